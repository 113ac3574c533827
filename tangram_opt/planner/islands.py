"""Islands: homogeneous virtual device groups.

An island is a maximal set of nodes with the same node shape (GPU type, GPUs per node, intra-node
link, NIC) in the same zone. Every collective of a stage (TP, CP, DP/ZeRO, EP) stays inside one
island; only pipeline point-to-point traffic crosses islands, which is what hides heterogeneity
from the per-stage cost model.
"""

from __future__ import annotations

from dataclasses import dataclass

from tangram_opt import units as u
from tangram_opt.cost import PipelineLink, pipeline_link
from tangram_opt.specs.cluster import Cluster, NodeSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class Island:
    """``num_nodes`` nodes of one :class:`NodeSpec` in one zone."""

    index: int
    name: str
    node: NodeSpec
    num_nodes: int
    zone: str
    node_groups: tuple[str, ...]

    @property
    def num_gpus(self) -> int:
        return self.num_nodes * self.node.gpus_per_node

    @property
    def gpus_per_node(self) -> int:
        return self.node.gpus_per_node

    @property
    def gpu_name(self) -> str:
        return self.node.gpu.name

    def valid_stage_sizes(self) -> list[int]:
        """GPU counts a stage may use: divisors of the node size, or whole numbers of nodes."""
        n = self.gpus_per_node
        sizes = [d for d in range(1, n + 1) if n % d == 0 and d <= self.num_gpus]
        sizes += [k * n for k in range(2, self.num_nodes + 1)]
        return sizes


def find_islands(cluster: Cluster) -> tuple[Island, ...]:
    """Merge node groups with identical node shape and zone into islands (order of first appearance)."""
    merged: dict[tuple[NodeSpec, str], list] = {}
    for g in cluster.node_groups:
        key = (g.node, g.zone)
        merged.setdefault(key, []).append(g)
    islands = []
    for idx, ((node, zone), groups) in enumerate(merged.items()):
        name = groups[0].name if len(groups) == 1 else "+".join(g.name for g in groups)
        islands.append(Island(index=idx, name=name, node=node, num_nodes=sum(g.num_nodes for g in groups),
                              zone=zone, node_groups=tuple(g.name for g in groups)))
    return tuple(islands)


def island_link(cluster: Cluster, a: Island, b: Island) -> PipelineLink:
    """The path of pipeline p2p traffic from a stage on ``a`` to one on ``b``.

    Consecutive stages inside a single-node island talk over the scale-up link; otherwise through
    the NICs (capped by the zone link when the islands are in different zones). Two stages of a
    larger island may share a node too; their traffic is still priced through the NICs
    (conservative: where the stages sit inside the island is not part of the plan).
    """
    intra = a.index == b.index and a.num_nodes == 1
    zl = cluster.zone_link(a.zone, b.zone) if a.zone != b.zone else None
    return pipeline_link(a.node, b.node, zl, intra_node=intra)


def islands_report(cluster: Cluster, islands: tuple[Island, ...] | None = None) -> str:
    """A readable table of the islands and the p2p links between them."""
    islands = islands or find_islands(cluster)
    lines = [f"{len(islands)} island(s) in cluster {cluster.name!r} ({cluster.num_gpus} GPUs):"]
    for isl in islands:
        n = isl.node
        lines.append(
            f"  [{isl.index}] {isl.name:<16} {isl.num_nodes:>4} nodes x {n.gpus_per_node} {n.gpu.name:<9} "
            f"= {isl.num_gpus:>5} GPUs  zone {isl.zone:<10} {n.intra_node_link} "
            f"{n.intra_node_bw_bytes_per_s / u.GB_PER_S:.0f} GB/s/GPU, "
            f"NIC {n.nic_bw_bytes_per_s / u.GBIT_PER_S:.0f} Gb/s/node")
    if len(islands) > 1:
        lines.append("  pipeline links (each GPU sends its share through its NIC; shared link, latency):")
        for a in islands:
            for b in islands:
                if a.index < b.index:
                    lk = island_link(cluster, a, b)
                    shared = "none" if lk.shared_bw_bytes_per_s == float("inf") else \
                        f"{lk.shared_bw_bytes_per_s / u.GB_PER_S:.1f} GB/s"
                    lines.append(f"    {a.name} <-> {b.name}: {shared}, {lk.latency_s / u.US:.0f} us")
    return "\n".join(lines)
