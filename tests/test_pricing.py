"""GPU prices (tangram_opt/specs/pricing.py): the default table is what its rule gives from the sourced
facts, cluster files override it per node group, and every bad price is refused naming the field."""

from __future__ import annotations

import pytest
import yaml

from tangram_opt import SpecError, load_cluster, make_cluster
from tangram_opt.specs import cluster_from_dict
from tangram_opt.specs.hardware import _BUILTIN
from tangram_opt.specs.pricing import (
    CLOUD_FACTS,
    PRICE_TABLE,
    default_gpu_prices,
    default_price,
    derive_default_prices,
    fill_cheapest,
    group_price,
    price_steps,
    price_table_yaml,
    usd_per_hour_of,
)

FACTS = yaml.safe_load(CLOUD_FACTS.read_text())


def _cluster(**group_extra):
    return {"name": "c", "node_groups": [{"name": "a", "gpu": "A100-40", "nodes": 1, "nic_gbps": 400, **group_extra},
                                         {"name": "v", "gpu": "V100-16", "nodes": 2, "nic_gbps": 25}]}


# --- the default table ---------------------------------------------------------------------------------
def test_shipped_table_is_what_the_rule_gives_from_the_facts():
    expected = price_table_yaml(derive_default_prices(FACTS), accessed=FACTS["accessed"])
    assert PRICE_TABLE.read_text() == expected, (
        "regenerate: python -c \"from tangram_opt.specs.pricing import write_default_table; write_default_table()\"")


def test_every_default_is_a_sourced_dated_instance_price_per_gpu():
    instances = {(i["provider"], i["name"]): i for i in FACTS["instances"]}
    catalog = {g.name for g in _BUILTIN}
    prices = default_gpu_prices()
    assert prices, "the table is not empty"
    for gpu, p in prices.items():
        assert gpu in catalog
        inst = instances[(p.provider, p.instance)]
        assert inst["catalog_gpu"] == gpu and inst["price_date"] == p.price_date and inst["price_region"] == p.region
        assert p.usd_per_gpu_hour == pytest.approx(inst["usd_per_hour"] / inst["gpus_per_node"], abs=1e-6)
        urls = {s["url"] for s in inst["sources"] if "usd_per_hour" in s.get("covers", [])}
        assert p.sources and set(p.sources) == urls
        # no dated instance of this GPU is cheaper per GPU
        for other in FACTS["instances"]:
            if other["catalog_gpu"] == gpu and other.get("usd_per_hour") and other.get("price_date"):
                assert other["usd_per_hour"] / other["gpus_per_node"] >= p.usd_per_gpu_hour - 1e-6


def test_the_table_prices_the_common_training_gpus():
    # the GPU types the facts file prices with a date; the rest (GB200, consumer cards, AMD) have no default
    assert set(default_gpu_prices()) == {"V100-16", "V100-32", "A100-40", "A100-80", "H100-SXM", "H200", "B200",
                                         "L4", "A10G"}
    assert default_price("MI300X") is None and default_price("RTX-4090") is None
    h100 = default_price("H100-SXM")
    assert (h100.provider, h100.instance, h100.region, h100.price_date) == ("aws", "p5.48xlarge", "us-east-1",
                                                                            "2026-07-20")
    assert h100.usd_per_gpu_hour == pytest.approx(55.04 / 8)


def test_rule_skips_undated_prices_breaks_ties_by_size_and_lists_cheaper_undated_quotes():
    src = [{"url": "https://example.org/p", "section": "s", "covers": ["usd_per_hour"]}]
    facts = {"instances": [
        {"provider": "x", "name": "small", "catalog_gpu": "L4", "gpus_per_node": 4, "usd_per_hour": 4.0,
         "price_region": "r", "price_date": "2026-01-01", "sources": src},
        {"provider": "x", "name": "big", "catalog_gpu": "L4", "gpus_per_node": 8, "usd_per_hour": 8.0,
         "price_region": "r", "price_date": "2026-01-01", "sources": src},
        {"provider": "y", "name": "cheap-undated", "catalog_gpu": "L4", "gpus_per_node": 8, "usd_per_hour": 2.0,
         "price_region": "r", "price_date": None, "sources": src},
        {"provider": "z", "name": "not-in-catalog", "catalog_gpu": None, "gpus_per_node": 8, "usd_per_hour": 1.0,
         "price_region": "r", "price_date": "2026-01-01", "sources": src},
        {"provider": "z", "name": "no-price", "catalog_gpu": "H200", "gpus_per_node": 8, "usd_per_hour": None,
         "price_region": None, "price_date": None, "sources": src}]}
    table = derive_default_prices(facts)
    assert list(table) == ["L4"]
    assert table["L4"].instance == "big" and table["L4"].usd_per_gpu_hour == 1.0
    assert table["L4"].cheaper_undated == ("y cheap-undated: 0.25",)


