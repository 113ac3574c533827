"""The public greedy baseline: hierarchical load balancing with redundant experts.

Written from the published description of DeepSeek's expert-parallelism load balancer (EPLB,
"hierarchical load balancing", DeepSeek-V3 technical report, arXiv:2412.19437, section 3.4, and
the EPLB README), not from its code:

1. **groups to nodes** -- when the expert groups divide evenly over the nodes, pack the groups onto the
   nodes so that every node gets the same number of groups and node loads are balanced (heaviest group
   first, onto the lightest node that still has room: longest-processing-time with a count limit);
2. **replicate within each node** -- give each node its share of the redundant slots and spend them one
   at a time on the node's expert with the largest load per replica (a replica serves ``w / c`` of an
   expert with ``c`` replicas: EPLB splits an expert's tokens evenly over its replicas);
3. **replicas to GPUs** -- pack the node's replicas onto its ranks, heaviest replica first, onto the
   lightest rank with a free slot.

When the groups do not divide over the nodes (or there is one node) the same steps run on the whole
EP group at once (EPLB's "global" policy).

Generalisations needed for our inputs, kept in the spirit of the policy: ranks may have different slot
counts and a replica budget below the slot count (``max_redundant``), so a node's redundant share is
``(P - E) / N`` rounded, with the remainder going to the heaviest nodes and never beyond the node's free
slots; step 3 skips ranks whose slots or memory are full and never puts two replicas of one expert on the
same rank (a second copy on the same GPU would only waste a slot); a redundant replica that fits on no
rank (or would leave too few slots or bytes for experts still without a replica) is dropped, and its
expert's load is split evenly over the replicas that were placed. The default grouping is one expert per group (the most
freedom the policy can have); DeepSeek-V3 uses 8 groups of 32 experts (``num_groups=8``).
"""

from __future__ import annotations

import heapq

from tangram_opt.errors import InfeasibleError, SpecError
from tangram_opt.experts.problem import PlacementProblem


def _pack_equal_counts(weights: list[float], packs: int) -> list[list[int]]:
    """Items to ``packs`` packs of equal item count, heaviest first onto the lightest pack with room."""
    per = len(weights) // packs
    out: list[list[int]] = [[] for _ in range(packs)]
    heap = [(0.0, k) for k in range(packs)]  # (load, pack) of the packs with room
    for i in sorted(range(len(weights)), key=lambda i: (-weights[i], i)):
        load, k = heapq.heappop(heap)
        out[k].append(i)
        if len(out[k]) < per:
            heapq.heappush(heap, (load + weights[i], k))
    return out


def _replicate(p: PlacementProblem, experts: list[int], extra: int, max_copies: int) -> dict[int, int]:
    """Spend ``extra`` replicas, one at a time, on the expert with the largest load per replica."""
    count = {e: 1 for e in experts}
    heap = [(-p.loads[e], e) for e in experts]
    heapq.heapify(heap)
    for _ in range(extra):
        while heap:
            _, e = heapq.heappop(heap)
            if count[e] < max_copies:
                break
        else:
            break
        count[e] += 1
        heapq.heappush(heap, (-p.loads[e] / count[e], e))
    return count


