"""Several data-parallel pipelines in one plan: pipeline templates plus a level-2 MIP (issue 10).

A plan may run ``R`` pipelines side by side on disjoint GPUs. Each pipeline is a chain of
homogeneous stages (as in a single-pipeline plan) with its own pipeline micro-batch ``b_p``,
stage layout and island types, and takes a whole number ``m_p`` of micro-batches, so its share of
the global batch is ``b_p m_p`` and the shares sum to ``B``. The step (docs/multi_pipeline.md,
formulations/multi_pipeline.md) is

    step = max_p PIPE_p(m_p) + X(R, stages) + max_p max_{k in p} OPT_k

- ``PIPE_p(m)``: pipeline p's 1F1B (or GPipe) step with every stage's tail reduced to its exposed
  intra-stage gradient sync. The model is the closed form ``CF'(m) = makespan(m) + tail excess``
  of pipeline_model.py (an upper bound of the exact schedule, which plans report);
- ``X``: the gradient all-reduce of every layer across the R pipelines (:func:`cross_sync`), not
  overlapped with compute; it starts when the slowest pipeline is ready;
- ``OPT_k``: stage k's optimizer update, which needs the all-reduced gradients.

With R = 1 there is no cross-pipeline sync and the optimizer stays in the stage tails: that is the
single-pipeline plan space of :func:`~tangram_opt.planner.search.solve`.

Two levels. (1) Templates: a template is a pipeline (stages with candidates and layer counts, and
its micro-batch ``b``) whose micro-batch count is left free. They come from every candidate that
holds the whole model on one stage (pure data parallelism with uneven shares), from the
single-pipeline optimizer run on scaled-down sub-clusters (every island's node count divided by
k) and on each island alone, and from the single-pipeline optimum itself. (2) A MIP chooses how
many replicas of each (template, micro-batch count) pair to run: an all-integer model (times in
integer ticks, rounded so that its optimum is a valid lower bound) that every backend solves.
The union of the single-pipeline space and the declared template space is the plan space the
certificate states; its bound is the smaller of the two levels' bounds.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from tangram_opt.cost import StageConfig
from tangram_opt.errors import TangramError
from tangram_opt.planner.assemble import choices_timing, make_plan
from tangram_opt.planner.candidates import Candidate
from tangram_opt.planner.context import PlanningContext
from tangram_opt.planner.formulations.positional import PipelineProblem, StageChoice
from tangram_opt.planner.islands import Island, find_islands
from tangram_opt.planner.formulations.pipeline_model import PipelineTiming, inflight_micro_batches, schedule_makespan
from tangram_opt.planner.plan import Certificate, PipelinePlan, Plan, StagePlan
from tangram_opt.solvers import (LinearModel, SolveOptions, SolveStatus, lp_relaxation_bound, lsum, relative_gap,
                                 solve_model)
from tangram_opt.specs.cluster import Cluster

#: Piece keys of the all-reduce: transformer blocks are 0 .. L-1, the embedding and the LM head
#: are their own pieces (a tied head keeps its own copy on the last stage, as in the cost model).
EMBEDDING, HEAD = "embedding", "head"


@dataclass(frozen=True, slots=True, kw_only=True)
class MultiPipelineOptions:
    """Knobs of the multi-pipeline level (all part of the declared plan space).

    - ``max_pipelines``: R_max, the most pipelines in a plan;
    - ``cluster_scales``: k for the sub-clusters with every island's node count divided by k;
    - ``island_scales``: k for the sub-clusters made of one island with its nodes divided by k;
    - ``template_share``: fraction of the multi-pipeline time budget spent generating templates
      (the sub-cluster solves); the rest goes to the level-2 MIP;
    - ``one_stage``: include the one-stage templates (every candidate holding the whole model).
    """

    max_pipelines: int = 8
    cluster_scales: tuple[int, ...] = (2, 4, 8)
    island_scales: tuple[int, ...] = (1, 2, 4)
    template_share: float = 0.35
    one_stage: bool = True

    def __post_init__(self) -> None:
        from tangram_opt.errors import SpecError

        if self.max_pipelines < 2:
            raise SpecError("multi_pipeline.max_pipelines", self.max_pipelines, "must be >= 2",
                            "allow at least two pipelines, or pass multi_pipeline=False")
        if not 0.0 <= self.template_share < 1.0:
            raise SpecError("multi_pipeline.template_share", self.template_share, "must be in [0, 1)",
                            "e.g. 0.35: a third of the multi-pipeline budget for the sub-cluster solves")


# --- the cross-pipeline gradient all-reduce -----------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class SyncStage:
    """What one stage contributes to the all-reduce across pipelines.

    ``bytes_per_gpu``: gradient bytes each GPU of the stage exchanges after the intra-stage
    reduce-scatter (what ZeRO-2 keeps per GPU); ``bw_per_gpu_bytes_per_s``: its share of the node
    NIC (times the calibration's network efficiency); ``pieces``: the layers (and embedding/head) it
    holds.
    """

    pipeline: int
    stage: int
    zone: str
    bytes_per_gpu: float
    bw_per_gpu_bytes_per_s: float
    nic_latency_s: float
    pieces: tuple[Any, ...]

    @property
    def ratio_s(self) -> float:
        return self.bytes_per_gpu / self.bw_per_gpu_bytes_per_s


@dataclass(frozen=True, slots=True, kw_only=True)
class SyncBreakdown:
    """The cross-pipeline sync of one plan: ``total_s = bandwidth_s + latency_s``."""

    pipelines: int
    ring_factor: float
    nic_s: float  # ring factor x max over stages of bytes per GPU / NIC share per GPU
    zone_s: float  # ring factor x max over zone-link directions of bytes / link bandwidth
    latency_s: float
    groups: int
    bottleneck: str

    @property
    def bandwidth_s(self) -> float:
        return max(self.nic_s, self.zone_s)

    @property
    def total_s(self) -> float:
        return self.bandwidth_s + self.latency_s


def ring_factor(r: int) -> float:
    """Bytes each participant of a ring all-reduce over ``r`` participants sends, per byte of buffer."""
    return 2.0 * (r - 1) / r if r > 1 else 0.0


def latency_steps(r: int) -> int:
    """Latency hops of one all-reduce over ``r`` participants: the faster of ring and tree (as comm.py)."""
    return 2 * min(r - 1, math.ceil(math.log2(r))) if r > 1 else 0


def cross_sync(stages: Sequence[Sequence[SyncStage]], piece_bytes: dict[Any, float],
               zone_links: dict[tuple[str, str], tuple[float, float]]) -> SyncBreakdown:
    """The all-reduce of every layer's gradient across the pipelines (``stages[p]`` = pipeline p's stages).

    Model (docs/multi_pipeline.md): every piece (block, embedding, head) is held by one stage of
    each of the R pipelines; its gradient, already reduce-scattered inside each stage, is
    all-reduced by a ring over those R stages, ordered by zone. Each GPU sends ``2 (R-1)/R`` times
    its shard. All pieces' rings run at once and share the NICs (fluid sharing), so the bandwidth
    time is the most loaded resource: a stage's NIC share (``2 (R-1)/R x bytes per GPU / NIC per
    GPU``) or a zone-link direction (each ring crossing it carries ``2 (R-1)/R`` times the piece's
    bytes). Latency: each group of pieces held by the same stages is one all-reduce of
    ``latency_steps(R)`` hops of the slowest NIC (plus the zone link's latency when it crosses
    zones); a stage's groups run one after another, and the slowest stage counts.
    ``zone_links[(a, b)]`` = (bytes/s, latency) with a < b.
    """
    R = len(stages)
    if R < 2:
        return SyncBreakdown(pipelines=R, ring_factor=0.0, nic_s=0.0, zone_s=0.0, latency_s=0.0, groups=0,
                             bottleneck="")
    c = ring_factor(R)
    worst = max((s for p in stages for s in p), key=lambda s: s.ratio_s)
    nic = c * worst.ratio_s
    holder: dict[Any, list[SyncStage]] = {}
    for p in stages:
        for s in p:
            for piece in s.pieces:
                holder.setdefault(piece, []).append(s)
    groups: dict[tuple[tuple[int, int], ...], list[Any]] = {}
    for piece, hs in holder.items():
        assert len(hs) == R, f"piece {piece} is held by {len(hs)} of {R} pipelines"
        groups.setdefault(tuple(sorted((s.pipeline, s.stage) for s in hs)), []).append(piece)
    by_key = {(s.pipeline, s.stage): s for p in stages for s in p}
    load: dict[tuple[str, str], float] = {}
    stage_latency: dict[tuple[int, int], float] = {}
    for key, pieces in groups.items():
        members = [by_key[k] for k in key]
        zones = sorted({s.zone for s in members})
        lat = max(s.nic_latency_s for s in members)
        if len(zones) > 1:
            hops = list(zip(zones, zones[1:] + zones[:1]))
            if len(zones) == 2:
                hops = hops[:1]  # a two-zone ring crosses the same link once in each direction
            gb = sum(piece_bytes[x] for x in pieces)
            for a, b in hops:
                load[(a, b)] = load.get((a, b), 0.0) + c * gb
            lat += max(zone_links[tuple(sorted(h))][1] for h in hops)  # type: ignore[index]
        for k in key:
            stage_latency[k] = stage_latency.get(k, 0.0) + latency_steps(R) * lat
    zone = 0.0
    zone_name = ""
    for (a, b), v in load.items():
        t = v / zone_links[tuple(sorted((a, b)))][0]  # type: ignore[index]
        if t > zone:
            zone, zone_name = t, f"zone link {a}->{b}"
    bottleneck = (zone_name if zone > nic else f"pipeline {worst.pipeline} stage {worst.stage} NIC")
    return SyncBreakdown(pipelines=R, ring_factor=c, nic_s=nic, zone_s=zone, latency_s=max(stage_latency.values()),
                         groups=len(groups), bottleneck=bottleneck)


# --- templates -----------------------------------------------------------------------------------
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


class _Pricer:
    """Prices templates: closed form with gradient-sync-only tails, exact schedule, sync terms."""

    def __init__(self, ctx: PlanningContext):
        self.ctx = ctx
        self._problems: dict[int, PipelineProblem] = {}
        self._parts: dict[tuple, StageParts] = {}
        cost = ctx.cost
        assert cost is not None
        self.efficiency = cost.calibration.network_efficiency
        node = ctx.islands[0].node
        full = StageConfig()
        self.piece_bytes_of_kind = {k: cost.layer(node, full, k).grad_bytes for k in ctx.kinds}  # type: ignore[arg-type]
        self.embedding_bytes = cost.embedding(node, full).grad_bytes
        self.head_bytes = cost.head(node, full).grad_bytes
        self.zone_links = {}
        for a in ctx.cluster.zones:
            for b in ctx.cluster.zones:
                link = ctx.cluster.zone_link(a, b)
                if a < b and link is not None:
                    self.zone_links[(a, b)] = (link.bw_bytes_per_s * self.efficiency, link.latency_s)

    def problem(self, b: int, m: int) -> PipelineProblem:
        if b not in self._problems:
            self._problems[b] = self.ctx.problem(b)
        return replace(self._problems[b], num_micro_batches=m)

    def parts(self, b: int, ci: int, layers: dict[str, int], first: bool, last: bool) -> StageParts:
        key = (b, ci, tuple(sorted(layers.items())), first, last)
        hit = self._parts.get(key)
        if hit is not None:
            return hit
        ctx, cost = self.ctx, self.ctx.cost
        assert cost is not None
        c = ctx.candidates(b)[ci]
        node = ctx.islands[c.island].node
        shard_cfg = replace(c.config, zero=max(2, c.config.zero))
        gs = opt = nbytes = 0.0
        for k, n in layers.items():
            if n:
                gs += n * c.layer[k].grad_sync_time_s
                opt += n * c.layer[k].optimizer_time_s
                nbytes += n * cost.layer(node, shard_cfg, k).grad_bytes  # type: ignore[arg-type]
        for use, lc, fn in ((first, c.embedding, cost.embedding), (last, c.head, cost.head)):
            if use:
                gs += lc.grad_sync_time_s
                opt += lc.optimizer_time_s
                nbytes += fn(node, shard_cfg).grad_bytes
        hit = self._parts[key] = StageParts(grad_sync_s=gs, optimizer_s=opt, bytes_per_gpu=nbytes, island=c.island)
        return hit

    def bw_per_gpu(self, island: int) -> float:
        return self.ctx.islands[island].node.nic_bw_per_gpu_bytes_per_s * self.efficiency

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
        t.min_period_s = self.timing(t, 2).bottleneck_s if sched == "1f1b" else self.timing(t, 1).bottleneck_s
        t.period_s = self.timing(t, P + 1).bottleneck_s
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


# --- template generation -------------------------------------------------------------------------
def one_stage_templates(ctx: PlanningContext, pricer: _Pricer, start: int = 0) -> list[Template]:
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
            keys = [(t.total_gpus, pricer.cf(t, 1), t.parts[0].grad_sync_s, t.optimizer_s, t.ratio_s, -t.m_cap,
                     t.min_period_s) for t in group]
            for i, t in enumerate(group):
                dominated = any(j != i and all(a <= b_ for a, b_ in zip(keys[j], keys[i]))
                                and (keys[j] != keys[i] or j < i) for j in range(len(group)))
                if not dominated:
                    out.append(t)
    for i, t in enumerate(out):
        t.index = start + i
    return out


class _SubProvider:
    """Candidates of a sub-cluster: the full cluster's table, renumbered and cut to the sub-island size."""

    def __init__(self, ctx: PlanningContext):
        self.ctx = ctx
        self.by_shape = {(i.node, i.zone): i for i in ctx.islands}

    def candidates(self, island: Island, pipeline_micro_batch: int) -> list[Candidate]:
        main = self.by_shape[(island.node, island.zone)]
        sizes = set(island.valid_stage_sizes())
        return [replace(c, island=island.index) for c in self.ctx.provider.candidates(main, pipeline_micro_batch)  # type: ignore[union-attr]
                if c.gpus in sizes]


