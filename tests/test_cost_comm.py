"""Collectives: NCCL bus-bandwidth factors, ring/tree latency, placement on nodes."""

from __future__ import annotations

import pytest

from tangram_opt import units as u
from tangram_opt.cost.comm import collective_time_s, place
from tangram_opt.specs import NodeSpec, get_gpu_type

MB = 64 * u.MB


def node(per_node: int = 8, intra_gbs: float = 300, nic_gbps: float = 1600, lat_us: float = 3) -> NodeSpec:
    return NodeSpec(gpu=get_gpu_type("A100-80"), gpus_per_node=per_node, intra_node_link="nvlink3",
                    intra_node_bw_bytes_per_s=intra_gbs * u.GB_PER_S, intra_node_latency_s=lat_us * u.US,
                    nic_bw_bytes_per_s=nic_gbps * u.GBIT_PER_S, nic_latency_s=5 * u.US)


@pytest.mark.parametrize("n", [2, 4, 8])
def test_bus_bandwidth_factors_inside_a_node(n):
    """nccl-tests PERFORMANCE.md: all-reduce 2(n-1)/n, reduce-scatter and all-gather (n-1)/n."""
    nd = node(lat_us=0)
    bw = nd.intra_node_bw_bytes_per_s
    assert collective_time_s(nd, "all_reduce", MB, n) == pytest.approx(2 * (n - 1) / n * MB / bw)
    assert collective_time_s(nd, "reduce_scatter", MB, n) == pytest.approx((n - 1) / n * MB / bw)
    assert collective_time_s(nd, "all_gather", MB, n) == pytest.approx((n - 1) / n * MB / bw)
    assert collective_time_s(nd, "all_to_all", MB, n) == pytest.approx((n - 1) / n * MB / bw)


def test_all_reduce_latency_uses_the_faster_of_ring_and_tree():
    nd = node(lat_us=10)
    tiny = 1.0
    assert collective_time_s(nd, "all_reduce", tiny, 8) == pytest.approx(2 * 3 * 10 * u.US, rel=1e-3)  # tree
    assert collective_time_s(nd, "all_reduce", tiny, 2) == pytest.approx(2 * 1 * 10 * u.US, rel=1e-3)
    assert collective_time_s(nd, "all_reduce", MB, 1) == 0.0


def test_placement_follows_rank_order():
    nd = node()
    assert place(nd, 8, 1).nodes == 1
    assert place(nd, 8, 2).per_node == 4 and place(nd, 8, 2).nodes == 2
    assert place(nd, 16, 8).per_node == 1 and place(nd, 16, 8).nodes == 16


def test_groups_spanning_nodes_are_slower_and_hierarchical():
    nd = node()
    inside = collective_time_s(nd, "all_reduce", MB, 8)
    across = collective_time_s(nd, "all_reduce", MB, 8, stride=2)
    assert across > inside
    # 16 ranks one per node: a flat ring over the NIC share of one GPU
    per_gpu_nic = nd.nic_bw_per_gpu_bytes_per_s
    flat = collective_time_s(nd, "all_reduce", MB, 16, stride=8)
    assert flat == pytest.approx(2 * 15 / 16 * MB / per_gpu_nic + 2 * 4 * 5 * u.US)


def test_every_collective_is_monotone_in_bandwidth():
    for kind in ("all_reduce", "reduce_scatter", "all_gather", "all_to_all"):
        for n, stride in ((4, 1), (16, 1), (16, 4), (32, 8)):
            fast = collective_time_s(node(), kind, MB, n, stride=stride)
            slow_intra = collective_time_s(node(intra_gbs=30), kind, MB, n, stride=stride)
            slow_nic = collective_time_s(node(nic_gbps=100), kind, MB, n, stride=stride)
            assert slow_intra >= fast and slow_nic >= fast
