"""Several data-parallel pipelines in one plan (issue 10): templates, level-2 MIP, sync model, checks."""

from __future__ import annotations

import dataclasses
import json
import math
import time

import pytest

from tangram_opt.cost import StageConfig
from tangram_opt.errors import SpecError
from tangram_opt.testing.exhaustive_multi import brute_force_multi
from tangram_opt.planner.context import PlanningContext
from tangram_opt.planner.islands import find_islands
from tangram_opt.planner.multi_pipeline import (MultiPipelineOptions, SyncStage, assemble, cross_sync, latency_steps,
                                               one_stage_templates, ring_factor, run_multi_pipeline, solve_level2,
                                               sub_cluster)
from tangram_opt.planner.multi_pipeline import TemplatePricer as _Pricer
from tangram_opt.planner.multi_pipeline.level2 import split_micro_batches, uniform_replicas
from tangram_opt.planner.plan import Plan
from tangram_opt.planner.search import SearchOptions, solve, solve_single_pipeline
from tangram_opt.planner.space import SearchSpace
from tangram_opt.export import identical_pipelines
from tangram_opt.sim import cross_pipeline_allreduce, simulate, validate
from tangram_opt.solvers import available_backends, relative_gap
from tangram_opt.solvers.workers import solve_by_deadline
from tangram_opt.specs import TrainingSpec, load_cluster, load_model, make_cluster

BACKENDS = available_backends()
SMALL_SPACE = dict(zero=(0, 1), recompute=("none", "full"), cp=(1,), micro_batch_sizes=(1, 2), tp=(1, 2))
RMAX = 4
SINGLE = SearchOptions(multi_pipeline=False)


def _multi(rmax):
    return SearchOptions(multi_pipeline_options=MultiPipelineOptions(max_pipelines=rmax))


def tiny_cluster():
    """Two one-node islands with fast NICs: small enough to enumerate, and several pipelines win (two
    A100 islands: a V100 island runs materialized attention, and a 4K sequence there loses to one island)."""
    return make_cluster("tiny-dp", [dict(name="a100", gpu="A100-40", nodes=1, gpus_per_node=4, nic_gbps=1600),
                                    dict(name="a100b", gpu="A100-80", nodes=1, gpus_per_node=4, nic_gbps=800)])


def two_zone_cluster():
    """Three one-node islands in two zones joined by a 200 Gb/s link (exercises the zone rows)."""
    return make_cluster("tiny-2z", [
        dict(name="a100", gpu="A100-40", nodes=1, gpus_per_node=4, nic_gbps=1600, zone="za"),
        dict(name="v100", gpu="V100-16", nodes=1, gpus_per_node=4, nic_gbps=800, zone="zb"),
        dict(name="a100b", gpu="A100-40", nodes=1, gpus_per_node=4, nic_gbps=1600, zone="zb")],
        zone_links=[dict(zones=["za", "zb"], gbps=200, latency_ms=0.5)])


INSTANCES = {"one-zone-1f1b": (tiny_cluster, 3, "1f1b", RMAX), "two-zones-gpipe": (two_zone_cluster, 2, "gpipe", 3)}


def _instance(name):
    make, max_stages, schedule, rmax = INSTANCES[name]
    # OPT-350M with its learned position table extended to 4,096 positions (+ OPT's 2 offset rows):
    # the stock table (2,050 rows) is refused at this sequence length
    cluster, model = make(), dataclasses.replace(load_model("opt-350m"), max_position_embeddings=4098)
    training = TrainingSpec(global_batch_size=16, seq_len=4096, precision="fp16")
    space = SearchSpace(max_stages=max_stages, schedule=schedule, **SMALL_SPACE)
    single = solve(cluster, model, training, space=space, time_limit_s=60, rel_gap=1e-9, options=SINGLE)
    ctx = PlanningContext(cluster, model, training, space=space)
    _, run = run_multi_pipeline(ctx, single, solver=solve_single_pipeline, backend=BACKENDS[0], time_limit_s=60,
                                t0=time.perf_counter(),
                                rel_gap=1e-9, options=MultiPipelineOptions(max_pipelines=rmax))
    best = brute_force_multi(ctx, run.templates, run.pricer, max_pipelines=rmax)
    assert best is not None and best.plans_evaluated > 1000
    return cluster, model, training, space, single, ctx, run, best, rmax


@pytest.fixture(scope="module", params=sorted(INSTANCES))
def instance(request):
    return _instance(request.param)


@pytest.fixture(scope="module")
def tiny():
    return _instance("one-zone-1f1b")


# --- the level-2 MIP against exhaustive enumeration -------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_level2_mip_matches_brute_force_over_the_template_space(instance, backend):
    _, _, _, _, single, ctx, run, best, rmax = instance
    lv = solve_level2(ctx, run.templates, run.pricer, cutoff_s=math.inf, max_pipelines=rmax, backend=backend,
                      time_limit_s=60, rel_gap=1e-9)
    assert lv.status == "optimal", lv
    assert lv.bound_s <= best.objective_s * (1 + 1e-12)  # a valid bound of the declared space
    assert lv.objective_s == pytest.approx(best.objective_s, rel=1e-9)  # and nothing better was missed
    # with the single-pipeline optimum as cutoff (what solve() does), the same plan comes out
    cut = solve_level2(ctx, run.templates, run.pricer, cutoff_s=single.certificate.objective_s,
                       max_pipelines=rmax, backend=backend, time_limit_s=60, rel_gap=1e-9)
    assert cut.objective_s == pytest.approx(best.objective_s, rel=1e-9)


