"""Summaries (tangram_opt.show.summary) and pictures (tangram_opt.show.plots) with the Agg backend."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest

import tangram_opt as to
from tangram_opt.export import save_plan_file
from tangram_opt.show import TABLE_COLUMNS, open_parts, plan_metrics, plan_table, summary_text
from tangram_opt.show.plots import plot_islands, plot_memory, plot_timeline

from test_export import hetero_plan, single_job_plan, two_pipeline_plan


@pytest.fixture(scope="module")
def cluster():
    return to.load_cluster("tiny-mixed")


@pytest.fixture(scope="module")
def model():
    return to.load_model("llama-3-8b")


@pytest.fixture(scope="module")
def sim_result(cluster, model):
    sim = pytest.importorskip("tangram_opt.sim")
    plan = hetero_plan()
    return sim.simulate(plan, cluster, model, to.TrainingSpec(global_batch_size=plan.global_batch_size,
                                                              seq_len=plan.seq_len, precision=plan.precision))


# --- table ------------------------------------------------------------------------------------------------

def test_plan_table_has_one_row_per_stage_and_the_documented_columns():
    plan = two_pipeline_plan()
    df = plan_table(plan)
    assert tuple(df.columns) == TABLE_COLUMNS
    assert len(df) == len(plan.stages) == 3
    assert list(df["pipeline"]) == [0, 1, 1] and list(df["stage"]) == [0, 0, 1]
    assert (df["memory_free_bytes"] == df["capacity_bytes"] - df["memory_bytes"]).all()
    assert (df["stage_time_s"] == df["fwd_time_s"] + df["bwd_time_s"]).all()
    assert df.attrs["step_time_s"] == plan.step_time_s and df.attrs["gpus_used"] == plan.gpus_used


def test_plan_metrics_include_throughput_mfu_and_gap():
    plan = hetero_plan()
    m = plan_metrics(plan)
    assert m["tokens_per_s"] == pytest.approx(plan.tokens_per_s)
    assert m["mfu"] == pytest.approx(plan.mfu) and m["gap"] == pytest.approx(plan.certificate.gap)
    assert m["cluster_gpus"] == 24


# --- text summary -----------------------------------------------------------------------------------------

def test_summary_text_names_every_figure():
    plan = hetero_plan()
    text = summary_text(plan, width=120)
    for needle in ("llama-3-8b on tiny-mixed", "tokens/s", "MFU", "gap", "bubble", "certificate: feasible",
                   "a100 8/8 GPUs", "v100 16/16 GPUs", "4xA100-40", "8xV100-16", "selective", "0-8+E", "25-31+H",
                   "mem GiB", "free GiB", "F+B ms", "ZeRO", f"{plan.stages[0].capacity_bytes / 2**30:.1f}"):
        assert needle in text, needle
    assert "\x1b[" not in text  # no colour codes
    assert max(len(line) for line in text.splitlines()) <= 120


def test_summary_text_shows_every_pipeline_and_hides_trivial_columns():
    text = summary_text(two_pipeline_plan())
    assert "pipeline 0:" in text and "pipeline 1:" in text
    header = next(line for line in text.splitlines() if line.startswith("stage"))
    assert " cp " not in header and " ep " not in header  # all 1 in this plan
    assert " cp " in next(line for line in summary_text(hetero_plan()).splitlines() if line.startswith("stage"))


def test_summary_without_bound_says_so():
    from test_export import make_plan, stage

    plan = make_plan([([stage("a100", 8, (0, 32), emb=True, head=True)], 8, 8)], bound_s=None)
    assert "no bound" in summary_text(plan)


def test_summary_names_the_parts_of_the_search_that_hold_the_gap():
    from dataclasses import replace

    plan = hetero_plan()
    cert = plan.certificate
    obj = cert.objective_s
    subs = ({"pipeline_micro_batch": 1, "status": "closed", "bound_s": 0.97 * obj},
            {"pipeline_micro_batch": 2, "status": "not finished (time limit)", "bound_s": 0.90 * obj},
            {"pipeline_micro_batch": 4, "status": "pruned by bound", "bound_s": 1.2 * obj},  # above the plan: done
            {"pipeline_micro_batch": 8, "status": "closed", "bound_s": obj * (1 - 1e-6)},  # within tolerance: done
            {"level": "multi-pipeline", "status": "feasible", "bound_s": 0.95 * obj},
            {"pipeline_micro_batch": 16, "status": "not finished (time limit)", "bound_s": 0.99 * obj})
    plan = replace(plan, certificate=replace(cert, subproblems=subs, bound_s=0.90 * obj, gap=0.10))
    line = next(x for x in summary_text(plan, width=400).splitlines() if x.startswith("bounds below the plan"))
    assert line.index("micro-batch 2:") < line.index("multi-pipeline") < line.index("micro-batch 1:")
    assert "(time limit)" in line and "(closed at its model bound)" in line
    assert "(not proved)" in line and "1 more" in line  # three shown, the fourth (b = 16) counted
    assert "micro-batch 4:" not in line and "micro-batch 8:" not in line and "micro-batch 16:" not in line
    assert len(open_parts(plan, limit=10)) == 4
    optimal = replace(plan, certificate=replace(plan.certificate, status="optimal", gap=0.0))
    assert "bounds below the plan" not in summary_text(optimal) and open_parts(optimal) == []


# --- pictures ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("suffix", ["png", "svg"])
def test_islands_and_memory_pictures_are_written(tmp_path, cluster, suffix):
    plan = hetero_plan()
    f1 = plot_islands(plan, cluster, save_path=tmp_path / f"islands.{suffix}")
    f2 = plot_memory(plan, save_path=tmp_path / f"memory.{suffix}")
    for name, fig in (("islands", f1), ("memory", f2)):
        p = tmp_path / f"{name}.{suffix}"
        assert p.stat().st_size > 1000
        assert fig.axes  # a Figure with content
    head = (tmp_path / f"islands.{suffix}").read_bytes()[:100]
    assert head.startswith(b"\x89PNG") if suffix == "png" else b"<svg" in head or b"<?xml" in head


def test_islands_picture_for_a_large_cluster_and_two_pipelines(tmp_path):
    plot_islands(two_pipeline_plan(), to.load_cluster("tiny-mixed"), save_path=tmp_path / "two.png")
    assert (tmp_path / "two.png").stat().st_size > 1000
    big = to.load_cluster("b200-h100-a100-4k")
    from test_export import make_plan, stage

    plan = make_plan([([stage("b200", 1024, (0, 40), tp=8, emb=True), stage("h100", 2048, (40, 40), tp=8, head=True)],
                       128, 8)], cluster=big.name)
    fig = plot_islands(plan, big, save_path=tmp_path / "big.png")  # > max_cells: one cell per node
    assert "one cell per node" in fig.axes[0].get_title(loc="left")
    assert (tmp_path / "big.png").stat().st_size < 150_000


def test_plots_draw_into_a_given_axes(cluster):
    from matplotlib.figure import Figure

    fig = Figure()
    ax1, ax2 = fig.subplots(1, 2)
    assert plot_memory(hetero_plan(), ax=ax1) is fig
    assert plot_islands(hetero_plan(), cluster, ax=ax2) is fig
    assert ax1.patches and ax2.patches


def test_timeline_picture_from_a_simulated_step(tmp_path, sim_result):
    fig = plot_timeline(sim_result, save_path=tmp_path / "timeline.png")
    assert (tmp_path / "timeline.png").stat().st_size > 1000
    ax = fig.axes[0]
    n_fb = sum(1 for e in sim_result.events if e.kind in ("F", "B", "tail"))
    assert len(ax.patches) == n_fb  # one bar per forward, backward and tail
    assert [t.get_text() for t in ax.get_yticklabels()] == ["stage 0", "stage 1", "stage 2", "stage 3"]
    plot_timeline(sim_result, save_path=tmp_path / "timeline.svg", show_sends=True)
    assert (tmp_path / "timeline.svg").stat().st_size > 1000


def test_picture_with_a_wrong_suffix_is_a_spec_error(tmp_path):
    with pytest.raises(to.SpecError, match="suffix"):
        plot_memory(hetero_plan(), save_path=tmp_path / "memory.txt")


def test_make_pictures_from_a_saved_plan(tmp_path, cluster, model):
    pytest.importorskip("tangram_opt.sim")
    from tangram_opt.show.make_pictures import main

    plan = single_job_plan()
    path = save_plan_file(tmp_path / "plan.json", plan, cluster=cluster, model=model,
                          training=to.TrainingSpec(global_batch_size=plan.global_batch_size, seq_len=plan.seq_len,
                                                   precision=plan.precision))
    assert main(["--plan", str(path), "--out", str(tmp_path / "img")]) == 0
    for name in ("timeline.png", "islands.png", "memory.png"):
        size = (tmp_path / "img" / name).stat().st_size
        assert 1000 < size < 150_000, (name, size)
