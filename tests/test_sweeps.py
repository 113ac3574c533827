"""What-if sweeps (tangram_opt/sweeps): bad sweeps are refused naming the field before anything is
solved, variants are the cartesian product of the axes, every row's dollars and Pareto flag are
what they should be, and the local worker processes (and Ray, where installed) give the same rows
as solving in this process. Instances are one or two nodes and OPT-350M: each solve takes well
under a second.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pandas as pd
import pytest
import yaml

import tangram_opt as to
from tangram_opt import SpecError
from tangram_opt.specs.pricing import default_price
from tangram_opt.sweeps import COLUMNS, RayUnavailableError, load_sweep, pareto_front, sweep
from tangram_opt.sweeps.spec import solve_key

BASE = {
    "name": "small",
    "cluster": {"name": "small", "node_groups": [
        {"name": "a100", "gpu": "A100-40", "nodes": 1, "nic_gbps": 400},
        {"name": "v100", "gpu": "V100-16", "nodes": 1, "nic_gbps": 25}]},
    "model": "opt-350m",
    "training": {"global_batch_size": 16, "seq_len": 1024},
    "solve": {"time_limit_s": 10, "rel_gap": 0.01, "multi_pipeline": False},
    "axes": {"node_groups.a100.nodes": [0, 1], "node_groups.v100.price_per_gpu_hour": [3.0, 0.5]},
}


def spec(**changes):
    d = copy.deepcopy(BASE)
    for key, value in changes.items():
        if key.startswith("axes."):
            if value is None:
                d["axes"].pop(key[5:])
            else:
                d["axes"][key[5:]] = value
        else:
            d[key] = value
    return d


@pytest.fixture(scope="module")
def local():
    """The base sweep solved in this process (4 variants, 2 solves)."""
    return sweep(BASE, workers=1)


# --- bad sweeps ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("changes, field, needle", [
    ({"axes.nodes.a100": [1, 2]}, "axes.nodes.a100", "is not a known axis"),
    ({"axes.node_groups.a100.nodes": []}, "axes.node_groups.a100.nodes", "is empty"),
    ({"axis": {}}, "axis", "is not a known field"),
    ({"axes.node_groups.a100.nodez": [1]}, "axes.node_groups.a100.nodez", "not a node group field"),
    ({"axes.node_groups.h100.nodes": [1]}, "axes.node_groups.h100.nodes", "names no node group"),
    ({"axes.node_groups.a100.nodes": [1, -1]}, "axes.node_groups.a100.nodes", "whole number of nodes"),
    ({"axes.node_groups.a100.nodes": [1, 1]}, "axes.node_groups.a100.nodes", "listed twice"),
    ({"axes.node_groups.v100.price_per_gpu_hour": ["cheap"]}, "axes.node_groups.v100.price_per_gpu_hour",
     "not a string"),
    ({"axes.node_groups.v100.price_per_gpu_hour": [float("nan")]}, "axes.node_groups.v100.price_per_gpu_hour",
     "finite"),
    ({"axes.node_groups.v100.price_per_gpu_hour": [-2.0]}, "axes.node_groups.v100.price_per_gpu_hour",
     "negative"),
    ({"axes.node_groups.a100.gpu": ["A100-80G"]}, "axes.node_groups.a100.gpu", "not a known GPU type"),
    ({"axes.training.global_batch_size": [16, 0]}, "axes.training.global_batch_size", "must be >= 1"),
    ({"axes.training.batch": [16]}, "axes.training.batch", "not a training field"),
    ({"axes.model": "opt-350m"}, "axes.model", "must be a list"),
    ({"axes.model": ["opt-350m", "llama-9b"]}, "axes.model", "is not a model"),
    ({"solve": {"timelimit": 5}}, "solve.timelimit", "is not a known field"),
    ({"solve": {"time_limit_s": -1}}, "solve.time_limit_s", "seconds >= 0"),
    ({"solve": {"backend": "gurobi"}}, "solve.backend", ""),
    ({"solve": {"multi_pipeline": "no"}}, "solve.multi_pipeline", "true or false"),
    ({"training": {"global_batch_size": 16, "seq_len": 1024, "precision": "bf16"}}, "training.precision", "bf16"),
])
def test_bad_sweeps_name_the_field(changes, field, needle, monkeypatch):
    monkeypatch.setattr("tangram_opt.sweeps.run_jobs", _no_solving)
    with pytest.raises(SpecError) as e:
        sweep(spec(**changes))
    assert field in e.value.field or field in str(e.value), str(e.value)
    assert needle in str(e.value) and e.value.fix


def _no_solving(*args, **kwargs):
    raise AssertionError("a bad sweep must be refused before anything is solved")


def test_a_combination_that_fails_is_named_by_its_values(monkeypatch):
    monkeypatch.setattr("tangram_opt.sweeps.run_jobs", _no_solving)
    # bf16 is fine for A100 alone, but not once the V100 group is in the variant
    bad = spec(training={"global_batch_size": 16, "seq_len": 1024, "precision": "bf16"},
               **{"axes.node_groups.v100.nodes": [0, 1]})
    bad["axes"]["node_groups.a100.nodes"] = [1]
    with pytest.raises(SpecError) as e:
        sweep(bad)
    assert e.value.field == "axes" and "v100.nodes=1" in str(e.value.value) and "bf16" in str(e.value)


def test_a_group_without_a_price_is_named_before_solving(monkeypatch):
    monkeypatch.setattr("tangram_opt.sweeps.run_jobs", _no_solving)
    s = spec(**{"axes.node_groups.v100.price_per_gpu_hour": None, "axes.node_groups.v100.gpu": ["V100-16", "MI300X"]})
    with pytest.raises(SpecError) as e:
        sweep(s)
    assert e.value.field == "node_groups.v100.price_per_gpu_hour" and "v100.gpu=MI300X" in e.value.problem
    assert "MI300X" in e.value.problem and "node_groups.v100.price_per_gpu_hour" in e.value.fix


@pytest.mark.parametrize("kwargs, field", [({"workers": 0}, "workers"), ({"figure": "pareto.txt"}, "figure"),
                                           ({"time_limit_s": float("inf")}, "time_limit_s"),
                                           ({"rel_gap": 1.5}, "rel_gap"), ({"ray_address": ""}, "ray_address")])
def test_bad_arguments_name_the_argument(kwargs, field, monkeypatch):
    monkeypatch.setattr("tangram_opt.sweeps.run_jobs", _no_solving)
    with pytest.raises(SpecError) as e:
        sweep(BASE, **kwargs)
    assert e.value.field == field


def test_a_sweep_file_reports_its_name(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump(spec(**{"axes.nodes.a100": [1]})))
    with pytest.raises(SpecError) as e:
        load_sweep(f)
    assert str(e.value).startswith(f"{f}: axes.nodes.a100")


# --- variants ------------------------------------------------------------------------------------------------
def test_variants_are_the_cartesian_product_and_empty_clusters_are_skipped():
    s = load_sweep(spec(**{"axes.node_groups.v100.nodes": [0, 2], "axes.training.global_batch_size": [8, 16]}))
    vs = s.check()
    assert s.size == len(vs) == 2 * 2 * 2 * 2
    assert [v.index for v in vs] == list(range(16))
    first = vs[0]
    assert first.label == "a100.nodes=0, v100.price_per_gpu_hour=3.0, v100.nodes=0, global_batch_size=8"
    assert first.cluster is None and "no node group left" in first.skipped
    v = next(v for v in vs if dict(v.settings) == {"node_groups.a100.nodes": 1,
                                                   "node_groups.v100.price_per_gpu_hour": 0.5,
                                                   "node_groups.v100.nodes": 2, "training.global_batch_size": 8})
    assert [(g.name, g.num_nodes, g.usd_per_gpu_hour) for g in v.cluster.node_groups] == [("a100", 1, None),
                                                                                         ("v100", 2, 0.5)]
    assert v.training.global_batch_size == 8 and v.training.precision == "fp16"  # auto: V100 has no bf16
    only_a100 = next(v for v in vs if dict(v.settings)["node_groups.v100.nodes"] == 0 and v.cluster is not None)
    assert only_a100.training.precision == "bf16"


def test_a_gpu_axis_follows_the_new_gpus_defaults_and_emptied_zones_lose_their_links():
    s = load_sweep({"cluster": "two-zone", "model": "opt-350m", "training": {"global_batch_size": 8, "seq_len": 512},
                    "axes": {"node_groups.a100-b.gpu": ["A100-40", "H100-SXM"], "node_groups.h100-a.nodes": [0, 4]}})
    vs = s.check()
    h100 = next(v for v in vs if dict(v.settings)["node_groups.a100-b.gpu"] == "H100-SXM")
    assert h100.cluster.node_groups[0].node.intra_node_link == "nvlink4"
    alone = next(v for v in vs if dict(v.settings)["node_groups.h100-a.nodes"] == 0)
    assert [g.name for g in alone.cluster.node_groups] == ["a100-b"] and alone.cluster.zone_links == ()


def test_variants_differing_only_in_price_share_one_solve():
    vs = load_sweep(BASE).check()
    by_price = {dict(v.settings)["node_groups.v100.price_per_gpu_hour"]: v for v in vs
                if dict(v.settings)["node_groups.a100.nodes"] == 1}
    solve = dict(BASE["solve"])
    assert solve_key(by_price[3.0], solve) == solve_key(by_price[0.5], solve)
    assert solve_key(by_price[3.0], {**solve, "objective": "usd_per_token"}) != \
        solve_key(by_price[0.5], {**solve, "objective": "usd_per_token"})


# --- results ---------------------------------------------------------------------------------------------
def test_rows_carry_the_plans_dollars_and_status(local):
    df = local
    assert list(df.columns[:4]) == ["variant", "label", "node_groups.a100.nodes",
                                    "node_groups.v100.price_per_gpu_hour"]
    assert set(COLUMNS) <= set(df.columns) and len(df) == 4
    assert df.attrs["distinct_solves"] == 2 and df.attrs["solve"]["time_limit_s"] == 10
    assert set(df["status"]) <= {"optimal", "feasible"}
    vs = load_sweep(BASE).check()
    for (_, row), v in zip(df.iterrows(), vs):
        plan = row["plan"]
        assert row["tokens_per_s"] == pytest.approx(plan.tokens_per_s) and row["gpus_used"] == plan.gpus_used
        # dollars from the stages and the prices, independently of tangram_opt.costing
        price = {"a100": default_price("A100-40").usd_per_gpu_hour,
                 "v100": dict(v.settings)["node_groups.v100.price_per_gpu_hour"]}
        usd_h = sum(s.gpus * price[s.island] for s in plan.stages)
        assert row["usd_per_hour"] == pytest.approx(usd_h)
        assert row["usd_per_1m_tokens"] == pytest.approx(usd_h * plan.step_time_s / 3600 / (16 * 1024) * 1e6)
        assert row["usd_per_hour_cluster"] == pytest.approx(sum(g.num_gpus * price[g.name]
                                                               for g in v.cluster.node_groups))
        bound = plan.certificate.bound_s
        assert row["tokens_per_s_bound"] == pytest.approx(16 * 1024 / bound) and row["tokens_per_s_bound"] >= \
            row["tokens_per_s"] * (1 - 1e-9)
    # the price-only twins: one solve, the same plan, their own dollars
    twins = df[df["node_groups.a100.nodes"] == 1]
    assert twins["tokens_per_s"].nunique() == 1 and twins["solved_with"].nunique() == 1


def test_pareto_flags_match_a_brute_force_check(local):
    ok = local[local["tokens_per_s"].notna()]
    for i, r in ok.iterrows():
        dominated = any(o["usd_per_hour"] <= r["usd_per_hour"] and o["tokens_per_s"] >= r["tokens_per_s"]
                        and (o["usd_per_hour"] < r["usd_per_hour"] or o["tokens_per_s"] > r["tokens_per_s"])
                        for j, o in ok.iterrows() if j != i)
        assert bool(r["pareto"]) == (not dominated)


def test_pareto_front_by_model_ignores_rows_without_numbers():
    nan = float("nan")
    df = pd.DataFrame({"model": ["m", "m", "m", "m", "n", "m"],
                       "usd_per_hour": [1.0, 2.0, 2.0, 3.0, 10.0, nan],
                       "tokens_per_s": [10.0, 20.0, 15.0, 20.0, 1.0, 99.0]})
    assert list(pareto_front(df)) == [True, True, False, False, True, False]


def test_infeasible_and_skipped_variants_are_rows_with_their_reason(tmp_path):
    s = spec(**{"axes.node_groups.v100.price_per_gpu_hour": None, "axes.model": ["opt-350m", "llama-3-70b"]})
    s["axes"]["node_groups.a100.nodes"] = [0]
    s["axes"]["node_groups.v100.nodes"] = [0, 1]
    seen = []
    df = sweep(s, workers=1, figure=tmp_path / "front.png", on_result=seen.append)
    assert [r["variant"] for r in sorted(seen, key=lambda r: r["variant"])] == list(df["variant"])
    status = dict(zip(df["label"], df["status"]))
    assert status["a100.nodes=0, model=opt-350m, v100.nodes=0"] == "skipped"
    row = df[df["label"] == "a100.nodes=0, model=llama-3-70b, v100.nodes=1"].iloc[0]
    assert row["status"] == "infeasible" and "No plan fits llama-3-70b" in row["message"]
    assert math.isnan(row["usd_per_hour"]) and not row["pareto"] and row["plan"] is None
    png = (tmp_path / "front.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and df.attrs["figure"] == str(tmp_path / "front.png")


def test_local_worker_processes_give_the_in_process_rows(local):
    pooled = sweep(BASE, workers=2)
    assert list(pooled["status"]) == list(local["status"])
    for a, b in zip(pooled["tokens_per_s"], local["tokens_per_s"]):
        assert a == pytest.approx(b, rel=0.02)  # both within the 1% gap of the same optimum


def test_ray_missing_names_the_extra(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(RayUnavailableError, match=r"tangram_opt\[ray\]"):
        sweep(BASE, ray_address="local")


def test_a_local_ray_runtime_gives_the_in_process_rows(local, monkeypatch):
    """CI installs the [ray] extra; Ray's own start-up takes most of this test's ~10 s."""
    ray = pytest.importorskip("ray")
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    assert not ray.is_initialized()
    on_ray = sweep(BASE, ray_address="local")
    assert not ray.is_initialized()  # the runtime the sweep started is shut down
    assert list(on_ray["status"]) == list(local["status"])
    for a, b in zip(on_ray["tokens_per_s"], local["tokens_per_s"]):
        assert a == pytest.approx(b, rel=0.02)


def test_tangram_opt_exposes_sweep_and_plan_cost():
    assert to.sweep is sweep and callable(to.plan_cost) and to.load_sweep is load_sweep


# --- the example and the user guide ------------------------------------------------------------------
ROOT = Path(__file__).resolve().parent.parent


def test_the_example_sweep_has_at_least_50_variants_and_every_one_checks():
    s = load_sweep(ROOT / "benchmarks" / "sweeps" / "mixed-fleet.yaml")
    vs = s.check()
    assert s.size == len(vs) == 108 and sum(v.cluster is not None for v in vs) == 104
    assert len({solve_key(v, s.solve) for v in vs if v.cluster is not None}) == 52


def test_the_user_guide_examples_load():
    import re

    from tangram_opt.specs import cluster_from_dict

    doc = (ROOT / "docs" / "user_guide" / "costs_and_sweeps.md").read_text()
    cluster_yaml, sweep_yaml = re.findall(r"```yaml\n(.*?)```", doc, flags=re.DOTALL)
    c = cluster_from_dict(yaml.safe_load(cluster_yaml))
    assert [g.usd_per_gpu_hour for g in c.node_groups] == [1.60, 0.45] and c.zone_links[0].egress_usd_per_gb == 0.02
    assert load_sweep(yaml.safe_load(sweep_yaml)).size == 108
