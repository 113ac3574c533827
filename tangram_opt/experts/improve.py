"""Local search on placements (the incumbent for the MIP's warm start).

State: the tokens ``s[r][e]`` each rank serves of each expert it holds. A step takes a rank ``A`` and, over
all cooler ranks ``B``, picks the move that lowers ``max(L_A, L_B)`` the most:

* **shift** -- ``e`` has replicas on ``A`` and ``B``: move ``min(s[A][e], (L_A - L_B) / 2)`` tokens
  (a replica left with no tokens is dropped, freeing its slot and a unit of the replica budget);
* **move** -- a replica of ``e`` moves from ``A`` to a free slot of ``B``;
* **replicate** -- a new replica of ``e`` on a free slot of ``B`` takes ``(L_A - L_B) / 2`` tokens (only
  while the replica budget ``P`` allows, and only for the hottest rank);
* **swap** -- replicas of ``e`` on ``A`` and ``g`` on ``B`` trade ranks;
* **exchange** (only when none of the above improves) -- one or two replicas of ``A`` trade places with
  one or two of ``B`` (2-for-2, 2-for-1, 1-for-2, slots permitting), the pair sums chosen by bisection so
  that ``A`` hands over as close to ``(L_A - L_B) / 2`` as possible. With every slot full, swaps are the only
  moves, and 2-for-2 exchanges reach the near-perfect partitions that single swaps miss (pairwise
  interchange neighbourhoods as in the cardinality-constrained scheduling heuristics of Dell'Amico, Iori and
  Martello, J. Heuristics 10, 2004).

``A`` is the hottest rank; when it has no improving move, the next hottest ranks are tried in turn (a
move there does not lower the maximum but makes room for later moves of the hottest), unless the hottest rank
is already within the caller's ``target`` (the bound plus half the gap tolerance). Every accepted move
lowers the sorted load vector lexicographically, so the search ends; it stops when no rank has an improving
move or the time budget is spent. All moves respect slots, memory and "one replica of an expert per rank".
The exact shares for the final replica set then come from the split LP (:mod:`.split`).
"""

from __future__ import annotations

import itertools
import math
import random
import time
from bisect import bisect_left
from collections.abc import Sequence

from tangram_opt.experts.problem import PlacementProblem


def local_search(p: PlacementProblem, served: Sequence[dict[int, float]], *, time_limit_s: float = 1.0,
                 max_steps: int = 100_000, target: float | None = None) -> list[dict[int, float]]:
    """Improve ``served[r][e]`` (a valid placement) by moves between ranks; returns a new one. Moves of the
    hottest rank go on until none improves; moves of the cooler ranks (which only make room) stop once the
    hottest rank is at most ``target``."""
    t_end = time.perf_counter() + time_limit_s
    st = _State(p, served)
    for _ in range(max_steps):
        if time.perf_counter() > t_end:
            break
        order = sorted(range(p.ranks), key=lambda r: -st.load[r])
        move = None
        for i, A in enumerate(order[:-1]):
            if i and (time.perf_counter() > t_end or (target is not None and st.load[order[0]] <= target)):
                break
            move = (st.best_move(A, allow_replicate=(i == 0), deadline=t_end)
                    or st.best_exchange(A, deadline=t_end))
            if move is not None:
                break
        if move is None:
            break
        st.apply(move)
    return st.s


def iterated_local_search(p: PlacementProblem, served: Sequence[dict[int, float]], *, time_limit_s: float,
                          target: float | None = None, seed: int = 0, rounds: int = 400) -> list[dict[int, float]]:
    """Local search, then rounds of kick + local search (iterated local search): a kick swaps a replica of
    the hottest rank and then one more pair of replicas, between random ranks; the result replaces the
    current placement when its hottest rank is not hotter. Seeded (``seed``) and capped at ``rounds``, so
    the result depends on the time only when ``time_limit_s`` runs out first."""
    t_end = time.perf_counter() + time_limit_s
    rng = random.Random(seed)
    cur = local_search(p, served, time_limit_s=time_limit_s, target=target)
    best, best_t = cur, _max_load(cur)
    cur_t = best_t
    tol = 1e-9 * max(1.0, p.total_load)
    for _ in range(rounds):
        if time.perf_counter() > t_end or (target is not None and best_t <= target):
            break
        kicked = _kick(p, cur, rng)
        if kicked is None:
            break
        cand = local_search(p, kicked, time_limit_s=max(0.0, t_end - time.perf_counter()), target=target)
        t = _max_load(cand)
        if t <= cur_t + tol:
            cur, cur_t = cand, t
            if t < best_t - tol:
                best, best_t = cand, t
    return best