# --- prices in cluster files ---------------------------------------------------------------------------------
def test_override_default_and_round_trip():
    c = cluster_from_dict(_cluster(price_per_gpu_hour=1.25))
    assert c.node_groups[0].usd_per_gpu_hour == 1.25 and c.node_groups[1].usd_per_gpu_hour is None
    a, v = group_price(c, "a"), group_price(c, "v")
    assert (a.usd_per_gpu_hour, a.origin, a.usd_per_hour) == (1.25, "cluster file", 10.0)
    assert v.usd_per_gpu_hour == default_price("V100-16").usd_per_gpu_hour
    assert v.origin.startswith("default: aws p3.16xlarge") and "2026-07-20" in v.origin
    d = c.to_dict()
    assert d["node_groups"][0]["price_per_gpu_hour"] == 1.25 and "price_per_gpu_hour" not in d["node_groups"][1]
    assert cluster_from_dict(d) == c
    zc = load_cluster("two-zone").to_dict()
    zc["zone_links"][0]["egress_usd_per_gb"] = 0.02
    z = cluster_from_dict(zc)
    assert z.zone_links[0].egress_usd_per_gb == 0.02 and cluster_from_dict(z.to_dict()) == z
    assert make_cluster("m", [dict(gpu="L4", nodes=1, nic_gbps=100, price_per_gpu_hour=0)]).node_groups[0] \
        .usd_per_gpu_hour == 0.0
    # clusters without prices write no price keys (their files and plan files are unchanged)
    assert "price_per_gpu_hour" not in str(load_cluster("tiny-mixed").to_dict())


@pytest.mark.parametrize("value, problem", [
    (-1.0, "is negative"), (float("nan"), "finite"), (float("inf"), "finite"), ("3.06", "not a string"),
    ("$3.06", "not a string"), (True, "must be a number"), ([3.06], "must be a number")])
def test_bad_group_price_names_the_field(value, problem):
    with pytest.raises(SpecError) as e:
        cluster_from_dict(_cluster(price_per_gpu_hour=value), source="c.yaml")
    assert e.value.field == "node_groups[0].price_per_gpu_hour" and problem in e.value.problem
    assert str(e.value).startswith("c.yaml: ") and e.value.fix
    if isinstance(value, str):
        assert "price_per_gpu_hour: 3.06" in e.value.fix


@pytest.mark.parametrize("key, problem", [
    ("price_eur_per_gpu_hour", "in EUR"), ("price_per_gpu_hour_gbp", "in GBP"), ("price_usd_per_gpu_hour",
                                                                                  "not a known price field"),
    ("cost_per_hour", "not a known price field"), ("spot_price", "not a known price field")])
def test_other_currencies_and_price_spellings_are_refused(key, problem):
    with pytest.raises(SpecError) as e:
        cluster_from_dict(_cluster(**{key: 2.0}))
    assert e.value.field == f"node_groups[0].{key}" and problem in e.value.problem
    assert "price_per_gpu_hour" in e.value.fix


@pytest.mark.parametrize("key, value, field", [
    ("egress_usd_per_gb", -0.01, "zone_links[0].egress_usd_per_gb"),
    ("egress_usd_per_gb", "0.02", "zone_links[0].egress_usd_per_gb"),
    ("egress_eur_per_gb", 0.02, "zone_links[0].egress_eur_per_gb"),
    ("egress_usd_per_gib", 0.01, "zone_links[0].egress_usd_per_gib")])
def test_bad_egress_price_names_the_field(key, value, field):
    d = load_cluster("two-zone").to_dict()
    d["zone_links"][0][key] = value
    with pytest.raises(SpecError) as e:
        cluster_from_dict(d)
    assert e.value.field == field and "egress_usd_per_gb" in str(e.value)


def test_a_gpu_without_a_default_needs_a_price_named_in_the_error():
    c = make_cluster("m", [dict(name="l4", gpu="L4", nodes=1, nic_gbps=100),
                           dict(name="mi", gpu="MI300X", nodes=1, nic_gbps=400)])
    with pytest.raises(SpecError) as e:
        group_price(c, "mi")
    assert e.value.field == "node_groups[1].price_per_gpu_hour"
    assert "MI300X" in e.value.problem and "add price_per_gpu_hour" in e.value.fix
    custom = {"name": "MyAccel", "fp16_tflops": 400, "memory_gib": 96, "hbm_gbs": 3000}
    c2 = make_cluster("m", [dict(name="x", gpu="MyAccel", nodes=1, nic_gbps=100)], gpu_types=[custom])
    with pytest.raises(SpecError, match="custom GPU type"):
        group_price(c2, "x")
    c3 = make_cluster("m", [dict(name="x", gpu="MyAccel", nodes=1, nic_gbps=100, price_per_gpu_hour=2.5)],
                      gpu_types=[custom])
    assert group_price(c3, "x").usd_per_gpu_hour == 2.5


def test_price_steps_fill_the_cheapest_gpus_first():
    c = make_cluster("m", [dict(name="dear", gpu="A100-40", nodes=2, nic_gbps=400, price_per_gpu_hour=3.0),
                           dict(name="cheap", gpu="A100-40", nodes=1, nic_gbps=400, price_per_gpu_hour=1.0)])
    steps = price_steps(c, ("dear", "cheap"))
    assert steps == (("cheap", 8, 1.0), ("dear", 16, 3.0))
    assert fill_cheapest(steps, 12) == {"cheap": 8, "dear": 4}
    assert usd_per_hour_of(steps, 12) == 8 * 1.0 + 4 * 3.0
    # the curve is convex: each extra GPU costs at least as much as the one before
    marginal = [usd_per_hour_of(steps, n + 1) - usd_per_hour_of(steps, n) for n in range(24)]
    assert marginal == sorted(marginal)
    with pytest.raises(ValueError):
        fill_cheapest(steps, 25)

