"""Plans from the planner and the baselines, checked by the independent validator and simulator.

Done-when criteria of issue 5: every plan ``solve`` (and ``greedy``) returns validates, fits memory
on every GPU in the replay, and its predicted step time agrees with the simulated one within 2%;
a disagreement names the stage. Property tests draw random small clusters and models.

Hypothesis properties that call ``solve`` run without shrinking (each example is a MIP solve);
the failing example is still printed.
"""

from __future__ import annotations

import functools

import pytest
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st

from tangram_opt import simulate, validate
from tangram_opt.baselines import greedy
from tangram_opt.errors import InfeasibleError, NoSolutionError
from tangram_opt.planner.context import PlanningContext
from tangram_opt.planner.plan import Plan
from tangram_opt.planner.search import solve
from tangram_opt.planner.space import SearchSpace
from tangram_opt.sim import SimulationResult
from tangram_opt.specs import Cluster, ModelSpec, MoESpec, TrainingSpec, make_cluster
from tangram_opt.specs.hardware import builtin_gpu_types
from tangram_opt.specs.presets import load_model

RTOL = 0.02
TIME_LIMIT_S = 5.0

CLUSTERS = {
    "a100+v100": make_cluster("a100+v100", [dict(gpu="A100-40", nodes=1, gpus_per_node=4, nic_gbps=200),
                                            dict(gpu="V100-16", nodes=1, gpus_per_node=4, nic_gbps=100)]),
    "h100x8": make_cluster("h100x8", [dict(gpu="H100-SXM", nodes=1, gpus_per_node=8, nic_gbps=400)]),
    "three-types": make_cluster("three-types", [dict(gpu="A100-80", nodes=1, gpus_per_node=2, nic_gbps=200),
                                                dict(gpu="L4", nodes=2, gpus_per_node=2, nic_gbps=100),
                                                dict(gpu="V100-32", nodes=1, gpus_per_node=4, nic_gbps=100)]),
}
MODELS = {"llama-3-8b-4L": lambda: load_model("llama-3-8b").with_layers(4),
          "mixtral-8x7b-4L": lambda: load_model("mixtral-8x7b").with_layers(4)}
TRAINING = TrainingSpec(global_batch_size=16, seq_len=1024, precision="fp16")
INSTANCES = [(c, m, s) for c in CLUSTERS for m in MODELS for s in ("1f1b", "gpipe")]


@functools.lru_cache(maxsize=None)
def planned(cluster: str, model: str, schedule: str, method: str) -> Plan:
    space = SearchSpace(max_stages=4, schedule=schedule)
    if method == "solve":
        return solve(CLUSTERS[cluster], MODELS[model](), TRAINING, time_limit_s=TIME_LIMIT_S, space=space)
    g = greedy(PlanningContext(CLUSTERS[cluster], MODELS[model](), TRAINING, space=space))
    assert g is not None, "greedy found no plan"
    return g.plan


def plan_problems(plan: Plan, cluster: Cluster, model: ModelSpec, training: TrainingSpec) -> tuple[list[str],
                                                                                                    SimulationResult]:
    """Validator violations, memory overflows and step-time bound breaches (not the 2% agreement)."""
    out = [str(v) for v in validate(plan, cluster, model, training)]
    res = simulate(plan, cluster, model, training)
    for s in res.stages:
        if not s.fits:
            out.append(f"pipeline {s.pipeline} stage {s.stage} ({s.label}): simulated peak {s.peak_memory_bytes:.4g} B "
                       f"> usable {s.capacity_bytes:.4g} B")
    for p in res.pipelines:
        m = p.num_micro_batches
        busiest = max(m * (s.fwd_time_s + s.bwd_time_s) + s.tail_time_s for s in p.stages)
        serial = sum(m * (s.fwd_time_s + s.bwd_time_s) + s.tail_time_s for s in p.stages) + 2 * m * sum(p.p2p_time_s)
        if not busiest * (1 - 1e-9) <= p.step_time_s <= serial * (1 + 1e-9):
            out.append(f"pipeline {p.index}: step {p.step_time_s} outside [busiest stage {busiest}, "
                       f"serialized {serial}]")
    return out, res


# --- fixed instances ----------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["solve", "greedy"])
@pytest.mark.parametrize("cluster,model,schedule", INSTANCES)
def test_plan_validates_and_fits(cluster, model, schedule, method):
    plan = planned(cluster, model, schedule, method)
    problems, _ = plan_problems(plan, CLUSTERS[cluster], MODELS[model](), TRAINING)
    assert not problems, "\n".join(problems)


# As of this writing these fail for multi-stage 1F1B plans: the planner's closed form ignores that 1F1B's
# in-flight cap makes the steady state pay the p2p round trip (docs/simulator.md, last section). The
# assertion stays strict on purpose; the message names the stages.
@pytest.mark.parametrize("method", ["solve", "greedy"])
@pytest.mark.parametrize("cluster,model,schedule", INSTANCES)
def test_predicted_step_time_agrees_with_the_replay(cluster, model, schedule, method):
    plan = planned(cluster, model, schedule, method)
    res = simulate(plan, CLUSTERS[cluster], MODELS[model](), TRAINING)
    problems = res.check(plan, rtol=RTOL)
    assert not problems, "\n".join(problems) + "\n" + res.compare_with(plan).describe()


# --- properties over random small clusters and models ------------------------------------------
GPU_NAMES = sorted(builtin_gpu_types())


