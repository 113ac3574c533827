"""Cardinality-aware lower bounds of expert placement against exact optima found by enumeration.

Every bound in ``lower_bounds`` (and the crowding test at the optimum) must be below the brute-force optimum
on small instances, in particular full ones (every slot needed: ``sum S == E``) and ones with a few spare
slots, with and without replication, with unequal slot counts. Deterministic (hypothesis derandomized)."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tangram_opt.experts import lower_bounds, make_problem, place_experts, synthetic_expert_loads
from tangram_opt.experts.bounds import crowding_infeasible, pigeonhole_fill_bound, spread_fill_bound


# --- exact optima -------------------------------------------------------------------------------------------
def gale_max_load(loads, holders):
    """Least max rank load for fixed replicas: max over expert sets A of w(A) / |ranks holding A|
    (Gale's supply-demand theorem; independent of the split LP)."""
    E = len(loads)
    rank_mask = [0] * E
    for r, h in enumerate(holders):
        for e in h:
            rank_mask[e] |= 1 << r
    best = 0.0
    for mask in range(1, 2 ** E):
        ranks, tot = 0, 0.0
        for e in range(E):
            if mask >> e & 1:
                ranks |= rank_mask[e]
                tot += loads[e]
        best = max(best, tot / bin(ranks).count("1"))
    return best


def exact_optimum(loads, slots, max_redundant=None):
    """Optimal max load over every replica set (ranks with equal slot counts are interchangeable, so one
    multiset of replica sets per group of equal ranks is enough)."""
    E = len(loads)
    spare = sum(slots) - E
    P = min(sum(slots), E + (spare if max_redundant is None else max_redundant))
    groups: dict[int, int] = {}
    for s in slots:
        groups[s] = groups.get(s, 0) + 1
    choices = []
    for s, n in sorted(groups.items()):
        subsets = [c for k in range(s + 1) for c in itertools.combinations(range(E), k)]
        choices.append(list(itertools.combinations_with_replacement(subsets, n)))
    best = math.inf
    for combo in itertools.product(*choices):
        holders = [h for grp in combo for h in grp]
        if sum(map(len, holders)) > P or len(set().union(*map(set, holders))) < E:
            continue
        best = min(best, gale_max_load(loads, holders))
    return best


def exact_whole(loads, slots):
    """Optimal max load when no expert may be split (``max_redundant = 0``): depth-first search over
    assignments, heaviest expert first, with rank-symmetry and load pruning."""
    order = sorted(range(len(loads)), key=lambda e: -loads[e])
    R = len(slots)
    load, used = [0.0] * R, [0] * R
    best = [math.inf]

    def go(i, cur):
        if cur >= best[0]:
            return
        if i == len(order):
            best[0] = cur
            return
        w = loads[order[i]]
        seen = set()
        for r in range(R):
            key = (load[r], used[r], slots[r])
            if used[r] >= slots[r] or key in seen:
                continue
            seen.add(key)
            load[r] += w
            used[r] += 1
            go(i + 1, max(cur, load[r]))
            load[r] -= w
            used[r] -= 1

    go(0, 0.0)
    return best[0]


def check_bounds(loads, slots, max_redundant, opt):
    p = make_problem(loads, len(slots), 1, slots, max_redundant=max_redundant)
    tol = 1e-9 * max(1.0, opt)
    for b in lower_bounds(p):
        assert b.value <= opt + tol, (b, opt, loads, slots, max_redundant)
    assert pigeonhole_fill_bound(p) <= opt + tol
    assert spread_fill_bound(p) <= opt + tol
    if opt > 0:  # the crowding test never refutes a target that some placement meets
        assert not crowding_infeasible(p, opt * (1 + 1e-12) + 1e-12), (loads, slots, max_redundant, opt)
    return p


# --- fixed cases: the claims of formulations/expert_placement.md ----------------------------------------------
def test_full_instance_bound_is_hottest_plus_lightest():
    # 8 experts on 2 ranks x 4 slots, every slot needed: the hottest expert's rank holds 3 more experts
    loads = [40, 9, 8, 7, 6, 3, 2, 1]
    opt = exact_whole(loads, [4, 4])
    assert opt == 40 + 1 + 2 + 3
    p = check_bounds(loads, [4, 4], 0, opt)
    assert max(b.value for b in lower_bounds(p)) == pytest.approx(opt)
    # with the two spare slots of 2 x 5 the hottest rank holds two experts fewer, still 3 in all ...
    assert exact_whole(loads, [5, 5]) == 40 + 1 + 2
    assert pigeonhole_fill_bound(make_problem(loads, 2, 1, 5, max_redundant=0)) == 40 + 1 + 2
    # ... and replication splits it: every bound stays below the enumerated optimum
    for slots, K in (([5, 5], 0), ([5, 4], 1), ([5, 5], 2), ([4, 4], None)):
        opt = exact_optimum(loads, slots, K) if K != 0 else exact_whole(loads, slots)
        check_bounds(loads, slots, K, opt)


def test_pigeonhole_fill_pairs_two_of_the_top_experts():
    # 3 ranks x 3 slots, 4 experts of 10: two share a rank, which holds a third expert (the lightest)
    loads = [10, 10, 10, 10, 1, 1, 1, 1, 1]
    opt = exact_whole(loads, [3, 3, 3])
    assert opt == 21
    p = check_bounds(loads, [3, 3, 3], 0, opt)
    assert pigeonhole_fill_bound(p) == pytest.approx(21)


def test_spread_fill_averages_over_the_hot_ranks():
    # 3 ranks x 2 slots, full: the two 10s sit on two ranks (together: 20), which hold two more experts,
    # at least 0 + 4: T >= (20 + 4) / 2 = 12, above the mean (32 / 3) and the hottest-plus-lightest (10)
    loads = [10, 10, 0, 4, 4, 4]
    opt = exact_whole(loads, [2, 2, 2])
    assert opt == 14
    p = check_bounds(loads, [2, 2, 2], 0, opt)
    assert spread_fill_bound(p) == pytest.approx(12)
    assert pigeonhole_fill_bound(p) == pytest.approx(10) and p.mean_load < 12


def test_few_spare_slots_limit_how_many_experts_are_split():
    # one spare slot: only one expert can be split, the other hot one keeps its rank full
    loads = [30, 30, 2, 2, 2, 1, 1]
    for slots, K in (([4, 4], None), ([3, 3, 2], None), ([3, 3, 2], 0)):
        opt = exact_optimum(loads, slots, K)
        check_bounds(loads, slots, K, opt)


def test_issue_instance_is_certified_within_one_percent():
    # 64 experts on 16 ranks x 4 slots (no spare slot), Zipf 1.0: the hottest expert plus the three lightest
    w = synthetic_expert_loads("zipf", 64, 1.0, tokens=64 * 4096, seed=1)
    pl = place_experts(w, 16, 2, 4, time_limit_s=10)
    srt = sorted(w)
    assert pl.max_load == pytest.approx(srt[-1] + sum(srt[:3]))
    assert pl.certificate.gap <= 0.01
    assert pl.certificate.max_load_bound == pytest.approx(pl.max_load, rel=1e-3)


# --- property tests -------------------------------------------------------------------------------------------
@st.composite
def replicated(draw):
    """Up to 5 experts on up to 3 ranks, 0-3 spare slots, any replica budget."""
    E = draw(st.integers(2, 5))
    R = draw(st.integers(1, 3))
    spare = draw(st.integers(0, 3))
    slots = [1] * R
    for _ in range(E + spare - R if E + spare > R else 0):
        slots[draw(st.integers(0, R - 1))] += 1
    if max(slots) > 3 or sum(slots) < E:
        slots = [math.ceil(E / R)] * R
    loads = draw(st.lists(st.sampled_from([0, 1, 2, 3, 5, 8, 13, 30, 60]), min_size=E, max_size=E))
    if sum(loads) == 0:
        loads[0] = 1
    K = draw(st.one_of(st.none(), st.integers(0, sum(slots) - E)))
    return loads, slots, K


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(replicated())
def test_bounds_below_the_enumerated_optimum_with_replication(inst):
    loads, slots, K = inst
    check_bounds(loads, slots, K, exact_optimum(loads, slots, K))


@st.composite
def whole(draw):
    """Up to 9 experts, no replication, 0-2 spare slots, unequal slot counts."""
    R = draw(st.integers(2, 4))
    E = draw(st.integers(R + 1, 9))
    spare = draw(st.integers(0, 2))
    slots = [1] * R
    for _ in range(E + spare - R):
        slots[draw(st.integers(0, R - 1))] += 1
    loads = draw(st.lists(st.integers(0, 50), min_size=E, max_size=E))
    if sum(loads) == 0:
        loads[0] = 1
    return loads, slots


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(whole())
def test_bounds_below_the_enumerated_optimum_without_replication(inst):
    loads, slots = inst
    opt = exact_whole(loads, slots)
    check_bounds(loads, slots, 0, opt)
    pl = place_experts(loads, len(slots), 1, slots, max_redundant=0, rel_gap=1e-6, time_limit_s=5)
    assert pl.max_load == pytest.approx(opt, rel=1e-6, abs=1e-9)
    assert pl.certificate.max_load_bound <= opt * (1 + 1e-9) + 1e-9
