"""Neighbourhood search on a plan: replace, merge, split or move one stage while the exact step time drops.

The window models find plans slowly where a plan's quality hinges on which stages carry large step
tails (slow NICs): a stage one candidate away, or two stages where one stood, can hide seconds of
gradient sync. :func:`improve` walks from a plan to better ones by four moves, first improvement
first, each trial memory-checked and scored with the closed form of pipeline_model.py (so every
plan it returns is a real plan, and nothing here touches a bound):

- *replace*: stage ``k`` runs on another candidate (any island with the GPUs free);
- *merge*: stages ``k`` and ``k + 1`` become one stage on one candidate;
- *split*: stage ``k`` becomes two stages (the same candidate twice, or its own candidate and
  another), its layers split where the two stage times are most even;
- *relocate*: stage ``k`` moves to another position, the ends included (:func:`~ordering.reorder`
  swaps middle stages only); a stage that no longer fits memory where it now stands (another
  in-flight count, or the embedding or LM head) takes the fastest candidate of its island that
  does.

After each accepted move the layer split is polished (:func:`~ordering.polish`) and the middle
stages reordered (:func:`~ordering.reorder`); where no move helps, the descent tries other end
stages (:func:`~ordering.turn_ends`: the plan reversed, its island blocks reordered). Replace,
merge and split trials are screened first by their stage time against the plan's period: a stage
slower than ``SCREEN_SLACK`` times the bottleneck would lengthen every one of the ``m - 1`` steady
periods, which a smaller tail rarely repays (a heuristic cut of the neighbourhood, not of the plan
space).
"""

from __future__ import annotations

import heapq
import random
import time
from collections.abc import Iterator

import numpy as np

from tangram_opt.planner.formulations.ordering import (exact_step_s, fits_at, fits_memory, in_plan_space, polish,
                                                       reorder, turn_ends)
from tangram_opt.planner.formulations.pipeline_model import pipeline_timing
from tangram_opt.planner.formulations.problem import PipelineProblem, StageChoice

#: a trial stage may be at most this much slower than the plan's bottleneck (screening only)
SCREEN_SLACK = 1.05
#: random moves per kick of the iterated local search, and how many kicks in a row may find
#: nothing better before it stops (on "128 V100+A10G", the best plans came within 10-100 kicks)
KICK_MOVES = 2
KICK_PATIENCE = 60
#: when no trial is faster as it is, this many of the fastest are polished and tried again
POLISH_TRIALS = 8


class CandidateTimes:
    """Per-candidate stage-time coefficients of one problem, as arrays: the time of every candidate
    holding given layers in a given role in one vector operation (for screening trials)."""

    def __init__(self, problem: PipelineProblem):
        cands = problem.candidates
        self.island = np.array([c.island for c in cands], dtype=np.int64)
        self.gpus = np.array([c.gpus for c in cands], dtype=np.int64)
        self.per_layer = {k: np.array([c.layer[k].fwd_time_s + c.layer[k].bwd_time_s for c in cands])
                          for k in problem.kinds}
        self.embedding = np.array([c.embedding.fwd_time_s + c.embedding.bwd_time_s for c in cands])
        self.head = np.array([c.head.fwd_time_s + c.head.bwd_time_s for c in cands])

    def time_of(self, c: int, layers: dict[str, int], *, first: bool, last: bool) -> float:
        """Stage time of candidate ``c`` holding ``layers``."""
        t = sum(n * float(self.per_layer[k][c]) for k, n in layers.items() if n)
        return t + (float(self.embedding[c]) if first else 0.0) + (float(self.head[c]) if last else 0.0)

    def times(self, layers: dict[str, int], *, first: bool, last: bool) -> np.ndarray:
        t = sum((n * self.per_layer[k] for k, n in layers.items() if n), np.zeros(len(self.gpus)))
        if first:
            t = t + self.embedding
        if last:
            t = t + self.head
        return t


