"""Baselines: best homogeneous island and heterogeneity-unaware (greedy has its own tests)."""

from __future__ import annotations

import math

import pytest

from tangram_opt import units as u
from tangram_opt.baselines import (
    HomogeneousResult,
    best_homogeneous,
    greedy,
    heterogeneity_unaware,
    reprice,
    virtual_cluster,
)
from tangram_opt.baselines.homogeneous import StageLayout, island_cluster, plan_layout
from tangram_opt.baselines.unaware import uniform_split, virtual_gpu
from tangram_opt.cost import StageConfig
from tangram_opt.errors import InfeasibleError, SpecError
from tangram_opt.planner.context import PlanningContext
from tangram_opt.planner.plan import Plan
from tangram_opt.planner.search import solve
from tangram_opt.planner.space import SearchSpace
from tangram_opt.specs import TrainingSpec, load_cluster, load_model, make_cluster

TIME_LIMIT_S = 10.0


@pytest.fixture(scope="module")
def tiny() -> PlanningContext:
    """8 A100-40 + 16 V100-16, OPT-350M, a small batch: every method solves it in about a second."""
    return PlanningContext(load_cluster("tiny-mixed"), load_model("opt-350m"),
                           TrainingSpec(global_batch_size=32, seq_len=2048, precision="fp16"))


@pytest.fixture(scope="module")
def homog(tiny: PlanningContext) -> HomogeneousResult:
    return best_homogeneous(tiny, solver=solve, time_limit_s=TIME_LIMIT_S)


@pytest.fixture(scope="module")
def mip(tiny: PlanningContext) -> Plan:
    return solve(tiny.cluster, tiny.model, tiny.training, time_limit_s=TIME_LIMIT_S)


def _check_plan(plan: Plan, ctx: PlanningContext) -> None:
    """Structurally valid on the real cluster; predicted memory fits; layers cover the model once."""
    assert plan.global_batch_size == ctx.training.global_batch_size
    assert plan.island_gpus == {i.name: i.num_gpus for i in ctx.islands}
    assert math.isfinite(plan.step_time_s) and plan.step_time_s > 0
    assert sum(p.sequences_per_step for p in plan.pipelines) == ctx.training.global_batch_size
    for pipe in plan.pipelines:
        assert sum(s.num_layers for s in pipe.stages) == ctx.model.num_layers
        assert [s.first_layer for s in pipe.stages] == [sum(t.num_layers for t in pipe.stages[:k])
                                                        for k in range(pipe.num_stages)]
        for s in pipe.stages:
            assert s.memory_bytes <= s.capacity_bytes
            assert s.tp * s.cp * s.dp == s.gpus
    for isl, n in plan.gpus_by_island().items():
        assert n <= plan.island_gpus[isl]
    try:
        from tangram_opt.sim import validate
    except ImportError:  # pragma: no cover - the simulator lands separately
        return
    assert validate(plan, ctx.cluster, ctx.model, ctx.training) == []


# --- best homogeneous ---------------------------------------------------------------------------
def test_homogeneous_returns_valid_plan_on_one_island(homog: HomogeneousResult, tiny: PlanningContext) -> None:
    plan = homog.plan
    assert plan.method == "homogeneous"
    _check_plan(plan, tiny)
    assert {s.island for s in plan.stages} == {homog.island}
    assert len({s.gpu for s in plan.stages}) == 1
    assert set(homog.per_island) == {i.name for i in tiny.islands}


def test_homogeneous_is_best_of_islands(homog: HomogeneousResult) -> None:
    fitting = [p.step_time_s for p in homog.per_island.values() if p is not None]
    assert homog.plan.step_time_s == min(fitting)
    assert homog.plan.certificate is not None and "alone" in homog.plan.certificate.plan_space


def test_homogeneous_keeps_the_island_solve_step(homog: HomogeneousResult, tiny: PlanningContext) -> None:
    """Moving the plan to the full cluster changes labels only: same costs and links on the same island."""
    isl = next(i for i in tiny.islands if i.name == homog.island)
    alone = solve(island_cluster(tiny.cluster, isl), tiny.model, tiny.training, time_limit_s=TIME_LIMIT_S)
    assert homog.plan.step_time_s == pytest.approx(alone.step_time_s, rel=1e-9)
    assert homog.plan.cluster == tiny.cluster.name
    assert homog.plan.cluster_peak_flops_per_s == tiny.cluster.peak_flops_per_s("fp16")
    for name, p in homog.per_island.items():
        if p is not None and len(p.pipelines) == 1:  # re-pricing from the specs gives the same step
            layout, b = plan_layout(tiny, p)
            assert reprice(tiny, layout, b, method="x").step_time_s == pytest.approx(p.step_time_s, rel=1e-9), name


def test_island_cluster_keeps_only_that_island(tiny: PlanningContext) -> None:
    for isl in tiny.islands:
        sub = island_cluster(tiny.cluster, isl)
        assert sub.num_gpus == isl.num_gpus
        assert {g.gpu.name for g in sub.node_groups} == {isl.gpu_name}


