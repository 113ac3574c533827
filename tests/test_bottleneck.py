"""The layer-covering knapsack bound on the bottleneck stage time (planner/formulations/knapsack_bound.py)."""

from __future__ import annotations

import itertools
import math
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tangram_opt.planner.context import PlanningContext
from tangram_opt.planner.formulations.bounds import fluid_bottleneck_s
from tangram_opt.planner.formulations.knapsack_bound import LayerKnapsack, knapsack_bottleneck_s
from tangram_opt.planner.formulations.ordering import fits_memory
from tangram_opt.planner.formulations.problem import choices_timing
from tangram_opt.planner.formulations.stage_types import enumerate_types
from tangram_opt.planner.search import tuning
from tangram_opt.planner.search.branch_and_bound import BranchAndBound
from tangram_opt.planner.search.nodes import SubProblem
from tangram_opt.planner.space import SearchSpace
from tangram_opt.testing.exhaustive import enumerate_plans
from tangram_opt.specs import TrainingSpec, load_model, make_cluster

GPUS = ["V100-32", "A100-40", "H100-SXM", "L4"]
MODELS = ["llama-3-8b", "mixtral-8x7b", "deepseek-v2-lite", "opt-350m"]


def _slowest_stage_s(problem, choices) -> float:
    return max(st.fwd_s + st.bwd_s for st in choices_timing(problem, list(choices)).stages)


def _within_gpu_budgets(problem, stages) -> bool:
    used: dict[int, int] = {}
    for t in stages:
        c = problem.candidates[t.candidate]
        used[c.island] = used.get(c.island, 0) + c.gpus
    return all(g <= problem.island_gpus[i] for i, g in used.items())


@st.composite
def instances(draw):
    n_groups = draw(st.integers(1, 3))
    gpus = draw(st.lists(st.sampled_from(GPUS), min_size=n_groups, max_size=n_groups, unique=True))
    groups = [dict(name=f"g{i}", gpu=g, nodes=1, gpus_per_node=draw(st.sampled_from([1, 2, 4])), nic_gbps=100)
              for i, g in enumerate(gpus)]
    model = load_model(draw(st.sampled_from(MODELS))).with_layers(draw(st.integers(2, 4)))
    training = TrainingSpec(global_batch_size=draw(st.sampled_from([4, 8])), seq_len=1024,
                            precision="fp16" if "V100-32" in gpus else "bf16")
    space = SearchSpace(max_stages=3, zero=(0, 3), recompute=("none", "full"), cp=(1,), micro_batch_sizes=(1, 2))
    return PlanningContext(make_cluster("random", groups), model, training, space=space)


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(instances())
def test_bound_is_below_the_slowest_stage_of_every_multi_stage_plan(ctx):
    for b in ctx.pipeline_micro_batches():
        problem = ctx.problem(b)
        if not problem.candidates:
            continue
        bound = knapsack_bottleneck_s(problem, enumerate_types(problem))
        slowest = [_slowest_stage_s(problem, ch) for ch in enumerate_plans(problem) if len(ch) >= 2]
        if not slowest:
            continue
        assert bound <= min(slowest) * (1 + 1e-9), f"b={b}: the bound cuts off a real pipeline"


def test_bound_beats_the_fluid_bound_on_a_mixed_cluster():
    # 64 H100 + 64 A100-80 with Llama-3-70B: 80 indivisible blocks over stages of 1-64 GPUs
    cluster = make_cluster("mixed", [dict(name="h100", gpu="H100-SXM", nodes=8, gpus_per_node=8, nic_gbps=3200),
                                     dict(name="a100", gpu="A100-80", nodes=8, gpus_per_node=8, nic_gbps=1600)])
    ctx = PlanningContext(cluster, load_model("llama-3-70b"), TrainingSpec(global_batch_size=256, seq_len=4096))
    problem = ctx.problem(8)
    types = enumerate_types(problem)
    knap = knapsack_bottleneck_s(problem, types)
    assert math.isfinite(knap)
    assert knap > fluid_bottleneck_s(problem) * 1.01
    sack = LayerKnapsack(problem, types)
    assert sack.feasible(knap) and not sack.feasible(knap * (1 - 1e-6))


def test_no_multi_stage_plan_gives_an_infinite_bound():
    # one GPU: no pipeline of two stages exists
    cluster = make_cluster("one", [dict(name="a", gpu="H100-SXM", nodes=1, gpus_per_node=1, nic_gbps=100)])
    ctx = PlanningContext(cluster, load_model("opt-350m").with_layers(2), TrainingSpec(global_batch_size=4, seq_len=512))
    problem = ctx.problem(1)
    assert knapsack_bottleneck_s(problem, enumerate_types(problem)) == math.inf


