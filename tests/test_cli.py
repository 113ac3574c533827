"""The ``tangram-opt`` command line, run as a subprocess (``python -m tangram_opt``).

Every verb is exercised; bad input must give one ``tangram-opt: ...`` line on stderr, the documented
exit code and no traceback. The one real planning run (module fixture, ~5 s) feeds ``show`` and
``simulate``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tangram_opt import cli

TIMEOUT_S = 60


def run(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    e = dict(os.environ)
    e.pop("TANGRAM_DEBUG", None)
    e["MPLBACKEND"] = "Agg"
    if env:
        e.update(env)
    return subprocess.run([sys.executable, "-m", "tangram_opt", *args], capture_output=True, text=True, cwd=cwd,
                          env=e, timeout=TIMEOUT_S)


def assert_one_line_error(res: subprocess.CompletedProcess, code: int, *needles: str) -> None:
    assert res.returncode == code, (res.returncode, res.stdout, res.stderr)
    assert "Traceback" not in res.stderr and "Traceback" not in res.stdout
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("tangram-opt"), lines[0]
    for n in needles:
        assert n in lines[0], (n, lines[0])


# --- one real planning run, shared ----------------------------------------------------------------------

PLAN_ARGS = ("plan", "--cluster", "tiny-mixed", "--model", "llama-3-8b", "--batch", "32", "--seq", "2048",
             "--time-limit", "5")


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    d = tmp_path_factory.mktemp("plan")
    res = run(*PLAN_ARGS, "--output", str(d / "plan.json"), "--export", "megatron,deepspeed,torchtitan",
              "--export-dir", str(d / "launch"))
    return d, res


def test_plan_prints_the_summary_and_progress(planned):
    _, res = planned
    assert res.returncode == cli.EXIT_OK, res.stderr
    out = res.stdout
    for needle in ("llama-3-8b on tiny-mixed", "tokens/s", "MFU", "certificate:", "gap", "pipeline 0:", "bubble",
                   "mem GiB", "free GiB", "a100", "v100"):
        assert needle in out, needle
    assert "\x1b[" not in out  # not a terminal: no colour codes
    err = res.stderr
    assert "precision: fp16" in err  # V100 cannot train in bf16: auto picks fp16
    progress = [ln for ln in err.splitlines() if " s / 5 s |" in ln]
    assert progress and all("best" in ln and "bound" in ln and "gap" in ln for ln in progress)


def test_plan_writes_the_plan_file_and_exports(planned):
    d, res = planned
    assert res.returncode == 0
    env = json.loads((d / "plan.json").read_text())
    assert env["schema"] == "tangram_opt.plan/1"
    assert env["cluster"]["name"] == "tiny-mixed" and env["model"]["name"] == "llama-3-8b"
    assert env["training"] == {"global_batch_size": 32, "seq_len": 2048, "precision": "fp16"}
    launch = d / "launch"
    assert (launch / "megatron_args.sh").read_text().startswith("#!/usr/bin/env bash")
    json.loads((launch / "deepspeed.json").read_text())
    # torchtitan trains in bf16 only: this fp16 plan (V100s) is refused with the reason, not written
    assert not list(launch.glob("torchtitan*"))
    assert "torchtitan" in res.stderr and "not written" in res.stderr and "fp16" in res.stderr


@pytest.mark.parametrize("fmt, check", [
    ("table", lambda out: "pipeline 0:" in out and "tokens/s" in out),
    ("json", lambda out: json.loads(out)["schema"] == "tangram_opt.plan/1"),
    ("csv", lambda out: out.splitlines()[0].startswith("pipeline,stage,island,gpu,gpus,tp,cp,dp")),
    ("megatron", lambda out: "--tensor-model-parallel-size" in out and "MODEL_ARGS=(" in out),
    ("deepspeed", lambda out: "train_micro_batch_size_per_gpu" in json.dumps(json.loads(out))),
    # an fp16 plan: torchtitan trains in bf16, so the export says why it is not written
    ("torchtitan", lambda out: "torchtitan 0.3" in out and "NOT WRITTEN" in out and "bf16" in out),
])
def test_show_formats(planned, fmt, check):
    d, _ = planned
    res = run("show", str(d / "plan.json"), "--format", fmt)
    assert res.returncode == 0, res.stderr
    assert check(res.stdout)


def test_unwritable_output_is_bad_input(planned, tmp_path):
    d, _ = planned
    (tmp_path / "afile").write_text("x")
    res = run("show", str(d / "plan.json"), "--memory-picture", str(tmp_path / "afile" / "m.png"))
    assert_one_line_error(res, cli.EXIT_BAD_INPUT, "afile")


def test_show_pictures(planned, tmp_path):
    d, _ = planned
    res = run("show", str(d / "plan.json"), "--islands-picture", str(tmp_path / "i.png"),
              "--memory-picture", str(tmp_path / "m.svg"))
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "i.png").stat().st_size > 1000 and (tmp_path / "m.svg").stat().st_size > 1000


def test_simulate_reports_and_draws_the_timeline(planned, tmp_path):
    pytest.importorskip("tangram_opt.sim")
    d, _ = planned
    res = run("simulate", str(d / "plan.json"), "--picture", str(tmp_path / "t.png"), "--trace",
              str(tmp_path / "trace.csv"))
    assert res.returncode == 0, res.stderr
    assert "simulated step" in res.stdout and "predicted" in res.stdout and "peak GiB" in res.stdout
    assert (tmp_path / "t.png").stat().st_size > 1000
    header = (tmp_path / "trace.csv").read_text().splitlines()[0]
    assert header.startswith("pipeline,stage,kind,micro_batch,start_s,end_s")


def test_simulate_a_bare_plan_needs_the_cluster(planned, tmp_path):
    d, _ = planned
    env = json.loads((d / "plan.json").read_text())
    (tmp_path / "bare.json").write_text(json.dumps(env["plan"]))
    assert_one_line_error(run("simulate", str(tmp_path / "bare.json")), cli.EXIT_BAD_INPUT, "--cluster")


# --- small verbs ----------------------------------------------------------------------------------------

def test_help_for_every_verb_has_examples():
    res = run("--help")
    assert res.returncode == 0
    for verb in cli.VERBS:
        assert verb in res.stdout
        sub = run(verb, "--help")
        assert sub.returncode == 0, verb
        assert "examples:" in sub.stdout, verb
    assert "exit codes" in res.stdout


def test_version_and_no_verb():
    assert run("--version").stdout.startswith("tangram-opt ")
    assert run().returncode == cli.EXIT_BAD_INPUT


def test_clusters_models_islands():
    res = run("clusters")
    assert res.returncode == 0 and "tiny-mixed" in res.stdout and "two-zone" in res.stdout
    res = run("models")
    assert res.returncode == 0 and "llama-3-8b" in res.stdout and "MoE" in res.stdout
    res = run("islands", "--cluster", "two-zone")
    assert res.returncode == 0 and "2 island(s)" in res.stdout and "h100-a <-> a100-b" in res.stdout


def test_experts_with_a_profile_and_a_loads_file(tmp_path):
    pytest.importorskip("tangram_opt.experts")
    res = run("experts", "--profile", "zipf", "--experts", "16", "--ranks", "4", "--nodes", "2", "--slots", "5",
              "--method", "greedy", "--output", str(tmp_path / "p.json"))
    assert res.returncode == 0, res.stderr
    assert "imbalance" in res.stdout and "heuristic" in res.stdout
    assert json.loads((tmp_path / "p.json").read_text())["method"] == "greedy"
    (tmp_path / "loads.json").write_text(json.dumps({"loads": [[5, 1, 1, 1], [1, 1, 1, 5]]}))
    res = run("experts", "--loads", str(tmp_path / "loads.json"), "--ranks", "2", "--nodes", "1", "--slots", "3",
              "--time-limit", "2")
    assert res.returncode == 0, res.stderr
    assert len([ln for ln in res.stdout.splitlines() if ln.strip().startswith(("0 ", "1 "))]) == 2


def test_bench_without_the_suite_is_unavailable(tmp_path):
    res = run("bench", "--quick", env={"TANGRAM_BENCH_ROOT": str(tmp_path)})
    assert_one_line_error(res, cli.EXIT_UNAVAILABLE, "benchmark suite")


def test_bench_delegates_to_benchmarks_run(tmp_path):
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "__init__.py").write_text("")
    (tmp_path / "benchmarks" / "run.py").write_text("import sys\nprint('ARGS', sys.argv[1:])\nsys.exit(7)\n")
    res = run("bench", "--quick", "--", "--only", "x", env={"TANGRAM_BENCH_ROOT": str(tmp_path)})
    assert res.returncode == 7
    assert "ARGS ['--quick', '--only', 'x']" in res.stdout
    res = run("bench", "--scenarios", "a,b", env={"TANGRAM_BENCH_ROOT": str(tmp_path)})
    assert res.returncode == 7 and "ARGS ['--scenarios', 'a,b']" in res.stdout


# --- exit codes -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("args, needle", [
    (("plan", "--model", "llama-3-8b"), "--cluster"),
    (("plan", "--cluster", "no-such-cluster", "--model", "llama-3-8b"), "no-such-cluster"),
    (("plan", "--cluster", "tiny-mixed", "--model", "llama-9"), "llama-9"),
    (("plan", "--cluster", "tiny-mixed", "--model", "llama-3-8b", "--batch", "0"), "--batch"),
    (("plan", "--cluster", "tiny-mixed", "--model", "llama-3-8b", "--time-limit", "soon"), "--time-limit"),
    (("plan", "--cluster", "tiny-mixed", "--model", "llama-3-8b", "--gap", "5 percent"), "--gap"),
    (("plan", "--cluster", "tiny-mixed", "--model", "llama-3-8b", "--gap", "150%"), "--gap"),
    (("plan", "--cluster", "tiny-mixed", "--model", "llama-3-8b", "--backend", "gurobi9"), "backend"),
    (("plan", "--cluster", "tiny-mixed", "--model", "llama-3-8b", "--precision", "bf16"), "precision"),
    (("plan", "--cluster", "tiny-mixed", "--model", "llama-3-8b", "--export", "slurm"), "slurm"),
    (("plan", "--cluster", "tiny-mixed", "--model", "llama-3-8b", "--zero", "5"), "ZeRO"),
    (("show", "missing.json"), "file not found"),
    (("show",), "PLAN_JSON"),
    (("frobnicate",), "frobnicate"),
    (("islands", "--cluster", "nope.yaml"), "nope.yaml"),
    (("experts", "--profile", "zipf", "--ranks", "4", "--nodes", "3", "--slots", "4"), ""),
])
def test_bad_input_is_one_line_and_exit_2(args, needle):
    assert_one_line_error(run(*args), cli.EXIT_BAD_INPUT, needle)


def test_malformed_plan_file_is_bad_input(tmp_path):
    (tmp_path / "p.json").write_text("{ nope")
    assert_one_line_error(run("show", str(tmp_path / "p.json")), cli.EXIT_BAD_INPUT, "not valid JSON")
    (tmp_path / "q.json").write_text(json.dumps({"schema": "tangram_opt.plan/9", "plan": {}}))
    assert_one_line_error(run("show", str(tmp_path / "q.json")), cli.EXIT_BAD_INPUT, "tangram_opt.plan/1")


def test_bad_cluster_file_names_the_field(tmp_path):
    (tmp_path / "c.yaml").write_text("name: c\nnode_groups:\n  - gpu: A100-80G\n    nodes: 1\n    nic_gbps: 100\n")
    assert_one_line_error(run("islands", "--cluster", str(tmp_path / "c.yaml")), cli.EXIT_BAD_INPUT,
                          "node_groups[0].gpu")


ONE_L4 = ("name: one-l4\nnode_groups:\n  - name: l4\n    gpu: L4\n    nodes: 1\n    gpus_per_node: 1\n"
          "    nic_gbps: 100\n")


def test_infeasible_exits_3_with_the_diagnosis(tmp_path):
    (tmp_path / "one.yaml").write_text(ONE_L4)
    res = run("plan", "--cluster", str(tmp_path / "one.yaml"), "--model", "llama-3-405b", "--batch", "8", "--seq",
              "4096", "--time-limit", "5", "--quiet")
    assert res.returncode == cli.EXIT_INFEASIBLE, res.stderr
    assert "Traceback" not in res.stderr
    err = [ln for ln in res.stderr.splitlines() if ln.startswith("tangram-opt")]
    assert len(err) == 1 and err[0].startswith("tangram-opt: infeasible: ") and "GiB" in res.stderr


def test_no_plan_within_the_time_limit_exits_4():
    """``--time-limit 0 --no-warm-start``: the search stops before the MIP and only exact one-stage
    pipelines are tried; gpt-neox-20b does not fit on one island of tiny-mixed (but does on two)."""
    res = run("plan", "--cluster", "tiny-mixed", "--model", "gpt-neox-20b", "--batch", "32", "--seq", "2048",
              "--time-limit", "0", "--no-warm-start", "--quiet")
    assert res.returncode == cli.EXIT_NO_PLAN, res.stderr
    assert "Traceback" not in res.stderr
    err = [ln for ln in res.stderr.splitlines() if ln.startswith("tangram-opt")]
    assert len(err) == 1 and err[0].startswith("tangram-opt: no plan: ")


def test_time_limit_zero_returns_the_heuristic_plan():
    res = run("plan", "--cluster", "tiny-mixed", "--model", "llama-3-8b", "--batch", "32", "--seq", "2048",
              "--time-limit", "0", "--quiet")
    assert res.returncode == 0, res.stderr
    assert "certificate:" in res.stdout


def test_training_file_replaces_batch_and_seq(tmp_path):
    (tmp_path / "t.yaml").write_text("training:\n  global_batch_size: 16\n  seq_len: 1024\n  precision: fp16\n")
    res = run("plan", "--cluster", "tiny-mixed", "--model", "llama-3-8b", "--training", str(tmp_path / "t.yaml"),
              "--time-limit", "0", "--quiet")
    assert res.returncode == 0, res.stderr
    assert "global batch 16 x 1024 tokens" in res.stdout
    res = run("plan", "--cluster", "tiny-mixed", "--model", "llama-3-8b", "--training", str(tmp_path / "t.yaml"),
              "--batch", "8")
    assert_one_line_error(res, cli.EXIT_BAD_INPUT, "--training")


# --- in-process: the exit-code mapping, internal errors, missing components, progress ---------------------

def test_exit_code_mapping():
    from tangram_opt.errors import (FormatError, InfeasibleError, NoSolutionError, SolverUnavailableError,
                                    SpecError, TangramError)

    assert cli.exit_code_for(SpecError("f", 1, "bad")) == cli.EXIT_BAD_INPUT == 2
    assert cli.exit_code_for(FormatError("f", 1, "bad")) == 2
    assert cli.exit_code_for(cli.UsageError("x")) == 2
    assert cli.exit_code_for(InfeasibleError("x")) == cli.EXIT_INFEASIBLE == 3
    assert cli.exit_code_for(NoSolutionError("x")) == cli.EXIT_NO_PLAN == 4
    assert cli.exit_code_for(SolverUnavailableError("x")) == cli.EXIT_UNAVAILABLE == 5
    assert cli.exit_code_for(cli.ComponentUnavailable("x")) == 5
    assert cli.exit_code_for(TangramError("x")) == 2
    assert cli.exit_code_for(PermissionError(13, "Permission denied")) == 2
    assert cli.exit_code_for(KeyboardInterrupt()) == cli.EXIT_INTERRUPTED
    assert cli.exit_code_for(ZeroDivisionError()) == cli.EXIT_INTERNAL == 1


def test_internal_error_is_one_line_please_report_and_debug_shows_traceback(monkeypatch, capsys):
    def boom(args):
        raise ZeroDivisionError("oops")

    monkeypatch.setitem(cli.VERBS, "clusters", boom)
    assert cli.main(["clusters"]) == cli.EXIT_INTERNAL
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "please report" in err and "Traceback" not in err
    assert cli.main(["clusters", "--debug"]) == cli.EXIT_INTERNAL
    assert "Traceback" in capsys.readouterr().err


def test_simulate_without_the_simulator_is_unavailable(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "tangram_opt.sim", None)  # makes `from tangram_opt.sim import ...` fail
    assert cli.main(["simulate", str(tmp_path / "plan.json")]) == cli.EXIT_UNAVAILABLE
    assert "simulator is not available" in capsys.readouterr().err


def test_experts_without_the_module_is_unavailable(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tangram_opt.experts", None)
    assert cli.main(["experts", "--profile", "zipf", "--ranks", "4", "--nodes", "1", "--slots", "16"]) == 5
    assert "expert placement is not available" in capsys.readouterr().err


def test_progress_prints_plain_lines_on_change():
    import io
    from types import SimpleNamespace as Ev

    buf = io.StringIO()
    with cli.SolveProgress(time_limit_s=10, live=False, stream=buf) as p:
        p(Ev(elapsed_s=0.5, incumbent_s=2.0, bound_s=1.0, message="start"))
        p(Ev(elapsed_s=0.7, incumbent_s=2.0, bound_s=None, message="b=2: incumbent 1.9"))  # heartbeat: no line
        p(Ev(elapsed_s=1.0, incumbent_s=1.5, bound_s=1.2, message="b=2: optimal"))
    lines = buf.getvalue().splitlines()
    assert len(lines) == 3
    assert "best 2.0000 s" in lines[1] and "gap 50.00%" in lines[1]
    assert "gap 20.00%" in lines[2] and "pipeline micro-batch 2: optimal" in lines[2]


def test_live_progress_renders_a_bar_and_the_figures():
    from types import SimpleNamespace as Ev

    from rich.console import Console

    p = cli.SolveProgress(time_limit_s=10, live=True)
    p(Ev(elapsed_s=0.5, incumbent_s=1.1, bound_s=1.0, message="b=4: incumbent 1.2310662"))
    with open(os.devnull, "w") as sink:
        con = Console(width=160, record=True, color_system=None, file=sink)
        con.print(p)
        text = con.export_text()
    assert "best 1.1000 s" in text and "bound 1.0000 s" in text and "gap 9.09%" in text
    assert "sub-problem incumbent 1.2311 s" in text


def test_gap_takes_a_fraction_or_a_percentage():
    assert cli._gap("0.02") == pytest.approx(0.02)
    assert cli._gap("1%") == pytest.approx(0.01)
    assert cli._gap(" 0.5% ") == pytest.approx(0.005)
    assert cli._gap("0") == 0.0


# --- sweep -------------------------------------------------------------------------------------------------

SWEEP = """\
name: two-prices
cluster:
  name: one-node
  node_groups:
    - {name: a100, gpu: A100-40, nodes: 1, nic_gbps: 400}
