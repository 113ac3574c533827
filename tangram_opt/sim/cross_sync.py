"""The gradient all-reduce between data-parallel pipelines, recomputed from the plan and the specs.

This is the simulator's own pricing of the cross-pipeline synchronization (docs/multi_pipeline.md,
"Cross-pipeline gradient synchronization"). It reads only the plan's stage layout (islands,
configurations, layer ranges), the cost model and the cluster's links; it shares no code with the
planner's multi-pipeline level (tangram_opt/planner/multi_pipeline/), which prices the same model from
its candidate tables. A test checks that the two agree.

Model. Every piece of the model (each transformer block, the embedding, the LM head) sits on one
stage of each of the R pipelines. Inside a stage its gradient is already reduce-scattered (that is
the stage's own exposed sync, in its tail), so each GPU holds a shard: the bytes ZeRO-2 keeps per
GPU. The R stages holding a piece then all-reduce it in a ring ordered by zone: every GPU sends and
receives ``2 (R-1)/R`` times its shard. All rings run at the same time and share bandwidth
(fluid sharing), so the time is set by the most loaded resource:

- each stage's NIC share, ``2 (R-1)/R x (shard bytes of all its pieces) / (node NIC / GPUs per
  node x network efficiency)``;
- each zone-link direction a ring crosses, carrying ``2 (R-1)/R`` times the piece's full bytes.

Latency: the pieces held by the same R stages form one all-reduce, ``2 min(R-1, ceil(log2 R))``
hops of the slowest member NIC's latency (plus the zone link's when it crosses zones); a stage's
all-reduces run one after another and the slowest stage counts. The all-reduce is not overlapped
with compute: it starts when the slowest pipeline has finished its backward passes and intra-stage
syncs, and the optimizer update of every stage follows it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from tangram_opt.cost import CostModel, StageConfig
from tangram_opt.planner.plan import Plan, StagePlan
from tangram_opt.sim._stages import island_by_name, stage_config, stage_layer_kinds
from tangram_opt.specs.cluster import Cluster


@dataclass(frozen=True, slots=True, kw_only=True)
class CrossSyncResult:
    """The cross-pipeline all-reduce of one plan; ``time_s = max(nic_s, zone_s) + latency_s``.

    ``zone_link_bytes``: bytes the rings move across each zone link in one step, both directions
    summed (``((zone_a, zone_b), bytes)``; what a per-GB transfer price applies to).
    """

    pipelines: int
    nic_s: float
    zone_s: float
    latency_s: float
    all_reduces: int
    slowest: str
    zone_link_bytes: tuple[tuple[tuple[str, str], float], ...] = ()

    @property
    def time_s(self) -> float:
        return max(self.nic_s, self.zone_s) + self.latency_s


def _pieces(stage: StagePlan, num_layers: int) -> list[object]:
    out: list[object] = list(stage.layer_range)
    if stage.has_embedding:
        out.append("E")
    if stage.has_head:
        out.append("H")
    return [p for p in out if not isinstance(p, int) or 0 <= p < num_layers]


def _shard_bytes(cost: CostModel, cluster: Cluster, stage: StagePlan) -> float:
    """Gradient bytes one GPU of the stage exchanges: its shard after the intra-stage reduce-scatter."""
    node = island_by_name(cluster)[stage.island].node
    cfg = stage_config(stage)
    shard = replace(cfg, zero=3) if cfg.zero == 3 else replace(cfg, zero=2)
    total = sum(n * cost.layer(node, shard, kind).grad_bytes  # type: ignore[arg-type]
                for kind, n in stage_layer_kinds(stage).items() if n > 0)
    if stage.has_embedding:
        total += cost.embedding(node, shard).grad_bytes
    if stage.has_head:
        total += cost.head(node, shard).grad_bytes
    return total


def cross_pipeline_allreduce(plan: Plan, cluster: Cluster, cost: CostModel) -> CrossSyncResult:
    """Price the all-reduce between the plan's pipelines (zero for a single pipeline)."""
    R = len(plan.pipelines)
    if R < 2:
        return CrossSyncResult(pipelines=R, nic_s=0.0, zone_s=0.0, latency_s=0.0, all_reduces=0, slowest="")
    islands = island_by_name(cluster)
    eff = cost.calibration.network_efficiency
    ring = 2.0 * (R - 1) / R
    hops = 2 * min(R - 1, math.ceil(math.log2(R)))
    model = cost.model
    L = model.num_layers
    # full gradient bytes of each piece (unsharded: tp = dp = 1)
    ref = next(iter(islands.values())).node
    kind_of = model.layer_kinds
    full: dict[object, float] = {i: cost.layer(ref, StageConfig(), kind_of[i]).grad_bytes for i in range(L)}  # type: ignore[arg-type]
    full["E"] = cost.embedding(ref, StageConfig()).grad_bytes
    full["H"] = cost.head(ref, StageConfig()).grad_bytes
    nic_s, slowest = 0.0, ""
    owners: dict[object, list[tuple[int, int]]] = {}
    for pi, pipe in enumerate(plan.pipelines):
        for k, st in enumerate(pipe.stages):
            node = islands[st.island].node
            t = ring * _shard_bytes(cost, cluster, st) / (node.nic_bw_per_gpu_bytes_per_s * eff)
            if t > nic_s:
                nic_s, slowest = t, f"pipeline {pi} stage {k} ({st.island}) NIC"
            for piece in _pieces(st, L):
                owners.setdefault(piece, []).append((pi, k))
    # pieces held by the same stages form one all-reduce
    reduces: dict[tuple[tuple[int, int], ...], list[object]] = {}
    for piece, who in owners.items():
        reduces.setdefault(tuple(sorted(who)), []).append(piece)
    link_load: dict[tuple[str, str], float] = {}
    moved: dict[tuple[str, str], float] = {}
    per_stage_latency: dict[tuple[int, int], float] = {}
    for who, pieces in reduces.items():
        sts = [plan.pipelines[p].stages[k] for p, k in who]
        zones = sorted({islands[s.island].zone for s in sts})
        latency = max(islands[s.island].node.nic_latency_s for s in sts)
        if len(zones) >= 2:
            crossings = [(zones[j], zones[(j + 1) % len(zones)]) for j in range(len(zones))]
            if len(zones) == 2:
                crossings = crossings[:1]  # both directions of one link, full duplex
            nbytes = sum(full[p] for p in pieces)
            for a, b in crossings:
                link_load[(a, b)] = link_load.get((a, b), 0.0) + ring * nbytes
                # the ring crosses a two-zone boundary once each way, else each crossing once
                moved[(a, b)] = moved.get((a, b), 0.0) + (2 if len(zones) == 2 else 1) * ring * nbytes
            latency += max(cluster.zone_link(a, b).latency_s for a, b in crossings)  # type: ignore[union-attr]
        for key in who:
            per_stage_latency[key] = per_stage_latency.get(key, 0.0) + hops * latency
    zone_s = 0.0
    for (a, b), nbytes in link_load.items():
        t = nbytes / (cluster.zone_link(a, b).bw_bytes_per_s * eff)  # type: ignore[union-attr]
        if t > zone_s:
            zone_s = t
            if t > nic_s:
                slowest = f"zone link {a}->{b}"
    return CrossSyncResult(pipelines=R, nic_s=nic_s, zone_s=zone_s, latency_s=max(per_stage_latency.values()),
                           all_reduces=len(reduces), slowest=slowest, zone_link_bytes=tuple(sorted(moved.items())))


def allreduce_hook(cluster: Cluster, cost: CostModel):  # type: ignore[no-untyped-def]
    """The default ``cross_pipeline_sync`` hook of :func:`~tangram_opt.sim.simulate`: this module's price."""

    def hook(plan: Plan, pipelines: Sequence[object]) -> float:
        return cross_pipeline_allreduce(plan, cluster, cost).time_s

    return hook


__all__ = ["CrossSyncResult", "allreduce_hook", "cross_pipeline_allreduce"]