def _h100_a100_context():
    """Llama-3-70B on 32 H100 + 32 A100-80."""
    cluster = make_cluster("mixed", [dict(name="h100", gpu="H100-SXM", nodes=4, gpus_per_node=8, nic_gbps=3200),
                                     dict(name="a100", gpu="A100-80", nodes=4, gpus_per_node=8, nic_gbps=1600)])
    return PlanningContext(cluster, load_model("llama-3-70b"), TrainingSpec(global_batch_size=128, seq_len=4096))


def _h100_a100_knapsack(ctx=None):
    """That cluster at pipeline micro-batch 8: the problem and its knapsack."""
    problem = (ctx or _h100_a100_context()).problem(8)
    return problem, LayerKnapsack(problem, enumerate_types(problem))


def test_cover_holds_every_block_within_the_cap_and_the_gpu_budgets():
    problem, sack = _h100_a100_knapsack()
    knap = sack.bottleneck_bound_s()
    for cap in (knap, knap * 1.05):
        for min_tol in (0, 8):
            cover = sack.cover(cap, min_tol)
            if cover is None:
                assert min_tol > 0  # at the bound itself a cover exists without a tolerance floor
                continue
            first, mids, last = cover
            stages = [first, *mids, last]
            assert sum(t.num_layers for t in stages) == problem.total_layers
            assert all(t.time_s <= cap * (1 + 1e-9) and t.num_layers >= 1 for t in stages)
            assert _within_gpu_budgets(problem, stages)
            assert all(t.tolerance >= min_tol for t in stages)


def test_cover_with_an_island_cap_keeps_that_island_below_it():
    # separator covers (search/primal.py, knapsack_plans): one island capped lower, so its stages can sit
    # between the other island's stages at the full cap
    problem, sack = _h100_a100_knapsack()
    cap = sack.bottleneck_bound_s() * 1.08
    found = 0
    for island in sorted(problem.island_gpus):
        for low in (0.7, 0.85, 0.95):
            cover = sack.cover(cap, 0, {island: cap * low})
            if cover is None:
                continue
            found += 1
            stages = [cover[0], *cover[1], cover[2]]
            assert sum(t.num_layers for t in stages) == problem.total_layers
            for t in stages:
                c = problem.candidates[t.candidate]
                assert t.time_s <= (cap * low if c.island == island else cap) * (1 + 1e-9)
            assert _within_gpu_budgets(problem, stages)
            # the capped island does hold stages (else the cap was not exercised)
            assert any(problem.candidates[t.candidate].island == island for t in stages)
    assert found >= 2


def test_reserved_separators_are_set_aside_on_their_island_and_the_ends_are_where_asked():
    # reserved separators (search/primal.py, knapsack_plans): k small stages on island j within a lower cap,
    # the rest covered within the full cap, first and last stage on the given islands
    problem, sack = _h100_a100_knapsack()
    cap = sack.bottleneck_bound_s() * 1.08
    islands = sorted(problem.island_gpus)
    found = 0
    for j, k, ends in itertools.product(islands, (1, 2, 3), itertools.product(islands, islands)):
        low = cap * 0.8
        cover = sack.cover(cap, 0, None, (j, k, low), ends)
        if cover is None:
            continue
        found += 1
        first, mids, last = cover
        stages = [first, *mids, last]
        assert sum(t.num_layers for t in stages) == problem.total_layers
        assert all(t.time_s <= cap * (1 + 1e-9) and t.num_layers >= 1 for t in stages)
        assert _within_gpu_budgets(problem, stages)
        assert (problem.candidates[first.candidate].island, problem.candidates[last.candidate].island) == ends
        small = [t for t in mids if problem.candidates[t.candidate].island == j and t.time_s <= low * (1 + 1e-9)]
        assert len(small) >= k
    assert found >= 4


