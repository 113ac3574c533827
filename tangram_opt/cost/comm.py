"""Collectives on the links of a node shape: alpha-beta model with NCCL algorithm factors.

A collective over ``n`` ranks moving a buffer of ``B`` bytes takes ``latency + traffic / bw`` where
the per-rank traffic uses the bus-bandwidth factors of nccl-tests (PERFORMANCE.md):

- all-reduce:      ``2 (n-1)/n B`` (ring; NCCL's tree moves the same bytes with ``2 log2 n`` latency steps)
- reduce-scatter:  ``(n-1)/n B``   (B is the full, unsharded buffer)
- all-gather:      ``(n-1)/n B``   (B is the gathered buffer)
- all-to-all:      ``(n-1)/n B``   (B is what one rank sends in total)

Ring latency is ``(n-1)`` hops per phase; the tree variant of all-reduce uses ``2 log2 n`` hops. We
take the faster of ring and tree, as NCCL's tuner does.

Placement. Ranks are numbered tensor-parallel fastest, then context-, expert- and data-parallel
(Megatron-LM's default order ``tp-cp-ep-dp``), and a stage fills whole nodes or divides one. A group
of ``n`` ranks ``stride`` apart therefore has ``k = min(n, gpus_per_node / stride)`` members per node
and spans ``n / k`` nodes. Inside a node it runs on the scale-up link (NVLink or PCIe, per GPU);
across nodes it is hierarchical (reduce-scatter inside the node, the cross-node step on ``1/k`` of
the data, all-gather inside the node), and the cross-node step gets ``nic_bw / gpus_per_node`` per
GPU because every GPU of the node runs the same collective at the same time (all groups of a stage
are in the same phase). The network efficiency of :class:`~tangram_opt.cost.calibration.Calibration`
scales every link figure.

GPUs without peer-to-peer access (GeForce and Titan cards over PCIe) run intra-node steps through
host memory: the per-GPU figure is then :attr:`NodeSpec.intra_node_bw_per_gpu`, the node's PCIe
rate shared by the GPUs behind one switch (they all communicate at once, as above).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tangram_opt.specs.cluster import NodeSpec, ZoneLink

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all")


@dataclass(frozen=True, slots=True)
class RankGroupLayout:
    """How a group of ``n`` ranks, ``stride`` apart in rank order, sits on the node shape."""

    n: int
    per_node: int  # members inside one node
    nodes: int  # nodes spanned

    @property
    def crosses_nodes(self) -> bool:
        return self.nodes > 1


def place(node: NodeSpec, n: int, stride: int = 1) -> RankGroupLayout:
    if n <= 1:
        return RankGroupLayout(n=1, per_node=1, nodes=1)
    per_node = max(1, min(n, node.gpus_per_node // max(1, stride)))
    return RankGroupLayout(n=n, per_node=per_node, nodes=math.ceil(n / per_node))


def _factor(kind: str, n: int) -> float:
    if kind == "all_reduce":
        return 2.0 * (n - 1) / n
    return (n - 1) / n


def _flat(kind: str, nbytes: float, n: int, bw: float, lat: float) -> float:
    """One flat collective over ``n`` ranks on one link class."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    traffic = _factor(kind, n) * nbytes / bw
    if kind == "all_reduce":
        ring = 2.0 * (n - 1) * lat
        tree = 2.0 * math.ceil(math.log2(n)) * lat
        return traffic + min(ring, tree)
    if kind == "all_to_all":
        return traffic + lat * math.ceil(math.log2(n))
    return traffic + (n - 1) * lat


