"""The ``replica-case`` lower bound: every replica count of the hot experts, when few replicas are free.

With few spare slots (``sigma = sum S - E``) or a small redundant budget ``K``, a target ``T`` fixes most
replica counts: expert ``e`` needs ``c[e] = ceil(w[e] / T)`` replicas, and only ``free = K - sum (c[e] - 1)``
redundant replicas are left to distribute. Enumerating where they go (a few hundred *cases*) fixes how many
replicas are used and how many slots stay empty, and in each case the ranks of a hot expert (or of a group of
them) must also hold the other experts' replicas that fill their slots, the lightest whole experts at best.
If every case is refuted, no placement has max load ``T``; bisection gives the bound. The argument is in
:func:`case_infeasible` and formulations/expert_placement.md ("replica-case").

This is the cardinality-constrained partitioning view (``P|#=k|Cmax``: Babel, Kellerer & Kotov, Math. Methods
Oper. Res. 47 (1998); Dell'Amico & Martello, J. Heuristics 7 (2001)) extended to split experts: their bound
"a machine with the largest job also gets ``k - 1`` of the smallest" is the single-expert test of a case
with no free replica.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Container, Sequence
from itertools import accumulate

from tangram_opt.experts.problem import PlacementProblem

MAX_CASES = 1500  # count vectors examined per target; with more the test refutes nothing
MAX_M = 12  # experts whose counts are enumerated: the heaviest, and every expert that must be split ...
MAX_MUST = 24  # ... unless more than this many must be split (then the test refutes nothing)
MAX_PREFIX = 10  # groups "the t heaviest of M" tested per case
MAX_PAIRS = 6  # pairs among the heaviest of M tested per case
CASE_TIME_S = 1.0  # time for the whole bisection of case_bound


def _min_copies(p: PlacementProblem, T: float) -> list[int]:
    """Replicas each expert needs so that none serves more than ``T``."""
    return [max(1, math.ceil(w / T - 1e-12)) for w in p.loads]


class _Cases:
    """The ``replica-case`` test of one target ``T`` (see :func:`case_infeasible` for the argument)."""

    def __init__(self, p: PlacementProblem, T: float, max_cases: int):
        E, w = p.experts, p.loads
        self.T, self.tol = T, 1e-9 * T
        self.c = c = _min_copies(p, T)
        cmax = [p.max_copies(e) for e in range(E)]
        K = p.max_replicas - E
        self.free = K - sum(ci - 1 for ci in c)
        self.impossible = any(ci > cm for ci, cm in zip(c, cmax)) or self.free < 0
        self.undecided = False
        if self.impossible:
            return
        self.sigma = sum(p.slots_per_rank) - E
        pos = sorted(s for s in p.slots_per_rank if s > 0)
        self.Rp = len(pos)
        self.small = [0, *accumulate(pos)]
        order = sorted(range(E), key=lambda e: -w[e])
        must = [e for e in order if c[e] >= 2]
        if len(must) > MAX_MUST or math.comb(len(must) + 1 + self.free, self.free) > max_cases:
            self.undecided = True
            return
        M = list(must)
        for e in order:  # the heaviest whole-able experts join M while the case count allows
            if len(M) >= MAX_M or math.comb(len(M) + 2 + self.free, self.free) > max_cases:
                break
            if c[e] == 1:
                M.append(e)
        inM = set(M)
        self.rest = [w[e] for e in order if e not in inM]  # decreasing
        self.rest_asc = self.rest[::-1]
        self.m = len(M)
        self.wM = [w[e] for e in M]  # decreasing: experts that must be split are the heaviest
        self.cM = [c[e] for e in M]
        self.capM = [min(cmax[e], c[e] + self.free) for e in M]

    # --- one case: ``a`` (replicas of the experts of M) and ``x_rest``, set by :meth:`refuted` --------------
    def _incs(self, cap: int) -> list[tuple[float, int]]:
        """``(increment, expert of M)``, sorted, for the *split* experts ``g`` of ``M`` (``a[g] >= 2``): the
        increments of ``cost_g(j) = max(0, w[g] - (a[g] - j) T)``, ``j = 1..min(a[g], cap)`` (cached per case).
        A whole expert of ``M`` costs its load, which is at least every load of the rest (``M`` holds the
        heaviest experts), so those come after the rest in :meth:`_cheapest`."""
        lst = self._cache.get(cap)
        if lst is None:
            T, a = self.T, self.a
            lst = []
            for gi in self._split:
                ag, wg, prev = a[gi], self.wM[gi], 0.0
                for j in range(1, min(ag, cap) + 1):
                    cost = max(0.0, wg - (ag - j) * T)
                    lst.append((cost - prev, gi))
                    prev = cost
            lst.sort()
            self._cache[cap] = lst
        return lst

    def _cheapest(self, n: int, cap: int, excluded: Container[int], skip_rest: int = 0) -> float:
        """Least sum of ``n`` values of the multiset {``x_rest`` zeros; the increments of the experts of ``M``
        outside ``excluded``, at most ``cap`` each; the loads of the rest without its ``skip_rest`` heaviest};
        ``inf`` if it has fewer than ``n`` values."""
        need = n - self.x_rest
        if need <= 0:
            return 0.0
        incs = self._incs(cap)
        rest = self.rest_asc
        n_rest = len(rest) - skip_rest
        i = j = 0
        total = 0.0
        inf = math.inf
        whole = None
        for _ in range(need):
            while i < len(incs) and incs[i][1] in excluded:
                i += 1
            vi = incs[i][0] if i < len(incs) else inf
            if j < n_rest:
                vr = rest[j]
            else:  # the rest is used up: whole experts of M, lightest first
                if whole is None:
                    whole = [self.wM[g] for g in range(self.m - 1, -1, -1) if self.a[g] == 1 and g not in excluded]
                k = j - n_rest
                vr = whole[k] if k < len(whole) else inf
            if vi <= vr:
                if vi == inf:
                    return inf
                total += vi
                i += 1
            else:
                total += vr
                j += 1
        return total

    def _single_fails(self, h: int, excluded: Container[int]) -> bool:
        """The ``a[h]`` ranks holding ``h`` (no member of ``excluded`` on them) cannot stay within ``T``."""
        ah = self.a[h]
        spare = ah * self.T - self.wM[h]
        if spare < -self.tol:
            return True
        n = self.small[ah] - ah - self.empty
        return n > 0 and self._cheapest(n, ah, excluded) > spare + self.tol

    def _group_fails(self, G: list[int]) -> bool:
        """The ranks ``Q`` holding any expert of ``G`` cannot stay within ``T`` whatever ``|Q| = q``."""
        a = self.a
        A = sum(a[g] for g in G)
        wG = sum(self.wM[g] for g in G)
        q_lo, q_hi = max(a[g] for g in G), min(A, self.Rp)
        Gs = frozenset(G)
        for q in range(q_lo, q_hi + 1):
            spare = q * self.T - wG
            if spare < -self.tol:
                continue
            n = self.small[q] - A - self.empty
            if n > 0 and self._cheapest(n, q_hi, Gs) > spare + self.tol:
                continue
            if q == A and any(self._single_fails(h, Gs) for h in G):
                continue  # disjoint: each member's ranks hold no other member
            return False
        return True

    def refuted(self, a: list[int], x_rest: int) -> bool:
        """Is the case (``a`` on ``M``, ``x_rest`` redundant replicas of the rest) refuted at ``T``?"""
        X = sum(ai - 1 for ai in a) + x_rest  # experts outside M have c[e] = 1
        self.a, self.x_rest, self.empty, self._cache = a, x_rest, self.sigma - X, {}
        self._split = [g for g in range(self.m) if a[g] >= 2]
        if self.empty < 0:
            return True
        m = self.m
        for h in range(m):
            if self._single_fails(h, (h,)):
                return True
        if x_rest < len(self.rest):  # among the x_rest + 1 heaviest of the rest one is whole
            n = self.small[1] - 1 - self.empty
            if n > 0 and self.rest[x_rest] + self._cheapest(n, 1, (), skip_rest=1) > self.T + self.tol:
                return True
        for t in range(2, min(m, MAX_PREFIX) + 1):
            if self._group_fails(list(range(t))):
                return True
        for i in range(min(m, MAX_PAIRS)):
            for j in range(i + 1, min(m, MAX_PAIRS)):
                if (i, j) != (0, 1) and self._group_fails([i, j]):  # (0, 1) is the prefix t = 2
                    return True
        return False

    def all_refuted(self, deadline: float = math.inf) -> bool:
        """True if every case is refuted (False when undecided, or at ``deadline``, a ``perf_counter`` time)."""
        if self.impossible:
            return True
        if self.undecided:
            return False
        a = list(self.cM)
        visits = [0]

        def dfs(i: int, left: int) -> bool:
            visits[0] += 1
            if visits[0] % 64 == 0 and time.perf_counter() > deadline:
                raise TimeoutError
            if i == self.m:
                return all(self.refuted(a, x_rest) for x_rest in range(left + 1))
            for extra in range(0, min(left, self.capM[i] - self.cM[i]) + 1):
                a[i] = self.cM[i] + extra
                if not dfs(i + 1, left - extra):
                    a[i] = self.cM[i]
                    return False
            a[i] = self.cM[i]
            return True

        try:
            return dfs(0, self.free)
        except TimeoutError:
            return False


def case_infeasible(p: PlacementProblem, T: float, *, max_cases: int = MAX_CASES,
                    deadline: float = math.inf) -> bool:
    """True if no placement has every rank load <= ``T``, by enumerating replica counts (``replica-case``).

    A placement within ``T`` gives expert ``e`` at least ``c[e] = ceil(w[e] / T)`` replicas, using
    ``sum (c[e] - 1)`` of the ``K`` redundant replicas; ``free`` are left. ``M`` holds every expert with
    ``c[e] >= 2`` and the heaviest others (as many as ``max_cases`` allows); the rest are whole except at most
    ``x_rest`` of them. A *case* fixes ``a[e] >= c[e]`` for ``e`` in ``M`` and ``x_rest``, so ``X`` (redundant
    replicas used) and the empty slots ``sigma - X`` are known. For a group ``G`` of ``M`` whose replicas sit on
    a set ``Q`` of ``q`` ranks (``max a[G] <= q <= sum a[G]``):

    * ``Q`` has at least ``small(q)`` slots (the ``q`` smallest positive slot counts), at most ``sigma - X``
      empty, so other experts have ``N = small(q) - sum a[G] - (sigma - X)`` replicas or more on ``Q``;
    * ``j`` replicas on ``Q`` of ``g`` in ``M`` serve at least ``max(0, w[g] - (a[g] - j) T)`` (its other
      replicas serve at most ``T`` each). A split expert ``g`` of the rest (``1 + x[g]`` replicas) has at most
      ``x[g]`` replicas on ``Q`` that may serve nothing; if all its replicas are there they serve ``w[g]``,
      exactly like one whole expert. So the rest contributes at most ``x_rest`` free replicas, and every
      other replica on ``Q`` costs the load of a distinct expert of the rest;
    * ``Q`` serves ``w(G)`` plus at least the ``N`` smallest marginal costs (each cost is convex in its
      count), and at most ``q T``. When ``q = sum a[G]`` no rank holds two members of ``G``, so each member's
      own ranks pass the same test with the other members left out.

    A case is refuted when, for some single expert, some group (the ``t`` heaviest of ``M``, pairs among the
    heaviest) or one whole expert of the rest (among the ``x_rest + 1`` heaviest of the rest one is whole),
    no ``q`` passes. Every placement within ``T`` (without two replicas of one expert on a rank, which loses
    nothing) is in some case, so if every case is refuted ``T`` is infeasible. With more than ``max_cases``
    cases, or at ``deadline`` (a ``time.perf_counter`` value), the test refutes nothing.
    """
    if T <= 0:
        return True
    return _Cases(p, T, max_cases).all_refuted(deadline)


def case_bound(p: PlacementProblem, lo: float, hi: float, *, iterations: int = 30,
               time_limit_s: float = CASE_TIME_S) -> float:
    """The largest target in ``[lo, hi]`` that :func:`case_infeasible` refutes (``lo`` if none), to a relative
    1e-4; a test cut short by ``time_limit_s`` (for all targets together) refutes nothing, which only stops the
    bisection early (every recorded target was refuted)."""
    deadline = time.perf_counter() + time_limit_s
    if hi <= lo or not case_infeasible(p, lo, deadline=deadline):
        return lo
    a, b = lo, hi
    for _ in range(iterations):
        if b - a <= 1e-5 * b or time.perf_counter() > deadline:
            break
        mid = (a + b) / 2
        if case_infeasible(p, mid, deadline=deadline):
            a = mid
        else:
            b = mid
    return a


# --- starts from the cases: replica counts the test cannot refute near the bound ---------------------------------
def case_counts(p: PlacementProblem, T: float, *, limit: int = 400, max_cases: int = MAX_CASES) -> list[list[int]]:
    """Replica counts (one per expert) of the cases :func:`case_infeasible` does not refute at ``T``, the rest
    whole (``x_rest = 0``); at most ``limit``. Empty when every case is refuted or the enumeration is too big."""
    cs = _Cases(p, T, max_cases)
    if cs.impossible or cs.undecided:
        return []
    order = sorted(range(p.experts), key=lambda e: -p.loads[e])[:cs.m]
    out: list[list[int]] = []
    a = list(cs.cM)

    def dfs(i: int, left: int) -> None:
        if len(out) >= limit:
            return
        if i == cs.m:
            if not cs.refuted(a, 0):
                counts = [1] * p.experts
                for e, ae in zip(order, a):
                    counts[e] = ae
                out.append(counts)
            return
        for extra in range(0, min(left, cs.capM[i] - cs.cM[i]) + 1):
            a[i] = cs.cM[i] + extra
            dfs(i + 1, left - extra)
        a[i] = cs.cM[i]

    dfs(0, cs.free)
    return out


def pack_counts(p: PlacementProblem, counts: Sequence[int]) -> list[dict[int, float]] | None:
    """Pieces ``w[e] / counts[e]``, heaviest first, each onto the least-loaded rank with a free slot, room in
    memory and no replica of that expert (longest processing time with slot counts); ``None`` if one does not fit.
    The slots left at the end are the hottest ranks' slots, so they take the lightest experts (or stay empty)."""
    R = p.ranks
    pieces = sorted(((p.loads[e] / c, e) for e, c in enumerate(counts) for _ in range(c)), key=lambda t: (-t[0], t[1]))
    served: list[dict[int, float]] = [{} for _ in range(R)]
    load = [0.0] * R
    mem = [0.0] * R
    for share, e in pieces:
        best = -1
        for r in range(R):
            if (len(served[r]) < p.slots_per_rank[r] and e not in served[r]
                    and mem[r] + p.bytes_of(e) <= p.memory_of(r) * (1 + 1e-12)
                    and (best < 0 or load[r] < load[best])):
                best = r
        if best < 0:
            return None
        served[best][e] = share
        load[best] += share
        mem[best] += p.bytes_of(e)
    return served