def test_knapsack_plans_try_island_caps_and_descend_from_a_better_plan(monkeypatch):
    # search/primal.py, knapsack_plans: besides the caps near the bound, caps up to
    # KNAPSACK_PLAN_ISLAND_SPAN times it with every island's cap a fraction of it (one island at the
    # full cap); a plan that improves the sub-problem's best near the incumbent gets one descent
    ctx = _h100_a100_context()
    problem, sack = _h100_a100_knapsack(ctx)
    knap = sack.bottleneck_bound_s()
    search = BranchAndBound(ctx, backend="highs", time_limit_s=300, threads=1, seed=0, rel_gap=1e-4,
                            formulation="aggregated", windows=True, fluid_cuts=True, warm_start=False,
                            on_progress=None, t0=time.perf_counter())
    sub = search.subs[8] = SubProblem(b=8, problem=problem, lower_bound_s=0.0)
    caps_asked, descents = [], []
    cover, improve_plan = sack.cover, search.improve_plan

    def recorded_cover(lam, tol=0, caps=None, *rest):
        caps_asked.append((lam, tol, dict(caps or {})))
        return cover(lam, tol, caps, *rest)

    def recorded_descent(s, deadline, kicks=None, seed=None):
        descents.append((s.b, s.objective_s, kicks))
        return improve_plan(s, deadline, kicks=kicks, seed=seed)

    monkeypatch.setattr(sack, "cover", recorded_cover)
    monkeypatch.setattr(search, "improve_plan", recorded_descent)
    search.knapsack_plans(sub, sack, knap, math.inf)

    islands = sorted(problem.island_gpus)
    island_caps = {(lam, tuple(round(caps[i] / lam, 9) for i in islands))
                   for lam, tol, caps in caps_asked if tol == 0 and sorted(caps) == islands}
    wide = [lam for lam, _ in island_caps if lam > knap * tuning.KNAPSACK_PLAN_SPAN]
    assert wide and max(wide) <= knap * tuning.KNAPSACK_PLAN_ISLAND_SPAN * (1 + 1e-12)
    fractions = {f for _, f in island_caps}
    assert (1.0, 0.5) in fractions and (0.5, 1.0) in fractions and (1.0, 1.0) not in fractions
    # one descent, from the best knapsack plan, and what the sub-problem keeps is a real plan
    assert len(descents) == 1 and descents[0][0] == 8 and descents[0][2] == 0
    assert sub.objective_s <= descents[0][1]
    assert fits_memory(problem, sub.best_choices)
    assert choices_timing(problem, sub.best_choices).step_time_s == pytest.approx(sub.objective_s, rel=1e-12)


def _second_pass_run(monkeypatch, root_min_s: float):
    """A search of a small mixed cluster whose first pass closes: (the search, the plan, the
    (pass, plans) of every root, the first pass's bound per sub-problem)."""
    cluster = make_cluster("mixed", [dict(name="h100", gpu="H100-SXM", nodes=2, gpus_per_node=2, nic_gbps=400),
                                     dict(name="l4", gpu="L4", nodes=2, gpus_per_node=2, nic_gbps=25)])
    space = SearchSpace(max_stages=4, zero=(0, 3), recompute=("none",), cp=(1,), micro_batch_sizes=(1,),
                        pipeline_micro_batches=(2, 4))
    ctx = PlanningContext(cluster, load_model("llama-3-8b").with_layers(5),
                          TrainingSpec(global_batch_size=16, seq_len=1024), space=space)
    monkeypatch.setattr(tuning, "SECOND_PASS_ROOT_MIN_S", root_min_s)
    monkeypatch.setattr(tuning, "FIRST_PASS_GAP", 0.3)  # a first pass loose enough to leave roots to the second
    search = BranchAndBound(ctx, backend="highs", time_limit_s=300, threads=1, seed=0, rel_gap=1e-4,
                            formulation="aggregated", windows=True, fluid_cuts=True, warm_start=False,
                            on_progress=None, t0=time.perf_counter())
    roots, floors = [], {}
    root, next_pass = search.root, search.next_pass

    def recorded_root(sub, plans=True):
        roots.append((bool(floors), plans))
        return root(sub, plans)

    def recorded_next_pass(live):
        floors.update({s.b: search.sub_bound(s) for s in search.subs.values()})
        return next_pass(live)

    monkeypatch.setattr(search, "root", recorded_root)
    monkeypatch.setattr(search, "next_pass", recorded_next_pass)
    return search, search.run(), roots, floors


def test_the_second_pass_roots_offer_no_knapsack_plans(monkeypatch):
    # BranchAndBound.next_pass: the first pass's roots offered the knapsack's covers as plans;
    # the second pass's roots bound their windows only, and it ends within rel_gap
    search, plan, roots, floors = _second_pass_run(monkeypatch, 0.5)
    assert floors, "the first pass closed, and a second one started"
    assert any(not second and plans for second, plans in roots)
    assert any(second for second, _ in roots) and all(not plans for second, plans in roots if second)
    assert plan.certificate.gap <= 1e-4


def test_a_second_pass_without_time_for_its_roots_keeps_the_first_pass_bound(monkeypatch):
    # with less than SECOND_PASS_ROOT_MIN_S left, no root is bounded again: every sub-problem keeps
    # the bound the first pass proved (its floor), and the certificate stays within that pass's gap
    search, plan, roots, floors = _second_pass_run(monkeypatch, 1e9)
    assert floors and not any(second for second, _ in roots)
    assert all(search.sub_bound(sub) == pytest.approx(floors[b], rel=1e-12) for b, sub in search.subs.items())
    assert plan.certificate.bound_s == pytest.approx(min([search.inc_s, *floors.values()]), rel=1e-9)
    assert plan.certificate.gap <= tuning.FIRST_PASS_GAP
