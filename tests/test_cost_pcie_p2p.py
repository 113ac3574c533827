"""GPUs without PCIe peer-to-peer (GeForce, Titan): transfers staged through host memory share the
PCIe switch uplinks (NodeSpec.peer_to_peer, gpus_per_pcie_switch; docs/cost_model.md §3.1)."""

from __future__ import annotations

import dataclasses

import pytest

from tangram_opt import units as u
from tangram_opt.cost import CostModel, StageConfig
from tangram_opt.cost.comm import collective_time_s, p2p_side_time_s
from tangram_opt.errors import SpecError
from tangram_opt.specs import NodeSpec, TrainingSpec, get_gpu_type
from tangram_opt.specs.cluster import cluster_from_dict


def node(gpu: str = "RTX-3090", link: str = "pcie4", per_node: int = 8, gbs: float = 31.5, per_switch: int = 1,
         p2p: bool | None = None) -> NodeSpec:
    return NodeSpec(gpu=get_gpu_type(gpu), gpus_per_node=per_node, intra_node_link=link,
                    intra_node_bw_bytes_per_s=gbs * u.GB_PER_S, intra_node_latency_s=8 * u.US,
                    nic_bw_bytes_per_s=100 * u.GBIT_PER_S, peer_to_peer=p2p, gpus_per_pcie_switch=per_switch)


def test_catalog_marks_geforce_and_titan_cards_without_pcie_peer_to_peer():
    for name in ("RTX-2080", "RTX-3090", "RTX-4090", "Titan-RTX"):
        assert get_gpu_type(name).pcie_peer_to_peer is False, name
    for name in ("V100-16", "A100-80", "H100-SXM", "L4", "A10G", "MI300X"):
        assert get_gpu_type(name).pcie_peer_to_peer is True, name


def test_peer_to_peer_defaults_from_the_gpu_on_pcie_and_is_always_on_for_nvlink():
    assert not node().has_peer_to_peer  # GeForce over PCIe
    assert node(link="nvlink3").has_peer_to_peer  # e.g. an NVLink-bridged pair: not through the host
    assert node(gpu="L4").has_peer_to_peer
    assert node(p2p=True).has_peer_to_peer and not node(gpu="L4", p2p=False).has_peer_to_peer


def test_an_all_reduce_through_host_memory_shares_the_switch_uplink():
    # 8 RTX 3090 behind two PCIe 4.0 switches of 4: every GPU sends up and receives down through
    # its switch's one x16 uplink (31.5 GB/s per direction) while the 3 others do the same, so
    # each gets 7.875 GB/s. An 8 MB all-reduce over 8 GPUs moves 2 x 7/8 x 8 MB = 14 MB per GPU:
    # 1.778 ms, plus the tree latency 2 x log2(8) x 8 us = 48 us.
    t = collective_time_s(node(per_switch=4), "all_reduce", 8 * u.MB, 8)
    assert t == pytest.approx(14e6 / 7.875e9 + 48e-6, rel=1e-9)
    # the same GPUs each on their own CPU root port: nothing shared, 4x faster bandwidth term
    alone = collective_time_s(node(per_switch=1), "all_reduce", 8 * u.MB, 8)
    assert alone == pytest.approx(14e6 / 31.5e9 + 48e-6, rel=1e-9)


def test_peer_to_peer_gpus_behind_a_switch_do_not_go_through_the_host():
    # with P2P the switch routes GPU-to-GPU traffic itself: the uplink is not in the path
    for kind in ("all_reduce", "reduce_scatter", "all_gather", "all_to_all"):
        assert collective_time_s(node(gpu="L4", per_switch=4), kind, 64 * u.MB, 4) == \
            collective_time_s(node(gpu="L4", per_switch=1), kind, 64 * u.MB, 4)


def test_pipeline_sends_inside_a_no_p2p_node_share_the_uplink_too():
    shared = p2p_side_time_s(16 * u.MB, node(per_switch=4), intra_node=True)
    assert shared == pytest.approx(16e6 / (31.5e9 / 4))
    # across nodes the NIC is the path, not the PCIe switch
    assert p2p_side_time_s(16 * u.MB, node(per_switch=4), intra_node=False) == \
        p2p_side_time_s(16 * u.MB, node(per_switch=1), intra_node=False)


