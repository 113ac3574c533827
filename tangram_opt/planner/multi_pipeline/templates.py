"""Templates: pipelines whose micro-batch count is left free, and what they cost.

A template is a pipeline (stages with candidates and layer counts, and its micro-batch ``b``) that
level 2 may replicate with any whole number ``m`` of micro-batches. :class:`TemplatePricer` prices
one: the closed form ``CF'(m)`` with every stage's tail cut to its exposed intra-stage gradient
sync (the optimizer waits for the cross-pipeline all-reduce), the exact schedule, and the
all-reduce itself (sync_model.py) from the candidate tables' sync prices. :func:`one_stage_templates`
lists every candidate that holds the whole model on one stage.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from tangram_opt.planner.candidates.sync import EMBEDDING, HEAD
from tangram_opt.planner.context import PlanningContext
from tangram_opt.planner.formulations.inflight import inflight_micro_batches
from tangram_opt.planner.formulations.pipeline_model import PipelineTiming, schedule_makespan
from tangram_opt.planner.formulations.problem import PipelineProblem, StageChoice, choices_timing
from tangram_opt.planner.multi_pipeline.sync_model import SyncBreakdown, SyncStage, cross_sync


@dataclass(frozen=True, slots=True, kw_only=True)
class StageParts:
    """Per-stage terms the multi-pipeline step needs beyond the closed form's timing."""

    grad_sync_s: float  # exposed intra-stage gradient sync (the tail without the optimizer)
    optimizer_s: float
    bytes_per_gpu: float  # gradient bytes per GPU after the intra-stage reduce-scatter
    island: int


@dataclass(eq=False)
class Template:
    """A pipeline whose micro-batch count is free: stages (candidates of ``ctx.candidates(b)``), ``b``."""

    index: int
    origin: str
    b: int
    choices: tuple[StageChoice, ...]
    parts: tuple[StageParts, ...]
    gpus: dict[int, int]  # island index -> GPUs
    zones: frozenset[str]
    m_cap: int  # most micro-batches that still fit in memory (memory grows with in-flight count)
    optimizer_s: float  # slowest stage's optimizer update
    ratio_s: float  # max over stages of bytes per GPU / NIC share per GPU
    nic_latency_s: float
    cf: dict[int, float] = field(default_factory=dict)  # m -> CF'(m)
    period_s: float = 0.0  # steady period for large m (lambda)
    min_period_s: float = 0.0  # lambda(2) (GPipe: lambda): CF'(m) >= m * min_period_s

    @property
    def num_stages(self) -> int:
        return len(self.choices)

    @property
    def total_gpus(self) -> int:
        return sum(self.gpus.values())

    def describe(self, ctx: PlanningContext) -> str:
        cands = ctx.candidates(self.b)
        parts = []
        for ch in self.choices:
            c = cands[ch.candidate]
            parts.append(f"{ctx.islands[c.island].name}[{c.gpus} {c.config.label}, {sum(ch.layers.values())}L]")
        return f"T{self.index} ({self.origin}; b={self.b}): " + " | ".join(parts)


