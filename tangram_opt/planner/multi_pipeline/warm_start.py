"""The level-2 warm start (formulations/multi_pipeline.md, "Warm start"): replicas of each island's
fastest templates with the micro-batches split for the smallest slowest pipeline
(:func:`greedy_level2`, :func:`split_micro_batches`), and replicas of any one template
(:func:`uniform_replicas`). Priced exactly by :class:`TemplatePricer`; no solver.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Sequence

from tangram_opt.planner.context import PlanningContext
from tangram_opt.planner.multi_pipeline.templates import Template, TemplatePricer


def _shifts(cur: int, step: int, count: int, mask: int) -> int:
    """The union of ``cur << step * m`` for m = 1..count (bit sets as ints, cut to ``mask``), in
    O(log count) shifts: blocks of 1, 2, 4, ... consecutive shifts, doubled and placed by the bits
    of ``count`` (one shift per m took minutes at a batch of 2^20 sequences)."""
    out, block, size, placed = 0, (cur << step) & mask, 1, 0
    while count:
        if count & 1:
            out |= (block << (step * placed)) & mask
            placed += size
        count >>= 1
        if count:
            block = (block | (block << (step * size))) & mask
            size *= 2
    return out


def split_micro_batches(pricer: TemplatePricer, replicas: Sequence[Template], batch: int,
                        deadline: float = math.inf) -> list[int] | None:
    """Micro-batch counts for ``replicas`` (one each) summing exactly to ``batch`` sequences with the
    smallest slowest CF' (bisection on the step, a subset-sum DP over the batch for each trial);
    None when there is none, or when ``deadline`` (``time.perf_counter()``) passes first."""
    if not replicas:
        return None
    caps = [min(t.m_cap, batch // t.b) for t in replicas]
    if any(c < 1 for c in caps):
        return None
    levels = sorted({pricer.cf(t, m) for t, c in zip(replicas, caps) for m in range(1, c + 1)})

    def reach(limit: float) -> list[int] | None:
        tops = []
        for t, c in zip(replicas, caps):
            top = 0
            while top < c and pricer.cf(t, top + 1) <= limit:
                top += 1
            if top < 1:
                return None
            tops.append(top)
        mask = (1 << (batch + 1)) - 1
        layers = [1]
        for t, top in zip(replicas, tops):
            layers.append(_shifts(layers[-1], t.b, top, mask))
        if not (layers[-1] >> batch) & 1:
            return None
        ms, left = [], batch
        for i in range(len(replicas) - 1, -1, -1):
            t = replicas[i]
            m = next(m for m in range(tops[i], 0, -1) if left - t.b * m >= 0 and (layers[i] >> (left - t.b * m)) & 1)
            ms.append(m)
            left -= t.b * m
        return ms[::-1]

    lo, hi = 0, len(levels) - 1
    if reach(levels[hi]) is None:
        return None
    while lo < hi:
        if time.perf_counter() >= deadline:
            return None
        mid = (lo + hi) // 2
        if reach(levels[mid]) is not None:
            hi = mid
        else:
            lo = mid + 1
    return reach(levels[lo])


#: templates per island the greedy warm start combines (the fastest by replicas x steady rate)
GREEDY_CHOICES = 6


def greedy_level2(ctx: PlanningContext, templates: Sequence[Template], pricer: TemplatePricer,
                  max_pipelines: int, deadline: float = math.inf) -> tuple[float, list[tuple[Template, int]]] | None:
    """A quick multi-pipeline plan (the level-2 MIP's warm start): per island, replicas of one of its
    fastest templates filling the island, micro-batches split by :func:`split_micro_batches`; and
    replicas of any one template (:func:`uniform_replicas`). Trials stop at ``deadline``
    (``time.perf_counter()``): each split is a subset sum over the batch."""
    B = ctx.training.global_batch_size
    rate = {t.index: t.b / max(t.min_period_s, 1e-12) for t in templates}
    per_island: list[list[tuple[float, Template, int]]] = []
    for isl in ctx.islands:
        opts = []
        for t in templates:
            if set(t.gpus) == {isl.index}:
                k = min(max_pipelines, isl.num_gpus // t.gpus[isl.index])
                if k >= 1:
                    opts.append((k * rate[t.index], t, k))
        opts.sort(key=lambda q: -q[0])
        if opts:
            per_island.append(opts[:GREEDY_CHOICES])
    best: tuple[float, list[tuple[Template, int]]] | None = None
    trials: list[list[Template]] = []
    for combo in itertools.islice(itertools.product(*per_island), 64):
        reps: list[tuple[float, Template]] = []
        for _, t, k in combo:
            reps += [(rate[t.index], t)] * k
        reps.sort(key=lambda q: -q[0])
        for r in range(min(max_pipelines, len(reps)), 1, -1):
            trials.append([t for _, t in reps[:r]])
    for reps_t in trials:
        if time.perf_counter() >= deadline:
            break
        ms = split_micro_batches(pricer, reps_t, B, deadline)
        if ms is None:
            continue
        pipes = list(zip(reps_t, ms))
        obj = pricer.objective(pipes)
        if best is None or obj < best[0]:
            best = (obj, pipes)
    for obj, pipes in uniform_replicas(ctx, templates, pricer, max_pipelines):
        if best is None or obj < best[0]:
            best = (obj, pipes)
    return best


def uniform_replicas(ctx: PlanningContext, templates: Sequence[Template], pricer: TemplatePricer,
                     max_pipelines: int) -> list[tuple[float, list[tuple[Template, int]]]]:
    """Plans of R identical replicas of one template (every template, every R = 2..max_pipelines whose
    replicas fit the GPUs), the micro-batches split as evenly as possible (CF' grows with m, so that
    split is the best one). They cover templates spanning islands and zones, which the per-island
    greedy leaves out: on issue 27's two-zone case two replicas of a 6-stage cross-zone template run
    at 9.614 s where the greedy's best (one pipeline per zone) takes 9.925 s."""
    B = ctx.training.global_batch_size
    out = []
    for t in templates:
        if B % t.b:
            continue
        M = B // t.b
        fit = min([max_pipelines, M] + [ctx.islands[i].num_gpus // g for i, g in t.gpus.items()])
        for R in range(2, fit + 1):
            lo, extra = divmod(M, R)
            if lo + (extra > 0) > t.m_cap:
                continue
            pipes = [(t, lo + 1)] * extra + [(t, lo)] * (R - extra)
            out.append((pricer.objective(pipes), pipes))
    return out


__all__ = ["GREEDY_CHOICES", "greedy_level2", "split_micro_batches", "uniform_replicas"]