def test_mip_at_least_as_good_as_homogeneous(mip: Plan, homog: HomogeneousResult) -> None:
    assert mip.step_time_s <= homog.plan.step_time_s * (1 + 1e-9)


def test_homogeneous_notes_islands_where_nothing_fits() -> None:
    """GPT-NeoX-20B needs ~320 GB of weights and optimizer state: 16 V100-16 cannot hold it alone."""
    ctx = PlanningContext(load_cluster("tiny-mixed"), load_model("gpt-neox-20b"),
                          TrainingSpec(global_batch_size=8, seq_len=2048, precision="fp16"),
                          space=SearchSpace(pipeline_micro_batches=(8,)))
    try:
        h = best_homogeneous(ctx, solver=solve, time_limit_s=TIME_LIMIT_S)
    except InfeasibleError as e:
        assert "v100" in str(e)
        return
    assert h.per_island["v100"] is None and "v100" in h.notes


# --- heterogeneity-unaware ----------------------------------------------------------------------
def test_virtual_gpu_is_slowest_type() -> None:
    cl = load_cluster("tiny-mixed")
    g = virtual_gpu(cl, "fp16")
    assert g.name == "V100-16" and g.hbm_bytes == 16 * u.GiB
    assert virtual_gpu(load_cluster("two-zone"), "bf16").name == "A100-40"


def test_virtual_gpu_takes_smallest_memory_present() -> None:
    """A slow GPU with a lot of memory is seen with the smallest memory of the cluster."""
    cl = make_cluster("slow-big", [{"gpu": "A100-40", "nodes": 1, "nic_gbps": 800},
                                   {"gpu": "Slow-96", "nodes": 2, "nic_gbps": 200}],
                      gpu_types=[{"name": "Slow-96", "fp16_tflops": 50, "fp32_tflops": 10, "memory_gib": 96,
                                  "hbm_gbs": 900}])
    g = virtual_gpu(cl, "bf16")
    assert g.name == "Slow-96" and g.fp16_flops_per_s == 50 * u.TFLOPS and g.hbm_bytes == 40 * u.GiB
    vc = virtual_cluster(cl, "bf16")
    assert vc.num_gpus == cl.num_gpus and len(vc.node_groups) == 1 and vc.node_groups[0].gpu == g


def test_uniform_split_differs_by_at_most_one() -> None:
    for total in (1, 7, 24, 61, 126):
        for parts in range(1, min(total, 32) + 1):
            s = uniform_split(total, parts)
            assert sum(s) == total and len(s) == parts and max(s) - min(s) <= 1
            if parts > 1 and total % parts:
                assert s[0] == min(s)  # the first stage (embedding) gets no extra layer


def test_unaware_plan_is_uniform_and_valid(tiny: PlanningContext) -> None:
    r = heterogeneity_unaware(tiny)
    plan = r.plan
    assert plan.method == "unaware"
    _check_plan(plan, tiny)
    stages = plan.pipelines[0].stages
    assert len({s.config for s in stages}) == 1
    assert len({s.gpus for s in stages}) == 1
    counts = [s.num_layers for s in stages]
    assert max(counts) - min(counts) <= 1
    # what its planner saw: the same stages on the virtual cluster, all of the slowest GPU
    vstages = r.virtual_plan.pipelines[0].stages
    assert [s.num_layers for s in vstages] == counts
    assert {s.gpu for s in vstages} == {"V100-16"}


def test_unaware_is_limited_by_the_slowest_gpus(tiny: PlanningContext) -> None:
    """On the real cluster the faster GPUs finish their equal share early: the V100 stages set the pace."""
    r = heterogeneity_unaware(tiny)
    stages = r.plan.pipelines[0].stages
    slowest = max(stages, key=lambda s: s.time_s)
    if any(s.gpu == "V100-16" for s in stages):
        assert slowest.gpu == "V100-16"
    # one zone, and every real node is at least as fast (GPU, links) as the virtual one
    assert r.plan.step_time_s <= r.virtual_plan.step_time_s * (1 + 1e-9)


def test_unaware_never_beats_mip_or_greedy(tiny: PlanningContext, mip: Plan) -> None:
    una = heterogeneity_unaware(tiny).plan
    g = greedy(tiny)
    assert g is not None
    assert mip.step_time_s <= una.step_time_s * (1 + 1e-9)
    assert g.plan.step_time_s <= una.step_time_s * (1 + 1e-9)


def test_unaware_on_homogeneous_cluster_sees_the_real_cluster() -> None:
    ctx = PlanningContext(load_cluster("h100-64"), load_model("llama-3-8b"),
                          TrainingSpec(global_batch_size=64, seq_len=2048))
    assert virtual_cluster(ctx.cluster, "bf16") is ctx.cluster
    r = heterogeneity_unaware(ctx)
    assert r.plan.step_time_s == pytest.approx(r.virtual_plan.step_time_s, rel=1e-12)
    assert [s.config for s in r.plan.stages] == [s.config for s in r.virtual_plan.stages]


