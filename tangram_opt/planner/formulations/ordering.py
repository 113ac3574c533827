"""Orders and local search: from a multiset of stage types to the best real plan found.

The aggregated model chooses stage types without an order. :func:`try_order` (and
:func:`best_order`, for a solution of the model, which always has one) tries a few constructed
orders (island blocks, memory order, increasing tail, interleaved small and large stages), keeps
the best memory-feasible one by the exact closed form and polishes its layer split
(:func:`polish`); :func:`reorder` swaps middle stages while that helps, and :func:`turn_ends` tries
the plan reversed and its island blocks in other orders (which moves its end stages). :func:`support_class_best`
enumerates every order of a solution's support class: the aggregated leaves cut off classes whose
exact best is known (formulations/pipeline_mip.md §5). Every plan scored here is scored with the
closed form of pipeline_model.py, the quantity the certificate refers to.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from tangram_opt.planner.formulations.inflight import inflight_from_end, inflight_micro_batches
from tangram_opt.planner.formulations.pipeline_model import pipeline_timing
from tangram_opt.planner.formulations.problem import PipelineProblem, StageChoice
from tangram_opt.planner.formulations.stage_types import StageType

if TYPE_CHECKING:
    from tangram_opt.planner.formulations.aggregated import AggregatedMIP


def best_order(problem: PipelineProblem, first: StageType, mids: list[StageType], last: StageType) -> list[StageChoice]:
    """:func:`try_order` for a solution of the aggregated model, which always has a feasible order."""
    out = try_order(problem, first, mids, last)
    assert out is not None, "Hall's condition guarantees the memory order is feasible"
    return out


def try_order(problem: PipelineProblem, first: StageType, mids: list[StageType],
              last: StageType, *, polish_split: bool = True) -> list[StageChoice] | None:
    """Order the middle stages and polish the layer split on the exact objective (None if no
    order tried fits memory, the first stage's position included; ``polish_split=False``: the
    best order as is).

    Orders tried: island blocks in every island order (within a block, most memory-tolerant first,
    or largest step tail last), the pure memory order (always feasible by Hall's condition),
    increasing tail (repaired for memory) and two orders interleaving small and large stages.
    The best memory-feasible order is then improved by moving single layers between neighbouring
    stages while the exact step time drops (memory re-checked at every move).
    """
    cands = problem.candidates
    m = problem.num_micro_batches
    P = len(mids) + 2
    gpipe = problem.schedule == "gpipe"

    def feasible(order: list[StageType]) -> bool:
        if gpipe:
            return True
        for k, t in enumerate(order):
            r = P - 2 - k  # distance from the end of middle stage k (pipeline index k + 1)
            if t.tolerance < inflight_from_end(r, m):
                return False
        return True

    keys = (lambda t: -t.tolerance, lambda t: (t.tail_s - t.bwd_s, -t.tolerance))
    orders: list[list[StageType]] = [sorted(mids, key=keys[0]), _tail_order(mids, m)] + [
        _interleaved_order(problem, first, mids, last, prefer_heavy=h) for h in (True, False)]
    islands = sorted({cands[t.candidate].island for t in mids})
    if len(islands) <= 5:
        for perm in itertools.permutations(islands):
            for key in keys:
                orders.append([t for i in perm for t in sorted(
                    (t for t in mids if cands[t.candidate].island == i), key=key)])
    best, best_t = None, math.inf
    for order in orders:
        if not feasible(order):
            continue
        stages = [StageChoice(candidate=t.candidate, layers=t.layer_dict) for t in [first, *order, last]]
        t = exact_step_s(problem, stages)
        if t < best_t:
            best, best_t = stages, t
    if best is None or (not gpipe and first.tolerance < min(P, m)):
        return None
    return polish(problem, best) if polish_split else best


def _tail_order(mids: list[StageType], m: int) -> list[StageType]:
    """Middle stages by increasing step tail, repaired for memory.

    Without memory limits, increasing tail order minimizes the exposed tail
    ``max_k (tail_k - upstream_k)`` (exchange argument: of two neighbours, the one with the smaller
    tail goes first). Positions are filled from the end: at each distance the stage whose
    tolerance forces it there goes first, otherwise the largest remaining tail; this is feasible
    whenever Hall's condition holds.
    """
    left = sorted(mids, key=lambda t: (t.tail_s, t.tolerance))
    placed: list[StageType] = []  # from the end
    r = 1
    while left:
        need = inflight_from_end(r, m)
        forced = [t for t in left if t.tolerance <= need]
        pick = max(forced, key=lambda t: t.tail_s) if forced else left[-1]
        left.remove(pick)
        placed.append(pick)
        r += 1
    return placed[::-1]


def _interleaved_order(problem: PipelineProblem, first: StageType, mids: list[StageType], last: StageType,
                       prefer_heavy: bool) -> list[StageType]:
    """Middle stages ordered so that neighbours fit the period: the two-stage block
    ``(T_a + T_b) / 2 + c_ab`` of each boundary stays within the slowest stage time if it can.

    Built from the end (memory: a stage whose tolerance forces it to the current distance goes
    there): next to the stage just placed, the heaviest (``prefer_heavy``) or the lightest remaining
    stage whose block with it fits; if none fits, the lightest. Heavy stages end up separated by
    light ones, which is what the ``neighbours`` rows of the model allow.
    """
    cands = problem.candidates
    m = problem.num_micro_batches
    target = max(t.time_s for t in [first, *mids, last])

    def block(a: StageType, b: StageType) -> float:
        return (a.time_s + b.time_s) / 2 + problem.boundary_s(cands[a.candidate], cands[b.candidate])

    left = list(mids)
    placed: list[StageType] = []  # from the end
    nxt = last
    r = 1
    while left:
        need = inflight_from_end(r, m)
        pool = [t for t in left if t.tolerance <= need] or left
        fit = [t for t in pool if block(t, nxt) <= target * (1 + 1e-12)]
        if fit:
            pick = (max if prefer_heavy else min)(fit, key=lambda t: t.time_s)
        else:
            pick = min(pool, key=lambda t: block(t, nxt))
        left.remove(pick)
        placed.append(pick)
        nxt = pick
        r += 1
    return placed[::-1]


def exact_step_s(problem: PipelineProblem, stages: Sequence[StageChoice]) -> float:
    """The closed-form step time of ``stages`` in pipeline order (pipeline_model.py)."""
    cands = problem.candidates
    return pipeline_timing([(cands[s.candidate], s.layers) for s in stages], problem.boundaries_s(stages),
                           problem.num_micro_batches, problem.schedule).step_time_s


def fits_memory(problem: PipelineProblem, stages: Sequence[StageChoice]) -> bool:
    """Whether every stage holds at least one layer and fits its GPUs' memory at its position."""
    P = len(stages)
    return all(sum(st.layers.values()) >= 1 and fits_at(problem, st.candidate, st.layers, k, P)
               for k, st in enumerate(stages))


def fits_at(problem: PipelineProblem, candidate: int, layers: dict[str, int], k: int, P: int) -> bool:
    """Whether ``candidate`` holding ``layers`` fits its GPUs' memory as stage ``k`` of ``P``."""
    c = problem.candidates[candidate]
    inflight = inflight_micro_batches(k, P, problem.num_micro_batches, problem.schedule)
    return c.memory_bytes(layers, inflight, first=k == 0, last=k == P - 1) <= c.capacity_bytes


def reorder(problem: PipelineProblem, stages: list[StageChoice], max_evals: int = 800) -> list[StageChoice]:
    """Local search over the order of the middle stages: swap two of them while the exact step
    time drops and memory still fits (first-improvement, at most ``max_evals`` evaluations).

    It complements the constructed orders of :func:`try_order` on a window's best solution, where
    blocks, links and tails interact in ways no single construction rule covers.
    """
    cur = list(stages)
    cur_t = exact_step_s(problem, cur)
    evals = 0
    improved = True
    while improved and evals < max_evals:
        improved = False
        for a in range(1, len(cur) - 2):
            for b in range(a + 1, len(cur) - 1):
                if cur[a].candidate == cur[b].candidate and cur[a].layers == cur[b].layers:
                    continue
                trial = list(cur)
                trial[a], trial[b] = trial[b], trial[a]
                if not fits_memory(problem, trial):
                    continue
                evals += 1
                t = exact_step_s(problem, trial)
                if t < cur_t * (1 - 1e-12):
                    cur, cur_t, improved = trial, t, True
                if evals >= max_evals:
                    return cur
    return cur


#: :func:`turn_ends` tries every order of a plan's island blocks when it has at most this many
#: (4! orders, each as is and with every block reversed: 48 plans, a few ms to score)
TURN_MAX_BLOCKS = 4
#: ... and polishes the layer split of this many of the best trials (scored unpolished)
TURN_POLISH = 3


def in_plan_space(problem: PipelineProblem, stages: Sequence[StageChoice]) -> bool:
    """The plan space the certificates refer to: with dense-first layers (two layer kinds), all
    dense layers on the first stage (formulations/pipeline_mip.md §2)."""
    if len(problem.kinds) < 2:
        return True
    dense = problem.kinds[0]
    return all(not s.layers.get(dense, 0) for s in stages[1:])


def turn_ends(problem: PipelineProblem, stages: list[StageChoice]) -> list[StageChoice]:
    """The best of ``stages`` and the plans that hand its ends to other stages: the plan reversed
    and, with at most ``TURN_MAX_BLOCKS`` island blocks (maximal runs of one island), every order
    of the blocks, each block as is or reversed; the ``TURN_POLISH`` best of those that fit memory
    and the plan space get their layer split polished.

    Under 1F1B the first stage holds the most micro-batches in flight and finishes its backward
    last, so its gradient sync is the one left exposed after the drain; which stages take the ends
    decides much of the step where syncs are slow. The window and knapsack models choose the end
    stages, and :func:`reorder` only swaps middle ones: on "256 A100+L4, 2 zones 2 ms" the roots'
    best plan (A100 stages, then L4 ones) went from 7.762 s to 7.564 s reversed.
    """
    cands = problem.candidates
    blocks: list[list[StageChoice]] = []
    for k, st in enumerate(stages):
        if k and cands[st.candidate].island == cands[stages[k - 1].candidate].island:
            blocks[-1].append(st)
        else:
            blocks.append([st])
    if len(blocks) <= TURN_MAX_BLOCKS:  # the blocks reversed, each reversed too, is the plan reversed
        trials = [[st for blk in perm for st in (reversed(blk) if flip else blk)]
                  for perm in itertools.permutations(blocks) for flip in (False, True)]
    else:
        trials = [list(reversed(stages))]
    seen = {_plan_key(stages)}
    scored: list[tuple[float, int, list[StageChoice]]] = []
    for n, trial in enumerate(trials):
        key = _plan_key(trial)
        if key in seen or not in_plan_space(problem, trial) or not fits_memory(problem, trial):
            continue
        seen.add(key)
        scored.append((exact_step_s(problem, trial), n, trial))
    best, best_t = stages, exact_step_s(problem, stages)
    for _, _, trial in sorted(scored, key=lambda q: q[:2])[:TURN_POLISH]:
        trial = polish(problem, trial)
        t = exact_step_s(problem, trial)
        if t < best_t * (1 - 1e-12) and in_plan_space(problem, trial):
            best, best_t = trial, t
    return best


def _plan_key(stages: Sequence[StageChoice]) -> tuple:
    return tuple((st.candidate, tuple(sorted(st.layers.items()))) for st in stages)


def polish(problem: PipelineProblem, stages: list[StageChoice], max_rounds: int = 200) -> list[StageChoice]:
    """Local search on the exact step time: move one layer across a stage boundary while it helps.

    Layers keep their model order (a layer moves from the end of one stage to the start of the
    next, or back), so dense-first order is preserved.
    """
    cur = [StageChoice(candidate=s.candidate, layers=dict(s.layers)) for s in stages]
    cur_t = exact_step_s(problem, cur)
    kinds = problem.kinds
    for _ in range(max_rounds):
        improved = False
        for k in range(len(cur) - 1):
            for direction in (1, -1):
                src, dst = (k, k + 1) if direction == 1 else (k + 1, k)
                # the layer crossing the boundary: last layer of stage k, or first of stage k + 1
                kind = next((kd for kd in reversed(kinds) if cur[k].layers.get(kd, 0)), None) if direction == 1 \
                    else next((kd for kd in kinds if cur[k + 1].layers.get(kd, 0)), None)
                if kind is None or cur[src].layers.get(kind, 0) < 1:
                    continue
                trial = [StageChoice(candidate=s.candidate, layers=dict(s.layers)) for s in cur]
                trial[src].layers[kind] -= 1
                trial[dst].layers[kind] = trial[dst].layers.get(kind, 0) + 1
                if not fits_memory(problem, trial):
                    continue
                t = exact_step_s(problem, trial)
                if t < cur_t * (1 - 1e-12):
                    cur, cur_t, improved = trial, t, True
        if not improved:
            break
    return cur


def support_class_best(problem: PipelineProblem, mip: AggregatedMIP, values: Sequence[float],
                       max_orders: int = 5000) -> tuple[float, list[StageChoice] | None] | None:
    """Exact best plan of the *support class* of a solution: the same first and last stage types
    and the same set of middle types, in any counts and any order (GPU budgets, stage limits and
    memory at every position checked exactly; the bottleneck window is not imposed, so the value
    is a lower bound over the class inside any window).

    Returns (step time, plan) — (inf, None) when no plan of the class fits — or None when the class
    has more than ``max_orders`` orders to evaluate. The search cuts off a class whose best is
    known (:meth:`AggregatedMIP.cut_support`), so the model's next optimum bounds the rest.
    """
    cands = problem.candidates
    first, _, last = mip.stage_multiset(values)
    support = [si for si, v in mip.n.items() if values[v.index] > 0.5]
    mids = [mip.types["mid"][si] for si in support]
    need = {k: problem.layers[k] - first.layer_dict.get(k, 0) - last.layer_dict.get(k, 0) for k in problem.kinds}
    used_gpus: dict[int, int] = {}
    for t in (first, last):
        c = cands[t.candidate]
        used_gpus[c.island] = used_gpus.get(c.island, 0) + c.gpus
    R = problem.max_stages
    counts: list[list[int]] = []

    def fill(k: int, left: dict[str, int], gpus: dict[int, int], stages: int, cur: list[int]) -> None:
        if len(counts) > max_orders:  # each count vector has at least one order: too large already
            return
        if k == len(mids):
            if all(v == 0 for v in left.values()) and 2 + stages >= problem.min_stages:
                counts.append(list(cur))
            return
        t = mids[k]
        c = cands[t.candidate]
        n = 1
        while True:
            rest = {kd: left[kd] - n * t.layer_dict.get(kd, 0) for kd in left}
            g = gpus.get(c.island, 0) + n * c.gpus
            if min(rest.values()) < 0 or g > problem.island_gpus[c.island] or 2 + stages + n > R:
                break
            fill(k + 1, rest, {**gpus, c.island: g}, stages + n, cur + [n])
            n += 1

    fill(0, need, used_gpus, 0, [])
    # distinct orders of each count vector: (sum n)! / prod n!; give up before evaluating any
    orders = 0
    for cnt in counts:
        orders += math.factorial(sum(cnt)) // math.prod(math.factorial(n) for n in cnt)
        if orders > max_orders:
            return None
    best: tuple[float, list[StageChoice] | None] = (math.inf, None)
    for cnt in counts:
        pool = [t for t, n in zip(mids, cnt) for _ in range(n)]
        for order in _distinct_orders(pool):
            stages = [StageChoice(candidate=t.candidate, layers=t.layer_dict) for t in [first, *order, last]]
            if not fits_memory(problem, stages):
                continue
            t_exact = exact_step_s(problem, stages)
            if t_exact < best[0]:
                best = (t_exact, stages)
    return best


def _distinct_orders(pool: list[StageType]):  # type: ignore[no-untyped-def]
    """Every distinct order of a multiset of stage types (copies of one type are interchangeable)."""
    keys = sorted({id(t): t for t in pool}.values(), key=lambda t: (t.candidate, t.layers))
    left = [sum(1 for p in pool if p is t) for t in keys]
    cur: list[StageType] = []

    def rec():  # type: ignore[no-untyped-def]
        if len(cur) == len(pool):
            yield list(cur)
            return
        for i, t in enumerate(keys):
            if left[i]:
                left[i] -= 1
                cur.append(t)
                yield from rec()
                cur.pop()
                left[i] += 1

    yield from rec()


__all__ = ["best_order", "exact_step_s", "fits_memory", "in_plan_space", "polish", "reorder", "support_class_best",
           "try_order", "turn_ends"]