def collective_time_s(node: NodeSpec, kind: str, nbytes: float, n: int, *, stride: int = 1,
                      efficiency: float = 1.0) -> float:
    """Seconds for ``kind`` over a group of ``n`` ranks ``stride`` apart, buffer ``nbytes`` per rank.

    Non-increasing in every bandwidth and non-decreasing in every latency (a property the planner
    relies on and tests check).
    """
    if n <= 1 or nbytes <= 0:
        return 0.0
    assert kind in COLLECTIVES, kind
    p = place(node, n, stride)
    intra_bw = node.intra_node_bw_per_gpu * efficiency
    if not p.crosses_nodes:
        return _flat(kind, nbytes, n, intra_bw, node.intra_node_latency_s)
    nic_bw = node.nic_bw_per_gpu_bytes_per_s * efficiency
    k, m = p.per_node, p.nodes
    if kind == "all_to_all":
        # each rank sends (k-1)/n of its buffer inside the node and (n-k)/n across nodes, concurrently
        intra = (k - 1) / n * nbytes / intra_bw + (node.intra_node_latency_s if k > 1 else 0.0)
        inter = (n - k) / n * nbytes / nic_bw + node.nic_latency_s * math.ceil(math.log2(m))
        return max(intra, inter)
    # hierarchical: intra-node reduce-scatter / all-gather on the full buffer, cross-node step on 1/k
    inner_kind = {"all_reduce": "all_reduce", "reduce_scatter": "reduce_scatter", "all_gather": "all_gather"}[kind]
    cross = _flat(inner_kind, nbytes / k, m, nic_bw, node.nic_latency_s)
    if k == 1:
        return cross
    if kind == "all_reduce":
        inner = _flat("reduce_scatter", nbytes, k, intra_bw, node.intra_node_latency_s) + _flat(
            "all_gather", nbytes, k, intra_bw, node.intra_node_latency_s)
    else:
        inner = _flat(kind, nbytes, k, intra_bw, node.intra_node_latency_s)
    return inner + cross


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineLink:
    """The path between the islands of two consecutive pipeline stages.

    ``intra_node``: both stages sit in one node and talk over its scale-up link (NVLink or PCIe);
    otherwise every GPU sends its share through its node's NIC. ``latency_s`` is one message's
    latency; ``shared_bw_bytes_per_s`` is a link the whole micro-batch crosses at once (the zone
    link between two zones; infinite inside one zone).
    """

    intra_node: bool
    latency_s: float
    shared_bw_bytes_per_s: float = math.inf


def pipeline_link(src: NodeSpec, dst: NodeSpec, zone_link: ZoneLink | None, *, intra_node: bool) -> PipelineLink:
    """The p2p path between two consecutive stages on nodes ``src`` and ``dst``.

    Inside one node (``intra_node``) it is the scale-up link; across nodes the NICs of both sides,
    with the larger of the two latencies; between zones the zone link caps the whole transfer and
    adds its latency.
    """
    if intra_node:
        return PipelineLink(intra_node=True, latency_s=src.intra_node_latency_s)
    lat = max(src.nic_latency_s, dst.nic_latency_s)
    if zone_link is None:
        return PipelineLink(intra_node=False, latency_s=lat)
    return PipelineLink(intra_node=False, latency_s=lat + zone_link.latency_s,
                        shared_bw_bytes_per_s=zone_link.bw_bytes_per_s)


def p2p_side_time_s(shard_bytes: float, node: NodeSpec, *, intra_node: bool, efficiency: float = 1.0) -> float:
    """Seconds for every GPU of one side of a stage boundary to move its ``shard_bytes`` share.

    Each data-parallel replica (and each context- and, with sequence parallelism, tensor-parallel
    rank) sends its own slice of the micro-batch to its peer in the next stage, all at the same
    time, so the busiest link carries one GPU's share at that GPU's share of the link: the
    scale-up bandwidth per GPU inside a node, ``nic_bw / gpus_per_node`` through the NIC (a stage
    of whole nodes drives all of each node's NIC; a stage smaller than a node gets its GPUs'
    share, since the node's other GPUs belong to stages sending at the same time under 1F1B).
    Without GPU peer-to-peer the scale-up share is the PCIe switch uplink's, as for collectives.
    """
    bw = node.intra_node_bw_per_gpu if intra_node else node.nic_bw_per_gpu_bytes_per_s
    return shard_bytes / (bw * efficiency)


def shared_link_time_s(link: PipelineLink, total_bytes: float, efficiency: float = 1.0) -> float:
    """Seconds the whole micro-batch (``total_bytes``) needs on the link both sides share (0 when none)."""
    if not math.isfinite(link.shared_bw_bytes_per_s):
        return 0.0
    return total_bytes / (link.shared_bw_bytes_per_s * efficiency)


def p2p_time_s(link: PipelineLink, *, side_s: tuple[float, float], shared_s: float) -> float:
    """One micro-batch's activations (or gradients) across a stage boundary: the latency plus the
    slowest of the sending side, the receiving side (``side_s``, from :func:`p2p_side_time_s`) and
    the shared link that the whole micro-batch crosses (``shared_s``, :func:`shared_link_time_s`).
    The two sides and the shared link run as one pipelined stream, so the slowest sets the rate."""
    return link.latency_s + max(side_s[0], side_s[1], shared_s)
