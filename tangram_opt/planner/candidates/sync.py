"""What the gradient all-reduce across data-parallel pipelines costs: the candidate tables' part of
the multi-pipeline level's pricing (docs/multi_pipeline.md, formulations/multi_pipeline.md).

The multi-pipeline level (tangram_opt/planner/multi_pipeline) reads these numbers and never the
cost model:

- per layer kind, and for the embedding and the LM head: the gradient bytes of one whole piece,
  which every pipeline's holder of it all-reduces with the other pipelines' holders;
- per candidate and piece: the gradient bytes each GPU of a stage exchanges after the intra-stage
  reduce-scatter, i.e. what ZeRO-2 keeps per GPU (the candidate's configuration at ZeRO >= 2);
- per island: each GPU's share of its node's NIC; per zone pair: the zone link (bandwidth, latency).

Bandwidths include the calibration's network efficiency. The shard sizes are priced on first use
and kept: only plans of several pipelines need them, so a single-pipeline search never pays for them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from tangram_opt.cost import CostModel, StageConfig
from tangram_opt.planner.candidates.table import Candidate
from tangram_opt.planner.islands import Island
from tangram_opt.specs.cluster import Cluster

#: the pieces of the all-reduce that are not transformer blocks
EMBEDDING, HEAD = "embedding", "head"


class SyncPrices:
    """The all-reduce prices of one planning context (islands indexed as in the context)."""

    def __init__(self, cost: CostModel, cluster: Cluster, islands: Sequence[Island], kinds: Sequence[str]):
        self._cost = cost
        self._nodes = {i.index: i.node for i in islands}
        self._shards: dict[tuple, float] = {}
        eff = cost.calibration.network_efficiency
        self.network_efficiency = eff
        node, whole = islands[0].node, StageConfig()
        #: gradient bytes of one whole block of each kind, of the embedding and of the head
        self.piece_bytes_of_kind = {k: cost.layer(node, whole, k).grad_bytes for k in kinds}
        self.embedding_bytes = cost.embedding(node, whole).grad_bytes
        self.head_bytes = cost.head(node, whole).grad_bytes
        #: (zone a, zone b) with a < b -> (bytes/s, latency s)
        self.zone_links: dict[tuple[str, str], tuple[float, float]] = {}
        for a in cluster.zones:
            for b in cluster.zones:
                link = cluster.zone_link(a, b)
                if a < b and link is not None:
                    self.zone_links[(a, b)] = (link.bw_bytes_per_s * eff, link.latency_s)

    def nic_bw_per_gpu(self, island: int) -> float:
        """Bytes per second each GPU of ``island`` gets from its node's NIC."""
        return self._nodes[island].nic_bw_per_gpu_bytes_per_s * self.network_efficiency

    def shard_bytes(self, cand: Candidate, piece: str) -> float:
        """Gradient bytes per GPU of one ``piece`` (a layer kind, :data:`EMBEDDING` or :data:`HEAD`)
        on a stage of ``cand`` after the intra-stage reduce-scatter."""
        key = (cand.island, cand.config, piece)
        hit = self._shards.get(key)
        if hit is None:
            node, cfg, cost = self._nodes[cand.island], replace(cand.config, zero=max(2, cand.config.zero)), self._cost
            if piece == EMBEDDING:
                hit = cost.embedding(node, cfg).grad_bytes
            elif piece == HEAD:
                hit = cost.head(node, cfg).grad_bytes
            else:
                hit = cost.layer(node, cfg, piece).grad_bytes  # type: ignore[arg-type]
            self._shards[key] = hit
        return hit


__all__ = ["EMBEDDING", "HEAD", "SyncPrices"]