def _pack_replicas(p: PlacementProblem, ranks: list[int], count: dict[int, int], holders: list[list[int]],
                   served: list[dict[int, float]], mem_used: list[float]) -> None:
    """Step 3: replicas (``w / c`` each) onto ``ranks``, heaviest first onto the lightest rank with room."""
    pieces = sorted(((p.loads[e] / c, e) for e, c in count.items() for _ in range(c)), key=lambda t: (-t[0], t[1]))
    load = {r: sum(served[r].values()) for r in ranks}
    pending = dict(count)
    placed: dict[int, list[int]] = {e: [] for e in count}
    # running totals and a heap of the ranks with a free slot, so that a piece costs O(log ranks) instead of
    # O(experts + ranks) (20,000 experts on 64 ranks took a minute with the totals recomputed per piece)
    unplaced, unplaced_bytes = len(count), sum(p.bytes_of(g) for g in count)
    free_slots = sum(p.slots_per_rank[r] - len(holders[r]) for r in ranks)
    free_bytes = sum(p.memory_of(r) - mem_used[r] for r in ranks)
    heap = [(load[r], r) for r in ranks if len(holders[r]) < p.slots_per_rank[r]]
    heapq.heapify(heap)
    for share, e in pieces:
        pending[e] -= 1
        # the lightest rank (ties: lowest id) with a free slot, no replica of e and room for its bytes
        skipped, r = [], None
        while heap:
            _, cand = item = heapq.heappop(heap)
            if e not in served[cand] and mem_used[cand] + p.bytes_of(e) <= p.memory_of(cand) * (1 + 1e-12):
                r = cand
                break
            skipped.append(item)
        redundant = bool(placed[e] or pending[e])
        if redundant and r is not None:
            # keep room (slots and bytes, in total) for the experts that have no replica yet (other than e)
            first = not placed[e]
            waiting, waiting_bytes = unplaced - first, unplaced_bytes - (p.bytes_of(e) if first else 0.0)
            if free_slots - 1 < waiting or free_bytes - p.bytes_of(e) < waiting_bytes:
                skipped.append((load[r], r))
                r = None
        for item in skipped:
            heapq.heappush(heap, item)
        if r is None:
            if redundant:
                continue  # a redundant replica that fits nowhere is dropped; its siblings take its share
            raise InfeasibleError(f"greedy: no rank among {ranks[0]}..{ranks[-1]} has a free slot and memory for "
                                  f"expert {e}", closest={"expert": e})
        holders[r].append(e)
        served[r][e] = share
        load[r] += share
        mem_used[r] += p.bytes_of(e)
        if len(holders[r]) < p.slots_per_rank[r]:
            heapq.heappush(heap, (load[r], r))
        free_slots -= 1
        free_bytes -= p.bytes_of(e)
        if not placed[e]:
            unplaced -= 1
            unplaced_bytes -= p.bytes_of(e)
        placed[e].append(r)
    for e, rs in placed.items():  # even split over the replicas actually placed
        if len(rs) != count[e]:
            for r in rs:
                served[r][e] = p.loads[e] / len(rs)


def greedy_placement(p: PlacementProblem, *, num_groups: int | None = None
                     ) -> tuple[list[list[int]], list[dict[int, float]]]:
    """EPLB-style hierarchical greedy. Returns ``holders[r]`` (experts in slot order, every replica)
    and ``served[r][e]`` (tokens of ``e`` served on ``r``: an even split over the replicas)."""
    E, R, N = p.experts, p.ranks, p.nodes
    G = E if num_groups is None else int(num_groups)
    if G < 1 or E % G:
        raise SpecError("num_groups", num_groups, f"must divide the number of experts ({E})",
                        "use a divisor of the expert count, e.g. 8 for DeepSeek-V3's 256 experts")
    per_group = E // G
    hierarchical = N > 1 and G % N == 0
    node_count = N if hierarchical else 1
    node_ranks = [list(range(n * (R // node_count), (n + 1) * (R // node_count))) for n in range(node_count)]
    # 1. groups -> nodes (equal group counts, balanced load)
    if hierarchical:
        group_load = [sum(p.loads[g * per_group:(g + 1) * per_group]) for g in range(G)]
        node_groups = _pack_equal_counts(group_load, N)
        node_experts = [sorted(e for g in gs for e in range(g * per_group, (g + 1) * per_group)) for gs in node_groups]
    else:
        node_experts = [list(range(E))]
    # 2. the redundant budget, split evenly over nodes (remainder to the heaviest), within free slots
    extra_total = p.max_replicas - E
    free = [sum(p.slots_per_rank[r] for r in rs) - len(es) for rs, es in zip(node_ranks, node_experts)]
    if min(free) < 0:
        raise InfeasibleError("greedy: a node got more experts than it has slots; use the MIP", closest={})
    node_load = [sum(p.loads[e] for e in es) for es in node_experts]
    extra = [min(free[n], extra_total // node_count) for n in range(node_count)]
    left = extra_total - sum(extra)
    for n in sorted(range(node_count), key=lambda n: (-node_load[n], n)):
        add = min(left, free[n] - extra[n])
        extra[n] += add
        left -= add
    holders: list[list[int]] = [[] for _ in range(R)]
    served: list[dict[int, float]] = [{} for _ in range(R)]
    mem_used = [0.0] * R
    for n in range(node_count):
        count = _replicate(p, node_experts[n], extra[n], max_copies=len(node_ranks[n]))
        # 3. replicas -> ranks of the node
        _pack_replicas(p, node_ranks[n], count, holders, served, mem_used)
    return holders, served
