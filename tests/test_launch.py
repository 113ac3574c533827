"""Launch targets (issue 29): plans a stock framework runs as one job, solved exactly in that space.

The launch space is the union of uniform configurations (every stage the same tp, cp, ep, dp, ZeRO
stage, recomputation and micro-batch); solve(launch=...) must find the best plan of it, which an
exhaustive enumeration over every uniform configuration confirms on tiny instances, and every plan
it returns must be one job of that framework (tangram_opt.export.launchable).
"""

from __future__ import annotations

import math

import pytest

from tangram_opt.errors import SpecError
from tangram_opt.export import launchable
from tangram_opt.planner.context import PlanningContext
from tangram_opt.planner.search import solve
from tangram_opt.planner.search.launch import (LAUNCH_TARGETS, launch_calibration, launch_rules, launch_subproblems,
                                               uniform_configs)
from tangram_opt.planner.space import SearchSpace
from tangram_opt.specs import TrainingSpec, load_model, make_cluster
from tangram_opt.specs import frameworks
from tangram_opt.testing.exhaustive import brute_force

SPACE = SearchSpace(max_stages=3, zero=(0, 1, 2, 3), recompute=("none", "full"), cp=(1, 2), micro_batch_sizes=(1, 2))


def _cluster():
    return make_cluster("tiny", [dict(name="a100", gpu="A100-40", nodes=1, gpus_per_node=4, nic_gbps=200),
                                 dict(name="h100", gpu="H100", nodes=1, gpus_per_node=4, nic_gbps=400)])


@pytest.fixture(scope="module")
def instance():
    model = load_model("llama-3-8b").with_layers(4)
    training = TrainingSpec(global_batch_size=8, seq_len=1024, precision="bf16")
    return _cluster(), model, training


@pytest.fixture(autouse=True)
def _torchtitan_knows_the_small_model(monkeypatch):
    # the 4-layer test model stands for a torchtitan Llama 3 flavour
    monkeypatch.setitem(frameworks.TORCHTITAN_RECIPES, "llama-3-8b-4L", ("llama3", "llama3_debugmodel"))


def _exhaustive(cluster, model, training, target):
    """Best closed-form step time over every uniform configuration the target runs (enumeration)."""
    rules = launch_rules(target)
    base = PlanningContext(cluster, model, training, space=SPACE, calibration=launch_calibration(rules, None))
    best = math.inf
    for _, k_space in uniform_configs(base, rules):
        res = brute_force(PlanningContext(cluster, model, training, space=k_space, cost=base.cost))
        if res is not None:
            best = min(best, res.step_time_s)
    return best


@pytest.mark.parametrize("target", LAUNCH_TARGETS)
def test_launch_space_optimum_matches_exhaustive_enumeration(instance, target):
    cluster, model, training = instance
    plan = solve(cluster, model, training, space=SPACE, time_limit_s=60, rel_gap=1e-6, launch=target)
    best = _exhaustive(cluster, model, training, target)
    cert = plan.certificate
    assert cert.status == "optimal"
    assert cert.objective_s == pytest.approx(best, rel=1e-5)
    assert cert.bound_s <= best * (1 + 1e-9)
    assert f"launch target {target}" in cert.plan_space
    assert any(n.startswith("runtime:") for n in cert.notes)
    # one job of that framework: every stage the same layout, one pipeline
    assert len(plan.pipelines) == 1
    layouts = {(s.tp, s.cp, s.dp, s.ep, s.zero, s.recompute, s.micro_batch_size) for s in plan.stages}
    assert len(layouts) == 1
    assert launchable(plan, target, model=model) == []


def test_the_launch_space_is_no_better_than_the_whole_space(instance):
    cluster, model, training = instance
    free = solve(cluster, model, training, space=SPACE, time_limit_s=60, rel_gap=1e-6)
    mega = solve(cluster, model, training, space=SPACE, time_limit_s=60, rel_gap=1e-6, launch="megatron")
    assert mega.certificate.objective_s >= free.certificate.bound_s * (1 - 1e-9)


