"""The sequence model (planner/formulations/stage_sequence.py) is exact: its optimum over one period window and stage
count is the best plan there, found by exhaustive enumeration, and every such plan encodes as a
feasible point priced no higher than its step time (formulations/pipeline_mip.md §3b)."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tangram_opt.planner.context import PlanningContext
from tangram_opt.planner.formulations.aggregated import AggregatedMIP
from tangram_opt.planner.formulations.problem import FormulationOptions, choices_timing
from tangram_opt.planner.formulations.stage_sequence import SequenceMIP, position_types
from tangram_opt.planner.formulations.stage_types import enumerate_types
from tangram_opt.planner.formulations.ticks import rounding_ticks
from tangram_opt.planner.formulations.ticks import tick_for as _tick_for
from tangram_opt.planner.space import SearchSpace
from tangram_opt.testing.exhaustive import enumerate_plans
from tangram_opt.solvers import SolveOptions, SolveStatus, available_backends, solve_model
from tangram_opt.specs import TrainingSpec, load_model, make_cluster

GPUS = ["V100-32", "A100-40", "H100-SXM", "L4"]
MODELS = ["llama-3-8b", "mixtral-8x7b", "deepseek-v2-lite"]


@st.composite
def instances(draw):
    n_groups = draw(st.integers(1, 3))
    gpus = draw(st.lists(st.sampled_from(GPUS), min_size=n_groups, max_size=n_groups, unique=True))
    groups = [dict(name=f"g{i}", gpu=g, nodes=draw(st.integers(1, 2)), gpus_per_node=draw(st.sampled_from([1, 2])),
                   nic_gbps=draw(st.sampled_from([25, 100, 400])))
              for i, g in enumerate(gpus)]
    model = load_model(draw(st.sampled_from(MODELS))).with_layers(draw(st.integers(3, 4)))
    training = TrainingSpec(global_batch_size=draw(st.sampled_from([8, 16])), seq_len=1024,
                            precision="fp16" if "V100-32" in gpus else "bf16")
    space = SearchSpace(max_stages=3, zero=(0, 3), recompute=("none", "full"), cp=(1,), micro_batch_sizes=(1,),
                        pipeline_micro_batches=(1, 2))
    return PlanningContext(make_cluster("random", groups), model, training, space=space)


def _plans_by_size(problem):
    """Multi-stage plans by stage count: (exact step time, period, plan)."""
    out: dict[int, list] = {}
    for plan in enumerate_plans(problem):
        if len(plan) >= 2:
            timing = choices_timing(problem, list(plan))
            out.setdefault(len(plan), []).append((timing.step_time_s, timing.bottleneck_s, plan))
    return out


def _point(model, hint) -> list[float]:
    """The full variable vector of a hint (``hint_from``): unset variables at 0."""
    x = [0.0] * len(model.vars)
    for var, val in hint.items():
        x[var.index] = val
    return x


def _solve(seq: SequenceMIP, backend: str = "highs", branching: bool = False, cutoff: float | None = None):
    return solve_model(seq.model, backend, SolveOptions(time_limit_s=60, threads=1, rel_gap=1e-9, presolve=False,
                                                        group_branching=branching, cutoff=cutoff))


def _check_problem(problem, backend: str = "highs", every: int = 2, joined: bool = False,
                   branching: bool = False) -> int:
    """For every stage count and every period cap ``hi`` at a plan's period: the model of the
    window [0, hi] has the best plan of that size with period <= hi as its optimum, and every
    such plan is a feasible point priced no higher than its step time. Returns the windows checked.
    ``joined``: the models carry the rows of the window's aggregated model (``relaxation``); the
    optimum must stay the best plan (the encoding check is left out: a hint sets no aggregated
    variable). ``branching``: solved by branching on the island of each position
    (solvers/group_branching.py), which must find the same optimum, and, with a cutoff just below
    it, nothing."""
    types = enumerate_types(problem)
    checked = 0
    integral = backend != "highs"  # as the search builds them (search.sequence_integral)
    for P, plans in _plans_by_size(problem).items():
        sized = dataclasses.replace(problem, min_stages=P, max_stages=P)
        for hi in sorted({lam for _, lam, _ in plans})[::every]:
            inside = [(t, plan) for t, lam, plan in plans if lam <= hi * (1 + 1e-12)]
            best = min(t for t, _ in inside)
            # ticks for the model's own scale, as the search picks them (hi <= incumbent / m there)
            tick = _tick_for(max(best, problem.num_micro_batches * hi))
            options = FormulationOptions(tick_s=tick)
            relaxation = None
            if joined:
                relaxation = AggregatedMIP(sized, options, all_types=types, upper_tmax_s=hi).build()
                assert not relaxation.empty
            seq = SequenceMIP(sized, options, types, P, 0.0, hi, integral=integral, relaxation=relaxation).build()
            slack = rounding_ticks(problem.num_micro_batches) * tick
            assert not seq.empty
            res = _solve(seq, backend, branching)
            assert res.status == SolveStatus.OPTIMAL, res.status
            if branching:
                assert res.bound <= res.objective
                assert _solve(seq, backend, branching, cutoff=res.objective * (1 - 1e-7)).status == SolveStatus.INFEASIBLE
            # valid (no higher than the best plan, up to the period's rounding) and exact (lower
            # only by the coefficients rounded down to whole ticks: below 1e-5 here)
            assert best * (1 - 1e-5) <= res.objective * tick <= best + slack, (P, hi, best, res.objective * tick)
            # its solution is a real plan of that size, as fast as the model says
            decoded = choices_timing(problem, seq.decode(res.values))
            assert decoded.step_time_s == pytest.approx(best, rel=1e-6)
            for t, plan in ([] if joined else inside):
                hint = seq.hint_from(list(plan))
                if hint is None:  # a stage type pruned as dominated at its position
                    continue
                x = _point(seq.model, hint)
                assert not seq.model.check(x, tol=1e-6), seq.model.check(x, tol=1e-6)[:3]
                assert seq.model.objective.value(x) * tick <= t + slack
            checked += 1
    return checked


def _check_context(ctx: PlanningContext, joined: bool = False) -> None:
    """``_check_problem`` on every 1F1B sub-problem (pipeline micro-batch size) of ``ctx``."""
    for b in ctx.pipeline_micro_batches():
        problem = ctx.problem(b)
        if problem.candidates and problem.schedule == "1f1b":
            _check_problem(problem, joined=joined)


def _mixed(batch: int = 16, max_stages: int = 4, space: SearchSpace | None = None) -> PlanningContext:
    """Llama-3-8B (5 layers) on fast H100 nodes beside slow-NIC L4 nodes: unequal links, so the
    link terms matter; b = 2."""
    cluster = make_cluster("mixed", [dict(name="h100", gpu="H100-SXM", nodes=2, gpus_per_node=2, nic_gbps=400),
                                     dict(name="l4", gpu="L4", nodes=2, gpus_per_node=2, nic_gbps=25)])
    space = space or SearchSpace(max_stages=max_stages, zero=(0, 3), recompute=("none",), cp=(1,),
                                 micro_batch_sizes=(1,), pipeline_micro_batches=(2,))
    return PlanningContext(cluster, load_model("llama-3-8b").with_layers(5),
                           TrainingSpec(global_batch_size=batch, seq_len=1024), space=space)


@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(instances())
def test_sequence_optimum_is_the_best_plan_of_its_window_and_size(ctx):
    _check_context(ctx)


@settings(max_examples=8, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(instances())
def test_sequence_model_with_the_aggregated_rows_joined_stays_exact(ctx):
    _check_context(ctx, joined=True)


@settings(max_examples=8, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(instances())
def test_branching_on_islands_finds_the_best_plan_of_its_window_and_size(ctx):
    for b in ctx.pipeline_micro_batches():
        problem = ctx.problem(b)
        if problem.candidates and problem.schedule == "1f1b":
            _check_problem(problem, branching=True)


def test_branching_on_islands_finds_the_best_plan_on_unequal_links():
    assert _check_problem(_mixed().problem(2), branching=True) >= 5
    assert _check_problem(_mixed().problem(2), joined=True, branching=True) >= 5


@pytest.mark.parametrize("nic_gbps, spread_above", [(25, True), (400, False)])
def test_island_link_spread_tells_slow_island_boundaries_from_fast_ones(nic_gbps, spread_above):
    # the search branches on islands only where their boundaries differ by a share of the period
    # (tuning.SEQUENCE_BRANCHING_MIN_SPREAD): L4 nodes on 25 Gb/s beside H100 nodes on 400 Gb/s do,
    # the same L4 nodes on 400 Gb/s do not; one island never does
    from tangram_opt.planner.search import tuning
    from tangram_opt.planner.search.leaves import island_link_spread

    cluster = make_cluster("mixed", [dict(name="h100", gpu="H100-SXM", nodes=2, gpus_per_node=2, nic_gbps=400),
                                     dict(name="l4", gpu="L4", nodes=2, gpus_per_node=2, nic_gbps=nic_gbps)])
    space = SearchSpace(max_stages=4, zero=(0, 3), recompute=("none",), cp=(1,), micro_batch_sizes=(1,),
                        pipeline_micro_batches=(2,))
    ctx = PlanningContext(cluster, load_model("llama-3-8b").with_layers(5),
                          TrainingSpec(global_batch_size=16, seq_len=1024), space=space)
    problem = ctx.problem(2)
    types = enumerate_types(problem)
    times = sorted(t.time_s for ts in types.values() for t in ts)
    hi = times[len(times) // 2]
    spread = island_link_spread(problem, types, hi)
    assert (spread >= tuning.SEQUENCE_BRANCHING_MIN_SPREAD) == spread_above, spread
    one = {role: [t for t in ts if problem.candidates[t.candidate].island == 0] for role, ts in types.items()}
    assert island_link_spread(problem, one, hi) == 0.0


def test_sequence_model_is_exact_where_stage_sizes_leave_gpus_of_an_island_idle():
    # stages of 3 GPUs on islands of 7 and 8: the GPU rows read 6 (problem.largest_total)
    from test_aggregated_rows import _odd_islands

    _check_context(_odd_islands())
    _check_context(_odd_islands(), joined=True)


def test_joined_rows_keep_the_best_plan_on_unequal_links():
    assert _check_problem(_mixed().problem(2), joined=True) >= 5


@pytest.mark.parametrize("backend", available_backends())
def test_sequence_model_is_exact_on_every_backend(backend):
    ctx = _mixed()
    # the OR-Tools wrappers take a few seconds per model here: fewer windows than HiGHS
    assert _check_problem(ctx.problem(2), backend, every=2 if backend == "highs" else 6) >= 5


@pytest.mark.parametrize("micro_batches", [2, 3])
def test_sequence_model_is_exact_with_few_micro_batches(micro_batches):
    # with m = 2 no block of two stages bounds the period: two slow neighbours are allowed, so
    # the clique rows (of two neighbouring positions, at most one slow type) must be left out
    ctx = _mixed(batch=2 * micro_batches)
    assert ctx.problem(2).num_micro_batches == micro_batches
    assert _check_problem(ctx.problem(2)) >= 5


def test_position_types_keep_a_dominating_type_for_every_type_they_drop():
    ctx = _mixed(space=SearchSpace(max_stages=4, cp=(1,), micro_batch_sizes=(1, 2), pipeline_micro_batches=(2,)))
    problem = ctx.problem(2)
    cands = problem.candidates
    mids = enumerate_types(problem)["mid"]
    # one micro-batch in flight (the last position): tolerance buys nothing, so types that
    # enumerate_types kept only for their tolerance go
    kept = position_types(problem, mids, need=1, hi=math.inf)
    assert len(kept) < len(mids)
    for t in mids:
        assert any(cands[k.candidate].island == cands[t.candidate].island and k.layers == t.layers
                   and cands[k.candidate].gpus <= cands[t.candidate].gpus and k.time_s <= t.time_s
                   and k.fwd_s <= t.fwd_s and k.tail_s <= t.tail_s for k in kept)


def test_stage_range_rows_hold_for_every_plan_of_the_range():
    # the search bounds a window's stage range with AggregatedMIP.with_stage_range: every plan of
    # that many stages must stay a feasible point, priced no higher than its step time
    ctx = _mixed(max_stages=5)
    problem = ctx.problem(2)
    types = enumerate_types(problem)
    checked = 0
    for P, plans in _plans_by_size(problem).items():
        for t, lam, plan in plans[::7]:
            tick = _tick_for(t)
            mip = AggregatedMIP(problem, FormulationOptions(tick_s=tick), all_types=types, lower_tmax_s=lam * 0.99,
                                upper_tmax_s=lam * 1.01).build()
            for first, last in ((P, P), (max(2, P - 1), P), (P, P + 1)):
                child = mip.with_stage_range(first, last)
                hint = child.hint_from(list(plan))
                if hint is None:
                    continue
                x = _point(child.model, hint)
                assert not child.model.check(x, tol=1e-6), (P, first, last, child.model.check(x, tol=1e-6)[:3])
                slack = rounding_ticks(problem.num_micro_batches) * tick
                assert child.model.objective.value(x) * tick <= t + slack
                checked += 1
            # the parent model is left as it was
            assert not any(c.name.startswith("stages_") for c in mip.model.constraints)
    assert checked >= 20


def test_tail_window_rows_keep_exactly_the_plans_with_a_tail_above_the_lower_edge():
    # a sequence leaf of a node split on the largest step tail holds the plans with some stage's
    # tail above the node's lower edge: its optimum is the best of those, and each of them encodes
    # as a feasible point priced no higher than its step time
    ctx = _mixed(max_stages=4)
    problem = ctx.problem(2)
    types = enumerate_types(problem)
    checked = 0
    for P, plans in _plans_by_size(problem).items():
        sized = dataclasses.replace(problem, min_stages=P, max_stages=P)
        hi = max(lam for _, lam, _ in plans)
        tick = _tick_for(max(min(t for t, _, _ in plans), problem.num_micro_batches * hi))
        slack = rounding_ticks(problem.num_micro_batches) * tick
        plain = SequenceMIP(sized, FormulationOptions(tick_s=tick), types, P, 0.0, hi).build()
        tails = []  # (largest stage tail, step time, plan) of the plans the model holds
        for t, _, plan in plans:
            hint = plain.hint_from(list(plan))
            if hint is not None:
                tails.append((max(ty.tail_s for k, xs in enumerate(plain.x) for x, ty in zip(xs, plain.at[k])
                                  if hint[x] > 0.5), t, plan))
        largest = sorted({tail for tail, _, _ in tails})
        for lower in largest[:-1][:: max(1, len(largest) // 4)]:
            seq = SequenceMIP(sized, FormulationOptions(tick_s=tick), types, P, 0.0, hi, lower_tail_s=lower).build()
            inside = [(t, plan) for tail, t, plan in tails if tail > lower]
            best = min(t for t, _ in inside)
            res = _solve(seq)
            assert res.status == SolveStatus.OPTIMAL, res.status
            assert best * (1 - 1e-5) <= res.objective * tick <= best + slack, (P, lower, best, res.objective * tick)
            for t, plan in inside:
                hint = seq.hint_from(list(plan))
                x = _point(seq.model, hint)
                assert not seq.model.check(x, tol=1e-6), seq.model.check(x, tol=1e-6)[:3]
                assert seq.model.objective.value(x) * tick <= t + slack
            checked += 1
        # above every type's tail no plan is left: the model says so before any solve
        top = max(ty.tail_s for ts in plain.at for ty in ts)
        assert SequenceMIP(sized, FormulationOptions(tick_s=tick), types, P, 0.0, hi, lower_tail_s=top).build().empty
    assert checked >= 4


def test_leaves_of_a_size_narrow_once_one_of_them_came_back_unfinished():
    # a sequence leaf 1.5% wide is solved as it is until a leaf of its pipeline micro-batch size
    # comes back unfinished; then it (and every window of that size) is split on the period down
    # to SEQUENCE_NARROW_RATIO, and other sizes keep the usual width
    from types import SimpleNamespace

    from tangram_opt.planner.search import tuning
    from tangram_opt.planner.search.nodes import Node
    from tangram_opt.planner.search.splitting import WindowSplits

    class Host(WindowSplits):
        def __init__(self, sequence: bool):
            self.sequence, self.leaf_ratio = sequence, tuning.SEQUENCE_WINDOW_RATIO
            self.subs = {8: SimpleNamespace(info={}), 16: SimpleNamespace(info={})}

    assert tuning.SEQUENCE_NARROW_RATIO < 1.015 < tuning.SEQUENCE_WINDOW_RATIO
    leaf = Node(18.0, b=8, lo_s=0.100, hi_s=0.1015, stages=(12, 12))
    other = Node(18.0, b=16, lo_s=0.200, hi_s=0.203, stages=(9, 9))
    host = Host(sequence=True)
    assert not host.splittable(leaf) and not host.splittable(other)
    host.subs[8].info["sequence_unfinished"] = tuning.SEQUENCE_NARROW_AFTER
    assert host.leaf_ratio_of(8) == tuning.SEQUENCE_NARROW_RATIO and host.splittable(leaf)
    assert host.leaf_ratio_of(16) == tuning.SEQUENCE_WINDOW_RATIO and not host.splittable(other)
    narrow = Node(18.0, b=8, lo_s=0.100, hi_s=0.1005, stages=(12, 12))
    assert not host.splittable(narrow)
    aggregated = Host(sequence=False)  # aggregated leaves keep their own width
    aggregated.subs[8].info["sequence_unfinished"] = 5
    assert aggregated.leaf_ratio_of(8) == tuning.SEQUENCE_WINDOW_RATIO
