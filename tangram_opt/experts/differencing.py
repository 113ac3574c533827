"""A start for full ranks: the differencing method for partitions with a cardinality per rank.

When (nearly) every slot is needed, "heaviest replica onto the lightest rank with a free slot" (the greedy's
packing step) has to put the last, lightest replicas wherever slots are left, and its hottest rank often
holds a hot replica next to medium ones. The differencing method of Karmarkar and Karp, in the balanced form
for ``m`` subsets of ``k`` items each (Michiels, Aarts, Korst, van Leeuwen and Spieksma, "Computer-assisted
proof of performance ratios for the Differencing Method", Discrete Optimization 9(1), 2012), keeps every
rank at exactly ``S`` items by construction:

1. replica counts: the replica budget is spent one replica at a time on the expert with the largest load per
   replica (as the greedy does), each expert capped by the ranks it fits on; every replica is an item of
   ``w[e] / c[e]`` tokens; zero-token items pad the list to ``R x S`` (an empty slot);
2. the items, heaviest first, are cut into ``S`` blocks of ``R``; each block is a partial partition (one item
   per rank);
3. the two partial partitions with the largest spread (max minus min rank sum) are merged by giving the
   heaviest rank of one the lightest rank of the other, and so on; this repeats until one remains.

Two replicas of an expert that land on one rank merge into one (a slot is freed). The shares are then
re-optimized by the split LP and improved by the local search (see :mod:`.api`). Only for equal slot counts
(the blocks need ``R`` items each) and when the result respects the memory limits.
"""

from __future__ import annotations

import heapq
import itertools

from tangram_opt.experts.problem import PlacementProblem


def replica_counts(p: PlacementProblem) -> list[int]:
    """Spend the redundant budget on the expert with the largest load per replica, one at a time."""
    cap = [p.max_copies(e) for e in range(p.experts)]
    count = [1] * p.experts
    heap = [(-w, e) for e, w in enumerate(p.loads) if cap[e] > 1]
    heapq.heapify(heap)
    for _ in range(p.max_replicas - p.experts):
        if not heap:
            break
        _, e = heapq.heappop(heap)
        count[e] += 1
        if count[e] < cap[e]:
            heapq.heappush(heap, (-p.loads[e] / count[e], e))
    return count


def differencing_placement(p: PlacementProblem) -> list[dict[int, float]] | None:
    """``served[r][e]`` from the balanced differencing method, or ``None`` when it does not apply (unequal
    slot counts, or a memory limit the result would break)."""
    R = p.ranks
    S = p.slots_per_rank[0]
    if S < 1 or any(s != S for s in p.slots_per_rank):
        return None
    count = replica_counts(p)
    items = sorted(((p.loads[e] / c, e) for e, c in enumerate(count) for _ in range(c)), key=lambda t: (-t[0], t[1]))
    if len(items) > R * S:
        return None
    items += [(0.0, -1)] * (R * S - len(items))
    tie = itertools.count()
    heap = []
    for b in range(S):
        part = [[share, [(share, e)]] for share, e in items[b * R:(b + 1) * R]]  # already heaviest first
        heap.append((-(part[0][0] - part[-1][0]), next(tie), part))
    heapq.heapify(heap)
    while len(heap) > 1:
        _, _, a = heapq.heappop(heap)
        _, _, b = heapq.heappop(heap)
        merged = sorted(([a[i][0] + b[R - 1 - i][0], a[i][1] + b[R - 1 - i][1]] for i in range(R)),
                        key=lambda t: -t[0])
        heapq.heappush(heap, (-(merged[0][0] - merged[-1][0]), next(tie), merged))
    served: list[dict[int, float]] = []
    for _, its in heap[0][2]:
        d: dict[int, float] = {}
        for share, e in its:
            if e >= 0:
                d[e] = d.get(e, 0.0) + share
        served.append(d)
    if p.expert_bytes is not None:
        for r, d in enumerate(served):
            if sum(p.bytes_of(e) for e in d) > p.memory_of(r) * (1 + 1e-12):
                return None
    return served
