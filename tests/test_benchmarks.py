"""The benchmark suite: scenario files, cluster files and the runner on one tiny scenario."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from benchmarks.report import geomean
from benchmarks.run import main, run_scenario
from benchmarks.scenario_suite import BENCH_DIR, METHODS, SCENARIO_DIR, load_scenario, load_scenarios
from tangram_opt.errors import SpecError
from tangram_opt.planner.islands import find_islands
from tangram_opt.specs import check_precision, list_presets, load_cluster, load_model

TINY = """\
name: tiny
description: "smoke test: 8 A100-40 + 16 V100-16, OPT-350M"
cluster: tiny-mixed
model: opt-350m
training: {global_batch_size: 16, seq_len: 1024, precision: fp16}
time_limit_s: {full: 5, quick: 3}
island_time_limit_s: {full: 2, quick: 2}
quick: true
"""


def test_suite_has_the_scenarios_the_issue_asks_for() -> None:
    scenarios = load_scenarios()
    assert len(scenarios) >= 12
    islands = {s.name: len(find_islands(s.load_cluster())) for s in scenarios}
    assert sum(n == 1 for n in islands.values()) >= 1, "a homogeneous control"
    assert sum(n > 1 for n in islands.values()) >= 11
    models = {s.model for s in scenarios}
    for m in ("opt-350m", "gpt-neo-2.7b", "llama-3-8b", "llama-3-70b", "llama-3-405b", "deepseek-v3",
              "mixtral-8x22b"):
        assert m in models
    assert any(s.model.startswith("qwen3") and "b-a" in s.model for s in scenarios), "a Qwen3-MoE scenario"
    assert any(len(s.load_cluster().zones) > 1 for s in scenarios), "a two-zone cluster"
    assert any(s.load_cluster().num_gpus >= 1024 for s in scenarios)
    assert 1 <= sum(s.quick for s in scenarios) < len(scenarios)


@pytest.mark.parametrize("path", sorted(SCENARIO_DIR.glob("*.yaml")), ids=lambda p: p.stem)
def test_scenario_file_parses_and_references_existing_inputs(path: Path) -> None:
    sc = load_scenario(path)
    cluster = sc.load_cluster()
    assert sc.model in list_presets()
    training = sc.training_spec()
    check_precision(training, cluster)  # V100 scenarios must say fp16
    assert sc.time_limit_s(quick=True) <= sc.time_limit_s(quick=False)
    assert sc.island_time_limit_s(quick=True) <= sc.island_time_limit_s(quick=False)
    assert sc.description


@pytest.mark.parametrize("path", sorted((BENCH_DIR / "clusters").glob("*.yaml")), ids=lambda p: p.stem)
def test_cluster_file_parses(path: Path) -> None:
    cl = load_cluster(path)
    assert cl.num_gpus > 0 and cl.name == path.stem


def test_time_limits_fit_the_budgets() -> None:
    """Solver limits alone (MIP + every island of the homogeneous baseline) leave room for the rest:
    < 20 of the 30 minutes for the full suite, < 90 s of the 3 minutes for --quick."""
    def budget(quick: bool) -> float:
        return sum(s.time_limit_s(quick) + len(find_islands(s.load_cluster())) * s.island_time_limit_s(quick)
                   for s in load_scenarios(quick=quick))
    assert budget(False) < 20 * 60
    assert budget(True) < 90


def test_scenario_errors_name_the_field(tmp_path: Path) -> None:
    p = tmp_path / "bad.yaml"
    p.write_text(TINY.replace("name: tiny", "name: bad").replace("quick: true", "quick: true\ncolour: red"))
    with pytest.raises(SpecError, match="colour"):
        load_scenario(p)
    p.write_text(TINY.replace("name: tiny", "name: bad").replace("time_limit_s: {full: 5, quick: 3}\n", ""))
    with pytest.raises(SpecError, match="time_limit_s"):
        load_scenario(p)
    p.write_text(TINY)
    with pytest.raises(SpecError, match="file name"):
        load_scenario(p)
    with pytest.raises(SpecError, match="not scenarios"):
        load_scenarios(["no-such-scenario"])


def test_geomean() -> None:
    assert geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert geomean([]) is None


@pytest.fixture()
def tiny_dir(tmp_path: Path) -> Path:
    d = tmp_path / "scenarios"
    d.mkdir()
    (d / "tiny.yaml").write_text(TINY)
    return d


def test_run_scenario_mip_is_at_least_every_baseline(tiny_dir: Path, tmp_path: Path) -> None:
    (sc,) = load_scenarios(directory=tiny_dir)
    r = run_scenario(sc, quick=True, instances_dir=tmp_path / "inst", log=lambda s: None)
    assert set(r.methods) == set(METHODS)
    assert all(m.ok for m in r.methods.values()), {k: m.error for k, m in r.methods.items()}
    assert r.violations == []
    for b in ("greedy", "homogeneous", "unaware"):
        assert r.ratio(b) >= 1 - 1e-9
    assert set(r.island_alone_tokens_per_s) == {"a100", "v100"}
    assert 0 < r.het_efficiency("mip") <= 1.5
    assert r.mps.get("file") == "tiny.mps.gz" and r.mps["rows"] > 0 and r.mps["best_known_ticks"] is not None


def test_runner_writes_csv_markdown_plots_and_instances(tiny_dir: Path, tmp_path: Path) -> None:
    out, inst = tmp_path / "out", tmp_path / "inst"
    rc = main(["--quick", "--scenario-dir", str(tiny_dir), "--out", str(out), "--no-docs", "--mps",
               "--instances", str(inst), "--backend", "cp-sat", "--threads", "1"])
    assert rc == 0
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert [r["method"] for r in rows] == list(METHODS)
    assert all(r["status"] == "ok" for r in rows)
    assert float(rows[0]["tokens_per_s"]) > 0 and rows[0]["gap"] != ""
    md = (out / "results.md").read_text()
    assert "| tiny |" in md and "Geometric mean of MIP / greedy" in md and "Where the gain comes from" in md
    assert "BUG" not in md
    assert (out / "tokens_per_s.png").is_file() and (out / "ratios.png").is_file()
    assert (inst / "tiny.mps.gz").is_file() and (inst / "tiny.yaml").is_file() and (inst / "tiny.cluster.yaml").is_file()
    readme = (inst / "README.md").read_text()
    assert "`tiny.mps.gz`" in readme
    load_cluster(inst / "tiny.cluster.yaml")  # the exported cluster file is loadable on its own


# --- planner_scaling --family comm (issue 27): the communication-bound cases -------------------------------
def test_comm_family_cases_load() -> None:
    from benchmarks.planner_scaling import COMM_DIR, comm_cases

    cases = comm_cases()
    names = [c.name for c in cases]
    assert len(set(names)) == len(names)
    files = {c.cluster for c in cases if isinstance(c.cluster, str)}
    assert files == {p.stem for p in COMM_DIR.glob("*.yaml")}, "every comm cluster file is a case"
    kinds = set()
    for case in cases:
        cluster = case.load_cluster()
        assert 64 <= cluster.num_gpus <= 1024
        assert case.model in list_presets()
        training = case.training(cluster)
        check_precision(training, cluster)  # V100 cases are planned in fp16
        kinds.add("moe" if load_model(case.model).is_moe else "dense")
    assert kinds == {"dense", "moe"}
    assert sum(c.name.startswith("issue 27") for c in cases) == 2
    assert any(c.load_cluster().num_gpus == 1024 for c in cases), "issue 27's 1,024-GPU target is measured"


def test_comm_family_tiny_case_plans_and_reports(tmp_path: Path) -> None:
    from benchmarks.planner_scaling import CommCase, read_before, report_comm, run_comm

    case = CommCase("tiny: 64 A10G+L4, OPT-350M", "comm-a10g-l4-4gpu-1z-64", "opt-350m", 64, seq=1024)
    row = run_comm(case, limit_s=1.5, threads=1)
    for key in ("multi", "single"):
        assert row[f"{key}_step_s"] > 0
        assert row[f"{key}_bound_s"] is not None
        assert row[f"{key}_bound_s"] <= row[f"{key}_step_s"] * (1 + 1e-9)
        assert 0 <= row[f"{key}_gap"] < 1
    # the default certificate's space holds every single-pipeline plan: its bound is below them all
    assert row["multi_bound_s"] <= row["single_step_s"] * (1 + 1e-9)
    page = tmp_path / "comm.md"
    page.write_text(report_comm([row], quick=True, threads=1), encoding="utf-8")
    text = page.read_text(encoding="utf-8")
    assert "Machine:" in text and case.name in text
    before = read_before(page)
    assert before[case.name][0].endswith("%") and before[case.name][1].endswith("%")
    with_before = report_comm([row], quick=True, threads=1, before=before)
    assert case.name in with_before
    # every table line has as many cells as the header (the before column included)
    table = [ln for ln in with_before.splitlines() if ln.startswith("|")]
    assert len({ln.count("|") for ln in table}) == 1


def test_launch_price_page_marks_a_launch_space_cut_by_the_time_limit() -> None:
    from benchmarks.launch_price import page

    done = {"step_s": 7.0, "gap": 0.2, "wall_s": 15.0, "stages": 24, "gpus": 768, "layout": "tp1", "islands": "b200",
            "cut": (60, 5184)}
    whole = dict(done, cut=None, gap=0.0)
    row = {"scenario": "s", "gpus": 1024, "free_s": 6.5, "free_gap": 0.1, "megatron": done, "deepspeed": whole,
           "torchtitan": {"error": "not here"}}
    text = page([row], quick=True, threads=1, cap_s=15)
    line = next(ln for ln in text.splitlines() if ln.startswith("| s |"))
    assert "(20.00% over 60 of 5,184 configurations: time limit)" in line
    assert line.count("configurations") == 1  # the uncut target's cell says nothing of the kind
