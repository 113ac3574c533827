"""Combinatorial lower bounds on the maximum rank load ``T`` of *any* placement (fractional shares).

Each bound is a short argument (proofs in formulations/expert_placement.md, section "Bounds"). Notation:
``K = P - E`` redundant replicas allowed, ``sigma = sum S - E`` spare slots (``K <= sigma``), loads sorted
``w_(1) >= w_(2) >= ...``, ``R'`` ranks with at least one slot. An expert with a single replica is *whole*.

* ``mean``: the ranks serve all ``W`` tokens, so ``T >= W / R'``.
* ``replica-count``: an expert with ``c[e]`` replicas puts at least ``w[e] / c[e]`` on one rank, and
  there are at most ``P`` replicas, so ``T >= min { max_e w[e] / c[e] : sum_e c[e] <= P,
  1 <= c[e] <= cmax[e] }``; the minimum is found exactly by giving replicas one at a time to the expert
  with the largest ``w[e] / c[e]`` (the objective is a max of decreasing functions of one ``c[e]`` each).
* ``top-j``: the ``j`` heaviest experts have at most ``j + K`` replicas (``K`` = redundant budget), so
  they are served by at most ``min(R, j + K)`` ranks: ``T >= w(top j) / min(R, j + K)``.
* ``pigeonhole`` (with cardinality fill): at most ``K`` experts are split, so among the ``t`` heaviest at
  least ``t - K`` are whole and some rank holds ``c = ceil((t - K) / R')`` of them. That rank also holds
  at least ``S_r - sigma`` whole experts (slack lemma: its empty slots plus its replicas of split experts
  number at most ``sigma``), so its load is at least the lightest set of ``max(c, S_min - sigma)`` experts
  with ``c`` of them among the ``t`` heaviest. With every slot needed (``sigma = 0``) and ``c = 1`` this
  is "the hottest expert plus the ``S - 1`` lightest others".
* ``spread-fill``: the ranks ``Q`` holding a replica of one of the ``t`` heaviest experts serve all their
  tokens plus at least ``sum_Q S_r - t - sigma - K`` whole experts from outside the top ``t``; the
  average over ``Q`` bounds ``T`` for every possible ``|Q| = q``, and without replication some rank of
  ``Q`` also holds ``ceil(t / q)`` of the top ``t`` (pigeonhole with fill). ``T`` is at least the minimum
  over ``q`` (k-partitioning bounds in the spirit of Dell'Amico & Martello 2001, Babel et al. 1998).
* ``crowding``: an expert's replicas fill their ranks, and the other experts' replicas that do not
  fit in the remaining ranks' slots must squeeze into what it leaves free
  (:func:`crowding_infeasible` states the test; the bound is the largest target it refutes).
"""

from __future__ import annotations

import heapq
import math
import time
from bisect import bisect_left
from dataclasses import dataclass
from itertools import accumulate

from tangram_opt.experts.cases import CASE_TIME_S, case_bound
from tangram_opt.experts.problem import PlacementProblem


@dataclass(frozen=True, slots=True)
class LoadBound:
    value: float
    source: str


def replica_count_bound(p: PlacementProblem) -> float:
    """``min max_e w[e] / c[e]`` over replica counts within the budget ``P`` (exact, by a heap)."""
    cmax = [p.max_copies(e) for e in range(p.experts)]
    count = [1] * p.experts
    heap = [(-w, e) for e, w in enumerate(p.loads)]
    heapq.heapify(heap)
    for _ in range(p.max_replicas - p.experts):
        while heap and count[heap[0][1]] >= cmax[heap[0][1]]:
            heapq.heappop(heap)
        if not heap:
            break
        _, e = heapq.heappop(heap)
        count[e] += 1
        heapq.heappush(heap, (-p.loads[e] / count[e], e))
    return max(w / c for w, c in zip(p.loads, count))


