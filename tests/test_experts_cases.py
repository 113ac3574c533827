"""The replica-case bound (tangram_opt/experts/cases.py) against exact optima found by enumeration, and the
starts it gives: every count vector of the hot experts when few replicas are free (few spare slots).

Exact optima come from an enumeration of replica sets written here (optimal shares of a replica set by
Gale's supply-demand formula), independent of the bounds and of the MIP. Deterministic (hypothesis
derandomized), a few seconds."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tangram_opt.experts import check_placement, lower_bounds, make_problem, place_experts, synthetic_expert_loads
from tangram_opt.experts.bounds import crowding_infeasible
from tangram_opt.experts.cases import case_bound, case_counts, case_infeasible, case_starts, pack_counts
from tangram_opt.experts.placement import PlacementCertificate, build_placement


def gale(loads, holders, R):
    """Least max rank load for fixed replicas (``holders[e]``: ranks of ``e``): max over expert sets A of
    w(A) / |ranks holding A| (Gale's supply-demand theorem)."""
    masks = [sum(1 << r for r in rs) for rs in holders]
    best = 0.0
    for A in range(1, 1 << len(loads)):
        ranks, tot = 0, 0.0
        for e, w in enumerate(loads):
            if A >> e & 1:
                ranks |= masks[e]
                tot += w
        best = max(best, tot / bin(ranks).count("1"))
    return best


def exact(loads, slots, max_redundant=None):
    """Optimal max load over every replica set (depth first, heaviest expert first, pruned by w / copies)."""
    E, R = len(loads), len(slots)
    P = min(sum(slots), E + (sum(slots) - E if max_redundant is None else max_redundant))
    order = sorted(range(E), key=lambda e: -loads[e])
    subsets = sorted((tuple(r for r in range(R) if m >> r & 1) for m in range(1, 1 << R)), key=len)
    used, hold, best = [0] * R, [()] * E, [math.inf]

    def dfs(i, reps):
        if i == E:
            best[0] = min(best[0], gale(loads, hold, R))
            return
        e = order[i]
        for sub in subsets:
            if reps + len(sub) > P - (E - i - 1) or any(used[r] >= slots[r] for r in sub):
                continue
            if loads[e] / len(sub) >= best[0]:
                continue
            for r in sub:
                used[r] += 1
            hold[e] = sub
            dfs(i + 1, reps + len(sub))
            for r in sub:
                used[r] -= 1
        hold[e] = ()

    dfs(0, 0)
    return best[0]


def bounds_of(loads, slots, K=None):
    p = make_problem(loads, len(slots), 1, slots, max_redundant=K)
    return p, {b.source: b.value for b in lower_bounds(p)}


# --- fixed cases: the bound is the optimum where the others are not ------------------------------------------------
@pytest.mark.parametrize("loads, slots, opt", [
    # 3 ranks x 2 slots, one spare slot. Splitting a 60 leaves the other 60 whole next to a full slot (61 at
    # best); the optimum splits a light expert instead: 60 + 0.5 twice. The mean, replica-count and pigeonhole
    # bounds stop at 60; the cases refute every count vector below 60.5
    ([60, 1, 60, 3, 1], [2, 2, 2], 60.5),
    ([60, 13, 2, 60, 3], [2, 2, 2], 61.0),  # 60 + 1 twice (the 2 split), 13 + 3
    ([13, 13, 3, 2, 8], [2, 2, 2], 14.0),  # 13 + 1 twice (the 2 split), 8 + 3
])
def test_replica_case_bound_is_exact_where_the_others_are_not(loads, slots, opt):
    assert exact(loads, slots) == pytest.approx(opt)
    p, b = bounds_of(loads, slots)
    assert b["replica-case"] == pytest.approx(opt, rel=1e-4)  # bisection to a relative 1e-4
    assert max(v for k, v in b.items() if k != "replica-case") < opt - 0.4
    assert not case_infeasible(p, opt * (1 + 1e-9))
    assert case_infeasible(p, opt * (1 - 1e-3))


def test_few_spare_slots_benchmark_size_is_proven_optimal():
    # 60 experts (Qwen1.5-MoE-A2.7B's routed experts) on 16 ranks x 4 slots: 4 spare slots, Zipf 1.0. The
    # hottest expert needs 3 replicas, the second 2, which leaves one free replica; the older bounds stopped at
    # w_1 / 3 = 1.140 x mean, the cases prove 1.311 (the hottest expert's three ranks also hold 8 light experts)
    w = synthetic_expert_loads("zipf", 60, 1.0, tokens=60 * 4096, seed=1)
    p = make_problem(w, 16, 2, 4)
    b = {x.source: x.value for x in lower_bounds(p)}
    assert b["replica-case"] >= 1.31 * p.mean_load
    pl = place_experts(w, 16, 2, 4, time_limit_s=10)
    assert check_placement(p, pl) == []
    assert pl.certificate.gap <= 0.01
    assert pl.certificate.max_load_bound <= pl.max_load * (1 + 1e-9)


def test_case_starts_find_counts_the_greedy_misses():
    # Zipf 0.5 on the same size: the greedy's counts (3, 2, 2, 1 for the four hottest) leave a whole
    # 0.57 x mean expert that cannot get below 1.011 x mean; the cases' counts reach 1.003 or better
    w = synthetic_expert_loads("zipf", 60, 0.5, tokens=60 * 4096, seed=1)
    p = make_problem(w, 16, 2, 4)
    lb = max(b.value for b in lower_bounds(p))
    s = case_starts(p, lb, 1.02 * lb, time_limit_s=5.0, target=lb * 1.0005)
    assert s is not None
    pl = build_placement(p, s, method="mip", certificate=PlacementCertificate(status="feasible", objective=0.0,
                                                                              bound=0.0, max_load_bound=0.0))
    assert check_placement(p, pl) == []
    assert pl.max_load <= 1.003 * p.mean_load


def test_pack_counts_respects_slots_and_memory():
    p = make_problem([50, 40, 30, 20, 10, 5], 3, 1, 3, expert_bytes=[4, 4, 2, 2, 1, 1], rank_memory_bytes=7)
    s = pack_counts(p, [2, 1, 1, 1, 1, 1])
    assert s is not None
    for r, d in enumerate(s):
        assert len(d) <= 3 and sum(p.bytes_of(e) for e in d) <= 7
    assert sorted(round(sum(d.get(e, 0) for d in s), 9) for e in range(6)) == sorted([50, 40, 30, 20, 10, 5])
    assert pack_counts(p, [3, 3, 3, 1, 1, 1]) is None  # 12 replicas in 9 slots


def test_too_many_cases_refute_nothing():
    # the same 60 / 16 x 4 instance: 1.2 x mean is refuted, but not when the case budget is too small to
    # enumerate (the test then gives up rather than guess), and no counts are offered either
    w = synthetic_expert_loads("zipf", 60, 1.0, tokens=60 * 4096, seed=1)
    p = make_problem(w, 16, 2, 4)
    assert case_infeasible(p, 1.2 * p.mean_load)
    assert not case_infeasible(p, 1.2 * p.mean_load, max_cases=1)
    assert case_counts(p, 1.32 * p.mean_load)
    assert case_counts(p, 1.32 * p.mean_load, max_cases=1) == []


def test_many_spare_slots_do_not_break_the_crowding_test():
    # regression: more free replicas than experts indexed past the expert list
    p = make_problem([10, 1, 1], 2, 1, 10)
    assert crowding_infeasible(p, 6.0) is False
    assert case_infeasible(p, 6.0) is False


# --- property tests --------------------------------------------------------------------------------------------------
@st.composite
def few_spare(draw):
    """2-6 experts on 2-3 ranks, 0-2 spare slots (equal or unequal slot counts), any replica budget."""
    R = draw(st.integers(2, 3))
    E = draw(st.integers(R, 6))
    spare = draw(st.integers(0, 2))
    slots = [1] * R
    for _ in range(E + spare - R):
        slots[draw(st.integers(0, R - 1))] += 1
    loads = draw(st.lists(st.sampled_from([0, 1, 2, 3, 5, 8, 13, 21, 40, 60]), min_size=E, max_size=E))
    if sum(loads) == 0:
        loads[0] = 1
    K = draw(st.one_of(st.none(), st.integers(0, sum(slots) - E)))
    return loads, slots, K


@settings(max_examples=80, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(few_spare())
def test_replica_case_never_refutes_the_optimum(inst):
    loads, slots, K = inst
    opt = exact(loads, slots, K)
    p, b = bounds_of(loads, slots, K)
    tol = 1e-9 * max(1.0, opt)
    for source, value in b.items():
        assert value <= opt + tol, (source, value, opt, loads, slots, K)
    assert not case_infeasible(p, opt * (1 + 1e-12) + 1e-12), (loads, slots, K, opt)
    assert case_bound(p, 0.0, 2 * opt + 1) <= opt + tol
    # a case that is not refuted at the optimum packs into a valid placement
    for counts in case_counts(p, opt * (1 + 1e-9) + 1e-9, limit=3):
        s = pack_counts(p, counts)
        if s is not None:
            assert all(len(d) <= S for d, S in zip(s, slots))