def improve(problem: PipelineProblem, stages: list[StageChoice], deadline: float,
            table: CandidateTimes | None = None, seed: int = 0, kicks: int | None = None
            ) -> tuple[list[StageChoice], float]:
    """The best plan reached from ``stages`` by replace / merge / split / relocate moves before ``deadline``
    (a ``time.perf_counter()`` value), and its exact step time. ``stages`` must fit memory.

    A descent (first improvement) ends in a plan no single move improves; while time is left, the
    search then *kicks* the best plan so far (``KICK_MOVES`` random moves, unscreened: a stage
    may shrink to fewer GPUs or grow slower, which frees GPUs or layers for the next descent) and
    descends again, keeping the better end (iterated local search, seeded: ``seed``), until
    ``KICK_PATIENCE`` kicks in a row found nothing better (at most ``kicks`` kicks when given, so
    ``kicks=0`` is the first descent alone)."""
    table = table if table is not None else CandidateTimes(problem)
    rng = random.Random(seed)
    best = _descend(problem, table, [StageChoice(candidate=s.candidate, layers=dict(s.layers)) for s in stages],
                    deadline)
    best_t = exact_step_s(problem, best)
    done = idle = 0
    while (kicks is None or done < kicks) and idle < KICK_PATIENCE and time.perf_counter() < deadline:
        done += 1
        idle += 1
        kicked = best
        for _ in range(KICK_MOVES):
            kicked = _random_move(problem, table, kicked, rng) or kicked
        if kicked is best:
            break
        end = _descend(problem, table, kicked, deadline)
        t = exact_step_s(problem, end)
        if t < best_t * (1 - 1e-9):
            best, best_t, idle = end, t, 0
    return best, best_t


def _descend(problem: PipelineProblem, table: CandidateTimes, cur: list[StageChoice],
             deadline: float) -> list[StageChoice]:
    cur_t = exact_step_s(problem, cur)
    while time.perf_counter() < deadline:
        better = _first_improvement(problem, table, cur, cur_t, deadline)
        if better is None:
            turned = turn_ends(problem, cur)  # no move helps: try other end stages, then go on
            if turned is cur:
                break
            better = turned
        polished = reorder(problem, polish(problem, better))
        cur = polished if in_plan_space(problem, polished) else better
        cur_t = exact_step_s(problem, cur)
    return cur


def _random_move(problem: PipelineProblem, table: CandidateTimes, cur: list[StageChoice],
                 rng: random.Random) -> list[StageChoice] | None:
    """One random replace, merge or split of ``cur`` that fits memory and the islands' GPUs (None
    if the tries drew none)."""
    cands = problem.candidates
    P = len(cur)
    free = dict(problem.island_gpus)
    for s in cur:
        free[cands[s.candidate].island] -= cands[s.candidate].gpus
    for _ in range(20):
        kind = rng.choice(("replace", "merge", "split") if P > 1 else ("replace", "split"))
        k = rng.randrange(P - 1 if kind == "merge" else P)
        gone = cur[k:k + 2] if kind == "merge" else cur[k:k + 1]
        avail = dict(free)
        for s in gone:
            avail[cands[s.candidate].island] += cands[s.candidate].gpus
        c = rng.randrange(len(cands))
        if kind == "split":
            if sum(cur[k].layers.values()) < 2 or P >= problem.max_stages:
                continue
            pair = rng.choice(((c, c), (cur[k].candidate, c), (c, cur[k].candidate)))
            options = list(_splits(problem, table, cur[k].layers, pair, first=k == 0, last=k == P - 1,
                                   free=avail, freed={}))
            if not options:
                continue
            trial = cur[:k] + [h[0] for h in rng.choice(options)] + cur[k + 1:]
        else:
            if table.gpus[c] > avail[int(table.island[c])]:
                continue
            layers = {kd: sum(s.layers.get(kd, 0) for s in gone) for kd in problem.kinds}
            trial = cur[:k] + [StageChoice(candidate=c, layers=layers)] + cur[k + len(gone):]
        if in_plan_space(problem, trial) and fits_memory(problem, trial):
            return trial
    return None