def case_starts(p: PlacementProblem, lower: float, upper: float, *, time_limit_s: float,
                target: float | None = None, tries: int = 12) -> list[dict[int, float]] | None:
    """A placement from the replica counts of the cases that are not refuted just above ``lower``: every
    such count vector is packed (:func:`pack_counts`), the ``tries`` best packings are improved by the local
    search, the best result is returned (``None`` if there was none). The greedies spend redundant replicas
    on the largest load per replica; with few spare slots the best counts often differ (a slot left empty
    next to a hot whole expert, or a second replica for a medium expert)."""
    from tangram_opt.experts.improve import local_search  # noqa: PLC0415 (improve imports nothing from here)

    t_end = time.perf_counter() + time_limit_s
    counts: list[list[int]] = []
    for rel in (1e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1):
        T = lower * (1 + rel)
        if T >= upper:
            break
        counts = case_counts(p, T)
        if counts or time.perf_counter() > t_end:
            break
    packed = []
    for c in counts:
        if time.perf_counter() > t_end:
            break
        s = pack_counts(p, c)
        if s is not None:
            packed.append((max(sum(d.values()) for d in s), s))
    packed.sort(key=lambda t: t[0])
    best, best_t = None, math.inf
    for i, (_, s) in enumerate(packed[:tries]):
        left = t_end - time.perf_counter()
        if left <= 0:
            break
        s = local_search(p, s, time_limit_s=left / (min(tries, len(packed)) - i), target=target)
        t = max(sum(d.values()) for d in s)
        if t < best_t:
            best, best_t = s, t
        if target is not None and best_t <= target:
            break
    return best