@st.composite
def cluster_groups(draw) -> list[dict]:
    """Node groups of 1-3 GPU types from the catalog, 1-16 GPUs in total (the file form, so a
    falsifying example prints compactly; build with ``make_cluster``)."""
    names = draw(st.lists(st.sampled_from(GPU_NAMES), min_size=1, max_size=3, unique=True))
    groups, total = [], 0
    for i, gpu in enumerate(names):
        per_node = draw(st.sampled_from([1, 2, 4, 8]))
        nodes = draw(st.integers(1, 2))
        room = 16 - total - (len(names) - i - 1)  # leave at least one GPU for each remaining type
        per_node = min(per_node, max(1, room))
        nodes = max(1, min(nodes, room // per_node))
        total += per_node * nodes
        groups.append(dict(name=f"g{i}", gpu=gpu, nodes=nodes, gpus_per_node=per_node,
                           nic_gbps=draw(st.sampled_from([100, 200, 400]))))
    return groups


@st.composite
def models(draw) -> ModelSpec:
    layers = draw(st.integers(1, 12))
    heads = draw(st.sampled_from([4, 8, 16]))
    kv = draw(st.sampled_from([h for h in (1, 2, 4, 8, 16) if heads % h == 0]))
    hidden = draw(st.sampled_from([1024, 2048, 4096]))
    moe = None
    if draw(st.booleans()):
        experts = draw(st.sampled_from([2, 4, 8]))
        moe = MoESpec(num_experts=experts, top_k=draw(st.integers(1, min(2, experts))),
                      expert_ffn_hidden_size=draw(st.sampled_from([hidden, 2 * hidden])),
                      first_dense_layers=draw(st.integers(0, min(2, layers - 1))))
    return ModelSpec(name="random", num_layers=layers, hidden_size=hidden, ffn_hidden_size=4 * hidden,
                     num_attention_heads=heads, num_kv_heads=kv, vocab_size=draw(st.sampled_from([1024, 32000])),
                     moe=moe)


@st.composite
def trainings(draw) -> TrainingSpec:
    return TrainingSpec(global_batch_size=draw(st.sampled_from([4, 8, 16])),
                        seq_len=draw(st.sampled_from([512, 1024, 2048])), precision="fp16")


SPACES = {s: SearchSpace(max_stages=3, micro_batch_sizes=(1, 2), schedule=s) for s in ("1f1b", "gpipe")}
SOLVE_SETTINGS = settings(max_examples=40, deadline=None, derandomize=True, phases=[Phase.explicit, Phase.generate],
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _solve_or_none(cluster: Cluster, model: ModelSpec, training: TrainingSpec, schedule: str) -> Plan | None:
    try:
        return solve(cluster, model, training, time_limit_s=2.0, space=SPACES[schedule])
    except InfeasibleError:
        return None  # nothing fits: no plan to check


@SOLVE_SETTINGS
@given(groups=cluster_groups(), model=models(), training=trainings(), schedule=st.sampled_from(["1f1b", "gpipe"]))
def test_property_solve_and_greedy_plans_validate_fit_and_respect_bounds(groups, model, training, schedule):
    cluster = make_cluster("random", groups)
    plans = []
    g = greedy(PlanningContext(cluster, model, training, space=SPACES[schedule]))
    if g is not None:
        plans.append(g.plan)
    try:
        s = _solve_or_none(cluster, model, training, schedule)
    except NoSolutionError:  # the time limit ran out before any plan: a solver-speed issue, not a plan to check
        s = None
    if s is not None:
        plans.append(s)
    for plan in plans:
        event(f"{plan.method} {schedule}: {max(p.num_stages for p in plan.pipelines)} stage(s), "
              f"{'several' if plan.pipelines[0].num_micro_batches > 1 else 'one'} micro-batch(es)")
        problems, _ = plan_problems(plan, cluster, model, training)
        assert not problems, f"{plan.method} plan:\n{plan.describe()}\n" + "\n".join(problems)


@SOLVE_SETTINGS
@given(groups=cluster_groups(), model=models(), training=trainings(), schedule=st.sampled_from(["1f1b", "gpipe"]))
def test_property_solve_predicted_step_time_agrees_with_the_replay(groups, model, training, schedule):
    cluster = make_cluster("random", groups)
    try:
        plan = _solve_or_none(cluster, model, training, schedule)
    except NoSolutionError:
        return
    if plan is None:
        return
    res = simulate(plan, cluster, model, training)
    problems = res.check(plan, rtol=RTOL)
    assert not problems, f"{plan.describe()}\n" + "\n".join(problems) + "\n" + res.compare_with(plan).describe()


@pytest.mark.slow
@settings(max_examples=150, deadline=None, derandomize=True, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(groups=cluster_groups(), model=models(), training=trainings(), schedule=st.sampled_from(["1f1b", "gpipe"]))
def test_property_greedy_plans_many(groups, model, training, schedule):
    cluster = make_cluster("random", groups)
    g = greedy(PlanningContext(cluster, model, training, space=SPACES[schedule]))
    if g is not None:
        problems, _ = plan_problems(g.plan, cluster, model, training)
        assert not problems, f"{g.plan.describe()}\n" + "\n".join(problems)


@pytest.mark.slow
@settings(max_examples=120, deadline=None, derandomize=True, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(groups=cluster_groups(), model=models(), training=trainings(), schedule=st.sampled_from(["1f1b", "gpipe"]))
def test_property_solve_plans_many(groups, model, training, schedule):
    cluster = make_cluster("random", groups)
    try:
        plan = _solve_or_none(cluster, model, training, schedule)
    except NoSolutionError:
        return
    if plan is not None:
        problems, _ = plan_problems(plan, cluster, model, training)
        assert not problems, f"{plan.describe()}\n" + "\n".join(problems)