def _first_improvement(problem: PipelineProblem, table: CandidateTimes, cur: list[StageChoice], cur_t: float,
                       deadline: float) -> list[StageChoice] | None:
    """The first trial faster than ``cur`` as it is; else the first of the ``POLISH_TRIALS`` fastest
    trials that is faster once its layer split is polished (a split or merge rarely lands on its
    best layer split); None if neither."""
    near: list[tuple[float, int, list[StageChoice]]] = []
    for n, trial in enumerate(_neighbours(problem, table, cur)):
        if time.perf_counter() >= deadline:
            break
        if not in_plan_space(problem, trial) or not fits_memory(problem, trial):
            continue
        t = exact_step_s(problem, trial)
        if t < cur_t * (1 - 1e-9):
            return trial
        item = (-t, n, trial)
        if len(near) < POLISH_TRIALS:
            heapq.heappush(near, item)
        elif item > near[0]:
            heapq.heapreplace(near, item)
    for _, _, trial in sorted(near, reverse=True):
        if time.perf_counter() >= deadline:
            break
        trial = polish(problem, trial)
        if in_plan_space(problem, trial) and exact_step_s(problem, trial) < cur_t * (1 - 1e-9):
            return trial
    return None


def _neighbours(problem: PipelineProblem, table: CandidateTimes, cur: list[StageChoice]) -> Iterator[list[StageChoice]]:
    """Trials in the order tried: replace (bottleneck stages first), then merge, then split, then
    relocate."""
    cands = problem.candidates
    P = len(cur)
    timing = pipeline_timing([(cands[s.candidate], s.layers) for s in cur], problem.boundaries_s(cur),
                             problem.num_micro_batches, problem.schedule)
    cap = SCREEN_SLACK * timing.bottleneck_s
    free = dict(problem.island_gpus)
    for s in cur:
        free[cands[s.candidate].island] -= cands[s.candidate].gpus

    def fitting(times: np.ndarray, freed: dict[int, int], limit: float, need: int = 1) -> np.ndarray:
        """Candidates with stage time <= limit whose island has ``need`` times their GPUs free
        once ``freed`` is given back, fastest first."""
        avail = np.array([free[i] + freed.get(i, 0) for i in range(int(table.island.max()) + 1)]) \
            if len(free) else np.zeros(1, dtype=np.int64)
        ok = (times <= limit) & (need * table.gpus <= avail[table.island])
        idx = np.flatnonzero(ok)
        return idx[np.argsort(times[idx], kind="stable")]

    def freed_by(*ks: int) -> dict[int, int]:
        out: dict[int, int] = {}
        for k in ks:
            c = cands[cur[k].candidate]
            out[c.island] = out.get(c.island, 0) + c.gpus
        return out

    order = sorted(range(P), key=lambda k: -timing.stages[k].time_s - timing.stages[k].tail_s)
    for k in order:  # replace
        times = table.times(cur[k].layers, first=k == 0, last=k == P - 1)
        for c in fitting(times, freed_by(k), cap):
            if c != cur[k].candidate:
                yield cur[:k] + [StageChoice(candidate=int(c), layers=dict(cur[k].layers))] + cur[k + 1:]
    for k in range(P - 1):  # merge
        layers = {kd: cur[k].layers.get(kd, 0) + cur[k + 1].layers.get(kd, 0) for kd in problem.kinds}
        times = table.times(layers, first=k == 0, last=k + 1 == P - 1)
        for c in fitting(times, freed_by(k, k + 1), cap):
            yield cur[:k] + [StageChoice(candidate=int(c), layers=layers)] + cur[k + 2:]
    for k in order if P < problem.max_stages else ():  # split
        if sum(cur[k].layers.values()) < 2:
            continue
        own = cur[k].candidate
        for c in fitting(table.times(cur[k].layers, first=k == 0, last=k == P - 1), freed_by(k), np.inf):
            for pair in ((int(c), int(c)), (own, int(c)), (int(c), own)):
                for halves in _splits(problem, table, cur[k].layers, pair, first=k == 0, last=k == P - 1,
                                      free=free, freed=freed_by(k)):
                    if max(h[1] for h in halves) <= cap:
                        yield cur[:k] + [h[0] for h in halves] + cur[k + 1:]
    yield from _relocations(problem, table, cur, free)