def _max_load(served: Sequence[dict[int, float]]) -> float:
    return max(sum(d.values()) for d in served)


def _kick(p: PlacementProblem, served: Sequence[dict[int, float]], rng: random.Random
          ) -> list[dict[int, float]] | None:
    """Two random swaps of whole replicas (the first one out of the hottest rank), slots and memory kept."""
    s = [dict(d) for d in served]
    load = [sum(d.values()) for d in s]
    done = 0
    for attempt in range(40):
        A = max(range(p.ranks), key=lambda r: load[r]) if done == 0 else rng.randrange(p.ranks)
        B = rng.randrange(p.ranks)
        if A == B or not s[A] or not s[B]:
            continue
        e = rng.choice(sorted(s[A]))
        g = rng.choice(sorted(s[B]))
        if e in s[B] or g in s[A]:
            continue
        if p.expert_bytes is not None:
            mA = sum(p.bytes_of(x) for x in s[A]) - p.bytes_of(e) + p.bytes_of(g)
            mB = sum(p.bytes_of(x) for x in s[B]) - p.bytes_of(g) + p.bytes_of(e)
            if mA > p.memory_of(A) * (1 + 1e-12) or mB > p.memory_of(B) * (1 + 1e-12):
                continue
        se, sg = s[A].pop(e), s[B].pop(g)
        s[B][e], s[A][g] = se, sg
        load[A] += sg - se
        load[B] += se - sg
        done += 1
        if done == 2:
            return s
    return s if done else None


