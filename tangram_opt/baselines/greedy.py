"""The greedy baseline, as the benchmark brief defines it, and a more thorough variant that
seeds the MIP.

Greedy (the baseline):

1. Islands form consecutive pipeline stages, largest memory first (early stages hold the most
   in-flight micro-batches). Each island is one stage; an island is split into ``s`` equal stages
   (``s`` = 2, 4, ...) only if the model does not fit otherwise — the smallest ``s`` that fits wins.
2. Layers are split across stages in proportion to their aggregate dense peak throughput
   (GPUs x peak FLOP/s), by largest remainder, at least one layer per stage.
3. Per stage, the fastest configuration of that island and size that fits memory at its position
   (stepping up tp, ZeRO or recomputation until it fits is how the enumeration reaches it).

Every pipeline micro-batch size is tried and the best pipeline is returned.

The thorough variant (``thorough=True``, the MIP's warm start) tries every ``s``, a second island
order (by throughput) and each island alone, keeping the best; it is stronger than the baseline
and is what makes "the MIP is never worse than the greedy" hold by construction.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tangram_opt.planner.assemble import make_plan, pipeline_plan
from tangram_opt.planner.candidates import Candidate
from tangram_opt.planner.context import PlanningContext
from tangram_opt.planner.formulations.inflight import inflight_micro_batches
from tangram_opt.planner.formulations.problem import StageChoice, choices_timing
from tangram_opt.planner.plan import Plan


@dataclass(slots=True)
class GreedyResult:
    plan: Plan
    pipeline_micro_batch: int
    choices: list[StageChoice]
    step_time_s: float


def _split(total: int, weights: list[float]) -> list[int] | None:
    """Largest-remainder split of ``total`` in proportion to ``weights``, every part >= 1."""
    n = len(weights)
    if n > total:
        return None
    wsum = sum(weights)
    raw = [total * w / wsum for w in weights]
    parts = [max(1, int(r)) for r in raw]
    while sum(parts) > total:
        i = max((i for i in range(n) if parts[i] > 1), key=lambda i: parts[i] - raw[i])
        parts[i] -= 1
    while sum(parts) < total:
        i = max(range(n), key=lambda i: raw[i] - parts[i])
        parts[i] += 1
    return parts


def _layers_of(start: int, count: int, kinds: tuple[str, ...], layers: dict[str, int]) -> dict[str, int]:
    """Kinds of layers ``start .. start+count-1`` (dense layers come first)."""
    out = {k: 0 for k in kinds}
    dense = layers.get("dense", 0)
    for idx in range(start, start + count):
        out["dense" if idx < dense and "dense" in out else kinds[-1]] += 1
    return out


def greedy(ctx: PlanningContext, *, thorough: bool = False) -> GreedyResult | None:
    """The best greedy pipeline over every pipeline micro-batch size (None if nothing fits)."""
    per_b = greedy_by_micro_batch(ctx, thorough=thorough)
    if not per_b:
        return None
    b, (t, choices) = min(per_b.items(), key=lambda kv: kv[1][0])
    plan = make_plan(ctx, [pipeline_plan(ctx, ctx.problem(b), choices)], method="greedy")
    return GreedyResult(plan=plan, pipeline_micro_batch=b, choices=choices, step_time_s=t)


def greedy_by_micro_batch(ctx: PlanningContext, *, thorough: bool = False
                          ) -> dict[int, tuple[float, list[StageChoice]]]:
    """The best greedy pipeline for each pipeline micro-batch size where one fits (see the
    module docstring for the baseline and the ``thorough`` variant)."""
    out: dict[int, tuple[float, list[StageChoice]]] = {}
    L = ctx.model.num_layers
    prec = ctx.training.precision
    for b in ctx.pipeline_micro_batches():
        cands = ctx.candidates(b)
        if not cands:
            continue
        problem = ctx.problem(b)
        m = problem.num_micro_batches
        by_index: dict[tuple[int, int], list[int]] = {}
        for ci, c in enumerate(cands):
            by_index.setdefault((c.island, c.gpus), []).append(ci)
        by_size = {key: _Sizes([cands[ci] for ci in idx], idx) for key, idx in by_index.items()}
        orders = [sorted(ctx.islands, key=lambda i: -i.node.gpu.hbm_bytes)]
        if thorough:
            orders.append(sorted(ctx.islands, key=lambda i: -i.num_gpus * i.node.gpu.peak_flops_per_s(prec)))
            if len(ctx.islands) > 1:
                orders += [[isl] for isl in ctx.islands]
        best: tuple[float, list[StageChoice]] | None = None
        s = 1
        while s <= max(i.num_gpus for i in ctx.islands) and (thorough or best is None):
            for order in orders:
                stages: list[tuple[int, int]] = []  # (island index, gpus)
                for isl in order:
                    sizes = [g for g in isl.valid_stage_sizes() if g * s <= isl.num_gpus and (isl.index, g) in by_size]
                    if sizes:
                        stages += [(isl.index, max(sizes))] * s
                if not stages or len(stages) > min(ctx.max_stages, L):
                    continue
                weights = [g * ctx.islands[i].node.gpu.peak_flops_per_s(prec) for i, g in stages]
                split = _split(L, weights)
                if split is None:
                    continue
                choices: list[StageChoice] = []
                start = 0
                for k, ((i, g), n) in enumerate(zip(stages, split)):
                    layers = _layers_of(start, n, ctx.kinds, ctx.layers)
                    start += n
                    inflight = inflight_micro_batches(k, len(stages), m, problem.schedule)
                    pick = by_size[i, g].fastest_fitting(layers, inflight, first=k == 0, last=k == len(stages) - 1)
                    if pick is None:
                        break
                    choices.append(StageChoice(candidate=pick, layers=layers))
                else:
                    t = choices_timing(problem, choices).step_time_s
                    if best is None or t < best[0]:
                        best = (t, choices)
            s *= 2
        if best is not None:
            out[b] = best
    return out


class _Sizes:
    """The candidates of one (island, GPU count) with their per-layer, embedding and head times
    as arrays, so :meth:`fastest_fitting` prices them all at once and tests memory from the
    fastest down (it was 82,000 memory tests for one 0.3 s sub-cluster solve of the multi-pipeline
    level, more than its time limit)."""

    def __init__(self, rows: list[Candidate], idx: list[int]):
        self.rows, self.idx = rows, idx
        self.layer = {k: np.array([c.layer[k].time_s for c in rows]) for k in rows[0].layer} if rows else {}
        self.embedding = np.array([c.embedding.time_s for c in rows])
        self.head = np.array([c.head.time_s for c in rows])

    def fastest_fitting(self, layers: dict[str, int], inflight: int, *, first: bool, last: bool) -> int | None:
        """The fastest candidate (the first of equals) that holds ``layers`` with ``inflight``
        micro-batches in flight; the same sums, in the same order, as pricing each one alone."""
        t = np.zeros(len(self.rows))
        for k, n in layers.items():
            if n:
                t = t + n * self.layer[k]
        t = t + ((self.embedding if first else 0.0) + (self.head if last else 0.0))
        for j in np.argsort(t, kind="stable"):
            c = self.rows[j]
            if c.memory_bytes(layers, inflight, first=first, last=last) <= c.capacity_bytes:
                return self.idx[j]
        return None