model: opt-350m
training: {global_batch_size: 16, seq_len: 1024}
solve: {time_limit_s: 10, rel_gap: 0.01, multi_pipeline: false}
axes:
  node_groups.a100.price_per_gpu_hour: [2.0, 1.0]
"""


def test_sweep_prints_the_front_and_writes_the_table_and_figure(tmp_path):
    f = tmp_path / "sweep.yaml"
    f.write_text(SWEEP)
    res = run("sweep", str(f), "--output", str(tmp_path / "s.csv"), "--figure", str(tmp_path / "p.png"),
              "--workers", "1")
    assert res.returncode == cli.EXIT_OK, res.stderr
    assert "2 variants" in res.stdout and "1 distinct solve" in res.stdout and "Pareto front" in res.stdout
    assert "[1/2] a100.price_per_gpu_hour=2.0: " in res.stderr and "$16.00/h" in res.stderr  # 8 GPUs x $2
    rows = (tmp_path / "s.csv").read_text().splitlines()
    assert len(rows) == 3 and rows[0].startswith("variant,label,node_groups.a100.price_per_gpu_hour")
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_sweep_bad_axis_is_one_line_exit_2(tmp_path):
    f = tmp_path / "sweep.yaml"
    f.write_text(SWEEP.replace("node_groups.a100.price_per_gpu_hour", "nodes.a100"))
    assert_one_line_error(run("sweep", str(f)), cli.EXIT_BAD_INPUT, "axes.nodes.a100", "is not a known axis")


def test_sweep_on_ray_without_ray_is_unavailable(tmp_path):
    import importlib.util

    if importlib.util.find_spec("ray") is not None:
        pytest.skip("ray is installed")
    f = tmp_path / "sweep.yaml"
    f.write_text(SWEEP)
    assert_one_line_error(run("sweep", str(f), "--ray-address", "local"), cli.EXIT_UNAVAILABLE, "tangram_opt[ray]")