class TemplatePricer:
    """Prices templates: closed form with gradient-sync-only tails, exact schedule, sync terms."""

    def __init__(self, ctx: PlanningContext):
        self.ctx = ctx
        self._problems: dict[int, PipelineProblem] = {}
        self._by_m: dict[tuple[int, int], PipelineProblem] = {}
        self._parts: dict[tuple, StageParts] = {}
        #: bytes and bandwidths of the all-reduce, from the candidate tables
        self.prices = prices = ctx.sync_prices()
        self.piece_bytes_of_kind = prices.piece_bytes_of_kind
        self.embedding_bytes = prices.embedding_bytes
        self.head_bytes = prices.head_bytes
        self.zone_links = prices.zone_links

    def problem(self, b: int, m: int) -> PipelineProblem:
        # one copy per (b, m): ``replace`` re-runs PipelineProblem.__post_init__ (link tables over
        # every candidate), 5 ms each on a 20,000-candidate MoE cluster, where the one-stage
        # templates alone asked for 15,000 of them (74 s; issue 27's "384 V100+A10G, MoE")
        hit = self._by_m.get((b, m))
        if hit is None:
            if b not in self._problems:
                self._problems[b] = self.ctx.problem(b)
            hit = self._by_m[b, m] = replace(self._problems[b], num_micro_batches=m)
        return hit

    def parts(self, b: int, ci: int, layers: dict[str, int], first: bool, last: bool) -> StageParts:
        key = (b, ci, tuple(sorted(layers.items())), first, last)
        hit = self._parts.get(key)
        if hit is not None:
            return hit
        ctx, prices = self.ctx, self.prices
        c = ctx.candidates(b)[ci]
        gs = opt = nbytes = 0.0
        for k, n in layers.items():
            if n:
                gs += n * c.layer[k].grad_sync_time_s
                opt += n * c.layer[k].optimizer_time_s
                nbytes += n * prices.shard_bytes(c, k)
        for use, lc, piece in ((first, c.embedding, EMBEDDING), (last, c.head, HEAD)):
            if use:
                gs += lc.grad_sync_time_s
                opt += lc.optimizer_time_s
                nbytes += prices.shard_bytes(c, piece)
        hit = self._parts[key] = StageParts(grad_sync_s=gs, optimizer_s=opt, bytes_per_gpu=nbytes, island=c.island)
        return hit

    def bw_per_gpu(self, island: int) -> float:
        return self.prices.nic_bw_per_gpu(island)

    def template(self, index: int, origin: str, b: int, choices: Sequence[StageChoice]) -> Template | None:
        """A template from stage choices (None when it does not fit in memory even at one micro-batch)."""
        ctx = self.ctx
        cands = ctx.candidates(b)
        P = len(choices)
        parts = tuple(self.parts(b, ch.candidate, ch.layers, k == 0, k == P - 1) for k, ch in enumerate(choices))
        gpus: dict[int, int] = {}
        for ch in choices:
            c = cands[ch.candidate]
            gpus[c.island] = gpus.get(c.island, 0) + c.gpus
        if any(g > ctx.islands[i].num_gpus for i, g in gpus.items()):
            return None
        B = ctx.training.global_batch_size
        sched = ctx.space.schedule

        def fits(m: int) -> bool:
            return all(cands[ch.candidate].memory_bytes(ch.layers, inflight_micro_batches(k, P, m, sched),
                                                        first=k == 0, last=k == P - 1)
                       <= cands[ch.candidate].capacity_bytes for k, ch in enumerate(choices))

        m_hi = max(1, B // b)
        if not fits(1):
            return None
        lo, hi = 1, m_hi
        while lo < hi:  # memory is non-decreasing in m
            mid = (lo + hi + 1) // 2
            if fits(mid):
                lo = mid
            else:
                hi = mid - 1
        t = Template(index=index, origin=origin, b=b, choices=tuple(choices), parts=parts, gpus=gpus,
                     zones=frozenset(ctx.islands[i].zone for i in gpus), m_cap=lo,
                     optimizer_s=max(p.optimizer_s for p in parts),
                     ratio_s=max(p.bytes_per_gpu / self.bw_per_gpu(p.island) for p in parts),
                     nic_latency_s=max(ctx.islands[i].node.nic_latency_s for i in gpus))
        first = self.timing(t, 2 if sched == "1f1b" else 1)
        t.min_period_s = first.bottleneck_s
        t.period_s = (first if sched == "1f1b" and P == 1 else self.timing(t, P + 1)).bottleneck_s
        return t

    def timing(self, t: Template, m: int) -> PipelineTiming:
        return choices_timing(self.problem(t.b, m), list(t.choices))

    def cf(self, t: Template, m: int) -> float:
        """CF'(m): closed-form makespan plus the tail excess of the gradient-sync-only tails."""
        hit = t.cf.get(m)
        if hit is not None:
            return hit
        P = t.num_stages
        if self.ctx.space.schedule == "1f1b" and m > P + 1:
            # every block of the 1F1B period counts once m > P: CF' is affine in m from there on
            val = self.cf(t, P + 1) + (m - P - 1) * t.period_s
        else:
            tm = self.timing(t, m)
            excess, upstream = 0.0, 0.0
            for st, p in zip(tm.stages, t.parts):
                excess = max(excess, p.grad_sync_s - upstream)
                upstream += st.bwd_s + st.p2p_s
            val = tm.makespan_s + excess
        t.cf[m] = val
        return val

    def exact(self, t: Template, m: int) -> tuple[PipelineTiming, float]:
        """The closed form's timing at m and the exact schedule's step with gradient-sync-only tails."""
        tm = self.timing(t, m)
        ends = schedule_makespan([s.fwd_s for s in tm.stages], [s.bwd_s for s in tm.stages],
                                 [s.p2p_s for s in tm.stages[:-1]], m, self.ctx.space.schedule)
        return tm, max(e + p.grad_sync_s for e, p in zip(ends, t.parts))

    def sync_stages(self, pipes: Sequence[tuple[Template, int]]) -> list[list[SyncStage]]:
        ctx = self.ctx
        L = sum(ctx.layers.values())
        out = []
        for pi, (t, _) in enumerate(pipes):
            row, layer = [], 0
            for k, (ch, p) in enumerate(zip(t.choices, t.parts)):
                n = sum(ch.layers.values())
                pieces: list[Any] = list(range(layer, layer + n))
                layer += n
                if k == 0:
                    pieces.append(EMBEDDING)
                if k == t.num_stages - 1:
                    pieces.append(HEAD)
                isl = ctx.islands[p.island]
                row.append(SyncStage(pipeline=pi, stage=k, zone=isl.zone, bytes_per_gpu=p.bytes_per_gpu,
                                     bw_per_gpu_bytes_per_s=self.bw_per_gpu(p.island),
                                     nic_latency_s=isl.node.nic_latency_s, pieces=tuple(pieces)))
            assert layer == L
            out.append(row)
        return out

    def piece_bytes(self) -> dict[Any, float]:
        out: dict[Any, float] = {EMBEDDING: self.embedding_bytes, HEAD: self.head_bytes}
        dense = self.ctx.layers.get("dense", 0) if len(self.ctx.kinds) == 2 else 0
        for i in range(sum(self.ctx.layers.values())):
            out[i] = self.piece_bytes_of_kind[self.ctx.kinds[0] if i < dense else self.ctx.kinds[-1]]
        return out

    def sync(self, pipes: Sequence[tuple[Template, int]]) -> SyncBreakdown:
        return cross_sync(self.sync_stages(pipes), self.piece_bytes(), self.zone_links)

    def objective(self, pipes: Sequence[tuple[Template, int]]) -> float:
        """The model objective of a multi-pipeline plan (R >= 2): max CF' + X + max optimizer."""
        return (max(self.cf(t, m) for t, m in pipes) + self.sync(pipes).total_s
                + max(t.optimizer_s for t, _ in pipes))


def one_stage_templates(ctx: PlanningContext, pricer: TemplatePricer, start: int = 0) -> list[Template]:
    """Every candidate (any pipeline micro-batch b) that holds the whole model on one stage.

    Exact pruning for the level-2 problem: among templates of the same b and island, one is dropped
    when another uses no more GPUs, is no slower per micro-batch (a one-stage CF'(m) is m times the
    stage time plus its gradient sync), no slower in gradient sync, optimizer and cross-pipeline sync,
    and fits at least as many micro-batches: swapping it in keeps every plan feasible and no slower.
    """
    out: list[Template] = []
    layers = dict(ctx.layers)
    for b in ctx.pipeline_micro_batches():
        groups: dict[int, list[Template]] = {}
        for ci, c in enumerate(ctx.candidates(b)):
            if c.gpus > ctx.islands[c.island].num_gpus:
                continue
            if c.memory_bytes(layers, 1, first=True, last=True) > c.capacity_bytes:
                continue
            t = pricer.template(0, "one stage", b, [StageChoice(candidate=ci, layers=dict(layers))])
            if t is not None:
                groups.setdefault(c.island, []).append(t)
        for group in groups.values():
            keys = np.array([(t.total_gpus, pricer.cf(t, 1), t.parts[0].grad_sync_s, t.optimizer_s, t.ratio_s,
                              -t.m_cap, t.min_period_s) for t in group], dtype=float)
            for i, t in enumerate(group):
                # dominated: another is no worse in every key and better in one, or equal and earlier
                no_worse = np.all(keys <= keys[i], axis=1)
                no_worse[i] = False
                equal = np.all(keys == keys[i], axis=1)
                if not np.any(no_worse & (~equal | (np.arange(len(group)) < i))):
                    out.append(t)
    for i, t in enumerate(out):
        t.index = start + i
    return out


__all__ = ["StageParts", "Template", "TemplatePricer", "one_stage_templates"]