def test_unaware_equals_homogeneous_on_homogeneous_cluster_single_stage() -> None:
    """With one stage both baselines search the same space exactly (every one-stage configuration)."""
    ctx = PlanningContext(load_cluster("h100-64"), load_model("llama-3-8b"),
                          TrainingSpec(global_batch_size=64, seq_len=2048), space=SearchSpace(max_stages=1))
    una = heterogeneity_unaware(ctx).plan
    hom = best_homogeneous(ctx, solver=solve, time_limit_s=TIME_LIMIT_S).plan
    assert una.step_time_s == pytest.approx(hom.step_time_s, rel=1e-9)


def test_unaware_homogeneous_cluster_is_no_better_than_homogeneous() -> None:
    ctx = PlanningContext(load_cluster("h100-64"), load_model("llama-3-8b"),
                          TrainingSpec(global_batch_size=64, seq_len=2048))
    una = heterogeneity_unaware(ctx).plan
    hom = best_homogeneous(ctx, solver=solve, time_limit_s=TIME_LIMIT_S)
    assert hom.plan.certificate is not None
    if hom.plan.certificate.status == "optimal":
        assert hom.plan.step_time_s <= una.step_time_s * (1 + 1e-9)


# --- re-pricing ---------------------------------------------------------------------------------
def test_reprice_round_trips_a_plan(tiny: PlanningContext) -> None:
    g = greedy(tiny)
    assert g is not None
    layout, b = plan_layout(tiny, g.plan)
    again = reprice(tiny, layout, b, method="greedy")
    assert again.step_time_s == pytest.approx(g.plan.step_time_s, rel=1e-9)
    assert [s.config for s in again.stages] == [s.config for s in g.plan.stages]


def test_reprice_rejects_a_stage_that_does_not_fit(tiny: PlanningContext) -> None:
    v100 = next(i for i in tiny.islands if i.gpu_name == "V100-16")
    cfg = StageConfig(tp=1, dp=1, micro_batch_size=8, recompute="none")
    layout = [StageLayout(island=v100, config=cfg, layers={"dense": tiny.model.num_layers})]
    big = PlanningContext(tiny.cluster, load_model("llama-3-8b"), TrainingSpec(global_batch_size=8, seq_len=4096,
                                                                                precision="fp16"))
    with pytest.raises(InfeasibleError, match="needs"):
        reprice(big, [StageLayout(island=v100, config=cfg, layers={"dense": big.model.num_layers})], 8,
                method="test")
    with pytest.raises(SpecError, match="pipeline micro-batch"):
        reprice(tiny, layout, 4, method="test")


def test_island_candidates_match_an_island_alone(tiny: PlanningContext) -> None:
    """The shared table gives exactly what the sub-cluster would enumerate by itself."""
    from tangram_opt.baselines.homogeneous import IslandCandidates

    for isl in tiny.islands:
        sub = PlanningContext(island_cluster(tiny.cluster, isl), tiny.model, tiny.training)
        shared = IslandCandidates(tiny, isl)
        for b in (1, 8):
            own = sub.provider.candidates(sub.islands[0], b)  # type: ignore[union-attr]
            got = shared.candidates(sub.islands[0], b)
            assert [(c.island, c.config, c.layer, c.capacity_bytes) for c in got] == \
                   [(c.island, c.config, c.layer, c.capacity_bytes) for c in own]
    other = next(i for i in tiny.islands if i.gpu_name == "V100-16")
    a100 = next(i for i in tiny.islands if i.gpu_name == "A100-40")
    with pytest.raises(SpecError):
        IslandCandidates(tiny, a100).candidates(other, 8)


def test_greedy_fastest_fitting_is_the_first_fastest_candidate_that_fits(tiny: PlanningContext) -> None:
    """The array pricing of the greedy picks what pricing every candidate alone picks: the
    fastest (the first of equals) that fits in memory."""
    from tangram_opt.baselines.greedy import _Sizes

    def reference(rows, idx, layers, inflight, first, last):
        best, best_t = None, math.inf
        for ci, c in zip(idx, rows):
            if c.memory_bytes(layers, inflight, first=first, last=last) > c.capacity_bytes:
                continue
            t = sum(n * c.layer[k].time_s for k, n in layers.items() if n)
            t += (c.embedding.time_s if first else 0.0) + (c.head.time_s if last else 0.0)
            if t < best_t:
                best, best_t = ci, t
        return best

    checked = 0
    for b in tiny.pipeline_micro_batches():
        cands = tiny.candidates(b)
        groups: dict[tuple[int, int], list[int]] = {}
        for ci, c in enumerate(cands):
            groups.setdefault((c.island, c.gpus), []).append(ci)
        for idx in groups.values():
            rows = [cands[ci] for ci in idx]
            sizes = _Sizes(rows, idx)
            for n in (1, 3, 8, tiny.model.num_layers):
                layers = {tiny.kinds[-1]: n}
                for inflight in (1, 4, 16):
                    for first, last in ((True, False), (False, False), (False, True), (True, True)):
                        want = reference(rows, idx, layers, inflight, first, last)
                        assert sizes.fastest_fitting(layers, inflight, first=first, last=last) == want
                        checked += want is not None
    assert checked > 50