def _relocations(problem: PipelineProblem, table: CandidateTimes, cur: list[StageChoice],
                 free: dict[int, int]) -> Iterator[list[StageChoice]]:
    """Stage ``k`` moved to position ``j``, moves that change an end first. Between ``k`` and ``j``
    every stage shifts by one position, so its in-flight count changes; a stage that no longer fits
    memory takes the fastest candidate of its island that fits there with the GPUs free (the trial
    is dropped when none does). On "384 V100+A10G, MoE" (b = 8) the last stage moved to the second
    place, a V100 stage taking the end, turned a 19.40 s plan into a 19.22 s one, which the other
    moves took to 19.11 s."""
    P = len(cur)
    # moving k to k - 1 is moving k - 1 to k: each swap of neighbours once
    pairs = [(k, j) for k in range(P) for j in range(P) if j != k and j != k - 1]
    pairs.sort(key=lambda kj: not ({0, P - 1} & set(kj)))  # ends first (stable)
    for k, j in pairs:
        trial = cur[:k] + cur[k + 1:]
        trial.insert(j, cur[k])
        lo, hi = min(k, j), max(k, j)
        spare = dict(free)
        for pos in range(lo, hi + 1):
            fixed = _fit_here(problem, table, trial[pos], pos, P, spare)
            if fixed is None:
                break
            trial[pos] = fixed
        else:
            yield trial


def _fit_here(problem: PipelineProblem, table: CandidateTimes, stage: StageChoice, k: int, P: int,
              spare: dict[int, int]) -> StageChoice | None:
    """``stage`` if it fits memory at position ``k`` of ``P``; else the fastest candidate of its island
    holding its layers that does, within its GPUs and ``spare`` (updated); None if none does."""
    if fits_at(problem, stage.candidate, stage.layers, k, P):
        return stage
    own = problem.candidates[stage.candidate]
    times = table.times(stage.layers, first=k == 0, last=k == P - 1)
    ok = (table.island == own.island) & (table.gpus <= own.gpus + spare[own.island])
    for c in np.flatnonzero(ok)[np.argsort(times[ok], kind="stable")]:
        if fits_at(problem, int(c), stage.layers, k, P):
            spare[own.island] -= int(table.gpus[c]) - own.gpus
            return StageChoice(candidate=int(c), layers=dict(stage.layers))
    return None


def _splits(problem: PipelineProblem, table: CandidateTimes, layers: dict[str, int], pair: tuple[int, int], *,
            first: bool, last: bool, free: dict[int, int], freed: dict[int, int]
            ) -> Iterator[tuple[tuple[StageChoice, float], tuple[StageChoice, float]]]:
    """``layers`` split in model order between a stage of ``pair[0]`` and one of ``pair[1]`` (nothing
    if their GPUs are not free): at the cut where the slower of the two stage times is smallest,
    and with a single layer on either side (a small separator stage next to a large one)."""
    need: dict[int, int] = {}
    for c in pair:
        i = int(table.island[c])
        need[i] = need.get(i, 0) + int(table.gpus[c])
    if any(n > free[i] + freed.get(i, 0) for i, n in need.items()):
        return
    flat = [kd for kd in problem.kinds for _ in range(layers.get(kd, 0))]

    def at(cut: int) -> tuple[tuple[StageChoice, float], tuple[StageChoice, float]]:
        a, b = _count(flat[:cut]), _count(flat[cut:])
        return ((StageChoice(candidate=pair[0], layers=a), table.time_of(pair[0], a, first=first, last=False)),
                (StageChoice(candidate=pair[1], layers=b), table.time_of(pair[1], b, first=False, last=last)))

    cuts = [at(cut) for cut in range(1, len(flat))]
    if not cuts:
        return
    even = min(range(len(cuts)), key=lambda i: max(cuts[i][0][1], cuts[i][1][1]))
    for i in dict.fromkeys((even, 0, len(cuts) - 1)):
        yield cuts[i]


def _count(kinds: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for kd in kinds:
        out[kd] = out.get(kd, 0) + 1
    return out


__all__ = ["KICK_MOVES", "KICK_PATIENCE", "POLISH_TRIALS", "SCREEN_SLACK", "CandidateTimes", "improve"]