def sub_cluster(cluster: Cluster, islands: Sequence[Island], nodes: dict[int, int]) -> Cluster | None:
    """The cluster keeping ``nodes[i]`` nodes of island i (taken from its node groups in order)."""
    groups_by_name = {g.name: g for g in cluster.node_groups}
    groups = []
    for isl in islands:
        want = nodes.get(isl.index, 0)
        for gname in isl.node_groups:
            g = groups_by_name[gname]
            take = min(want, g.num_nodes)
            if take > 0:
                groups.append(replace(g, num_nodes=take))
                want -= take
    if not groups:
        return None
    zones = {g.zone for g in groups}
    links = tuple(z for z in cluster.zone_links if z.zone_a in zones and z.zone_b in zones)
    return Cluster(name=f"{cluster.name}-sub", node_groups=tuple(groups), zone_links=links)


def _nearest_divisor(n: int, target: float) -> int:
    divs = [d for d in range(1, n + 1) if n % d == 0]
    return min(divs, key=lambda d: (abs(math.log(d / max(target, 1e-9))), d))


def _choices_of(ctx: PlanningContext, pipe: PipelinePlan, cluster: Cluster | None = None) -> list[StageChoice] | None:
    """Stage choices (indices into ``ctx.candidates(b)``) of a pipeline planned on ``cluster`` (default: the
    context's; a sub-cluster's islands are matched by node shape and zone) via each stage's configuration."""
    b = pipe.pipeline_micro_batch
    cands = ctx.candidates(b)
    index = {(c.island, c.config): i for i, c in enumerate(cands)}
    shape = {(i.node, i.zone): i.index for i in ctx.islands}
    named = {i.name: i for i in (find_islands(cluster) if cluster is not None else ctx.islands)}
    out = []
    for st in pipe.stages:
        isl = named.get(st.island)
        if isl is None or (isl.node, isl.zone) not in shape:
            return None
        key = (shape[(isl.node, isl.zone)], st.config)
        if key not in index:
            return None
        layers = {k: (st.num_dense_layers if k == "dense" else st.num_moe_layers) for k in ctx.kinds}
        out.append(StageChoice(candidate=index[key], layers=layers))
    return out


