"""The island-order search (planner/search/patterns.py): its orders are exactly those one edit away
from the incumbent's, its model is the sequence model restricted to one island per position (exact
inside that order: the best plan of the order, by enumeration), and inside the search it offers
that best plan. Dives visit every island order their LPs leave and find the best plan of their
stage count, and leave their model as they found it."""

from __future__ import annotations

import dataclasses
import time
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tangram_opt.planner.context import PlanningContext
from tangram_opt.planner.formulations.problem import FormulationOptions, choices_timing
from tangram_opt.planner.formulations.stage_sequence import SequenceMIP
from tangram_opt.planner.formulations.stage_types import enumerate_types
from tangram_opt.planner.formulations.ticks import rounding_ticks, tick_for
from tangram_opt.planner.search import patterns, tuning
from tangram_opt.planner.search.branch_and_bound import BranchAndBound
from tangram_opt.planner.search.nodes import SubProblem
from tangram_opt.planner.search.patterns import Dive, dive_positions, neighbour_orders
from tangram_opt.planner.space import SearchSpace
from tangram_opt.solvers import SolveOptions, SolveStatus, solve_model
from tangram_opt.specs import TrainingSpec, load_model, make_cluster
from tangram_opt.testing.exhaustive import enumerate_plans


def _one_edit(order: tuple[int, ...], islands: list[int]) -> set[tuple[int, ...]]:
    out = {order}
    for k in range(len(order) + 1):
        out |= {order[:k] + (i,) + order[k:] for i in islands}
    for k in range(len(order)):
        out.add(order[:k] + order[k + 1:])
        out |= {order[:k] + (i,) + order[k + 1:] for i in islands}
    return out


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.lists(st.integers(0, 2), min_size=2, max_size=9), st.integers(1, 4), st.integers(4, 12))
def test_neighbour_orders_are_the_order_and_every_order_one_edit_away_once(order, lo, hi):
    order = tuple(order)
    islands = [0, 1, 2]
    got = neighbour_orders(order, islands, lo, hi)
    assert len(got) == len(set(got))
    expected = {o for o in _one_edit(order, islands) if max(2, lo) <= len(o) <= hi}
    assert set(got) == expected
    if order in expected:
        assert got[0] == order  # the incumbent's own order first (its layers and candidates re-solved)
    # next, a run one stage longer, where the length allows one: a stage more shortens the period
    others = [o for o in got if o != order]
    if max(2, lo) <= len(order) + 1 <= hi:
        longer = others[0]
        assert len(longer) == len(order) + 1
        assert any(longer[:k] + longer[k + 1:] == order and (longer[k] in longer[max(0, k - 1):k] + longer[k + 1:k + 2])
                   for k in range(len(longer)))


def _mixed() -> PlanningContext:
    """Llama-3-8B (5 layers) on fast H100 nodes beside slow-NIC L4 nodes, b = 2 (as tests/test_sequence.py)."""
    cluster = make_cluster("mixed", [dict(name="h100", gpu="H100-SXM", nodes=2, gpus_per_node=2, nic_gbps=400),
                                     dict(name="l4", gpu="L4", nodes=2, gpus_per_node=2, nic_gbps=25)])
    space = SearchSpace(max_stages=4, zero=(0, 3), recompute=("none",), cp=(1,), micro_batch_sizes=(1,),
                        pipeline_micro_batches=(2,))
    return PlanningContext(cluster, load_model("llama-3-8b").with_layers(5),
                           TrainingSpec(global_batch_size=16, seq_len=1024), space=space)


def _search(ctx: PlanningContext, **kw) -> BranchAndBound:
    return BranchAndBound(ctx, backend="highs", time_limit_s=300, threads=1, seed=0, rel_gap=1e-4,
                          formulation="aggregated", windows=True, fluid_cuts=True, warm_start=False,
                          on_progress=None, t0=time.perf_counter() - 1.0, **kw)


def _turning_search(ctx: PlanningContext, monkeypatch, **knobs) -> BranchAndBound:
    """A search whose island-order turns run from the start, whatever the gap, with every share
    of the time theirs, and the ``tuning`` knobs given."""
    for name, value in {"ORDER_START_SHARE": 0.0, "ORDER_MIN_GAP": 0.0, "ORDER_SHARE": 1.0, **knobs}.items():
        monkeypatch.setattr(tuning, name, value)
    return _search(ctx)


