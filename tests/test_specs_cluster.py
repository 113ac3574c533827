"""Clusters: the example YAML files, round trips, Python construction, zones and custom GPU types."""

import pytest
import yaml

from tangram_opt import units as u
from tangram_opt.errors import SpecError
from tangram_opt.specs import Cluster, cluster_from_dict, example_clusters, get_gpu_type, load_cluster, make_cluster
from tangram_opt.specs.cluster import DEFAULT_NIC_LATENCY_S, DEFAULT_ZONE
from tangram_opt.specs.hardware import LINKS


def test_all_seven_examples_ship():
    assert set(example_clusters()) == {"a100-v100", "b200-h100-a100-1k", "b200-h100-a100-4k", "h100-64",
                                       "h100-a100-l4", "tiny-mixed", "two-zone"}


@pytest.mark.parametrize("name", example_clusters())
def test_example_loads_and_round_trips(name):
    c = load_cluster(name)
    assert isinstance(c, Cluster) and c.num_gpus == sum(g.num_nodes * g.node.gpus_per_node for g in c.node_groups)
    assert c.description
    again = cluster_from_dict(c.to_dict())
    assert again == c
    assert cluster_from_dict(yaml.safe_load(yaml.safe_dump(c.to_dict()))) == c  # through YAML text too
    assert load_cluster(c) is c


def test_example_sizes():
    sizes = {n: load_cluster(n).num_gpus for n in example_clusters()}
    assert sizes == {"a100-v100": 96, "b200-h100-a100-1k": 1024, "b200-h100-a100-4k": 4096, "h100-64": 64,
                     "h100-a100-l4": 384, "tiny-mixed": 24, "two-zone": 96}


def test_units_are_converted_once_at_the_edge():
    c = load_cluster("h100-a100-l4")
    h100, a100, l4 = c.node_groups
    assert h100.node.nic_bw_bytes_per_s == 3200 * u.GBIT_PER_S == 400 * u.GB_PER_S
    assert h100.node.intra_node_bw_bytes_per_s == LINKS["nvlink4"].bw_bytes_per_s == 450 * u.GB_PER_S
    assert l4.node.nic_latency_s == pytest.approx(20 * u.US)
    assert a100.node.nic_latency_s == DEFAULT_NIC_LATENCY_S
    assert h100.gpu.hbm_bytes == 80 * u.GiB
    assert h100.zone == DEFAULT_ZONE


def test_python_construction_equals_yaml():
    yaml_cluster = load_cluster("two-zone")
    py_cluster = make_cluster(
        "two-zone",
        [dict(name="h100-a", gpu="H100-SXM", nodes=4, gpus_per_node=8, nic_gbps=3200, zone="zone-a"),
         dict(name="a100-b", gpu="A100-40", nodes=8, gpus_per_node=8, nic_gbps=800, zone="zone-b")],
        [dict(zones=["zone-a", "zone-b"], gbps=200, latency_ms=0.5)],
        description="32 H100 in zone-a + 64 A100-40 in zone-b, 200 Gb/s between zones")
    assert py_cluster == yaml_cluster


def test_zone_links():
    c = load_cluster("two-zone")
    assert c.zones == ("zone-a", "zone-b")
    link = c.zone_link("zone-b", "zone-a")
    assert link is not None and link.bw_bytes_per_s == 200 * u.GBIT_PER_S and link.latency_s == pytest.approx(0.5e-3)
    assert c.zone_link("zone-a", "zone-a") is None


def test_custom_gpu_type_in_file_form_and_as_object():
    gpu = dict(name="MyAccel", fp16_tflops=400, bf16_tflops=400, fp32_tflops=50, memory_gib=96, hbm_gbs=3000,
               link="pcie5", source="vendor sheet")
    c = cluster_from_dict({"name": "c", "gpu_types": [gpu],
                           "node_groups": [{"gpu": "myaccel", "nodes": 2, "gpus_per_node": 4, "nic_gbps": 400}]})
    g = c.node_groups[0].gpu
    assert g.name == "MyAccel" and g.hbm_bytes == 96 * u.GiB and g.bf16_flops_per_s == 400 * u.TFLOPS
    assert c.node_groups[0].node.intra_node_link == "pcie5"
    assert cluster_from_dict(c.to_dict()) == c  # the custom type is embedded in the file form
    same = make_cluster("c", [{"gpu": "MyAccel", "nodes": 2, "gpus_per_node": 4, "nic_gbps": 400}], gpu_types=[g])
    assert same == c
    with pytest.raises(SpecError, match="MyAccel"):
        get_gpu_type("MyAccel")  # defined per cluster, not registered globally


def test_custom_gpu_without_bf16():
    c = make_cluster("c", [{"gpu": "OldCard", "nodes": 1, "nic_gbps": 100}],
                     gpu_types=[dict(name="OldCard", fp16_tflops=100, bf16_tflops=None, memory_gb=16, hbm_gbs=900)])
    assert not c.node_groups[0].gpu.supports("bf16") and c.node_groups[0].gpu.supports("fp16")


def test_gpu_aliases_and_defaults():
    c = make_cluster("c", [{"gpu": "a100-sxm4-80gb", "nodes": 1, "nic_gbps": 200}])
    g = c.node_groups[0]
    assert g.gpu.name == "A100-80" and g.node.gpus_per_node == 8 and g.node.intra_node_link == "nvlink3"
    assert g.name == "a100-80-0"


def test_describe_mentions_every_group():
    text = load_cluster("h100-a100-l4").describe()
    assert all(n in text for n in ("h100", "a100", "l4", "384 GPUs"))


def test_peak_flops():
    c = load_cluster("tiny-mixed")
    assert c.peak_flops_per_s("fp16") == 8 * 312 * u.TFLOPS + 16 * 125 * u.TFLOPS