def test_deepspeed_prices_gradient_sync_as_exposed_and_keeps_zero2_to_one_stage(instance):
    cluster, model, training = instance
    ds = launch_rules("deepspeed")
    assert not launch_calibration(ds, None).overlap_grad_reduce
    assert launch_calibration(launch_rules("megatron"), None).overlap_grad_reduce
    ctx = PlanningContext(cluster, model, training, space=SPACE, calibration=launch_calibration(ds, None))
    subs, counts = launch_subproblems(ctx, ds)
    assert counts["configurations"] > 0 and counts["sub_problems"] >= len(subs)
    for problem, label in subs.values():
        if " z2 " in label or " z3 " in label:
            assert problem.max_stages == 1, label
        assert all(c.config.tp == 1 and c.config.cp == 1 for c in problem.candidates), label


@pytest.mark.parametrize("target, precision, words", [
    ("torchtitan", "fp16", "fp16"), ("deepspeed", "fp8", "FP8"), ("torchtitan", "fp8", "fp8"), ("slurm", "bf16", ""),
])
def test_a_target_refuses_what_it_cannot_run(instance, target, precision, words):
    cluster, model, _ = instance
    with pytest.raises(SpecError) as exc:
        solve(cluster, model, TrainingSpec(global_batch_size=8, seq_len=1024, precision=precision),
              space=SPACE, time_limit_s=5, launch=target)
    assert exc.value.field == "launch" and words in str(exc.value)


def test_torchtitan_refuses_a_model_it_has_no_definition_of():
    with pytest.raises(SpecError) as exc:
        solve(_cluster(), load_model("opt-350m").with_layers(2), TrainingSpec(global_batch_size=8, seq_len=1024),
              space=SPACE, time_limit_s=5, launch="torchtitan")
    assert "no model definition" in str(exc.value) and "megatron" in exc.value.fix


def test_cli_plan_launch_prints_the_price_and_writes_a_one_job_export(tmp_path):
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TANGRAM_DEBUG"}
    res = subprocess.run([sys.executable, "-m", "tangram_opt", "plan", "--cluster", "tiny-mixed", "--model",
                          "llama-3-8b", "--batch", "16", "--seq", "1024", "--time-limit", "20", "--quiet",
                          "--launch", "megatron", "--output", str(tmp_path / "plan.json"), "--export", "megatron",
                          "--export-dir", str(tmp_path)], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "price of a stock megatron launch" in res.stdout and "best plan of the whole space" in res.stdout
    script = (tmp_path / "megatron_args.sh").read_text()
    assert "NOT WRITTEN" not in script and "--tensor-model-parallel-size" in script
    bad = subprocess.run([sys.executable, "-m", "tangram_opt", "plan", "--cluster", "tiny-mixed", "--model",
                          "llama-3-8b", "--batch", "16", "--seq", "1024", "--time-limit", "5", "--quiet",
                          "--launch", "torchtitan"], capture_output=True, text=True, env=env, timeout=120)
    assert bad.returncode == 2 and "fp16" in bad.stderr and "Traceback" not in bad.stderr


def test_a_launch_space_cut_by_the_time_limit_says_so(instance, monkeypatch):
    """Building the launch sub-problems stops at LAUNCH_BUILD_SHARE of the limit (at 0: once one
    fits): the configurations left out are not searched, and the certificate does not claim them."""
    import tangram_opt.planner.search.launch as launch

    cluster, model, training = instance
    monkeypatch.setattr(launch, "LAUNCH_BUILD_SHARE", 0.0)
    plan = solve(cluster, model, training, space=SPACE, time_limit_s=60, rel_gap=1e-6, launch="megatron")
    cert = plan.certificate
    assert cert.status == "feasible"  # whatever its gap over the configurations searched
    assert "the time limit stopped building the others" in cert.plan_space
    cut = next(n for n in cert.notes if n.startswith("time limit:"))
    assert "were not built or searched" in cut
    assert launchable(plan, "megatron", model=model) == []
    assert plan.step_time_s >= _exhaustive(cluster, model, training, "megatron") * (1 - 1e-9)
    # building stopped after the first configuration with a fitting sub-problem
    rules = launch_rules("megatron")
    ctx = PlanningContext(cluster, model, training, space=SPACE, calibration=launch_calibration(rules, None))
    subs, counts = launch_subproblems(ctx, rules, deadline=0.0)
    assert subs and counts["configurations"] - counts["not_built"] == 1  # the first one fits here
    assert counts["configurations"] > 1
