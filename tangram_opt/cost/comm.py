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
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tangram_opt.specs.cluster import NodeSpec, ZoneLink

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all")


@dataclass(frozen=True, slots=True)
class Placement:
    """How a group of ``n`` ranks, ``stride`` apart in rank order, sits on the node shape."""

    n: int
    per_node: int  # members inside one node
    nodes: int  # nodes spanned

    @property
    def crosses_nodes(self) -> bool:
        return self.nodes > 1


def place(node: NodeSpec, n: int, stride: int = 1) -> Placement:
    if n <= 1:
        return Placement(n=1, per_node=1, nodes=1)
    per_node = max(1, min(n, node.gpus_per_node // max(1, stride)))
    return Placement(n=n, per_node=per_node, nodes=math.ceil(n / per_node))


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
    intra_bw = node.intra_node_bw_bytes_per_s * efficiency
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


def p2p_time_s(nbytes: float, bw_bytes_per_s: float, latency_s: float, efficiency: float = 1.0) -> float:
    """One point-to-point send of ``nbytes``."""
    return latency_s + nbytes / (bw_bytes_per_s * efficiency)


def pipeline_link(src: NodeSpec, dst: NodeSpec, zone_link: ZoneLink | None, *,
                  intra_node: bool) -> tuple[float, float]:
    """Bandwidth (bytes/s) and latency (s) of the p2p path between two consecutive stages.

    Inside one node (``intra_node``) it is the scale-up link of one GPU pair (each TP rank sends its
    own slice to its peer, so the per-GPU figure applies to each slice in parallel; the micro-batch's
    activation crosses at ``tp x`` that rate, which we conservatively do not count). Across nodes,
    each side drives one node's NIC (a conservative figure for stages larger than a node, whose TP
    ranks send through several NICs), and a zone link caps the rate and adds its latency when the
    stages sit in different zones.
    """
    if intra_node:
        return src.intra_node_bw_bytes_per_s, src.intra_node_latency_s
    bw = min(src.nic_bw_bytes_per_s, dst.nic_bw_bytes_per_s)
    lat = max(src.nic_latency_s, dst.nic_latency_s)
    if zone_link is not None:
        bw = min(bw, zone_link.bw_bytes_per_s)
        lat += zone_link.latency_s
    return bw, lat
