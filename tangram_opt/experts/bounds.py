"""Combinatorial lower bounds on the maximum rank load ``T`` of *any* placement (fractional shares).

Each bound is a short argument (proofs in formulations/expert_placement.md, section "Bounds"):

* ``mean``: the ranks serve all ``W`` tokens, so ``T >= W / R``.
* ``replica-count``: an expert with ``c[e]`` replicas puts at least ``w[e] / c[e]`` on one rank, and
  there are at most ``P`` replicas, so ``T >= min { max_e w[e] / c[e] : sum_e c[e] <= P,
  1 <= c[e] <= cmax[e] }``; the minimum is found exactly by giving replicas one at a time to the expert
  with the largest ``w[e] / c[e]`` (the objective is a max of decreasing functions of one ``c[e]`` each).
* ``top-j``: the ``j`` heaviest experts have at most ``j + K`` replicas (``K`` = redundant budget), so
  they are served by at most ``min(R, j + K)`` ranks: ``T >= w(top j) / min(R, j + K)``.
* ``pigeonhole``: at most ``K`` experts have more than one replica, so among the ``m = k R + K + 1``
  heaviest at least ``k R + 1`` are unsplit and some rank holds ``k + 1`` of them:
  ``T >= w_(m-k) + ... + w_(m)`` (loads sorted in decreasing order, 1-based).
* ``crowding``: a hot expert's replicas fill their ranks, and the other experts' replicas that do not
  fit in the remaining ranks' slots must squeeze into what the hot expert leaves free
  (:func:`crowding_infeasible` states the test; the bound is the largest target it refutes).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

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


def _min_copies(p: PlacementProblem, T: float) -> list[int]:
    return [max(1, math.ceil(w / T - 1e-12)) for w in p.loads]


def crowding_infeasible(p: PlacementProblem, T: float) -> bool:
    """True if no placement has every rank load <= ``T`` (a necessary condition fails).

    With ``c[e] = ceil(w[e] / T)`` replicas needed and slack ``sigma = P - sum c``: a hot expert ``h``
    with ``c'`` replicas (``c[h] <= c' <= c[h] + sigma``) occupies ``c'`` ranks whose spare load is at
    most ``c' T - w[h]``. The other experts need ``n_o = sum_{e != h} c[e]`` replicas but the other ranks
    have at most ``slots_o`` slots (the ``R - c'`` largest slot counts), so ``m = n_o - slots_o`` of them
    sit on ``h``'s ranks. A replica of ``e`` carries at least ``l[e] = max(0, w[e] - (c[e] - 1 + s) T)``
    (its siblings carry at most ``T`` each; ``s`` is the slack left for extra replicas, which may carry
    nothing), so those ``m`` replicas carry at least the ``m`` smallest of the pool {``c[e]`` copies of
    ``l[e]``} + {``s`` zeros}. If that exceeds the spare load for every ``c'``, ``T`` is infeasible.
    """
    if T <= 0:
        return True
    c = _min_copies(p, T)
    if any(ci > cm for ci, cm in zip(c, (p.max_copies(e) for e in range(p.experts)))):
        return True
    sigma = p.max_replicas - sum(c)
    if sigma < 0:
        return True
    slots_desc = sorted(p.slots_per_rank, reverse=True)
    for h in (e for e in range(p.experts) if c[e] >= 2):
        n_o = sum(c) - c[h]
        ok = False
        for extra in range(0, sigma + 1):
            ch = c[h] + extra
            if ch > p.max_copies(h):
                break
            s = sigma - extra
            slots_o = sum(slots_desc[:p.ranks - ch])
            m = n_o - slots_o
            if m <= 0:
                ok = True
                break
            if m > sum(slots_desc[:ch]) - ch:
                continue
            pool = [0.0] * s
            for e in range(p.experts):
                if e != h:
                    le = max(0.0, p.loads[e] - (c[e] - 1 + s) * T)
                    pool.extend([le] * c[e])
            need = sum(heapq.nsmallest(m, pool))
            if need <= ch * T - p.loads[h] + 1e-9 * T:
                ok = True
                break
        if not ok:
            return True
    return False


def crowding_bound(p: PlacementProblem, lo: float, hi: float, *, iterations: int = 40) -> float:
    """The largest target in ``[lo, hi]`` that :func:`crowding_infeasible` refutes (``lo`` if none).

    Valid without monotonicity of the test: the returned ``T`` was refuted, and the true problem is
    monotone (a placement within ``T`` is within every ``T' > T``), so the optimum exceeds it."""
    best = lo
    if hi <= lo or not crowding_infeasible(p, lo):
        return lo
    a, b = lo, hi
    for _ in range(iterations):
        mid = (a + b) / 2
        if crowding_infeasible(p, mid):
            best, a = mid, mid
        else:
            b = mid
        if b - a <= 1e-7 * b:
            break
    return best


def lower_bounds(p: PlacementProblem, *, upper: float | None = None) -> list[LoadBound]:
    """All combinatorial bounds (each valid on its own)."""
    out = [LoadBound(p.mean_load, "mean"), LoadBound(replica_count_bound(p), "replica-count")]
    w = sorted(p.loads, reverse=True)
    K = p.max_replicas - p.experts
    acc, best = 0.0, 0.0
    for j in range(1, p.experts + 1):
        acc += w[j - 1]
        best = max(best, acc / min(p.ranks, j + K))
    out.append(LoadBound(best, "top-j"))
    best = 0.0
    k = 1
    while k * p.ranks + K + 1 <= p.experts:
        m = k * p.ranks + K + 1
        best = max(best, sum(w[m - k - 1:m]))
        k += 1
    out.append(LoadBound(best, "pigeonhole"))
    base = max(b.value for b in out)
    hi = upper if upper is not None else max(p.loads)
    out.append(LoadBound(crowding_bound(p, base, hi), "crowding"))
    return out


def best_lower_bound(p: PlacementProblem, *, upper: float | None = None) -> LoadBound:
    """The strongest combinatorial bound; ``upper`` (a known feasible max load) limits the search range."""
    return max(lower_bounds(p, upper=upper), key=lambda b: b.value)
