"""Public cloud facts (tangram_opt/data/cloud_instances.yaml) and the communication-bound cluster family
(benchmarks/clusters/comm/): every fact carries a source, numbers are sane, clusters load."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

import tangram_opt
from tangram_opt.specs.hardware import LINKS, get_gpu_type

ROOT = Path(__file__).resolve().parents[1]
FACTS = ROOT / "tangram_opt" / "data" / "cloud_instances.yaml"
COMM_DIR = ROOT / "benchmarks" / "clusters" / "comm"
COMM_FILES = sorted(COMM_DIR.glob("*.yaml"))

# Keys whose numbers are physical quantities (must be > 0); every other number must be >= 0
# (prices may be 0: Azure does not charge for inter-AZ transfer).
POSITIVE_KEY_PARTS = ("gbps", "latency_ms", "gib", "gpus_per_node")


@pytest.fixture(scope="module")
def facts() -> dict[str, Any]:
    with FACTS.open() as f:
        return yaml.safe_load(f)


def _walk_numbers(obj: Any, path: str = "", key: str = "") -> Iterator[tuple[str, str, float]]:
    """Yield (path, key, value) for every number in a nested structure (bools excluded)."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _walk_numbers(v, f"{path}.{k}", str(k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _walk_numbers(v, f"{path}[{i}]", key)
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        yield path, key, obj


def _check_sources(entry: dict[str, Any], where: str) -> None:
    sources = entry.get("sources")
    assert isinstance(sources, list) and sources, f"{where}: no sources"
    for s in sources:
        assert str(s.get("url", "")).startswith("https://"), f"{where}: source without an https URL: {s}"
        assert s.get("section"), f"{where}: source without a page/section: {s['url']}"
        for field in s.get("covers", []):
            assert field in entry, f"{where}: source {s['url']} covers unknown field {field!r}"


def test_header_and_access_date(facts: dict[str, Any]) -> None:
    assert facts["accessed"] == "2026-12-04"
    assert FACTS.read_text().startswith("#"), "the file opens with its explanatory comment"
    assert {"instances", "zone_links", "egress"} <= set(facts)


def test_every_instance_is_sourced_and_consistent(facts: dict[str, Any]) -> None:
    instances = facts["instances"]
    assert {e["provider"] for e in instances} >= {"aws", "gcp", "azure"}
    names = [e["name"] for e in instances]
    assert len(names) == len(set(names)), "instance names are unique"
    for e in instances:
        where = f"{e['provider']}:{e['name']}"
        _check_sources(e, where)
        assert isinstance(e["gpus_per_node"], int) and e["gpus_per_node"] > 0, where
        for key in ("gpu_memory_gib", "nic_gbps", "usd_per_hour"):
            assert e[key] is None or e[key] > 0, f"{where}: {key} = {e[key]}"
        if e["usd_per_hour"] is not None:
            assert e["price_region"], f"{where}: a price needs its region"
            assert e["price_basis"], f"{where}: a price needs its basis"
        if e["catalog_gpu"] is None:
            assert e["catalog_note"], f"{where}: a GPU missing from the catalog is reported"
        else:
            assert get_gpu_type(e["catalog_gpu"]).name == e["catalog_gpu"], where
        assert e["intra_node_link"] is None or e["intra_node_link"] in LINKS, where


def test_zone_links_and_egress_are_sourced(facts: dict[str, Any]) -> None:
    for section in ("zone_links", "egress"):
        assert facts[section], section
        for i, e in enumerate(facts[section]):
            _check_sources(e, f"{section}[{i}] {e['provider']} {e['scope']}")
    # the provider statements the brief asks for are there
    scopes = {(e["provider"], e["scope"]) for e in facts["zone_links"]}
    assert {("aws", "inter_az_same_region"), ("gcp", "intra_region_zones"), ("azure", "inter_az_same_region")} <= scopes


def test_all_numbers_are_positive(facts: dict[str, Any]) -> None:
    for path, key, value in _walk_numbers(facts):
        if any(part in key for part in POSITIVE_KEY_PARTS):
            assert value > 0, f"{path} = {value}"
        else:
            assert value >= 0, f"{path} = {value}"


def test_comm_family_size() -> None:
    assert 6 <= len(COMM_FILES) <= 10


@pytest.mark.parametrize("path", COMM_FILES, ids=lambda p: p.stem)
def test_comm_cluster_loads_and_is_communication_bound(path: Path, facts: dict[str, Any]) -> None:
    cluster = tangram_opt.load_cluster(path)
    assert cluster.name == path.stem
    assert 64 <= cluster.num_gpus <= 1024
    assert len(cluster.zones) in (1, 2)
    assert len({g.gpu.name for g in cluster.node_groups}) >= 2, "a mixture of GPU types"
    for link in cluster.zone_links:
        assert 1e-3 <= link.latency_s <= 10e-3
    # every node group is an instance shape from the facts file (same GPU, GPUs per node and NIC)
    shapes = {(e["catalog_gpu"], e["gpus_per_node"], e["nic_gbps"]) for e in facts["instances"]}
    with path.open() as f:
        raw = yaml.safe_load(f)
    for g in raw["node_groups"]:
        assert g["gpu"] in {"V100-16", "V100-32", "A100-40", "A100-80", "L4", "A10G"}, g["name"]
        assert 25 <= g["nic_gbps"] <= 100, g["name"]
        assert (g["gpu"], g["gpus_per_node"], g["nic_gbps"]) in shapes, f"{path.name}: {g['name']} is not a sourced shape"
