"""The fill bound of a window (formulations/sequence_fill.py) against exhaustive enumeration: it
never lies above the best plan of its window and stage count, and says "no plan" only where there
is none."""

from __future__ import annotations

import dataclasses
import math

from hypothesis import HealthCheck, given, settings

from tangram_opt.planner.formulations.problem import FormulationOptions, choices_timing
from tangram_opt.planner.formulations.sequence_fill import fill_bound_s, fill_bounds_s
from tangram_opt.planner.formulations.stage_sequence import SequenceMIP
from tangram_opt.planner.formulations.stage_types import enumerate_types
from tangram_opt.planner.formulations.ticks import tick_for
from tangram_opt.testing.exhaustive import enumerate_plans

from test_sequence import _mixed, instances


def _plans(problem):
    """Multi-stage plans: (stage count, exact step time, period, largest stage tail, plan)."""
    out = []
    for plan in enumerate_plans(problem):
        if len(plan) >= 2:
            timing = choices_timing(problem, list(plan))
            tail = max(s.tail_s for s in timing.stages)
            out.append((len(plan), timing.step_time_s, timing.bottleneck_s, tail, plan))
    return out


def _check(problem, windows_per_size: int = 6) -> int:
    """For windows [lo, hi] between plan periods and every stage count: the bound is at most the
    best plan's step time of that window and count, and finite wherever such a plan exists; with a
    lower edge on the largest tail, the same over the plans with a tail above it."""
    types = enumerate_types(problem)
    plans = _plans(problem)
    checked = 0
    for P in sorted({n for n, *_ in plans}):
        mine = [q for q in plans if q[0] == P]
        periods = sorted({lam for _, _, lam, _, _ in mine})
        picks = periods[:: max(1, len(periods) // windows_per_size)]
        for lo in [0.0, *picks]:
            for hi in [h for h in picks if h >= lo][:3]:
                tick = tick_for(max(min(t for _, t, *_ in mine), problem.num_micro_batches * hi))
                tails = sorted({tail for *_, tail, _ in mine})
                # with a lower edge, the plans whose stage types all stand in their positions'
                # lists: one with a dominated stage above the edge is dominated by one below it,
                # which a node below the edge holds (as for the sequence model's tail rows)
                sized = dataclasses.replace(problem, min_stages=P, max_stages=P)
                listed = SequenceMIP(sized, FormulationOptions(tick_s=tick), types, P, 0.0, hi).build()
                for lower in [None, *tails[:: max(1, len(tails) // 3)]]:
                    inside = [t for _, t, lam, tail, plan in mine if lo - 1e-12 <= lam <= hi * (1 + 1e-12)
                              and (lower is None or (tail > lower and listed.hint_from(list(plan)) is not None))]
                    bound = fill_bounds_s(problem, types, lo, hi, (P, P), tick_s=tick, lower_tail_s=lower)
                    assert bound is not None and set(bound) == {P}
                    if inside:
                        assert bound[P] <= min(inside) * (1 + 1e-9), (P, lo, hi, lower, bound[P], min(inside))
                    checked += 1
    return checked


@settings(max_examples=10, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(instances())
def test_fill_bound_never_exceeds_the_best_plan_of_its_window(ctx):
    for b in ctx.pipeline_micro_batches():
        problem = ctx.problem(b)
        if problem.candidates and problem.schedule == "1f1b":
            _check(problem)


def test_fill_bound_on_unequal_links_and_its_stage_ranges():
    # fast H100 nodes beside slow-NIC L4 nodes: the links matter. One pass over a range of stage
    # counts gives what a pass per count gives, and the leaf form (a built sequence model) agrees
    ctx = _mixed(max_stages=4)
    problem = ctx.problem(2)
    assert _check(problem) >= 10
    types = enumerate_types(problem)
    plans = _plans(problem)
    periods = sorted({lam for *_, lam, _, _ in plans})
    hi = periods[len(periods) // 3]
    tick = tick_for(problem.num_micro_batches * hi)
    ranged = fill_bounds_s(problem, types, 0.0, hi, (2, 4), tick_s=tick)
    assert ranged is not None and set(ranged) == {2, 3, 4}
    for P in (2, 3, 4):
        single = fill_bounds_s(problem, types, 0.0, hi, (P, P), tick_s=tick)
        assert single is not None and single[P] == ranged[P]
        sized = dataclasses.replace(problem, min_stages=P, max_stages=P)
        seq = SequenceMIP(sized, FormulationOptions(tick_s=tick), types, P, 0.0, hi).build()
        assert fill_bound_s(seq) == (math.inf if seq.empty else ranged[P])


def test_fill_bound_sees_what_the_islands_gpus_cannot_hold():
    # one GPU fewer on an island than the plans of a stage count need: the program says "no plan"
    # for every window where the full cluster had one of that count and none fits the smaller one
    ctx = _mixed(max_stages=3)
    problem = ctx.problem(2)
    types = enumerate_types(problem)
    island = max(problem.island_gpus, key=problem.island_gpus.get)
    small = dataclasses.replace(problem, island_gpus={**problem.island_gpus, island: 1})
    full, fits = _plans(problem), _plans(small)
    hi = max(lam for *_, lam, _, _ in full)
    tick = tick_for(problem.num_micro_batches * hi)
    big = fill_bounds_s(problem, types, 0.0, hi, (2, 3), tick_s=tick)
    cut = fill_bounds_s(small, types, 0.0, hi, (2, 3), tick_s=tick)
    assert big is not None and cut is not None
    for P in (2, 3):
        if any(n == P for n, *_ in full):
            assert math.isfinite(big[P])
        if not any(n == P for n, *_ in fits):
            assert cut[P] == math.inf
        else:
            assert cut[P] <= min(t for n, t, *_ in fits if n == P) * (1 + 1e-9)
