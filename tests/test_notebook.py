"""docs/notebooks/solver_gaps.ipynb: in sync with its source script, stored executed, and a fresh build
runs top to bottom in fast mode."""

from __future__ import annotations

import ast
import importlib.util
import json
import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

ROOT = Path(__file__).resolve().parent.parent
NB_DIR = ROOT / "docs" / "notebooks"
NOTEBOOK = NB_DIR / "solver_gaps.ipynb"
#: the issue's budget is 3 minutes in fast mode; this guard (twice that) only catches a notebook
#: whose fast mode stopped being fast, not timing noise
MAX_FAST_S = 360


def _builder():
    spec = importlib.util.spec_from_file_location("notebook_build", NB_DIR / "build.py")
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    return mod


def test_notebook_cells_match_their_source():
    build = _builder()
    src = NB_DIR / "solver_gaps.py"
    assert build.is_current(NOTEBOOK, src), (
        "docs/notebooks/solver_gaps.ipynb is out of date: run python docs/notebooks/build.py --execute")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and any("parameters" in c.metadata.get("tags", []) for c in code)


def test_check_ignores_outputs_but_not_sources(tmp_path):
    build = _builder()
    src = NB_DIR / "solver_gaps.py"
    nb = build.build(src)
    cell = next(c for c in nb.cells if c.cell_type == "code")
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="hello\n")]
    cell.execution_count = 7
    nb.metadata["language_info"] = {"name": "python", "version": "3.x"}
    stored = tmp_path / "solver_gaps.ipynb"
    stored.write_text(build.render(nb), encoding="utf-8")
    assert build.is_current(stored, src)  # outputs, counts, kernel metadata: ignored
    stale = tmp_path / "stale.py"
    stale.write_text(src.read_text(encoding="utf-8").replace("GAP_TARGET = 0.01", "GAP_TARGET = 0.02"))
    assert not build.is_current(stored, stale)  # a source edit: out of date
    tagless = tmp_path / "tagless.py"
    tagless.write_text(src.read_text(encoding="utf-8").replace('# %% tags=["parameters"]', "# %%"))
    assert not build.is_current(stored, tagless)  # the builder's tags count


def _expected_output(source: str) -> set[str]:
    """What a code cell of the notebook shows when run: a generated paragraph (a top-level report() or
    display() call), a figure (plt.show()), a table or value (a last statement that is a bare
    expression other than those calls) or printed lines (a top-level print())."""
    tree = ast.parse(source)
    kinds = set()
    for stmt in tree.body:
        call = stmt.value if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) else None
        name = ast.unparse(call.func) if call is not None else ""
        if name in ("report", "display"):
            kinds.add("text/markdown")
        elif name == "plt.show":
            kinds.add("image/png")
        elif name == "print":
            kinds.add("stream")
    last = tree.body[-1] if tree.body else None
    if isinstance(last, ast.Expr) and not (isinstance(last.value, ast.Call) and ast.unparse(last.value.func) in (
            "report", "display", "plt.show", "print")):
        kinds.add("execute_result")
    return kinds


def _shown(cell) -> set[str]:
    kinds = set()
    for o in cell.outputs:
        if o.output_type in ("stream", "execute_result"):
            kinds.add(o.output_type)
        kinds.update(o.get("data", {}))
    return kinds


def _missing_outputs(nb) -> list[tuple[int, list[str]]]:
    """(cell index, output kinds) of the code cells that lack outputs their code produces."""
    out = []
    for i, c in enumerate(nb.cells):
        lacking = _expected_output(c.source) - _shown(c) if c.cell_type == "code" else set()
        if lacking:
            out.append((i, sorted(lacking)))
    return out