@pytest.mark.parametrize("backend", BACKENDS)
def test_level2_mip_given_its_cutoff_keeps_every_better_plan(monkeypatch, instance, backend):
    """The level-2 MIP gets the cutoff as the solver's (plus the tick its rounding may add): with
    no warm start, a cutoff a hair above the brute-force optimum still yields that optimum; below
    it, no plan better than the optimum is claimed and the bound stays under both."""
    import tangram_opt.planner.multi_pipeline.level2 as l2

    _, _, _, _, _, ctx, run, best, rmax = instance
    monkeypatch.setattr(l2, "greedy_level2", lambda *a, **k: None)

    def level2(cutoff):
        return solve_level2(ctx, run.templates, run.pricer, cutoff_s=cutoff, max_pipelines=rmax, backend=backend,
                            time_limit_s=60, rel_gap=1e-9)

    above = level2(best.objective_s * (1 + 1e-9))
    assert above.objective_s == pytest.approx(best.objective_s, rel=1e-9)
    assert above.bound_s <= best.objective_s * (1 + 1e-12)
    for factor in (1 - 1e-6, 1 - 1e-3):
        below = level2(best.objective_s * factor)
        assert below.objective_s is None or below.objective_s >= best.objective_s * (1 - 1e-12)
        assert below.bound_s <= best.objective_s * factor * (1 + 1e-12)


