"""Local search on placements (the incumbent for the MIP's warm start).

State: the tokens ``s[r][e]`` each rank serves of each expert it holds. Every step looks at the hottest
rank ``A`` and, over all other ranks ``B``, picks the move that lowers ``max(L_A, L_B)`` the most:

* **shift** -- ``e`` has replicas on ``A`` and ``B``: move ``min(s[A][e], (L_A - L_B) / 2)`` tokens
  (a replica left with no tokens is dropped, freeing its slot and a unit of the replica budget);
* **move** -- a replica of ``e`` moves from ``A`` to a free slot of ``B``;
* **replicate** -- a new replica of ``e`` on a free slot of ``B`` takes ``(L_A - L_B) / 2`` tokens (only
  while the replica budget ``P`` allows);
* **swap** -- replicas of ``e`` on ``A`` and ``g`` on ``B`` trade ranks.

All moves respect slots, memory and "one replica of an expert per rank". The search stops when the
hottest rank has no improving move or the time budget is spent; the exact shares for the final
replica set then come from the split LP (:mod:`.split`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from tangram_opt.experts.problem import PlacementProblem


def local_search(p: PlacementProblem, served: Sequence[dict[int, float]], *, time_limit_s: float = 1.0,
                 max_steps: int = 100_000) -> list[dict[int, float]]:
    """Improve ``served[r][e]`` (a valid placement) by moves on the hottest rank; returns a new one."""
    t_end = time.perf_counter() + time_limit_s
    s = [dict(d) for d in served]
    load = [sum(d.values()) for d in s]
    mem = [sum(p.bytes_of(e) for e in d) for d in s]
    replicas = sum(len(d) for d in s)
    R = p.ranks
    tol = 1e-9 * max(1.0, p.total_load)
    for step in range(max_steps):
        if step % 64 == 0 and time.perf_counter() > t_end:
            break
        A = max(range(R), key=lambda r: load[r])
        LA = load[A]
        best_val, best = LA - tol, None
        for B in range(R):
            if B == A:
                continue
            LB = load[B]
            if LB >= LA - tol:
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
                fits = free_B and mem[B] + p.bytes_of(e) <= p.memory_of(B) * (1 + 1e-12)
                if fits:
                    val = max(LA - se, LB + se)
                    if val < best_val:
                        best_val, best = val, ("move", A, B, e, se)
                    if se > half and replicas < p.max_replicas:
                        val = LA - half
                        if val < best_val:
                            best_val, best = val, ("replicate", A, B, e, half)
                for g, sg in sB.items():
                    if sg >= se or g in s[A]:
                        continue
                    if (p.expert_bytes is not None
                            and (mem[B] - p.bytes_of(g) + p.bytes_of(e) > p.memory_of(B) * (1 + 1e-12)
                                 or mem[A] - p.bytes_of(e) + p.bytes_of(g) > p.memory_of(A) * (1 + 1e-12))):
                        continue
                    val = max(LA - se + sg, LB + se - sg)
                    if val < best_val:
                        best_val, best = val, ("swap", A, B, e, g)
        if best is None:
            break
        kind, A, B, e, arg = best
        if kind == "swap":
            g = arg
            se, sg = s[A].pop(e), s[B].pop(g)
            s[B][e], s[A][g] = se, sg
            load[A] += sg - se
            load[B] += se - sg
            mem[A] += p.bytes_of(g) - p.bytes_of(e)
            mem[B] += p.bytes_of(e) - p.bytes_of(g)
            continue
        d = arg
        if kind == "move":
            s[A].pop(e)
            s[B][e] = d
            mem[A] -= p.bytes_of(e)
            mem[B] += p.bytes_of(e)
        else:
            if kind == "replicate":
                s[B][e] = 0.0
                replicas += 1
                mem[B] += p.bytes_of(e)
            s[A][e] -= d
            s[B][e] += d
            if s[A][e] <= tol:  # the replica on A serves nothing: drop it
                s[B][e] += s[A].pop(e)
                replicas -= 1
                mem[A] -= p.bytes_of(e)
        load[A] -= d
        load[B] += d
    return s
