"""Bad cluster and GPU-type figures are refused with a SpecError naming the field, on every path in:
the spec dataclasses built from Python, and YAML/JSON files."""

import dataclasses
import math

import pytest

from tangram_opt import units as u
from tangram_opt.errors import FormatError, SpecError
from tangram_opt.specs import (GPUType, NodeGroup, NodeSpec, ZoneLink, cluster_from_dict, get_gpu_type, load_cluster,
                               make_cluster)
from tangram_opt.specs.hardware import gpu_type_from_dict

A100 = get_gpu_type("A100-40")


def node(**kw) -> NodeSpec:
    fields = dict(gpu=A100, gpus_per_node=4, intra_node_link="nvlink3", intra_node_bw_bytes_per_s=300 * u.GB_PER_S,
                  intra_node_latency_s=3 * u.US, nic_bw_bytes_per_s=200 * u.GBIT_PER_S)
    return NodeSpec(**{**fields, **kw})


def custom(**kw) -> dict:
    return {"name": "MyAccel", "fp16_tflops": 100, "memory_gib": 80, "hbm_gbs": 1000, **kw}


def cluster(*, gpu_types=(), gpu="A100-40", zone_links=(), groups=None) -> dict:
    return {"name": "c", "gpu_types": list(gpu_types), "zone_links": list(zone_links),
            "node_groups": groups or [{"gpu": gpu, "nodes": 1, "nic_gbps": 100}]}


@pytest.mark.parametrize("field, value", [
    ("intra_node_bw_bytes_per_s", -1.0), ("intra_node_bw_bytes_per_s", 0.0), ("intra_node_bw_bytes_per_s", math.nan),
    ("nic_bw_bytes_per_s", 0.0), ("nic_bw_bytes_per_s", math.inf), ("intra_node_latency_s", math.nan),
    ("intra_node_latency_s", -1e-6), ("nic_latency_s", math.nan), ("gpus_per_node", "4"), ("gpus_per_node", True),
    ("gpus_per_node", 0), ("gpus_per_node", 4.0), ("intra_node_link", None),
])
def test_node_spec_refuses_bad_figures(field, value):
    with pytest.raises(SpecError) as e:
        node(**{field: value})
    assert e.value.field == field and field in str(e.value)


def test_node_spec_accepts_zero_latency():
    assert node(intra_node_latency_s=0.0, nic_latency_s=0.0).nic_latency_s == 0.0


def test_zero_nic_refused_even_on_one_node():
    # a one-node group still crosses its NIC at stage boundaries to other groups; the file form refuses 0 too
    with pytest.raises(SpecError, match="nic_bw_bytes_per_s"):
        NodeGroup(name="a", node=node(nic_bw_bytes_per_s=0.0), num_nodes=1)
    with pytest.raises(SpecError) as e:
        cluster_from_dict(cluster(groups=[{"gpu": "A100-40", "nodes": 1, "nic_gbps": 0}]))
    assert e.value.field == "node_groups[0].nic_gbps"


def test_file_and_python_agree_on_zero_latency():
    c = cluster_from_dict(cluster(groups=[{"gpu": "A100-40", "nodes": 1, "nic_gbps": 100,
                                           "intra_node_latency_us": 0, "nic_latency_us": 0}]))
    assert c.node_groups[0].node == dataclasses.replace(c.node_groups[0].node, intra_node_latency_s=0.0)


@pytest.mark.parametrize("field, value", [("num_nodes", 0), ("num_nodes", -2), ("num_nodes", "2"), ("num_nodes", 1.5),
                                          ("name", ""), ("zone", ""), ("usd_per_gpu_hour", -1.0)])
def test_node_group_refuses_bad_figures(field, value):
    kw = dict(name="a", node=node(), num_nodes=1)
    with pytest.raises(SpecError) as e:
        NodeGroup(**{**kw, field: value})
    assert e.value.field == field


@pytest.mark.parametrize("field, value", [("bw_bytes_per_s", 0.0), ("bw_bytes_per_s", math.nan),
                                          ("latency_s", -1.0), ("latency_s", math.inf), ("zone_b", "x")])
def test_zone_link_refuses_bad_figures(field, value):
    kw = dict(zone_a="x", zone_b="y", bw_bytes_per_s=1e9, latency_s=0.0)
    with pytest.raises(SpecError) as e:
        ZoneLink(**{**kw, field: value})
    assert e.value.field == field


def test_json_duplicate_key_is_refused(tmp_path):
    p = tmp_path / "c.json"
    p.write_text('{"name": "c", "node_groups": [{"gpu": "A100-40", "nodes": 1, "nic_gbps": 200, "nodes": 64}]}')
    with pytest.raises(FormatError, match="key 'nodes' twice"):
        load_cluster(p)