def test_uniform_replicas_are_plans_of_the_template_space_with_their_best_split(instance):
    # the level-2 warm start's replicas of one template (issue 27): every one a feasible plan of the
    # declared space, priced exactly, never below the brute-force optimum, and its even split of the
    # micro-batches no slower than any other split of R replicas of that template
    _, _, training, _, _, ctx, run, best, rmax = instance
    B, pricer = training.global_batch_size, run.pricer
    plans = uniform_replicas(ctx, run.templates, pricer, rmax)
    assert plans
    for obj, pipes in plans:
        t = pipes[0][0]
        assert all(q is t for q, _ in pipes) and 2 <= len(pipes) <= rmax
        assert sum(t.b * m for _, m in pipes) == B and all(1 <= m <= t.m_cap for _, m in pipes)
        for i, g in t.gpus.items():
            assert len(pipes) * g <= ctx.islands[i].num_gpus
        assert obj == pricer.objective(pipes) and obj >= best.objective_s * (1 - 1e-12)
        if len(pipes) == 2:
            M = B // t.b
            others = [pricer.objective([(t, a), (t, M - a)]) for a in range(1, M) if max(a, M - a) <= t.m_cap]
            assert obj <= min(others) * (1 + 1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_solve_returns_the_better_structure_with_a_certificate_for_the_union(instance, backend):
    cluster, model, training, space, single, _, _, best, rmax = instance
    assert best.objective_s < single.certificate.objective_s  # on these instances several pipelines win
    plan = solve(cluster, model, training, space=space, backend=backend, time_limit_s=60, rel_gap=1e-9,
                 options=_multi(rmax))
    cert = plan.certificate
    assert len(plan.pipelines) >= 2
    assert cert.objective_s <= best.objective_s * (1 + 1e-6)
    assert cert.bound_s <= min(best.objective_s, single.certificate.objective_s) * (1 + 1e-12)
    assert cert.status == "optimal" and cert.gap <= 1e-5
    assert cert.plan_space.startswith("union of (A) single") and "templates" in cert.plan_space
    assert any(r.get("level", "").startswith("multi-pipeline") for r in cert.subproblems)
    assert plan.step_time_s <= single.step_time_s
    assert sum(plan.sequences_per_pipeline) == training.global_batch_size
    assert validate(plan, cluster, model, training) == []
    sim = simulate(plan, cluster, model, training)
    assert sim.step_time_s == pytest.approx(plan.step_time_s, rel=0.02)
    assert sim.cross_pipeline_sync_s == pytest.approx(plan.cross_sync_s, rel=1e-9)


# --- the three special cases of the same machinery -----------------------------------------------
def test_one_pipeline_when_several_never_help():
    cluster = make_cluster("one-node", [dict(name="a100", gpu="A100-40", nodes=1, gpus_per_node=8, nic_gbps=800)])
    model, training = load_model("opt-350m"), TrainingSpec(global_batch_size=32, seq_len=2048, precision="fp16")
    alone = solve(cluster, model, training, time_limit_s=30, options=SINGLE)
    both = solve(cluster, model, training, time_limit_s=30)
    assert len(both.pipelines) == 1
    assert both.certificate.objective_s == pytest.approx(alone.certificate.objective_s, rel=1e-12)
    assert both.step_time_s == pytest.approx(alone.step_time_s, rel=1e-12)
    assert both.certificate.status == "optimal" and both.cross_sync_s == 0.0
    assert "single" in both.certificate.plan_space and "union" not in alone.certificate.plan_space


def test_pure_data_parallelism_with_uneven_shares_on_a_mixed_cluster():
    cluster, model = load_cluster("tiny-mixed"), load_model("opt-350m")
    training = TrainingSpec(global_batch_size=64, seq_len=2048, precision="fp16")
    # single-stage pipelines only: a single pipeline then holds one island; without the limit a
    # two-stage A100 -> V100 pipeline is the optimum here (stage boundaries cross islands through
    # every node's NIC at once), so data parallelism across islands would not be exercised
    space = SearchSpace(max_stages=1)
    alone = solve(cluster, model, training, time_limit_s=30, options=SINGLE, space=space)
    plan = solve(cluster, model, training, time_limit_s=30, space=space)
    assert len(plan.pipelines) >= 2 and all(p.num_stages == 1 for p in plan.pipelines)
    assert plan.step_time_s < alone.step_time_s
    # shares follow speed: sequences per GPU in about the ratio of one GPU's layer time on each
    # (an A100 runs flash attention, a V100 materializes the scores: OPT-350M's attention is much of its work)
    per_gpu: dict[str, float] = {}
    for p in plan.pipelines:
        per_gpu[p.stages[0].gpu] = per_gpu.get(p.stages[0].gpu, 0.0) + p.sequences_per_step / p.gpus
    assert set(per_gpu) == {"A100-40", "V100-16"}
    ctx = PlanningContext(cluster, model, training, space=space)
    isl = {i.gpu_name: i for i in ctx.islands}
    one = StageConfig(micro_batch_size=1)
    speed = (ctx.cost.layer(isl["V100-16"].node, one, "dense").time_s
             / ctx.cost.layer(isl["A100-40"].node, one, "dense").time_s)
    assert speed / 2 <= per_gpu["A100-40"] / per_gpu["V100-16"] <= speed * 2
    assert validate(plan, cluster, model, training) == []
    sim = simulate(plan, cluster, model, training)
    assert sim.step_time_s == pytest.approx(plan.step_time_s, rel=0.02)
    assert not sim.check(plan, rtol=0.02)


def test_identical_replicas_of_one_template_on_a_homogeneous_cluster():
    # a fixed pipeline micro-batch of 8 sequences caps a stage at dp 8 (one node): one pipeline
    # would need a second stage (bubble) or tensor parallelism; two copies of the one-node stage win
    cluster = make_cluster("two-nodes", [dict(name="a100", gpu="A100-40", nodes=2, gpus_per_node=8, nic_gbps=800)])
    model, training = load_model("opt-350m"), TrainingSpec(global_batch_size=64, seq_len=2048, precision="fp16")
    space = SearchSpace(pipeline_micro_batches=(8,))
    alone = solve(cluster, model, training, space=space, time_limit_s=30, options=SINGLE)
    plan = solve(cluster, model, training, space=space, time_limit_s=30)
    assert len(plan.pipelines) == 2 and plan.certificate.objective_s < alone.certificate.objective_s
    a, b = plan.pipelines
    assert a.stages == b.stages and a.num_micro_batches == b.num_micro_batches == 4
    sim = simulate(plan, cluster, model, training)
    assert sim.step_time_s == pytest.approx(plan.step_time_s, rel=0.02)


# --- the cross-pipeline all-reduce ---------------------------------------------------------------------
def _stage(p: int, k: int, zone: str, nbytes: float, bw: float, pieces) -> SyncStage:
    return SyncStage(pipeline=p, stage=k, zone=zone, bytes_per_gpu=nbytes, bw_per_gpu_bytes_per_s=bw,
                     nic_latency_s=1e-6, pieces=tuple(pieces))


def test_cross_sync_model_by_hand():
    assert ring_factor(1) == 0.0 and ring_factor(2) == 1.0 and ring_factor(4) == 1.5
    assert latency_steps(2) == 2 and latency_steps(8) == 6 and latency_steps(1) == 0
    pieces = {0: 100.0, 1: 100.0, "embedding": 10.0, "head": 10.0}
    # one pipeline: nothing to synchronize
    one = cross_sync([[_stage(0, 0, "z", 50.0, 10.0, [0, 1, "embedding", "head"])]], pieces, {})
    assert one.total_s == 0.0
    # two pipelines, one of them with two stages: the slowest NIC share sets the bandwidth term
    pipes = [[_stage(0, 0, "z", 60.0, 10.0, [0, 1, "embedding", "head"])],
             [_stage(1, 0, "z", 20.0, 2.0, [0, "embedding"]), _stage(1, 1, "z", 20.0, 4.0, [1, "head"])]]
    res = cross_sync(pipes, pieces, {})
    assert res.nic_s == pytest.approx(1.0 * 20.0 / 2.0) and res.zone_s == 0.0
    assert res.groups == 2  # {p0s0, p1s0} and {p0s1... }: pieces grouped by the stages holding them
    assert res.latency_s == pytest.approx(2 * latency_steps(2) * 1e-6)  # stage p0s0 is in both groups
    # across zones the link carries 2(R-1)/R of every piece's bytes
    zoned = [[_stage(0, 0, "a", 1.0, 1e9, [0, 1, "embedding", "head"])],
             [_stage(1, 0, "b", 1.0, 1e9, [0, 1, "embedding", "head"])]]
    res = cross_sync(zoned, pieces, {("a", "b"): (22.0, 1e-3)})
    assert res.zone_s == pytest.approx(220.0 / 22.0) and res.bottleneck.startswith("zone link")
    assert res.latency_s == pytest.approx(latency_steps(2) * (1e-6 + 1e-3))


def _fits(ctx, group) -> bool:
    used = {}
    for t in group:
        for i, g in t.gpus.items():
            used[i] = used.get(i, 0) + g
    return all(g <= ctx.islands[i].num_gpus for i, g in used.items())


def _plans_to_check():
    """Multi-pipeline plans built directly from templates: mixed islands, zones, MoE, several stages."""
    out = []
    cases = [
        (load_cluster("tiny-mixed"), load_model("opt-350m"), 64, {}, "fp16"),
        (load_cluster("two-zone"), load_model("gpt-neo-2.7b").with_layers(8), 32, {}, "fp16"),
        (make_cluster("moe", [dict(name="h100", gpu="H100-SXM", nodes=1, gpus_per_node=8, nic_gbps=3200),
                              dict(name="a100", gpu="A100-80", nodes=1, gpus_per_node=8, nic_gbps=1600)]),
         load_model("mixtral-8x7b").with_layers(2), 16, dict(zero=(1, 3), micro_batch_sizes=(1,), cp=(1,)), "bf16"),
    ]
    for cluster, model, batch, sp, precision in cases:
        training = TrainingSpec(global_batch_size=batch, seq_len=2048, precision=precision)
        ctx = PlanningContext(cluster, model, training, space=SearchSpace(**sp))
        single = solve(cluster, model, training, space=SearchSpace(**sp), time_limit_s=20, options=SINGLE)
        _, run = run_multi_pipeline(ctx, single, solver=solve_single_pipeline, backend=BACKENDS[0], time_limit_s=20,
                                    t0=time.perf_counter())
        pricer = run.pricer
        ones = [t for t in run.templates if t.num_stages == 1]
        deep = [t for t in run.templates if t.num_stages > 1]
        by_island = {}
        for t in ones:
            (i,) = t.gpus
            by_island.setdefault(i, []).append(t)
        widest = [max(ts, key=lambda t: (t.total_gpus, -t.min_period_s)) for ts in by_island.values()]
        half = [min(ts, key=lambda t: abs(2 * t.total_gpus - ctx.islands[i].num_gpus)) for i, ts in by_island.items()]
        groups = [widest, [half[0], half[0]]]
        for t in deep:
            rest = [o for o in ones if _fits(ctx, [t, o])]
            if rest:
                groups.append([t, max(rest, key=lambda o: o.total_gpus)])
        for group in groups:
            if len(group) < 2 or not _fits(ctx, group):
                continue
            ms = split_micro_batches(pricer, group, batch)
            if ms is not None:
                out.append((cluster, model, training, assemble(ctx, pricer, list(zip(group, ms)))))
    return out


def test_simulator_prices_the_cross_pipeline_sync_independently_and_agrees():
    plans = _plans_to_check()
    assert len(plans) >= 5
    assert any(len({p.stages[0].island for p in plan.pipelines}) > 1 for _, _, _, plan in plans)
    for cluster, model, training, plan in plans:
        assert validate(plan, cluster, model, training) == [], plan.describe()
        sim = simulate(plan, cluster, model, training)
        priced = cross_pipeline_allreduce(plan, cluster, sim_cost(model, training))
        assert priced.time_s == pytest.approx(plan.cross_sync_s, rel=1e-9)
        assert sim.cross_pipeline_sync_s == pytest.approx(plan.cross_sync_s, rel=1e-9)
        assert sim.post_sync_time_s == pytest.approx(plan.post_sync_s, rel=1e-9)
        assert sim.step_time_s == pytest.approx(plan.step_time_s, rel=0.02)
        assert not sim.check(plan, rtol=0.02), sim.check(plan, rtol=0.02)
    zoned = [plan for c, _, _, plan in plans if c.name == "two-zone"]
    assert zoned and all(p.cross_sync_s > 0 for p in zoned)
    assert any(max(p.num_stages for p in plan.pipelines) > 1 for _, _, _, plan in plans)
    assert any(model.moe is not None for _, model, _, _ in plans)


def sim_cost(model, training):
    from tangram_opt.cost import CostModel

    return CostModel(model, training)


# --- pieces ---------------------------------------------------------------------------------------
def test_sub_cluster_keeps_shapes_zones_and_links():
    cluster = load_cluster("two-zone")
    islands = find_islands(cluster)
    sub = sub_cluster(cluster, islands, {0: 2, 1: 4})
    assert sub is not None and sub.num_gpus == 48 and sub.zones == cluster.zones
    assert sub.zone_link("zone-a", "zone-b") is not None
    only = sub_cluster(cluster, islands, {1: 8})
    assert only is not None and only.zones == ("zone-b",) and not only.zone_links
    assert sub_cluster(cluster, islands, {}) is None


def test_sub_provider_tables_are_the_full_tables_renumbered_and_kept():
    """A sub-cluster's candidates are the full cluster's of the same island shape, cut to the
    sub-island's stage sizes and renumbered; one provider serves every sub-cluster and hands
    out copies of the list it keeps."""
    from tangram_opt.planner.multi_pipeline.generation import SubProvider
    cluster = load_cluster("two-zone")
    ctx = PlanningContext(cluster, load_model("opt-350m"), TrainingSpec(global_batch_size=32, seq_len=1024))
    provider = SubProvider(ctx)
    sub = sub_cluster(cluster, ctx.islands, {1: 1})  # one node of the second island, alone: index 0
    assert sub is not None
    (island,) = find_islands(sub)
    main = ctx.islands[1]
    got = provider.candidates(island, 2)
    sizes = set(island.valid_stage_sizes())
    want = [c for c in ctx.provider.candidates(main, 2) if c.gpus in sizes]
    assert got and len(got) == len(want) and island.index != main.index
    for g, w in zip(got, want):
        assert g.island == island.index and g.config == w.config and g.layer is w.layer
        assert g.layer_transient_bytes == w.layer_transient_bytes and g.p2p_nic_s == w.p2p_nic_s
    again = provider.candidates(island, 2)
    assert again == got and again is not got and all(a is b for a, b in zip(again, got))
    assert want[0].on_island(main.index) is want[0]


def test_replica_capacities_are_the_largest_sums_of_the_template_sizes(tiny):
    # level 2 reads, per island, the most GPUs replicas of its templates can hold at once
    from tangram_opt.planner.formulations.problem import largest_total
    from tangram_opt.planner.multi_pipeline.level2 import _replica_capacities

    _, _, _, _, _, ctx, run, _, _ = tiny
    caps = _replica_capacities(ctx, run.templates)
    for isl in ctx.islands:
        sizes = {t.gpus[isl.index] for t in run.templates if t.gpus.get(isl.index)}
        assert caps[isl.index] == largest_total(isl.num_gpus, sizes) <= isl.num_gpus
    three = dataclasses.replace(run.templates[0], gpus={0: 3})  # 3 GPUs on a 4-GPU island: one replica
    assert ctx.islands[0].num_gpus == 4 and _replica_capacities(ctx, [three]) == {0: 3, 1: 0}


def test_split_micro_batches_is_exact_and_balanced():
    ctx = PlanningContext(load_cluster("tiny-mixed"), load_model("opt-350m"),
                          TrainingSpec(global_batch_size=64, seq_len=2048, precision="fp16"))
    pricer = _Pricer(ctx)
    ones = one_stage_templates(ctx, pricer)
    a100 = max((t for t in ones if set(t.gpus) == {0} and t.b == 8), key=lambda t: t.total_gpus)
    v100 = max((t for t in ones if set(t.gpus) == {1} and t.b == 8), key=lambda t: t.total_gpus)
    ms = split_micro_batches(pricer, [a100, v100], 64)
    assert ms is not None and 8 * sum(ms) == 64
    worst = max(pricer.cf(a100, ms[0]), pricer.cf(v100, ms[1]))
    for m in range(1, 8):  # no other split has a faster slowest pipeline
        assert max(pricer.cf(a100, m), pricer.cf(v100, 8 - m)) >= worst - 1e-15
    assert split_micro_batches(pricer, [a100, v100], 4) is None  # 4 sequences cannot feed two pipelines of 8


def test_plan_fields_round_trip_and_show_and_export_several_pipelines(tiny):
    from tangram_opt.export import deepspeed_json, megatron_script, torchtitan_toml
    from tangram_opt.export.parts import cross_pipeline_groups
    from tangram_opt.show import plan_table, summary_text

    cluster, model, training, space, *_ = tiny
    plan = solve(cluster, model, training, space=space, time_limit_s=30,
                 options=_multi(RMAX))
    assert len(plan.pipelines) >= 2
    again = Plan.from_json(plan.to_json())
    assert again == plan and again.cross_sync_s > 0 and again.post_sync_s > 0
    text = summary_text(plan)
    assert "pipeline 1:" in text and "cross-pipeline" in text and "share" in text
    df = plan_table(plan)
    assert df.attrs["cross_sync_s"] == plan.cross_sync_s and set(df.pipeline) == set(range(len(plan.pipelines)))
    groups = cross_pipeline_groups(plan)
    assert sum(len(g.layers) for g in groups) == model.num_layers
    assert all(len(g.members) == len(plan.pipelines) for g in groups)
    script = megatron_script(plan, model=model, cluster=cluster)
    # identical pipelines are one stock job with a larger data-parallel group (issue 31); otherwise
    # the script carries the cross-pipeline all-reduce groups
    if identical_pipelines(plan):  # one job of dp x pipelines in every framework
        assert json.loads(deepspeed_json(plan, cluster))["train_batch_size"] == plan.global_batch_size
    else:
        assert "all-reduce group" in script and "loss" in script
        assert "pipelines" in deepspeed_json(plan, cluster)
        assert "NOT one torchtitan job" in torchtitan_toml(plan, cluster)


def test_timeline_picture_draws_the_cross_pipeline_phase(tiny, tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from tangram_opt.show.plots import plot_islands, plot_timeline

    cluster, model, training, space, *_ = tiny
    plan = solve(cluster, model, training, space=space, time_limit_s=30,
                 options=_multi(RMAX))
    sim = simulate(plan, cluster, model, training)
    fig = plot_timeline(sim, save_path=tmp_path / "t.png")
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert any("all-reduce" in t for t in labels)
    plot_islands(plan, cluster, save_path=tmp_path / "i.png")
    assert (tmp_path / "t.png").stat().st_size > 0 and (tmp_path / "i.png").stat().st_size > 0


def test_options_are_validated():
    with pytest.raises(SpecError, match="max_pipelines"):
        MultiPipelineOptions(max_pipelines=1)
    with pytest.raises(SpecError, match="template_share"):
        MultiPipelineOptions(template_share=1.5)


# --- issue 27: the strengthened level-2 bound (constant Rho/Opt bounds, branched LP) -----------------
def _level2_models(monkeypatch, instance, **kw):
    """solve_level2 on ``instance`` with and without the strengthenings; the models it hands the solver."""
    import tangram_opt.planner.multi_pipeline.level2 as l2

    _, _, _, _, _, ctx, run, best, rmax = instance
    models = []
    real = l2.solve_model

    def grab(md, *a, **k):
        models.append(md)
        return real(md, *a, **k)

    monkeypatch.setattr(l2, "solve_model", grab)
    out = {}
    for strengthen in (False, True):
        out[strengthen] = solve_level2(ctx, run.templates, run.pricer, cutoff_s=math.inf, max_pipelines=rmax,
                                       backend=BACKENDS[0], time_limit_s=60, rel_gap=1e-9, strengthen=strengthen,
                                       **kw)
    return out, models, best


def test_strengthened_level2_lp_bound_is_valid_and_no_weaker(monkeypatch, instance):
    out, _, best = _level2_models(monkeypatch, instance)
    old, new = out[False], out[True]
    tick = new.info["tick_s"]
    assert new.info["lp_bound_s"] is not None and old.info["lp_bound_s"] is not None
    # the claimed LP bound (one tick off, as solve_level2 takes it) is below the brute-force optimum
    assert new.info["lp_bound_s"] - tick <= best.objective_s * (1 + 1e-12)
    assert new.info["branched_lp_bound_s"] is not None
    assert new.info["lp_bound_s"] >= old.info["lp_bound_s"] - 1e-12
    assert new.info["root_lp_bound_s"] >= old.info["root_lp_bound_s"] * (1 - 1e-12) - 1e-9 * tick
    assert new.bound_s <= best.objective_s * (1 + 1e-12)
    assert new.objective_s == pytest.approx(best.objective_s, rel=1e-9) == old.objective_s


def test_strengthened_level2_rows_keep_the_best_plan_feasible(monkeypatch, instance):
    """The brute-force optimum, given as the warm start, is a feasible point of the strengthened model
    (every row, the lp_bound row with the branched bound included)."""
    import tangram_opt.planner.multi_pipeline.level2 as l2

    best = instance[7]
    # a warm objective above the optimum keeps every pair of the optimum in the model
    monkeypatch.setattr(l2, "greedy_level2", lambda *a, **k: (best.objective_s * 2, list(best.pipes)))
    out, models, _ = _level2_models(monkeypatch, instance)
    md = models[-1]
    assert out[True].info["hinted"] and len(md.hint) == len(md.vars)
    x = [md.hint[i] for i in range(len(md.vars))]
    assert md.check(x) == []
    assert out[True].objective_s == pytest.approx(best.objective_s, rel=1e-9)


def _with_and_without(monkeypatch, instance, rows: str):
    """solve_level2 on ``instance`` with the level2 module's row builder ``rows`` and without it;
    both LP bounds (less a tick) stay under the brute-force optimum and the rows never lower them."""
    import tangram_opt.planner.multi_pipeline.level2 as l2

    _, _, _, _, _, ctx, run, best, rmax = instance

    def level2():
        return solve_level2(ctx, run.templates, run.pricer, cutoff_s=math.inf, max_pipelines=rmax,
                            backend=BACKENDS[0], time_limit_s=60, rel_gap=1e-9)

    with_rows = level2()
    monkeypatch.setattr(l2, rows, lambda *a, **k: None)
    without = level2()
    tick = with_rows.info["tick_s"]
    for key in ("root_lp_bound_s", "branched_lp_bound_s"):
        assert with_rows.info[key] >= without.info[key] - 1e-3 * tick
        assert with_rows.info[key] - tick <= best.objective_s * (1 + 1e-12)
    return with_rows, without


def test_average_rows_lift_the_level2_lp_and_keep_it_below_the_optimum(monkeypatch, instance):
    """The max-at-least-average rows (R Rho >= sum of the replicas' ratios, R Tpipe >= sum of their
    CF') are valid (the bound stays under the brute-force optimum) and, on the two-zone instance
    (zone patterns: R is left fractional), lift the root LP where the "template used" binaries
    alone price Rho at the smallest ratio."""
    import tangram_opt.planner.multi_pipeline.level2 as l2

    ctx, best = instance[5], instance[7]
    monkeypatch.setattr(l2, "_gpu_weighted_rows", lambda *a, **k: None)  # these rows alone
    with_rows, without = _with_and_without(monkeypatch, instance, "_average_rows")
    if ctx.space.schedule == "gpipe":  # the two-zone instance
        assert with_rows.info["root_lp_bound_s"] > without.info["root_lp_bound_s"] * 1.01


def test_gpu_weighted_rows_lift_the_level2_lp_and_keep_it_below_the_optimum(monkeypatch, instance):
    """N_i Rho >= sum g_ti ratio_t n (and the same for Opt) are valid (the bounds stay under the
    brute-force optimum; the best plan stays a feasible point: the test above) and, on the two-zone
    instance, lift the branched LP to the optimum (within its rounding)."""
    ctx, best = instance[5], instance[7]
    with_rows, without = _with_and_without(monkeypatch, instance, "_gpu_weighted_rows")
    assert with_rows.bound_s <= best.objective_s * (1 + 1e-12)
    if ctx.space.schedule == "gpipe":  # the two-zone instance: the branched LP reaches the optimum
        assert with_rows.info["branched_lp_bound_s"] > without.info["branched_lp_bound_s"] * 1.003
        assert with_rows.info["branched_lp_bound_s"] == pytest.approx(best.objective_s, rel=1e-5)


def test_level2_stops_at_the_lp_when_its_bound_reaches_the_cutoff(monkeypatch, instance):
    """With a cutoff under the LP bound (less its tick), no plan of the model beats the cutoff: the
    level answers "nothing better" from the LP alone, without a MIP solve, and the brute force agrees."""
    import tangram_opt.planner.multi_pipeline.level2 as l2

    _, _, _, _, _, ctx, run, best, rmax = instance
    full = solve_level2(ctx, run.templates, run.pricer, cutoff_s=math.inf, max_pipelines=rmax,
                        backend=BACKENDS[0], time_limit_s=60, rel_gap=1e-9)
    cutoff = full.info["lp_bound_s"] * (1 - 1e-3)
    assert best.objective_s >= cutoff  # the brute force: nothing beats it

    def no_mip(*a, **k):
        raise AssertionError("the level-2 MIP ran although its LP bound is at the cutoff")

    monkeypatch.setattr(l2, "solve_model", no_mip)
    monkeypatch.setattr(l2, "solve_by_deadline", no_mip)
    monkeypatch.setattr(l2, "greedy_level2", lambda *a, **k: None)
    cut = solve_level2(ctx, run.templates, run.pricer, cutoff_s=cutoff, max_pipelines=rmax,
                       backend=BACKENDS[0], time_limit_s=60, rel_gap=1e-9)
    assert cut.pairs > 0  # the pairs did not all fall to the cutoff before the LP
    assert cut.info["solver_status"] == "not run (LP bound at the cutoff)"
    assert cut.status == "nothing better than the cutoff" and cut.bound_s == cutoff


def test_level2_stops_at_the_lp_when_the_warm_start_meets_its_bound(monkeypatch, instance):
    """Given the brute-force optimum as its warm start, level 2 runs no MIP once its LP bound (less
    a tick) is within the optimality resolution of it: the plan is the warm start's, certified by
    the LP bound. Given a plan further above that bound (uniform replicas), the MIP runs and
    finds the optimum."""
    import tangram_opt.planner.multi_pipeline.level2 as l2

    _, _, _, _, _, ctx, run, best, rmax = instance
    ran: list[str] = []
    real = l2.solve_model
    monkeypatch.setattr(l2, "solve_model", lambda *a, **k: (ran.append("mip"), real(*a, **k))[1])
    monkeypatch.setattr(l2, "solve_by_deadline", lambda md, b, o, hard_s: (ran.append("mip"), real(md, b, o))[1])
    worse = max(uniform_replicas(ctx, run.templates, run.pricer, rmax), key=lambda q: q[0])
    assert worse[0] > best.objective_s * (1 + 10 * l2.OPTIMAL_RESOLUTION)
    for warm in ((best.objective_s, list(best.pipes)), worse):
        ran.clear()
        monkeypatch.setattr(l2, "greedy_level2", lambda *a, warm=warm, **k: warm)
        lv = solve_level2(ctx, run.templates, run.pricer, cutoff_s=worse[0] * 2, max_pipelines=rmax,
                          backend=BACKENDS[0], time_limit_s=60, rel_gap=1e-9)
        lp_s = lv.info["lp_bound_s"] - lv.info["tick_s"]
        assert lp_s <= best.objective_s * (1 + 1e-12) and lv.bound_s <= best.objective_s * (1 + 1e-12)
        assert lv.objective_s == pytest.approx(best.objective_s, rel=1e-9)
        if relative_gap(warm[0], lp_s) <= l2.OPTIMAL_RESOLUTION:
            assert ran == [] and lv.status == "optimal" and lv.bound_s == pytest.approx(lp_s, rel=1e-12)
            assert lv.info["solver_status"] == "not run (LP bound within the resolution of the warm start)"
        else:
            assert warm is worse and ran == ["mip"]


def test_a_level2_mip_that_cannot_raise_the_certificates_bound_gets_the_share_its_plan_can_gain(monkeypatch,
                                                                                                    instance):
    """With ``floor_s`` (the single-pipeline level's bound) at or below its LP bound, the level-2 MIP
    can only find a better plan, down to that LP bound: it gets the share (cutoff - LP) / (cutoff -
    floor) of the time left, at least PRIMAL_ONLY_MIN_S; with the floor above the LP bound it gets
    all of it. Either way its answer stays valid against the brute force."""
    import tangram_opt.planner.multi_pipeline.level2 as l2

    _, _, _, _, _, ctx, run, best, rmax = instance
    full = solve_level2(ctx, run.templates, run.pricer, cutoff_s=math.inf, max_pipelines=rmax,
                        backend=BACKENDS[0], time_limit_s=60, rel_gap=1e-9)
    lp_s = full.info["lp_bound_s"] - full.info["tick_s"]  # the bound solve_level2 takes from its LP
    limits: list[float] = []
    real = l2.solve_model

    def grab(md, backend, opts):
        limits.append(opts.time_limit_s)
        return real(md, backend, opts)

    monkeypatch.setattr(l2, "solve_model", grab)
    monkeypatch.setattr(l2, "solve_by_deadline", lambda md, backend, opts, hard_s: grab(md, backend, opts))
    monkeypatch.setattr(l2, "greedy_level2", lambda *a, **k: None)
    cutoff = best.objective_s * 1.5  # the optimum and more lie below it
    for floor in (lp_s * 0.5, None, cutoff * 0.99):
        limits.clear()
        lv = solve_level2(ctx, run.templates, run.pricer, cutoff_s=cutoff, max_pipelines=rmax, backend=BACKENDS[0],
                          time_limit_s=60, rel_gap=1e-9, floor_s=floor)
        assert len(limits) == 1
        own_lp_s = lv.info["lp_bound_s"] - lv.info["tick_s"]  # with this cutoff
        if floor is not None and own_lp_s >= floor:
            share = (cutoff - own_lp_s) / (cutoff - floor)
            assert share < 0.9
            # of the time left after building and the LPs (somewhere in 50-60 s here)
            assert max(l2.PRIMAL_ONLY_MIN_S, share * 50) <= limits[0] <= max(l2.PRIMAL_ONLY_MIN_S, share * 60)
        else:
            assert floor is None or floor > own_lp_s
            assert limits[0] > 50  # all the time left
        assert lv.bound_s <= best.objective_s * (1 + 1e-12)
        assert lv.objective_s == pytest.approx(best.objective_s, rel=1e-9)  # small instances: solved anyway


def test_a_large_level2_mip_runs_in_a_worker_under_a_hard_deadline_and_finds_the_same_plan(monkeypatch, tiny):
    # HiGHS's presolve does not stop at the time limit, so a large level-2 MIP is solved in a worker
    # process stopped shortly after it (level2.DEADLINE_NONZEROS); here every model counts as large
    import tangram_opt.planner.multi_pipeline.level2 as l2

    _, _, _, _, _, ctx, run, best, rmax = tiny
    sent = []

    def recording(md, backend, options, hard_s):
        sent.append((options.time_limit_s, hard_s))
        return solve_by_deadline(md, backend, options, hard_s)

    monkeypatch.setattr(l2, "DEADLINE_NONZEROS", 0)
    monkeypatch.setattr(l2, "solve_by_deadline", recording)
    # no warm start: the greedy's plan meets this instance's LP bound, and the MIP would not run
    monkeypatch.setattr(l2, "greedy_level2", lambda *a, **k: None)
    lv = solve_level2(ctx, run.templates, run.pricer, cutoff_s=math.inf, max_pipelines=rmax, backend=BACKENDS[0],
                      time_limit_s=60, rel_gap=1e-9)
    assert len(sent) == 1 and sent[0][1] == pytest.approx(sent[0][0] + l2.DEADLINE_GRACE_S)
    assert lv.objective_s == pytest.approx(best.objective_s, rel=1e-9)
    assert lv.bound_s <= best.objective_s * (1 + 1e-12)


@pytest.mark.parametrize("per_pair", [1e-4, 1e3])
def test_a_level2_model_too_large_for_the_time_left_is_not_built_and_bounds_by_the_fluid_bound(
        monkeypatch, instance, per_pair):
    """A batch of 10^5-10^6 sequences gives one (template, micro-batch count) pair per count: when
    the pairs would take longer to build than the level has, no model is built (no MIP, no pattern
    LPs); the bound is the fluid bound, still below the brute-force optimum, and the plan the
    greedy's."""
    import tangram_opt.planner.multi_pipeline.level2 as l2

    _, _, _, _, _, ctx, run, best, rmax = instance

    def no_solver(*a, **k):
        raise AssertionError("a level-2 model was solved although it was too large to build")

    monkeypatch.setattr(l2, "BUILD_S_PER_PAIR", per_pair * 60)  # a pair "takes" 6 ms or an hour
    for name in ("solve_model", "solve_by_deadline", "_branched_lp"):
        monkeypatch.setattr(l2, name, no_solver)
    lv = solve_level2(ctx, run.templates, run.pricer, cutoff_s=math.inf, max_pipelines=rmax, backend=BACKENDS[0],
                      time_limit_s=1e-3 if per_pair < 1 else 60, rel_gap=1e-9)
    assert lv.status.startswith("model not built (too large for the time left)")
    assert lv.info["solver_status"].startswith("not run")
    assert 0 < lv.bound_s <= best.objective_s * (1 + 1e-12)
    if lv.pipes is not None:  # the greedy's plan, priced exactly, no better than the optimum
        assert lv.objective_s >= best.objective_s * (1 - 1e-12)


def test_shifted_unions_and_divisors_match_the_direct_scans():
    """The level-2 split's subset sums (a union of shifts built by doubling) and the candidate
    tables' divisors (trial division to sqrt n) give what the one-by-one scans gave."""
    import random

    from tangram_opt.planner.candidates.analytical import _divisors
    from tangram_opt.planner.multi_pipeline.warm_start import _shifts

    for n in list(range(1, 600)) + [2 ** 20, 3 ** 9, 10 ** 6, 999_983]:
        assert _divisors(n) == [d for d in range(1, n + 1) if n % d == 0]
    rng = random.Random(7)
    for _ in range(500):
        batch = rng.randint(1, 200)
        mask = (1 << (batch + 1)) - 1
        cur, step, count = rng.getrandbits(batch + 1), rng.randint(1, 16), rng.randint(0, 40)
        direct = 0
        for m in range(1, count + 1):
            direct |= cur << (step * m)
        assert _shifts(cur, step, count, mask) == direct & mask


def test_sub_clusters_of_the_whole_cluster_are_solved_before_single_islands():
    """The sub-cluster searches share the template budget in turn, and the last ones get what the
    first left (or are skipped): the scaled-down copies of the whole cluster, whose plans replicate
    over it, come first, smallest divisor first, then each island alone."""
    from tangram_opt.planner.multi_pipeline.generation import _sub_contexts
    cluster = load_cluster("two-zone")
    ctx = PlanningContext(cluster, load_model("opt-350m"), TrainingSpec(global_batch_size=64, seq_len=1024))
    opts = MultiPipelineOptions(cluster_scales=(4, 2), island_scales=(1, 2))
    subs = _sub_contexts(ctx, opts)
    origins = [origin for origin, _, _ in subs]
    assert origins[:2] == ["cluster / 2", "cluster / 4"]
    assert origins[2:] and all(o.startswith("island ") for o in origins[2:])
    assert [batch for _, _, batch in subs[:2]] == [32, 16]
    whole = cluster.num_gpus
    assert [sub.num_gpus for _, sub, _ in subs[:2]] == [whole // 2, whole // 4]