class _Sorted:
    """Loads sorted in decreasing order with prefix sums, and the slot counts the fill bounds need."""

    def __init__(self, p: PlacementProblem):
        self.E = p.experts
        self.d = sorted(p.loads, reverse=True)
        self.pre = [0.0, *accumulate(self.d)]
        self.K = p.max_replicas - p.experts
        self.sigma = sum(p.slots_per_rank) - p.experts
        pos = sorted(s for s in p.slots_per_rank if s > 0)
        self.Rp = len(pos)
        self.smax = pos[-1]
        self.pos_slots = pos
        self.small = [0, *accumulate(pos)]  # small[q] = sum of the q smallest positive slot counts

    def smin_at_least(self, c: int) -> int:
        """The fewest slots of a rank that can hold ``c`` replicas."""
        return self.pos_slots[bisect_left(self.pos_slots, c)]

    def lightest_set(self, t: int, c: int, n: int) -> float:
        """Least total load of ``n`` distinct experts of which at least ``c`` are among the ``t`` heaviest
        (``inf`` if there is no such set). Swapping an expert outside the top ``t`` for a lighter-or-equal
        one keeps the count, and any top one weighs at least every other, so the best set takes the
        ``k = max(c, n - (E - t))`` lightest of the top ``t`` and the ``n - k`` lightest of the rest."""
        E = self.E
        k = max(c, n - (E - t))
        if k > t or n > E or n < 0:
            return math.inf
        j = n - k
        return (self.pre[t] - self.pre[t - k]) + (self.pre[E] - self.pre[E - j])

    def lightest_rest(self, t: int, n: int) -> float:
        """Least total load of ``n`` experts outside the ``t`` heaviest (``inf`` if fewer exist)."""
        if n <= 0:
            return 0.0
        if n > self.E - t:
            return math.inf
        return self.pre[self.E] - self.pre[self.E - n]

    def pigeon_fill(self, t: int, c: int) -> float:
        """Load of a rank holding ``c`` whole experts from the top ``t``, filled to ``S - sigma`` whole ones."""
        if c > self.smax:
            return math.inf
        n = max(c, self.smin_at_least(c) - self.sigma)
        return self.lightest_set(t, c, n)


def pigeonhole_fill_bound(p: PlacementProblem) -> float:
    """``pigeonhole`` with cardinality fill (module docstring); for each ``c`` the smallest ``t`` is best."""
    s = _Sorted(p)
    best = 0.0
    c = 1
    while True:
        t = (c - 1) * s.Rp + s.K + 1  # the fewest heaviest experts that put c whole ones on one rank
        if t > s.E or c > s.smax:
            break
        best = max(best, s.pigeon_fill(t, c))
        c += 1
    return best