def test_memory_gib_and_memory_gb_together_are_refused():
    with pytest.raises(SpecError) as e:
        cluster_from_dict(cluster(gpu_types=[custom(memory_gb=16)], gpu="MyAccel"))
    assert e.value.field == "gpu_types[0].memory_gb" and "memory_gib" in str(e.value)


def test_gpu_types_differing_only_in_case_are_refused():
    with pytest.raises(SpecError) as e:
        cluster_from_dict(cluster(gpu_types=[custom(name="X"), custom(name="x", fp16_tflops=1)], gpu="X"))
    assert e.value.field == "gpu_types[1].name" and "gpu_types[0]" in str(e.value)


@pytest.mark.parametrize("name", ["A100-40", "a100-40", "h100"])  # catalog name, other case, alias
def test_gpu_type_named_like_the_catalog_is_refused(name):
    with pytest.raises(SpecError) as e:
        cluster_from_dict(cluster(gpu_types=[custom(name=name)], gpu=name))
    assert e.value.field == "gpu_types[0].name" and "replaces_catalog" in e.value.fix


def test_replaces_catalog_is_explicit_and_round_trips():
    c = cluster_from_dict(cluster(gpu_types=[custom(name="A100-40", memory_gib=8, replaces_catalog=True)]))
    assert c.node_groups[0].gpu.hbm_bytes == 8 * u.GiB
    assert cluster_from_dict(c.to_dict()) == c
    # a GPUType object under a catalog name (the unaware baseline, published-run benchmarks) still builds
    shrunk = dataclasses.replace(A100, hbm_bytes=20 * u.GiB)
    c2 = make_cluster("c", [{"gpu": "A100-40", "nodes": 1, "nic_gbps": 100}], gpu_types=[shrunk])
    assert c2.node_groups[0].gpu.hbm_bytes == 20 * u.GiB
    for bad in (custom(replaces_catalog=True), custom(name="h100", replaces_catalog=True)):
        with pytest.raises(SpecError, match="replaces_catalog|catalog spelling"):
            gpu_type_from_dict(bad, field="gpu_types[0]")


@pytest.mark.parametrize("cc", [75, 2.0, 20])
def test_implausible_compute_capability_is_refused(cc):
    with pytest.raises(SpecError) as e:
        gpu_type_from_dict(custom(compute_capability=cc), field="gpu_types[0]")
    assert e.value.field == "gpu_types[0].compute_capability"
    if cc == 75:
        assert "7.5" in e.value.fix
    with pytest.raises(SpecError, match="compute_capability"):
        dataclasses.replace(A100, compute_capability=float(cc))


def test_fp32_above_fp16_is_allowed():
    # Pascal GeForce/Tesla cards (GP102/GP104) run FP16 at 1/64 of FP32: a real configuration
    g = gpu_type_from_dict(custom(fp16_tflops=0.18, fp32_tflops=11.8, compute_capability=6.1), field="gpu_types[0]")
    assert isinstance(g, GPUType) and g.fp32_flops_per_s > g.fp16_flops_per_s


def test_duplicate_zone_links_are_refused():
    groups = [{"name": "a", "gpu": "A100-40", "nodes": 1, "nic_gbps": 100, "zone": "a"},
              {"name": "b", "gpu": "A100-40", "nodes": 1, "nic_gbps": 100, "zone": "b"}]
    links = [{"zones": ["a", "b"], "gbps": 100}, {"zones": ["b", "a"], "gbps": 0.001}]
    with pytest.raises(SpecError) as e:
        cluster_from_dict(cluster(groups=groups, zone_links=links))
    assert e.value.field == "zone_links[1].zones" and "zone_links[0]" in str(e.value)


def test_yaml_exponent_notation_gets_a_hint(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("node_groups:\n  - gpu: A100-40\n    nodes: 1\n    nic_gbps: 1e3\n")
    with pytest.raises(SpecError) as e:
        load_cluster(p)
    assert e.value.field == "node_groups[0].nic_gbps" and "1.0e+3 or 1000" in e.value.fix
    with pytest.raises(SpecError) as e:
        cluster_from_dict(cluster(groups=[{"gpu": "A100-40", "nodes": 1, "nic_gbps": "fast"}]))
    assert "1.0e+3" not in e.value.fix


def test_a_custom_gpu_type_round_trips_with_its_fp8_sms_and_compute_capability():
    # to_dict dropped them: a saved cluster then assumed flash attention and no FP8 on reload
    c = cluster_from_dict(cluster(gpu_types=[custom(fp8_tflops=500, num_sms=108, compute_capability=7.5)], gpu="MyAccel"))
    again = cluster_from_dict(c.to_dict())
    assert again == c
    g = again.node_groups[0].gpu
    assert g.fp8_flops_per_s == 500 * u.TFLOPS and g.num_sms == 108 and g.compute_capability == 7.5