def test_tensor_parallel_layer_is_slower_behind_shared_switches():
    cm = CostModel(_small_model(), TrainingSpec(global_batch_size=8, seq_len=1024, precision="fp16"))
    cfg = StageConfig(tp=4, micro_batch_size=2, sequence_parallel=False)
    a = cm.layer(node(gpu="Titan-RTX", link="pcie3", per_node=4, gbs=15.75, per_switch=1), cfg, "dense")
    b = cm.layer(node(gpu="Titan-RTX", link="pcie3", per_node=4, gbs=15.75, per_switch=4), cfg, "dense")
    assert a.breakdown["compute_fwd"] == b.breakdown["compute_fwd"]
    assert b.fwd_time_s > a.fwd_time_s and b.bwd_time_s > a.bwd_time_s


def _small_model():
    from tangram_opt.specs import ModelSpec

    return ModelSpec(name="tiny-gpt", num_layers=4, hidden_size=1024, num_attention_heads=16, ffn_hidden_size=4096,
                     vocab_size=50304)


def _cluster(**extra):
    return cluster_from_dict({"name": "c", "node_groups": [
        {"gpu": "RTX-3090", "nodes": 1, "gpus_per_node": 8, "nic_gbps": 100, **extra}]})


def test_cluster_file_fields_parse_round_trip_and_price():
    c = _cluster(gpus_per_pcie_switch=4)
    n = c.node_groups[0].node
    assert not n.has_peer_to_peer and n.intra_node_bw_per_gpu == pytest.approx(31.5e9 / 4)
    again = cluster_from_dict(c.to_dict())
    assert again.node_groups[0].node == n
    forced = _cluster(gpus_per_pcie_switch=4, peer_to_peer=True).node_groups[0].node
    assert forced.intra_node_bw_per_gpu == pytest.approx(31.5e9)
    assert cluster_from_dict(_cluster(peer_to_peer=True).to_dict()).node_groups[0].node.peer_to_peer is True


@pytest.mark.parametrize("extra, field", [
    ({"peer_to_peer": "no"}, "node_groups[0].peer_to_peer"),
    ({"gpus_per_pcie_switch": 16}, "node_groups[0].gpus_per_pcie_switch"),
    ({"gpus_per_pcie_switch": 0}, "node_groups[0].gpus_per_pcie_switch"),
    ({"gpus_per_pcie_switch": 2.5}, "node_groups[0].gpus_per_pcie_switch"),
])
def test_bad_topology_fields_name_the_field(extra, field):
    with pytest.raises(SpecError) as e:
        _cluster(**extra)
    assert e.value.field == field


def test_node_spec_rejects_a_switch_wider_than_the_node():
    with pytest.raises(SpecError) as e:
        dataclasses.replace(node(per_switch=4), gpus_per_node=2)
    assert e.value.field == "gpus_per_pcie_switch"


def test_custom_gpu_type_declares_pcie_peer_to_peer():
    base = {"name": "my-card", "fp16_tflops": 100, "memory_gib": 24, "hbm_gbs": 900}
    c = cluster_from_dict({"name": "c", "gpu_types": [{**base, "pcie_p2p": False}],
                           "node_groups": [{"gpu": "my-card", "nodes": 1, "nic_gbps": 100}]})
    assert c.node_groups[0].gpu.pcie_peer_to_peer is False and not c.node_groups[0].node.has_peer_to_peer
    assert cluster_from_dict(c.to_dict()).node_groups[0].gpu.pcie_peer_to_peer is False
    with pytest.raises(SpecError) as e:
        cluster_from_dict({"name": "c", "gpu_types": [{**base, "pcie_p2p": "false"}],
                           "node_groups": [{"gpu": "my-card", "nodes": 1, "nic_gbps": 100}]})
    assert e.value.field == "gpu_types[0].pcie_p2p"