def spread_fill_bound(p: PlacementProblem, *, deadline: float = math.inf) -> float:
    """``spread-fill`` (module docstring): ``max_t min_q`` of the average over ``q`` ranks (and, without
    replication, the pigeonhole inside them). Each ``t`` gives a valid bound, so at ``deadline`` (a
    ``time.perf_counter`` value) the maximum over the ``t`` examined so far is returned."""
    s = _Sorted(p)
    best = 0.0
    slack = s.sigma + s.K
    for t in range(1, s.E + 1):
        if t % 64 == 0 and time.perf_counter() > deadline:
            break
        q_lo = max(1, -(-t // s.smax))
        q_hi = min(s.Rp, t + s.K)
        low = math.inf
        for q in range(q_lo, q_hi + 1):
            fill = s.lightest_rest(t, s.small[q] - t - slack)
            val = (s.pre[t] + fill) / q
            if s.K == 0:
                val = max(val, s.pigeon_fill(t, -(-t // q)))
            low = min(low, val)
            if low <= best:
                break  # this t cannot raise the bound
        if low < math.inf:
            best = max(best, low)
    return best


def _min_copies(p: PlacementProblem, T: float) -> list[int]:
    return [max(1, math.ceil(w / T - 1e-12)) for w in p.loads]


def crowding_infeasible(p: PlacementProblem, T: float) -> bool:
    """True if no placement has every rank load <= ``T`` (a necessary condition fails).

    With ``c[e] = ceil(w[e] / T)`` replicas needed and slack ``sigma = P - sum c``: an expert ``h`` with
    ``c'`` replicas (``c[h] <= c' <= c[h] + sigma``; ``c' = 1`` is "h whole") occupies ``c'`` ranks ``H``
    whose spare load is at most ``c' T - w[h]``. The other experts need ``n_o = sum_{e != h} c[e]``
    replicas but the other ranks have at most ``slots_o`` slots (the ``R - c'`` largest slot counts), so
    ``m = n_o - slots_o`` more than the others' extra replicas sit on ``H``. An extra replica can make at
    most ``min(c[e], c' - 1)`` replicas of an expert on ``H`` cheap, so at least
    ``m2 = m - (sum of the s largest min(c[e], c' - 1))`` replicas on ``H`` belong to experts with exactly
    ``c[e]`` replicas (``s = sigma - (c' - c[h])``), each serving at least ``l[e] = max(0, w[e] - (c[e] - 1) T)``.
    If the ``m2`` smallest such values exceed the spare load for every ``c'``, ``T`` is infeasible.
    """
    if T <= 0:
        return True
    E, R = p.experts, p.ranks
    c = _min_copies(p, T)
    cmax = [p.max_copies(e) for e in range(E)]
    if any(ci > cm for ci, cm in zip(c, cmax)):
        return True
    sumc = sum(c)
    sigma = p.max_replicas - sumc
    if sigma < 0:
        return True
    top_slots = [0, *accumulate(sorted(p.slots_per_rank, reverse=True))]  # top_slots[k]: k largest
    level = [max(0.0, w - (ci - 1) * T) for w, ci in zip(p.loads, c)]
    pool = sorted(v for v, ci in zip(level, c) for _ in range(ci))
    pre = [0.0, *accumulate(pool)]
    neg_c = sorted(-ci for ci in c)  # c in decreasing order, negated (for bisect)
    pre_c = [0, *accumulate(-x for x in neg_c)]
    tol = 1e-9 * T

    def cheap(s: int, cap: int) -> int:
        """Sum of the ``s`` largest ``min(c[e], cap)`` (``h`` included: a weaker, still valid count)."""
        s = min(s, E)  # only E experts can have extra replicas
        j = min(s, bisect_left(neg_c, -cap + 0.5))  # entries with c >= cap come first
        return j * cap + pre_c[s] - pre_c[j]

    def smallest_without(h: int, m: int) -> float:
        """Sum of the ``m`` smallest pool values once ``h``'s ``c[h]`` copies are removed."""
        v, k = level[h], c[h]
        i = bisect_left(pool, v)  # ties are interchangeable: h's copies may sit at i..i+k-1
        return pre[m] if m <= i else pre[m + k] - k * v

    for h in sorted(range(E), key=lambda e: -p.loads[e]):
        n_o = sumc - c[h]
        refuted = True
        for ch in range(c[h], min(c[h] + sigma, cmax[h]) + 1):
            s = sigma - (ch - c[h])
            m = n_o - top_slots[R - ch]
            if m <= 0:
                refuted = False
                break
            if m > top_slots[ch] - ch:
                continue  # the others' replicas do not fit on H at all
            m2 = m - cheap(s, ch - 1) if ch > 1 else m
            need = smallest_without(h, m2) if m2 > 0 else 0.0
            if need <= ch * T - p.loads[h] + tol:
                refuted = False
                break
        if refuted:
            return True
    return False


def crowding_bound(p: PlacementProblem, lo: float, hi: float, *, iterations: int = 40,
                   deadline: float = math.inf) -> float:
    """The largest target in ``[lo, hi]`` that :func:`crowding_infeasible` refutes (``lo`` if none).

    Valid without monotonicity of the test: the returned ``T`` was refuted, and the true problem is
    monotone (a placement within ``T`` is within every ``T' > T``), so the optimum exceeds it. The
    bisection stops at ``deadline`` (a ``time.perf_counter`` value; one test is ``O(E log E)``)."""
    best = lo
    if hi <= lo or time.perf_counter() > deadline or not crowding_infeasible(p, lo):
        return lo
    a, b = lo, hi
    for _ in range(iterations):
        if time.perf_counter() > deadline:
            break
        mid = (a + b) / 2
        if crowding_infeasible(p, mid):
            best, a = mid, mid
        else:
            b = mid
        if b - a <= 1e-7 * b:
            break
    return best


def lower_bounds(p: PlacementProblem, *, upper: float | None = None, deadline: float = math.inf
                 ) -> list[LoadBound]:
    """All combinatorial bounds (each valid on its own).

    ``deadline`` (a ``time.perf_counter`` value) cuts the iterative ones short (``spread-fill``,
    ``crowding``, ``replica-case``: each returns the best value proven so far); ``mean``, ``replica-count``,
    ``top-j`` and ``pigeonhole`` always run, in ``O(E log E + P log E)``."""
    ranks_with_slots = sum(1 for s in p.slots_per_rank if s > 0)
    out = [LoadBound(p.total_load / ranks_with_slots, "mean"), LoadBound(replica_count_bound(p), "replica-count")]
    w = sorted(p.loads, reverse=True)
    K = p.max_replicas - p.experts
    acc, best = 0.0, 0.0
    for j in range(1, p.experts + 1):
        acc += w[j - 1]
        best = max(best, acc / min(p.ranks, j + K))
    out.append(LoadBound(best, "top-j"))
    out.append(LoadBound(pigeonhole_fill_bound(p), "pigeonhole"))
    out.append(LoadBound(spread_fill_bound(p, deadline=deadline), "spread-fill"))
    base = max(b.value for b in out)
    hi = upper if upper is not None else p.total_load  # no placement has a rank above W
    out.append(LoadBound(crowding_bound(p, base, hi, deadline=deadline), "crowding"))
    base = max(b.value for b in out)
    left = deadline - time.perf_counter()
    if left > 0:
        out.append(LoadBound(case_bound(p, base, hi, time_limit_s=min(CASE_TIME_S, left)), "replica-case"))
    return out


def best_lower_bound(p: PlacementProblem, *, upper: float | None = None, deadline: float = math.inf
                     ) -> LoadBound:
    """The strongest combinatorial bound; ``upper`` (a known feasible max load) limits the search range,
    ``deadline`` (a ``time.perf_counter`` value) the time (see :func:`lower_bounds`)."""
    return max(lower_bounds(p, upper=upper, deadline=deadline), key=lambda b: b.value)