class _State:
    def __init__(self, p: PlacementProblem, served: Sequence[dict[int, float]]):
        self.p = p
        self.s = [dict(d) for d in served]
        self.load = [sum(d.values()) for d in self.s]
        self.mem = [sum(p.bytes_of(e) for e in d) for d in self.s]
        self.replicas = sum(len(d) for d in self.s)
        self.tol = 1e-9 * max(1.0, p.total_load)

    def _fits(self, r: int, extra_bytes: float) -> bool:
        return self.mem[r] + extra_bytes <= self.p.memory_of(r) * (1 + 1e-12)

    def best_move(self, A: int, *, allow_replicate: bool, deadline: float = math.inf) -> tuple | None:
        """The best shift, move, replicate or swap from ``A`` to a cooler rank (or ``None``); at ``deadline``
        (a ``time.perf_counter`` value) the best one found so far (one rank ``B`` costs ``O(S_A S_B)``)."""
        p, s, load = self.p, self.s, self.load
        LA = load[A]
        best_val, best = LA - self.tol, None
        for B in range(p.ranks):
            if B == A:
                continue
            if time.perf_counter() > deadline:
                break
            LB = load[B]
            if LB >= LA - self.tol:
                continue
            half = (LA - LB) / 2
            free_B = len(s[B]) < p.slots_per_rank[B]
            sB = s[B]
            for e, se in s[A].items():
                if e in sB:  # shift tokens between two replicas of e
                    d = min(se, half)
                    val = max(LA - d, LB + d)
                    if val < best_val:
                        best_val, best = val, ("shift", A, B, e, d)
                    continue
                if free_B and self._fits(B, p.bytes_of(e)):
                    val = max(LA - se, LB + se)
                    if val < best_val:
                        best_val, best = val, ("move", A, B, e, se)
                    if allow_replicate and se > half and self.replicas < p.max_replicas:
                        val = LA - half
                        if val < best_val:
                            best_val, best = val, ("replicate", A, B, e, half)
                for g, sg in sB.items():
                    if sg >= se or g in s[A]:
                        continue
                    if (p.expert_bytes is not None
                            and (not self._fits(B, p.bytes_of(e) - p.bytes_of(g))
                                 or not self._fits(A, p.bytes_of(g) - p.bytes_of(e)))):
                        continue
                    val = max(LA - se + sg, LB + se - sg)
                    if val < best_val:
                        best_val, best = val, ("swap", A, B, (e,), (g,))
        return best

    def best_exchange(self, A: int, *, deadline: float = math.inf) -> tuple | None:
        """The exchange (``give`` from ``A``, ``take`` from ``B``; sizes 2-2, 2-1 or 1-2) that lowers
        ``max(L_A, L_B)`` the most, or ``None``. For each set on ``B`` the sets on ``A`` whose sum is closest
        to ``sum + (L_A - L_B) / 2`` are found by bisection in the sorted sums. At ``deadline`` (a
        ``time.perf_counter`` value) the best exchange found so far."""
        p, s, load = self.p, self.s, self.load
        if time.perf_counter() > deadline:
            return None
        LA = load[A]
        sets_A = {a: sorted((sum(s[A][e] for e in c), c) for c in itertools.combinations(s[A], a)) for a in (1, 2)}
        keys_A = {a: [v for v, _ in lst] for a, lst in sets_A.items()}
        best_val, best = LA - self.tol, None
        for B in range(p.ranks):
            LB = load[B]
            if B == A or LB >= LA - self.tol:
                continue
            half = (LA - LB) / 2
            sB = s[B]
            for b in (1, 2):
                for take in itertools.combinations(sB, b):
                    if time.perf_counter() > deadline:
                        return best
                    if any(g in s[A] for g in take):
                        continue
                    vt = sum(sB[g] for g in take)
                    for a in (1, 2):
                        if a == b == 1:
                            continue  # the plain swap
                        if len(s[A]) - a + b > p.slots_per_rank[A] or len(sB) - b + a > p.slots_per_rank[B]:
                            continue
                        keys, lst = keys_A[a], sets_A[a]
                        i = bisect_left(keys, vt + half)
                        for j in (i - 2, i - 1, i, i + 1):
                            if not 0 <= j < len(lst):
                                continue
                            vg, give = lst[j]
                            d = vg - vt
                            if d <= 0 or any(e in sB for e in give):
                                continue
                            val = max(LA - d, LB + d)
                            if val >= best_val:
                                continue
                            if p.expert_bytes is not None:
                                db = sum(p.bytes_of(e) for e in give) - sum(p.bytes_of(g) for g in take)
                                if not self._fits(B, db) or not self._fits(A, -db):
                                    continue
                            best_val, best = val, ("swap", A, B, give, take)
        return best

    def apply(self, move: tuple) -> None:
        p, s, load, mem = self.p, self.s, self.load, self.mem
        kind, A, B, e, arg = move
        if kind == "swap":
            give, take = e, arg
            for x in give:
                s[B][x] = s[A].pop(x)
            for g in take:
                s[A][g] = s[B].pop(g)
            d = sum(s[B][x] for x in give) - sum(s[A][g] for g in take)
            db = sum(p.bytes_of(x) for x in give) - sum(p.bytes_of(g) for g in take)
            load[A] -= d
            load[B] += d
            mem[A] -= db
            mem[B] += db
            return
        d = arg
        if kind == "move":
            s[A].pop(e)
            s[B][e] = d
            mem[A] -= p.bytes_of(e)
            mem[B] += p.bytes_of(e)
        else:
            if kind == "replicate":
                s[B][e] = 0.0
                self.replicas += 1
                mem[B] += p.bytes_of(e)
            s[A][e] -= d
            s[B][e] += d
            if s[A][e] <= self.tol:  # the replica on A serves nothing: drop it
                s[B][e] += s[A].pop(e)
                self.replicas -= 1
                mem[A] -= p.bytes_of(e)
        load[A] -= d
        load[B] += d