def _sub_contexts(ctx: PlanningContext, opts: MultiPipelineOptions) -> list[tuple[str, Cluster, int]]:
    """(origin, sub-cluster, its global batch) in the order they are solved."""
    isl, B = ctx.islands, ctx.training.global_batch_size
    peak = {i.index: i.num_gpus * i.node.gpu.peak_flops_per_s(ctx.training.precision) for i in isl}
    total = sum(peak.values())
    out: list[tuple[str, Cluster, int]] = []
    seen: set[tuple] = set()

    def add(origin: str, nodes: dict[int, int], batch: int) -> None:
        key = tuple(sorted((i, n) for i, n in nodes.items() if n > 0))
        if not key or key in seen or batch < 1:
            return
        if key == tuple(sorted((i.index, i.num_nodes) for i in isl)):
            return  # the whole cluster: that is the single-pipeline search itself
        sub = sub_cluster(ctx.cluster, isl, nodes)
        if sub is not None:
            seen.add(key)
            out.append((origin, sub, batch))

    scales = sorted(set(opts.island_scales) | set(opts.cluster_scales))
    for k in scales:
        if k in opts.island_scales and len(isl) > 1:
            for i in isl:
                if i.num_nodes // k >= 1:
                    add(f"island {i.name} / {k}", {i.index: i.num_nodes // k},
                        _nearest_divisor(B, B * peak[i.index] / total / k))
        if k in opts.cluster_scales and B % k == 0:
            add(f"cluster / {k}", {i.index: i.num_nodes // k for i in isl}, B // k)
    return out


def generate_templates(ctx: PlanningContext, single: Plan | None, opts: MultiPipelineOptions, *, backend: str,
                       deadline: float, threads: int = 1, seed: int = 0, rel_gap: float = 1e-4,
                       log: list[str] | None = None, pricer: _Pricer | None = None) -> list[Template]:
    """Level 1: the template set (one-stage, single-pipeline optimum, sub-cluster optima)."""
    from tangram_opt.planner.search import solve

    pricer = pricer or _Pricer(ctx)
    log = log if log is not None else []
    multi: list[Template] = []
    seen: set[tuple] = set()

    def add(origin: str, pipe: PipelinePlan, cluster: Cluster | None = None) -> None:
        ch = _choices_of(ctx, pipe, cluster)
        if ch is None:
            log.append(f"{origin}: plan does not map onto the candidate table; skipped")
            return
        key = (pipe.pipeline_micro_batch, tuple((c.candidate, tuple(sorted(c.layers.items()))) for c in ch))
        if key in seen:
            return
        t = pricer.template(0, origin, pipe.pipeline_micro_batch, ch)
        if t is not None and t.num_stages > 1:
            seen.add(key)
            multi.append(t)

    if single is not None:
        add("single-pipeline optimum", single.pipelines[0])
    subs = _sub_contexts(ctx, opts)
    for n, (origin, sub, batch) in enumerate(subs):
        left = deadline - time.perf_counter()
        if left <= 0.2:
            log.append(f"{origin}: skipped (template time budget spent)")
            continue
        limit = max(0.2, left / (len(subs) - n))
        space = ctx.space
        if space.pipeline_micro_batches is not None:
            keep = tuple(b for b in space.pipeline_micro_batches if batch % b == 0)
            if not keep:
                continue
            space = replace(space, pipeline_micro_batches=keep)
        training = replace(ctx.training, global_batch_size=batch)
        try:
            plan = solve(sub, ctx.model, training, time_limit_s=limit, backend=backend, threads=threads, seed=seed,
                         rel_gap=max(rel_gap, 1e-3), space=space, provider=_SubProvider(ctx),
                         calibration=ctx.calibration, profiles=ctx.profiles,
                         moe_load_imbalance=ctx.moe_load_imbalance, multi_pipeline=False)
        except TangramError as e:
            log.append(f"{origin}: no plan ({type(e).__name__})")
            continue
        add(origin, plan.pipelines[0], sub)
    ones = one_stage_templates(ctx, pricer) if opts.one_stage else []
    out = ones + multi
    for i, t in enumerate(out):
        t.index = i
    return out


# --- level 2 -----------------------------------------------------------------------------------
@dataclass(slots=True)
class Level2Result:
    """What the level-2 search found over the template space with 2..R_max pipelines."""

    status: str  # "optimal", "feasible", "nothing better than the cutoff", "no solution", "not run"
    pipes: list[tuple[Template, int]] | None
    objective_s: float | None  # exact model objective of ``pipes``
    bound_s: float  # valid lower bound over the template space (R >= 2), capped by the cutoff
    pairs: int = 0
    templates: int = 0
    solve_time_s: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)


#: the level-2 MIP counts time in ticks of about cutoff / LEVEL2_TICKS: fine enough that rounding
#: costs ~1e-6 relative, coarse enough to keep coefficients (GPUs x ticks) easy for LP-based solvers
LEVEL2_TICKS = 1e6
#: "optimal" means a gap within the solver's tolerance or this resolution (three level-2 ticks)
OPTIMAL_RESOLUTION = 3 / LEVEL2_TICKS


def _tick_for(reference_s: float) -> float:
    return 10.0 ** math.floor(math.log10(max(reference_s, 1e-9) / LEVEL2_TICKS))


def fluid_throughput(ctx: PlanningContext, templates: Sequence[Template]) -> float:
    """Most sequences per second any set of replicas can sustain (LP over fractional replica counts).

    A replica of t with m micro-batches needs ``CF'(m) >= m * min_period`` seconds, so it runs at
    most ``b / min_period`` sequences per second; GPUs per island bound the replicas.
    """
    md = LinearModel(name="fluid")
    x = [md.add_var(f"x{t.index}", 0.0, math.inf) for t in templates]
    for isl in ctx.islands:
        terms = [t.gpus[isl.index] * v for t, v in zip(templates, x) if t.gpus.get(isl.index)]
        if terms:
            md.add(lsum(terms) <= isl.num_gpus, f"gpus[{isl.index}]")
    md.minimize(lsum(-(t.b / max(t.min_period_s, 1e-12)) * v for t, v in zip(templates, x)))
    lp = lp_relaxation_bound(md, 10.0)
    if lp is not None and math.isfinite(lp):
        return -lp * (1 + 1e-7)
    # no LP solver: every GPU at the best per-GPU rate of any template touching its island
    best = {i.index: 0.0 for i in ctx.islands}
    for t in templates:
        rate = t.b / max(t.min_period_s, 1e-12) / t.total_gpus
        for i in t.gpus:
            best[i] = max(best[i], rate)
    return sum(best[i.index] * i.num_gpus for i in ctx.islands)


def split_micro_batches(pricer: _Pricer, replicas: Sequence[Template], batch: int) -> list[int] | None:
    """Micro-batch counts for ``replicas`` (one each) summing exactly to ``batch`` sequences with the
    smallest slowest CF' (bisection on the step, a subset-sum DP over the batch for each trial)."""
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
            cur, nxt = layers[-1], 0
            for m in range(1, top + 1):
                nxt |= cur << (t.b * m)
            layers.append(nxt & mask)
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
        mid = (lo + hi) // 2
        if reach(levels[mid]) is not None:
            hi = mid
        else:
            lo = mid + 1
    return reach(levels[lo])


#: templates per island the greedy warm start combines (the fastest by replicas x steady rate)
GREEDY_CHOICES = 6


def greedy_level2(ctx: PlanningContext, templates: Sequence[Template], pricer: _Pricer,
                  max_pipelines: int) -> tuple[float, list[tuple[Template, int]]] | None:
    """A quick multi-pipeline plan (the level-2 MIP's warm start): per island, replicas of one of its
    fastest templates filling the island; micro-batches split by :func:`split_micro_batches`."""
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
        ms = split_micro_batches(pricer, reps_t, B)
        if ms is None:
            continue
        pipes = list(zip(reps_t, ms))
        obj = pricer.objective(pipes)
        if best is None or obj < best[0]:
            best = (obj, pipes)
    return best


def solve_level2(ctx: PlanningContext, templates: Sequence[Template], pricer: _Pricer, *, cutoff_s: float,
                 max_pipelines: int, backend: str, time_limit_s: float, threads: int = 1, seed: int = 0,
                 rel_gap: float = 1e-4) -> Level2Result:
    """Choose replica counts of (template, micro-batch count) pairs; see formulations/multi_pipeline.md.

    Only plans with 2..``max_pipelines`` pipelines and objective below ``cutoff_s`` are searched
    (pairs that cannot be part of one are left out, which keeps the bound valid: it is capped at
    the cutoff).
    """
    t0 = time.perf_counter()
    B = ctx.training.global_batch_size
    Rmax = max_pipelines
    if not templates:
        return Level2Result(status="not run", pipes=None, objective_s=None, bound_s=cutoff_s)
    lat_min = min(i.node.nic_latency_s for i in ctx.islands)
    b_min = min(t.b for t in templates)
    # a pair is in a plan of R >= 2 pipelines only with X >= c_2 ratio + latency and the optimizer after
    floor = {t.index: t.optimizer_s + ring_factor(2) * t.ratio_s + latency_steps(2) * lat_min for t in templates}
    pairs: list[tuple[Template, int, float]] = []
    for t in templates:
        for m in range(1, min(t.m_cap, (B - b_min) // t.b) + 1):
            v = pricer.cf(t, m)
            if v + floor[t.index] >= cutoff_s:
                break  # CF' is increasing in m
            pairs.append((t, m, v))
    if not pairs:
        return Level2Result(status="nothing better than the cutoff", pipes=None, objective_s=None,
                            bound_s=cutoff_s, templates=len(templates))
    warm = greedy_level2(ctx, sorted({id(t): t for t, _, _ in pairs}.values(), key=lambda t: t.index), pricer, Rmax)
    if warm is not None and warm[0] >= cutoff_s:
        warm = None
    # the warm start is a better cutoff: the MIP searches plans strictly better than it
    cut = min(cutoff_s, warm[0]) if warm is not None else cutoff_s
    pairs = [(t, m, v) for t, m, v in pairs if v + floor[t.index] < cut]
    if not pairs:
        assert warm is not None
        return Level2Result(status="optimal", pipes=warm[1], objective_s=warm[0], bound_s=warm[0],
                            templates=len(templates), solve_time_s=time.perf_counter() - t0,
                            info={"warm_start_s": warm[0], "note": "no pair can beat the warm start"})
    used_t = sorted({id(t): t for t, _, _ in pairs}.values(), key=lambda t: t.index)
    thr = fluid_throughput(ctx, used_t)
    fluid_s = B / thr if thr > 0 else 0.0
    reference = min(cut, max(cf for _, _, cf in pairs))
    tick = _tick_for(reference)

    def fl(x: float) -> int:
        """Ticks, rounded down: every row built with it is implied by the exact values."""
        return math.floor(x / tick + 1e-9)

    md = LinearModel(name="multi_pipeline")
    cap = {}
    for t in used_t:
        cap[t.index] = min([Rmax] + [ctx.islands[i].num_gpus // g for i, g in t.gpus.items()])
    n, v = {}, {}
    for t, m, _ in pairs:
        n[t.index, m] = md.add_var(f"n[{t.index},{m}]", 0, cap[t.index], integer=True)
        v[t.index, m] = md.add_binary(f"v[{t.index},{m}]")
        md.add(n[t.index, m] <= cap[t.index] * v[t.index, m], f"nv[{t.index},{m}]")
        md.add(n[t.index, m] >= v[t.index, m], f"vn[{t.index},{m}]")
    md.add(lsum(t.b * m * n[t.index, m] for t, m, _ in pairs) == B, "batch")
    for isl in ctx.islands:
        terms = [t.gpus[isl.index] * n[t.index, m] for t, m, _ in pairs if t.gpus.get(isl.index)]
        if terms:
            md.add(lsum(terms) <= isl.num_gpus, f"gpus[{isl.index}]")
    y = {R: md.add_binary(f"y[{R}]") for R in range(2, Rmax + 1)}
    md.add(lsum(y.values()) == 1, "one_R")
    md.add(lsum(n.values()) == lsum(R * yv for R, yv in y.items()), "R")
    cf_max = max(fl(cf) for _, _, cf in pairs)
    tp = md.add_var("Tpipe", min(fl(fluid_s), cf_max), cf_max, integer=True)
    opt_max = max(fl(t.optimizer_s) for t in used_t)
    o = md.add_var("Opt", 0, opt_max, integer=True)
    # GPU-time per island: replicas are disjoint and each is busy CF' <= Tpipe, so
    # sum g CF' n <= N Tpipe (valid; it prices fill, drain and tails into the LP relaxation)
    for isl in ctx.islands:
        terms = [t.gpus[isl.index] * fl(cf) * n[t.index, m] for t, m, cf in pairs if t.gpus.get(isl.index)]
        if terms:
            md.add(lsum(terms) <= isl.num_gpus * tp, f"gpu_time[{isl.index}]")
    for t, m, cf in pairs:
        md.add(tp >= fl(cf) * v[t.index, m], f"pipe[{t.index},{m}]")
    # w[t]: template t has a replica (per-template rows keep the model small for LP-based presolve)
    w = {t.index: md.add_binary(f"w[{t.index}]") for t in used_t}
    for t in used_t:
        ms = [var for (ti, _), var in v.items() if ti == t.index]
        md.add(lsum(ms) <= len(ms) * w[t.index], f"used[{t.index}]")
        if fl(t.optimizer_s) > 0:
            md.add(o >= fl(t.optimizer_s) * w[t.index], f"opt[{t.index}]")
    # sync: ring factor 2(R-1)/R times the most loaded resource, plus latency (lower bounds)
    zs = _ZoneBounds(ctx, pricer, used_t, fl)
    rho_ub = max([fl(t.ratio_s) for t in used_t] + [zs.sigma] + list(zs.kappa.values()))
    rho = md.add_var("Rho", 0, rho_ub, integer=True)
    for t in used_t:
        if fl(t.ratio_s) > 0:
            md.add(rho >= fl(t.ratio_s) * w[t.index], f"rho[{t.index}]")
    span = zs.build(md, w, rho)
    lat = {R: fl(latency_steps(R) * lat_min) for R in y}
    zlat = {R: fl(latency_steps(R) * zs.zone_latency_s) for R in y}
    x_ub = 2 * rho_ub + max(lat.values()) + max(zlat.values()) + 1
    x = md.add_var("X", 0, x_ub, integer=True)

    def zl(R: int) -> Any:
        """Zone-link latency of every all-reduce group when single-zone pipelines span zones."""
        return zlat[R] * span if span is not None else 0

    md.add(x >= rho + lat[2] + zl(2), "sync_R2")  # 2(R-1)/R >= 1 and latencies grow with R
    for R, yv in y.items():
        big = 2 * (R - 1) * rho_ub + R * (lat[R] + zlat[R])
        md.add(R * x >= 2 * (R - 1) * rho + R * lat[R] + R * zl(R) - big * (1 - yv), f"sync[{R}]")
    md.minimize(tp + x + o)
    # the LP relaxation (HiGHS) bounds the MIP optimum; as a row it also helps CP-SAT prune
    lp = lp_relaxation_bound(md, max(2.0, min(10.0, 0.3 * time_limit_s)))
    if lp is not None and math.isinf(lp) and lp > 0:
        return _nothing_better(warm, cutoff_s, len(pairs), len(templates), time.perf_counter() - t0, {})
    lp_ticks = math.ceil(lp - 1e-6 * max(1.0, abs(lp))) if lp is not None and math.isfinite(lp) else None
    if lp_ticks is not None:
        md.add(tp + x + o >= lp_ticks, "lp_bound")
    hinted = False
    if warm is not None:
        hint = _level2_hint(warm[1], n, v, w, y, tp, x, o, rho, fl, lat, zlat, pricer, zs)
        if hint is not None:
            md.set_hint(hint)
            hinted = True
    st = md.stats()
    left = max(0.5, time_limit_s - (time.perf_counter() - t0))  # building, the greedy and the LP took their share
    res = solve_model(md, backend, SolveOptions(time_limit_s=left, threads=threads, seed=seed, rel_gap=rel_gap))
    info = {"rows": st.rows, "columns": st.columns, "integers": st.integer_columns, "tick_s": tick,
            "fluid_lower_bound_s": fluid_s, "lp_bound_s": None if lp_ticks is None else lp_ticks * tick,
            "solver_status": res.status.value,
            "warm_start_s": warm[0] if warm is not None else None, "hinted": hinted}
    elapsed = time.perf_counter() - t0
    if res.status == SolveStatus.INFEASIBLE:
        return _nothing_better(warm, cutoff_s, len(pairs), len(templates), elapsed, info)
    # every plan below the cutoff has Tpipe >= the fluid bound; the MIP optimum exceeds the exact
    # optimum by at most one tick (the integer X rounds c_R * Rho up), so one tick comes off its bound
    bound = fluid_s
    if lp_ticks is not None:
        bound = max(bound, (lp_ticks - 1) * tick)
    if res.bound is not None and math.isfinite(res.bound):
        bound = max(bound, (res.bound - 1) * tick)
    bound = min(bound, cut)
    best: tuple[float, list[tuple[Template, int]]] | None = warm
    if res.values is None:
        if best is not None:
            return Level2Result(status="feasible", pipes=best[1], objective_s=best[0], bound_s=bound,
                                pairs=len(pairs), templates=len(templates), solve_time_s=elapsed, info=info)
        return Level2Result(status="no solution", pipes=None, objective_s=None, bound_s=bound,
                            pairs=len(pairs), templates=len(templates), solve_time_s=elapsed, info=info)
    by_index = {t.index: t for t in used_t}
    for vals in [res.values] + [vv for _, vv in sorted(res.pool, key=lambda q: q[0])[:25]]:
        pipes: list[tuple[Template, int]] = []
        for (ti, m), var in n.items():
            pipes += [(by_index[ti], m)] * int(round(vals[var.index]))
        pipes.sort(key=lambda q: (sorted(q[0].gpus), -q[0].total_gpus, q[0].index, -q[1]))
        obj = pricer.objective(pipes)
        if best is None or obj < best[0]:
            best = (obj, pipes)
    assert best is not None
    bound = min(bound, best[0])
    # the MIP prices latency and zone terms by lower bounds: "optimal" only if the exact value agrees
    status = "optimal" if relative_gap(best[0], bound) <= max(rel_gap, OPTIMAL_RESOLUTION) else "feasible"
    return Level2Result(status=status, pipes=best[1], objective_s=best[0], bound_s=bound, pairs=len(pairs),
                        templates=len(templates), solve_time_s=elapsed, info=info)


class _ZoneBounds:
    """Lower bounds of the zone-link part of the sync (clusters with several zones).

    - single-zone templates in two zones both run (``span``): every piece's ring crosses a zone link:
      ``Rho >= sigma`` with ``sigma`` = all piece bytes over the fastest zone link (divided by the
      number of link directions when there are more than two zones); every all-reduce group then
      pays a zone latency too;
    - a template spanning zones runs with any single-zone template (``single``): the pieces it holds
      outside that template's zone cross, at least ``kappa_t`` bytes (the fewest outside one zone).
    """

    def __init__(self, ctx: PlanningContext, pricer: _Pricer, templates: Sequence[Template], fl: Any):
        self.templates = templates
        self.zones = sorted(ctx.cluster.zones)
        self.sigma, self.kappa, self.zone_latency_s = 0, {}, 0.0
        links = pricer.zone_links
        if not links or len(self.zones) < 2:
            return
        # a crossing piece loads at least one zone-link direction (one key per link with two zones,
        # up to Z (Z - 1) ordered pairs with more), so the busiest one carries >= 1/K of the bytes
        K = 1 if len(self.zones) == 2 else len(self.zones) * (len(self.zones) - 1)
        bw = K * max(b for b, _ in links.values())
        self.zone_latency_s = min(lat for _, lat in links.values())
        pieces = pricer.piece_bytes()
        self.sigma = fl(sum(pieces.values()) / bw)
        for t in templates:
            if len(t.zones) > 1:
                held: dict[str, float] = {}
                for st in pricer.sync_stages([(t, 1)])[0]:
                    held[st.zone] = held.get(st.zone, 0.0) + sum(pieces[x] for x in st.pieces)
                total = sum(held.values())
                self.kappa[t.index] = fl(min(total - held.get(z, 0.0) for z in self.zones) / bw)

    def build(self, md: LinearModel, w: dict[int, Any], rho: Any) -> Any:
        """Add the rows; returns the ``span`` binary (None for one zone)."""
        if self.sigma <= 0:
            return None
        self.zu = {z: md.add_binary(f"zone[{z}]") for z in self.zones}
        self.single = md.add_binary("single_zone_used")
        for t in self.templates:
            if len(t.zones) == 1:
                md.add(self.zu[next(iter(t.zones))] >= w[t.index], f"zu[{t.index}]")
                md.add(self.single >= w[t.index], f"single[{t.index}]")
        self.span = md.add_binary("span")
        for a in self.zones:
            for b in self.zones:
                if a < b:
                    md.add(self.span >= self.zu[a] + self.zu[b] - 1, f"span[{a},{b}]")
        md.add(rho >= self.sigma * self.span, "rho_zone")
        for t in self.templates:
            if self.kappa.get(t.index, 0) > 0:
                md.add(rho >= self.kappa[t.index] * (w[t.index] + self.single - 1), f"rho_cross[{t.index}]")
        return self.span

    def hint(self, pipes: Sequence[tuple[Template, int]]) -> tuple[dict[Any, float], int, int]:
        """Values of the zone binaries, the span and the zone part of Rho for ``pipes``."""
        if self.sigma <= 0:
            return {}, 0, 0
        zones = {z for t, _ in pipes if len(t.zones) == 1 for z in t.zones}
        single = 1 if zones else 0
        span = 1 if len(zones) > 1 else 0
        vals: dict[Any, float] = {var: int(z in zones) for z, var in self.zu.items()}
        vals[self.single], vals[self.span] = single, span
        r = max([self.sigma * span] + [self.kappa.get(t.index, 0) * single for t, _ in pipes])
        return vals, span, r


def _nothing_better(warm: tuple[float, list[tuple[Template, int]]] | None, cutoff_s: float, pairs: int,
                    templates: int, elapsed: float, info: dict[str, Any]) -> Level2Result:
    """The MIP proved that no plan beats its cutoff: the warm start is optimal, or nothing beats ``cutoff_s``."""
    if warm is not None:
        return Level2Result(status="optimal", pipes=warm[1], objective_s=warm[0], bound_s=warm[0], pairs=pairs,
                            templates=templates, solve_time_s=elapsed, info=info)
    return Level2Result(status="nothing better than the cutoff", pipes=None, objective_s=None, bound_s=cutoff_s,
                        pairs=pairs, templates=templates, solve_time_s=elapsed, info=info)


def _level2_hint(pipes: Sequence[tuple[Template, int]], n: dict, v: dict, w: dict, y: dict, tp: Any, x: Any,
                 o: Any, rho: Any, fl: Any, lat: dict[int, int], zlat: dict[int, int], pricer: _Pricer,
                 zs: _ZoneBounds) -> dict | None:
    """A complete assignment of the level-2 model for ``pipes`` (None if a pair was left out)."""
    count: dict[tuple[int, int], int] = {}
    for t, m in pipes:
        count[t.index, m] = count.get((t.index, m), 0) + 1
    R = len(pipes)
    if any(k not in n for k in count) or R not in y:
        return None
    used = {t.index for t, _ in pipes}
    vals: dict[Any, float] = {}
    for k, var in n.items():
        vals[var] = count.get(k, 0)
        vals[v[k]] = 1 if count.get(k, 0) else 0
    for ti, var in w.items():
        vals[var] = 1 if ti in used else 0
    for r, var in y.items():
        vals[var] = 1 if r == R else 0
    zone_vals, span, zone_rho = zs.hint(pipes)
    vals.update(zone_vals)
    vals[tp] = max(max(fl(pricer.cf(t, m)) for t, m in pipes), tp.lb)
    vals[o] = max(fl(t.optimizer_s) for t, _ in pipes)
    r_val = max([fl(t.ratio_s) for t, _ in pipes] + [zone_rho])
    vals[rho] = r_val
    vals[x] = max(r_val + lat[2] + zlat[2] * span,
                  -(-(2 * (R - 1) * r_val + R * lat[R] + R * zlat[R] * span) // R))
    if vals[x] > x.ub or vals[tp] > tp.ub:
        return None
    return vals


# --- assembling a multi-pipeline plan ------------------------------------------------------------
def assemble(ctx: PlanningContext, pricer: _Pricer, pipes: Sequence[tuple[Template, int]], *, method: str = "mip",
             certificate: Certificate | None = None) -> Plan:
    """The :class:`Plan` of ``pipes`` (template, micro-batches): exact step = max pipeline + sync + optimizer."""
    out = []
    for t, m in pipes:
        tm, exact = pricer.exact(t, m)
        cands = ctx.candidates(t.b)
        stages, layer, P = [], 0, t.num_stages
        for k, (ch, st, p) in enumerate(zip(t.choices, tm.stages, t.parts)):
            c = cands[ch.candidate]
            isl = ctx.islands[c.island]
            cfg = c.config
            dense, moe = ch.layers.get("dense", 0), ch.layers.get("moe", 0)
            stages.append(StagePlan(island=isl.name, gpu=isl.gpu_name, gpus=cfg.gpus, tp=cfg.tp, cp=cfg.cp, dp=cfg.dp,
                                    ep=cfg.ep, zero=cfg.zero, recompute=cfg.recompute,
                                    micro_batch_size=cfg.micro_batch_size, first_layer=layer, num_dense_layers=dense,
                                    num_moe_layers=moe, has_embedding=k == 0, has_head=k == P - 1,
                                    fwd_time_s=st.fwd_s, bwd_time_s=st.bwd_s, tail_time_s=p.grad_sync_s,
                                    p2p_time_s=st.p2p_s, memory_bytes=st.memory_bytes,
                                    capacity_bytes=st.capacity_bytes, inflight=st.inflight,
                                    post_sync_time_s=p.optimizer_s))
            layer += dense + moe
        out.append(PipelinePlan(stages=tuple(stages), pipeline_micro_batch=t.b, num_micro_batches=m,
                                schedule=ctx.space.schedule, makespan_s=tm.makespan_s, step_time_s=exact,
                                model_step_time_s=pricer.cf(t, m), bottleneck_s=tm.bottleneck_s))
    sync = pricer.sync(pipes)
    step = max(p.step_time_s for p in out) + sync.total_s + max(t.optimizer_s for t, _ in pipes)
    plan = make_plan(ctx, out, method=method, certificate=certificate, step_time_s=step)
    return replace(plan, cross_sync_s=sync.total_s)


# --- the entry point used by solve() -----------------------------------------------------------
@dataclass(slots=True)
class MultiPipelineRun:
    """Everything the multi-pipeline level produced (for tests, brute force and the benchmark)."""

    templates: list[Template]
    level2: Level2Result
    pricer: _Pricer
    log: list[str]


def with_multi_pipeline(ctx: PlanningContext, single: Plan, *, backend: str, time_limit_s: float, t0: float,
                        threads: int = 1, seed: int = 0, rel_gap: float = 1e-4,
                        options: MultiPipelineOptions | None = None) -> Plan:
    """Run the template and level-2 stages after the single-pipeline search; return the better plan.

    The returned plan's certificate covers the union of the single-pipeline space and the template
    space; its bound is the smaller of the two levels' bounds.
    """
    plan, _ = run_multi_pipeline(ctx, single, backend=backend, time_limit_s=time_limit_s, t0=t0, threads=threads,
                                 seed=seed, rel_gap=rel_gap, options=options)
    return plan


def run_multi_pipeline(ctx: PlanningContext, single: Plan, *, backend: str, time_limit_s: float, t0: float,
                       threads: int = 1, seed: int = 0, rel_gap: float = 1e-4,
                       options: MultiPipelineOptions | None = None,
                       templates: list[Template] | None = None) -> tuple[Plan, MultiPipelineRun]:
    """:func:`with_multi_pipeline` returning also the templates and the level-2 result."""
    opts = options or MultiPipelineOptions()
    cert = single.certificate
    assert cert is not None
    pricer = _Pricer(ctx)
    log: list[str] = []
    now = time.perf_counter()
    left = max(0.0, time_limit_s - (now - t0))
    if templates is None:
        deadline = now + opts.template_share * left
        templates = generate_templates(ctx, single, opts, backend=backend, deadline=deadline, threads=threads,
                                       seed=seed, rel_gap=rel_gap, log=log, pricer=pricer)
    # keep a little of the budget for assembling and evaluating the plans
    remaining = max(0.5, 0.97 * time_limit_s - (time.perf_counter() - t0))
    level2 = solve_level2(ctx, templates, pricer, cutoff_s=cert.objective_s, max_pipelines=opts.max_pipelines,
                          backend=backend, time_limit_s=remaining, threads=threads, seed=seed, rel_gap=rel_gap)
    run = MultiPipelineRun(templates=templates, level2=level2, pricer=pricer, log=log)
    return _combine(ctx, single, run, opts, t0=t0, backend=backend, rel_gap=rel_gap), run


def describe_template_space(ctx: PlanningContext, templates: Sequence[Template], opts: MultiPipelineOptions) -> str:
    ones = [t for t in templates if t.num_stages == 1]
    multi = [t for t in templates if t.num_stages > 1]
    bs = sorted({t.b for t in ones})
    text = (f"2 to {opts.max_pipelines} data-parallel pipelines on disjoint GPUs, each a copy of one of "
            f"{len(templates)} templates with a free whole number of micro-batches (shares summing to the global "
            f"batch): {len(ones)} one-stage templates (every candidate holding the whole model, pipeline "
            f"micro-batch in {bs}, exact-Pareto pruned) and {len(multi)} multi-stage templates")
    if multi:
        text += " (" + "; ".join(t.describe(ctx) for t in multi) + ")"
    return text + ("; step = slowest pipeline (gradient-sync-only tails) + cross-pipeline all-reduce + optimizer "
                   "(docs/multi_pipeline.md)")


def _combine(ctx: PlanningContext, single: Plan, run: MultiPipelineRun, opts: MultiPipelineOptions, *, t0: float,
             backend: str, rel_gap: float) -> Plan:
    cert = single.certificate
    assert cert is not None
    lv = run.level2
    single_bound = cert.bound_s if cert.bound_s is not None else 0.0
    bound = min(single_bound, lv.bound_s)
    space = f"union of (A) {cert.plan_space} and (B) {describe_template_space(ctx, run.templates, opts)}"
    row = {"level": "multi-pipeline (templates + level-2 MIP)", "status": lv.status, "templates": lv.templates,
           "pairs": lv.pairs, "objective_s": lv.objective_s, "bound_s": lv.bound_s, "solve_time_s": lv.solve_time_s,
           **lv.info}
    notes = cert.notes + (
        f"single-pipeline level: {cert.status}, objective {cert.objective_s:.6f} s, bound {single_bound:.6f} s"
        + (f", gap {100 * cert.gap:.3f}%" if cert.gap is not None else ""),
        f"multi-pipeline level (R = 2..{opts.max_pipelines}): {lv.status}"
        + (f", objective {lv.objective_s:.6f} s" if lv.objective_s is not None else "")
        + f", bound {lv.bound_s:.6f} s over {lv.templates} templates, {lv.pairs} (template, micro-batch count) pairs",
    ) + tuple(run.log)
    multi = None
    if lv.pipes is not None and lv.objective_s is not None:
        multi = assemble(ctx, run.pricer, lv.pipes, method="mip")
    # the better plan is the one with the shorter exact step (what plans report and the simulator
    # replays); the closed form breaks ties. Its certificate states its own model objective.
    use_multi = multi is not None and (multi.step_time_s, lv.objective_s) < (single.step_time_s, cert.objective_s)
    objective = lv.objective_s if use_multi else cert.objective_s
    assert objective is not None
    gap = relative_gap(objective, bound)
    status = "optimal" if gap <= max(rel_gap, OPTIMAL_RESOLUTION) else "feasible"
    elapsed = time.perf_counter() - t0
    new_cert = replace(cert, status=status, objective_s=objective, bound_s=bound, gap=gap, solve_time_s=elapsed,
                       plan_space=space, subproblems=cert.subproblems + (row,), notes=notes)
    if use_multi:
        assert multi is not None
        return replace(multi, certificate=new_cert)
    return replace(single, certificate=new_cert)


__all__ = ["MultiPipelineOptions", "MultiPipelineRun", "Level2Result", "SyncBreakdown", "SyncStage", "Template",
           "assemble", "cross_sync", "fluid_throughput", "generate_templates", "latency_steps",
           "one_stage_templates", "ring_factor", "run_multi_pipeline", "solve_level2", "sub_cluster",
           "with_multi_pipeline"]