def _plans_by_order(problem):
    """Multi-stage plans by island order: (exact step time, period, plan)."""
    out: dict[tuple[int, ...], list] = {}
    for plan in enumerate_plans(problem):
        if len(plan) >= 2:
            timing = choices_timing(problem, list(plan))
            order = tuple(problem.candidates[st.candidate].island for st in plan)
            out.setdefault(order, []).append((timing.step_time_s, timing.bottleneck_s, plan))
    return out


def test_the_model_of_an_island_order_has_the_best_plan_of_that_order_as_its_optimum():
    problem = _mixed().problem(2)
    types = enumerate_types(problem)
    by_order = _plans_by_order(problem)
    assert len(by_order) >= 6
    for order, plans in by_order.items():
        hi = sorted(lam for _, lam, _ in plans)[len(plans) // 2]  # a window holding about half of them
        inside = [t for t, lam, _ in plans if lam <= hi * (1 + 1e-12)]
        best = min(inside)
        tick = tick_for(max(best, problem.num_micro_batches * hi))
        sized = dataclasses.replace(problem, min_stages=len(order), max_stages=len(order))
        seq = SequenceMIP(sized, FormulationOptions(tick_s=tick), types, len(order), 0.0, hi, islands=order).build()
        assert all(problem.candidates[t.candidate].island == i for ts, i in zip(seq.at, order) for t in ts)
        res = solve_model(seq.model, "highs", SolveOptions(time_limit_s=60, threads=1, rel_gap=1e-9, presolve=False))
        assert res.status == SolveStatus.OPTIMAL, (order, res.status)
        slack = rounding_ticks(problem.num_micro_batches) * tick
        assert best * (1 - 1e-5) <= res.objective * tick <= best + slack, (order, best, res.objective * tick)
        decoded = seq.decode(res.values)
        assert tuple(problem.candidates[st.candidate].island for st in decoded) == order
        assert choices_timing(problem, decoded).step_time_s == pytest.approx(best, rel=1e-6)


def test_order_turns_improve_on_the_incumbent_and_try_every_order_around_the_last_one(monkeypatch):
    # the incumbent is the worst multi-stage plan of the instance. The first order tried is its own
    # (solved exactly here: the best plan of that order in the window), and turns go on from each
    # new incumbent until every order one edit away from the last one has been tried
    ctx = _mixed()
    problem = ctx.problem(2)
    by_order = _plans_by_order(problem)
    worst_t, worst_lam, worst = max((p for ps in by_order.values() for p in ps), key=lambda p: p[0])
    search = _turning_search(ctx, monkeypatch, ORDER_SLICE_S=60.0, ORDER_PATIENCE=10**6)
    sub = search.subs[2] = SubProblem(b=2, problem=problem, lower_bound_s=0.0)
    sub.types = enumerate_types(problem, worst_t)
    search.offer(2, list(worst), worst_t)
    order = tuple(problem.candidates[st.candidate].island for st in worst)
    hi = min(worst_t / (problem.num_micro_batches - 1), worst_lam * (1 + tuning.ORDER_PERIOD_SLACK))
    own_best = min(t for t, lam, _ in by_order[order] if lam <= hi * (1 + 1e-12))
    for _ in range(100):
        before = set(search.order_tried.get(2, ()))
        search.order_turn()
        if search.order_tried[2] == before:
            break
    assert search.inc_s < worst_t * (1 - 1e-6)
    assert search.inc_s <= own_best * (1 + 1e-9)
    b, choices = search.inc
    assert b == 2 and choices_timing(problem, choices).step_time_s == pytest.approx(search.inc_s, rel=1e-12)
    last = tuple(problem.candidates[st.candidate].island for st in choices)
    assert set(neighbour_orders(last, sorted(problem.island_gpus), problem.min_stages, problem.max_stages)) \
        <= search.order_tried[2]
    assert sub.info["order_solves"] >= 2


def test_order_turns_wait_for_a_new_incumbent_after_patience_runs_out(monkeypatch):
    # from the best plan of the instance no order finds anything better: after ORDER_PATIENCE
    # orders the turns stop trying, until a much better incumbent arrives
    ctx = _mixed()
    problem = ctx.problem(2)
    best_t, _, best = min((p for ps in _plans_by_order(problem).values() for p in ps), key=lambda p: p[0])
    search = _turning_search(ctx, monkeypatch, ORDER_PATIENCE=2)
    sub = search.subs[2] = SubProblem(b=2, problem=problem, lower_bound_s=0.0)
    sub.types = enumerate_types(problem, best_t * 1.5)
    search.offer(2, list(best), best_t)
    for _ in range(3):
        search.order_turn()
    assert len(search.order_tried[2]) == 2 and search.inc_s == best_t
    search.order_turn()  # the same incumbent: no more orders
    assert len(search.order_tried[2]) == 2
    # an incumbent ORDER_MIN_GAIN better than when patience started (here: as if that had been
    # twice as slow) starts it anew
    search.order_from_s = 2 * best_t
    search.order_turn()
    assert len(search.order_tried[2]) == 4


def test_a_sequence_leaf_split_on_its_end_islands_keeps_every_plan_below_the_target():
    # LeafSolves.end_islands fixes to 0 the types of an end island whose restricted LP reaches the
    # target; the best plan of every window and stage count below the target must survive it, and
    # the tightened model must still find it. With the target just below that plan it may close
    # the leaf (nothing below the target), and on this instance it does on most
    ctx = _mixed()
    problem = ctx.problem(2)
    types = enumerate_types(problem)
    search = BranchAndBound(ctx, backend="highs", time_limit_s=300, threads=1, seed=0, rel_gap=1e-4,
                            formulation="aggregated", windows=True, fluid_cuts=True, warm_start=False,
                            on_progress=None, t0=time.perf_counter())
    by_size: dict[int, list] = {}
    for ps in _plans_by_order(problem).values():
        for t, lam, plan in ps:
            by_size.setdefault(len(plan), []).append((t, lam, plan))
    checked = closed = 0
    for P, plans in by_size.items():
        sized = dataclasses.replace(problem, min_stages=P, max_stages=P)
        for hi in sorted({lam for _, lam, _ in plans})[::3]:
            best_t, _, best = min((p for p in plans if p[1] <= hi * (1 + 1e-12)), key=lambda p: p[0])
            for target_over in (1.001, 0.999):  # the target just above the best plan, and just below
                search.inc_s = best_t * target_over / (1 - search.gap)
                tick = tick_for(max(best_t, problem.num_micro_batches * hi))
                seq = SequenceMIP(sized, FormulationOptions(tick_s=tick), types, P, 0.0, hi).build()
                kept = search.end_islands(seq)
                if target_over < 1:
                    closed += not kept
                    continue
                assert kept, (P, hi)
                hint = seq.hint_from(list(best))
                if hint is not None:  # its types are still allowed at both ends
                    assert all(var.ub > 0 for var in (seq.model.vars[v.index] for v, val in hint.items()
                                                      if val > 0.5 and v.integer))
                res = solve_model(seq.model, "highs", SolveOptions(time_limit_s=60, threads=1, rel_gap=1e-9,
                                                                   presolve=False))
                assert res.status == SolveStatus.OPTIMAL
                assert choices_timing(problem, seq.decode(res.values)).step_time_s == pytest.approx(best_t, rel=1e-6)
                checked += 1
    assert checked >= 5
    assert closed >= 5  # with the target just below the best plan, the split alone closes leaves


@settings(max_examples=30, deadline=None, derandomize=True)
@given(st.integers(1, 40))
def test_a_dive_fixes_every_position_once_ends_first(stages):
    order = dive_positions(stages)
    assert sorted(order) == list(range(stages))
    assert order[0] == 0 and (stages == 1 or order[1] == stages - 1)
    # inwards: in the order of their distance from the nearer end
    assert all(min(k, stages - 1 - k) <= min(j, stages - 1 - j) for a, k in enumerate(order) for j in order[a:])


def test_a_dive_finds_the_best_plan_of_its_stage_count_and_leaves_its_model_as_it_was():
    # against the worst plan as cutoff nothing better is pruned: the dive visits every island
    # order with a plan below it, and the best of its leaves is the best plan of that many stages
    problem = _mixed().problem(2)
    plans = [p for ps in _plans_by_order(problem).values() for p in ps]
    worst_t = max(t for t, _, _ in plans)
    m = problem.num_micro_batches
    for P in sorted({len(plan) for _, _, plan in plans}):
        best_t = min(t for t, _, plan in plans if len(plan) == P)
        orders = {tuple(problem.candidates[st.candidate].island for st in plan) for t, _, plan in plans
                  if len(plan) == P and t < worst_t}
        sized = dataclasses.replace(problem, min_stages=P, max_stages=P)
        tick = tick_for(worst_t)
        hi = worst_t / (m - 1)
        seq = SequenceMIP(sized, FormulationOptions(tick_s=tick, cutoff_s=worst_t), enumerate_types(problem, worst_t),
                          P, 0.0, hi).build()
        before = list(seq.model.vars)
        found: list[float] = []
        leaves: set[tuple[int, ...]] = set()
        cutoff = worst_t / tick + rounding_ticks(m)

        def solve(limit_s: float):
            return solve_model(seq.model, "highs", SolveOptions(time_limit_s=limit_s, threads=1, rel_gap=1e-9,
                                                                 presolve=False, cutoff=cutoff))

        def keep(res) -> None:
            leaves.add(tuple(next(problem.candidates[t.candidate].island for v, t in zip(seq.x[k], seq.at[k])
                                  if seq.model.vars[v.index].ub > 0) for k in range(P)))
            if res.values is not None:
                found.append(choices_timing(problem, seq.decode(res.values)).step_time_s)

        dive = Dive(seq, lambda: cutoff, lambda: 30.0, solve, keep)
        steps = 0
        while dive.step():
            steps += 1
        assert dive.done and not dive.step()
        assert seq.model.vars == before  # every bound put back
        assert orders <= leaves  # every order with a plan below the cutoff reached a leaf
        assert min(found) == pytest.approx(best_t, rel=1e-6), P
        assert steps == dive.lps + dive.leaves


def test_once_the_orders_are_used_up_the_turns_dive_and_find_the_best_plan(monkeypatch):
    # from the worst plan, with the orders' patience used up (and never renewed: patience 0),
    # the turns go to dives (when they have patience left), which reach the best multi-stage plan
    # of the instance
    ctx = _mixed()
    problem = ctx.problem(2)
    plans = [p for ps in _plans_by_order(problem).values() for p in ps]
    worst_t, _, worst = max(plans, key=lambda p: p[0])
    best_t = min(t for t, _, _ in plans)
    search = _turning_search(ctx, monkeypatch, ORDER_SLICE_S=60.0, DIVE_LEAF_S=30.0, ORDER_PATIENCE=0)
    sub = search.subs[2] = SubProblem(b=2, problem=problem, lower_bound_s=0.0)
    sub.types = enumerate_types(problem, worst_t)
    search.offer(2, list(worst), worst_t)
    monkeypatch.setattr(tuning, "DIVE_PATIENCE_S", 0.0)
    search.order_turn()  # no patience: no dive either
    assert not search.dived and not search.order_tried.get(2)
    monkeypatch.setattr(tuning, "DIVE_PATIENCE_S", 1e9)
    search.order_turn()
    assert search.order_tried.get(2, set()) == set()  # no order was tried
    assert search.dived and {k for k, _ in search.dived} == {2}
    assert search.inc_s < worst_t  # the slice ends at the first better plan
    for _ in range(40):
        search.order_turn()
        if not search.dives and search.dived >= set(search.dive_keys()):
            break
    assert search.order_tried.get(2, set()) == set()
    assert search.inc_s == pytest.approx(best_t, rel=1e-6)
    assert sub.info["dive_leaves"] >= 1 and not search.dives  # every dive started ran to its end


def test_a_dive_turn_stops_once_the_dives_patience_is_spent(monkeypatch):
    # patience is checked between a dive's steps too, not only between dives: in a slice far
    # longer than the patience, the dives stop once it is spent, and later turns wait for a
    # better plan (without even listing the orders). A fake clock: each step takes 1 s.
    ctx = _mixed()
    problem = ctx.problem(2)
    best_t, _, best = min((p for ps in _plans_by_order(problem).values() for p in ps), key=lambda p: p[0])
    search = _turning_search(ctx, monkeypatch, ORDER_SLICE_S=60.0, ORDER_PATIENCE=0, DIVE_PATIENCE_S=2.5)
    sub = search.subs[2] = SubProblem(b=2, problem=problem, lower_bound_s=0.0)
    sub.types = enumerate_types(problem, best_t * 1.5)
    search.offer(2, list(best), best_t)
    clock = [0.0]
    monkeypatch.setattr(patterns, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    steps = []

    def step(dive: Dive) -> bool:
        clock[0] += 1.0
        steps.append(dive)
        return True  # never done

    monkeypatch.setattr(Dive, "step", step)
    search.order_turn()
    assert search.dives and len(steps) == 3  # 1 s steps while less than 2.5 s were spent (60 without the check)
    assert search.dive_idle_s == pytest.approx(3.0)
    monkeypatch.setattr(patterns, "neighbour_orders", lambda *a: pytest.fail("orders listed after patience"))
    search.order_turn()
    assert len(steps) == 3