def test_stored_notebook_is_executed():
    """The committed notebook carries its fast-mode outputs (tables, generated text, figures), so a reader
    sees them on GitHub without running it: python docs/notebooks/build.py --execute refreshes it."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    hint = "docs/notebooks/solver_gaps.ipynb is stored without its outputs: run python docs/notebooks/build.py --execute"
    missing = _missing_outputs(nb)
    assert not missing, f"{hint}; cells without the outputs their code produces: {missing}"
    assert sum(bool(c.outputs) for c in code) >= 0.75 * len(code), hint
    assert sum("image/png" in _shown(c) for c in code) >= 7  # the figures are among them
    assert all(c.execution_count is not None for c in code), "a partly executed notebook"
    assert not [o for c in code for o in c.outputs if o.output_type == "error"]
    streams = "".join(o.get("text", "") for c in code for o in c.outputs if o.output_type == "stream")
    line = next((ln for ln in streams.splitlines() if ln.startswith("NOTEBOOK_SUMMARY ")), None)
    assert line is not None, hint
    assert json.loads(line.removeprefix("NOTEBOOK_SUMMARY "))["fast"] is True  # stored in fast mode
    assert NOTEBOOK.stat().st_size < 2_000_000


def test_notebook_runs_in_fast_mode():
    """CI executes a fresh copy built from the source (the stored outputs are not trusted), the same way
    python docs/notebooks/build.py --execute does."""
    build = _builder()
    nb = build.build(NB_DIR / "solver_gaps.py")
    t0 = time.perf_counter()
    nb = build.execute(nb, timeout=600)  # raises CellExecutionError on the first failing cell
    elapsed = time.perf_counter() - t0

    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
    assert not _missing_outputs(nb)
    streams = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs
                      if o.output_type == "stream")
    line = next(ln for ln in streams.splitlines() if ln.startswith("NOTEBOOK_SUMMARY "))
    summary = json.loads(line.removeprefix("NOTEBOOK_SUMMARY "))
    assert summary["fast"] is True
    rows = summary["rows"]
    n_backends = len(summary["backends"])
    assert n_backends >= 1
    assert rows["study1"] == 2 * n_backends  # two fast scenarios x every installed backend
    assert rows["study2"] == 2 * n_backends
    for table in ("study3", "study4", "study5", "lp_table", "sweep", "study7"):
        assert rows[table] > 0, table
    # the conclusions are generated from the measurements: every study wrote its paragraph
    markdown = "\n".join(o["data"]["text/markdown"] for c in nb.cells if c.cell_type == "code" for o in c.outputs
                         if o.output_type == "display_data" and "text/markdown" in o.get("data", {}))
    assert markdown.count("*Measured") >= 8
    assert "best backend" in markdown
    figures = sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert figures >= 7
    assert elapsed < MAX_FAST_S, f"fast mode took {elapsed:.0f} s"


# --- the helpers the notebook is built on (tangram_opt.analysis.solver_study) --------------------------------
def test_trajectory_helpers_read_search_events():
    from tangram_opt import SearchEvent
    from tangram_opt.analysis.solver_study import gap_at, time_to_gap, trajectory_frame

    events = [SearchEvent(0.5, 2.0, 1.0, "start"), SearchEvent(1.0, 2.0, 1.9, "root bounds"),
              SearchEvent(3.0, 1.95, 1.95, "done")]
    tj = trajectory_frame(events)
    assert list(tj.columns) == ["elapsed_s", "incumbent_s", "bound_s", "gap", "message"]
    assert tj["gap"].tolist() == pytest.approx([0.5, 0.05, 0.0])
    assert gap_at(tj, 0.1) != gap_at(tj, 0.1)  # NaN before the first event
    assert gap_at(tj, 2.0) == pytest.approx(0.05)
    assert time_to_gap(tj, 0.01) == 3.0
    assert time_to_gap(tj, 0.1) == 1.0
    assert time_to_gap(trajectory_frame([(0.1, None, 1.0)]), 0.5) is None


def test_formulation_sizes_gives_valid_lp_bounds_and_the_solve_trace_matches_the_certificate():
    import tangram_opt as to
    from tangram_opt.analysis.solver_study import formulation_sizes, solve_traced, subproblem_frame

    training = to.TrainingSpec(global_batch_size=64, seq_len=2048, precision="fp16")  # tiny-mixed-opt-350m
    model = to.load_model("opt-350m")
    # the single-pipeline search alone (solve()'s multi-pipeline level is not in the trajectory)
    run = solve_traced("tiny-mixed", model, training, time_limit_s=20, backend="highs", multi_pipeline=False)
    cert = run.plan.certificate
    assert cert.status == "optimal"
    assert run.plan.pipelines[0].num_stages >= 2  # the MIPs (and their LPs) cover pipelines of 2+ stages
    assert run.trajectory[["elapsed_s", "incumbent_s", "bound_s"]].to_numpy().tolist() == \
        [list(t) for t in cert.trajectory]
    row = run.summary()
    assert row["root_bound_s"] <= cert.objective_s * (1 + 1e-9)
    assert row["time_to_1pct_s"] <= run.wall_s
    assert len(subproblem_frame(run.plan)) == len(cert.subproblems)

    b = run.plan.pipelines[0].pipeline_micro_batch
    sizes = formulation_sizes("tiny-mixed", model, training, pipeline_micro_batches=[b],
                              variants=[{}, {"windows": False, "fluid_cuts": False, "mccormick_cuts": False,
                                             "tail_averages": False, "knapsack": False},
                                        {"formulation": "positional"}])
    assert sizes["formulation"].tolist() == ["aggregated", "aggregated", "positional"]
    built = sizes[sizes["status"] == "built"]
    assert len(built) == 3
    # every LP relaxation bounds the optimum of the sub-problem that holds the optimal plan
    assert (built["lp_bound_s"] <= cert.objective_s * (1 + 1e-6)).all()
    agg, bare, pos = built.itertuples()
    assert agg.lp_bound_s >= bare.lp_bound_s - 1e-12  # cuts and the root window only tighten
    assert pos.rows > agg.rows and pos.windows is None and pos.tail_averages is None
