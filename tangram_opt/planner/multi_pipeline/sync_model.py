"""The gradient all-reduce across data-parallel pipelines, as the multi-pipeline level models it.

Every piece of the model (a transformer block, the embedding, the LM head) is held by one stage of
each of the R pipelines; after the intra-stage reduce-scatter its gradient is all-reduced by a ring
over those R stages (docs/multi_pipeline.md). :func:`cross_sync` prices one plan's all-reduce from
what each stage holds (:class:`SyncStage`); the bytes and bandwidths come from the candidate
tables (tangram_opt/planner/candidates/sync.py), and tangram_opt/sim/cross_sync.py prices the same
all-reduce independently for the simulator.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


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


__all__ = ["SyncBreakdown", "SyncStage", "cross_sync", "latency_steps", "ring_factor"]
