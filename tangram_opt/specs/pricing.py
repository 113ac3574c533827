"""GPU prices: the default on-demand table and the prices a cluster file gives.

**Default table.** ``tangram_opt/data/gpu_prices.yaml`` holds one on-demand price per catalog GPU
type, in US dollars per GPU-hour. It is *derived*, by :func:`derive_default_prices`, from the sourced
public instance prices in ``tangram_opt/data/cloud_instances.yaml`` (docs/results/cloud_facts.md):

1. take every instance whose GPU maps to a catalog type (``catalog_gpu``) and whose on-demand
   price (``usd_per_hour``) has a price date (``price_date``): an undated quote cannot say how
   stale it is, so it is left out (it is listed under ``cheaper_undated`` when it is cheaper);
2. divide the instance's price by its GPU count: the price of one GPU *with its share of the
   host* (CPUs, memory, NICs), which is what a GPU-hour of that instance costs;
3. keep the cheapest per GPU type (a tie goes to the instance with more GPUs, then the name).

The result names its provider, instance, region, price date and source URLs. GPU types with no
sourced, dated price (GB200, GH200-96, the consumer cards, AMD) have no default: a dollar figure
for them needs ``price_per_gpu_hour`` in the cluster file, and :func:`group_price` says so, naming
the field. :func:`write_default_table` rewrites the table from the facts file;
tests/test_pricing.py checks that the shipped table is exactly what the rule gives.

**Cluster files** may override the default per node group (``price_per_gpu_hour``: reserved,
spot or negotiated prices, in USD per GPU-hour) and give a cross-zone transfer price per zone link
(``egress_usd_per_gb``: USD per GB, 10^9 bytes, crossing the link, both providers' charges
included). Only US dollars are read; a key that looks like a price in another currency, or a price
field with a different spelling, is refused with the field named (:func:`reject_price_typos`).

Money stays in the unit the name carries (``usd_per_gpu_hour``, ``usd_per_gb``); per-second and
per-byte figures are derived where they are used, with the constants of :mod:`tangram_opt.units`.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from tangram_opt.errors import SpecError
from tangram_opt.specs._io import load_structured_file

if TYPE_CHECKING:
    from tangram_opt.specs.cluster import Cluster, NodeGroup

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
#: the shipped default table (generated; see the module docstring)
PRICE_TABLE = DATA_DIR / "gpu_prices.yaml"
#: the sourced public facts the table is derived from
CLOUD_FACTS = DATA_DIR / "cloud_instances.yaml"

#: file field of a node group's price override and of a zone link's transfer price
GROUP_PRICE_FIELD = "price_per_gpu_hour"
EGRESS_PRICE_FIELD = "egress_usd_per_gb"

#: currency words a mistaken price key may carry (ISO codes and symbols); USD is the only one read
_CURRENCIES = ("usd", "eur", "gbp", "jpy", "cny", "rmb", "inr", "chf", "cad", "aud", "krw", "sek", "nok", "dkk",
               "pln", "brl", "sgd", "hkd", "dollar", "euro", "pound", "yen", "yuan", "$", "€", "£", "¥")
_PRICE_WORDS = ("price", "cost", "egress", "per_hour", "per_gpu_h", "per_gb", "per_gib", "hourly", "spot", "reserved")


# --- validation ------------------------------------------------------------------------------------
def usd_amount(field: str, value: Any, *, source: str = "", unit: str = "USD per GPU-hour",
               example: str = "3.06") -> float:
    """A price in US dollars: a finite number >= 0 (0 is a valid price: owned hardware, free
    transfer), or a :class:`SpecError` naming ``field`` and the fix."""
    if isinstance(value, str):
        number = re.sub(r"[^0-9.eE+-]", "", value)
        fix = (f"write the number without quotes or currency, e.g. {field.rsplit('.', 1)[-1]}: {number}"
               if _is_number(number) else f"write a number of {unit}, e.g. {example}")
        raise SpecError(field, value, f"must be a number of {unit}, not a string", fix, source=source)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecError(field, value, f"must be a number of {unit}", f"write a number such as {example}",
                        source=source)
    value = float(value)
    if math.isnan(value) or math.isinf(value):
        raise SpecError(field, value, "must be a finite number", f"write the price in {unit}, e.g. {example}",
                        source=source)
    if value < 0:
        raise SpecError(field, value, "is negative", f"write a price >= 0 in {unit}, e.g. {example}", source=source)
    return value


def _is_number(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def reject_price_typos(field: str, data: Mapping[str, Any], known: Iterable[str], *, price_field: str,
                       unit: str, source: str = "") -> None:
    """Refuse a key that is not in ``known`` but looks like a price (``price_eur_per_gpu_hour``,
    ``cost_per_hour``, ``egress_usd_per_gib``): say that prices are read in USD, under one name.
    Other unknown keys are left to the generic unknown-field check."""
    known = set(known)
    for key in data:
        low = str(key).lower()
        if key in known:
            continue
        words = set(re.split(r"[^a-z0-9$€£¥]+", low))
        currency = next((c for c in _CURRENCIES if c in words or (len(c) == 1 and c in low)), None)
        if currency is None and not any(w in low for w in _PRICE_WORDS):
            continue
        path = f"{field}.{key}" if field else str(key)
        if currency is not None and currency != "usd":
            problem = f"is a price in {currency.upper()}: tangram_opt reads prices in US dollars only"
        else:
            problem = "is not a known price field"
        raise SpecError(path, data[key], problem, f"convert to US dollars and write {price_field}: <{unit}>",
                        source=source)


# --- the default table -----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class GPUPrice:
    """The default on-demand price of one catalog GPU type, and where it comes from."""

    gpu: str
    usd_per_gpu_hour: float
    provider: str
    instance: str
    gpus_per_instance: int
    usd_per_instance_hour: float
    region: str
    price_date: str
    price_basis: str
    sources: tuple[str, ...]
    #: cheaper quotes left out because they carry no price date ("provider instance: $/GPU-h")
    cheaper_undated: tuple[str, ...] = ()

    @property
    def origin(self) -> str:
        """One line naming the quote: ``aws p5.48xlarge (8 GPUs), us-east-1, price of 2026-07-20``."""
        return (f"{self.provider} {self.instance} ({self.gpus_per_instance} GPUs), {self.region}, price of "
                f"{self.price_date}")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "usd_per_gpu_hour": self.usd_per_gpu_hour, "provider": self.provider, "instance": self.instance,
            "gpus_per_instance": self.gpus_per_instance, "usd_per_instance_hour": self.usd_per_instance_hour,
            "region": self.region, "price_date": self.price_date, "price_basis": self.price_basis,
            "sources": list(self.sources)}
        if self.cheaper_undated:
            out["cheaper_undated"] = list(self.cheaper_undated)
        return out


def _catalog_names() -> list[str]:
    from tangram_opt.specs.hardware import _BUILTIN

    return [g.name for g in _BUILTIN]


def derive_default_prices(facts: Mapping[str, Any]) -> dict[str, GPUPrice]:
    """The default table from the facts file's ``instances`` (the rule in the module docstring),
    in catalog order."""
    best: dict[str, tuple[tuple[float, int, str], GPUPrice]] = {}
    undated: dict[str, list[tuple[float, str]]] = {}
    for inst in facts.get("instances", []):
        gpu, usd, n = inst.get("catalog_gpu"), inst.get("usd_per_hour"), inst.get("gpus_per_node")
        if gpu is None or usd is None or not n:
            continue
        per_gpu = round(float(usd) / int(n), 6)
        if inst.get("price_date") is None:
            undated.setdefault(gpu, []).append((per_gpu, f"{inst['provider']} {inst['name']}: {per_gpu:g}"))
            continue
        urls = tuple(s["url"] for s in inst.get("sources", []) if "usd_per_hour" in (s.get("covers") or []))
        price = GPUPrice(gpu=gpu, usd_per_gpu_hour=per_gpu, provider=str(inst["provider"]), instance=str(inst["name"]),
                         gpus_per_instance=int(n), usd_per_instance_hour=float(usd), region=str(inst["price_region"]),
                         price_date=str(inst["price_date"]), price_basis=str(inst.get("price_basis") or ""),
                         sources=urls)
        key = (per_gpu, -int(n), str(inst["name"]))
        if gpu not in best or key < best[gpu][0]:
            best[gpu] = (key, price)
    out: dict[str, GPUPrice] = {}
    for name in _catalog_names():
        if name not in best:
            continue
        p = best[name][1]
        cheaper = tuple(text for v, text in sorted(undated.get(name, [])) if v < p.usd_per_gpu_hour)
        out[name] = replace(p, cheaper_undated=cheaper)
    return out


def _price_from_dict(gpu: str, d: Mapping[str, Any]) -> GPUPrice:
    return GPUPrice(gpu=gpu, usd_per_gpu_hour=float(d["usd_per_gpu_hour"]), provider=d["provider"],
                    instance=d["instance"], gpus_per_instance=int(d["gpus_per_instance"]),
                    usd_per_instance_hour=float(d["usd_per_instance_hour"]), region=d["region"],
                    price_date=str(d["price_date"]), price_basis=d["price_basis"], sources=tuple(d["sources"]),
                    cheaper_undated=tuple(d.get("cheaper_undated", ())))


@functools.lru_cache(maxsize=1)
def _shipped_table() -> tuple[GPUPrice, ...]:
    data = load_structured_file(PRICE_TABLE)
    return tuple(_price_from_dict(gpu, d) for gpu, d in data["prices"].items())


def default_gpu_prices() -> dict[str, GPUPrice]:
    """The shipped default table: catalog GPU name -> :class:`GPUPrice` (only GPUs with a sourced price)."""
    return {p.gpu: p for p in _shipped_table()}


def default_price(gpu_name: str) -> GPUPrice | None:
    """The default price of a catalog GPU type (``None`` when no sourced price exists)."""
    return default_gpu_prices().get(gpu_name)


HEADER = """\
# Default on-demand GPU prices, USD per GPU-hour, one per catalog GPU type.
# GENERATED from tangram_opt/data/cloud_instances.yaml by
#   python -c "from tangram_opt.specs.pricing import write_default_table; write_default_table()"
# (sourced public prices; docs/results/cloud_facts.md); do not edit by hand.
#
# Rule (tangram_opt/specs/pricing.py): among the instances of a GPU type with a dated on-demand price,
# the cheapest instance price divided by its GPU count (a GPU-hour with its share of the host);
# ties go to the instance with more GPUs. Undated quotes are left out and, when cheaper, listed
# under cheaper_undated. GPU types missing here have no default: give price_per_gpu_hour per node group.
# Prices change often and differ by region; override them in the cluster file for your own rates.
"""


def price_table_yaml(prices: Mapping[str, GPUPrice], *, accessed: str) -> str:
    """The text of ``gpu_prices.yaml`` for ``prices``."""
    body = {"schema_version": 1, "currency": "USD", "unit": "USD per GPU-hour, on-demand",
            "derived_from": "tangram_opt/data/cloud_instances.yaml", "sources_accessed": accessed,
            "prices": {g: p.to_dict() for g, p in prices.items()}}
    return HEADER + yaml.safe_dump(body, sort_keys=False, width=110, allow_unicode=True)


def write_default_table(path: Path = PRICE_TABLE, facts_path: Path = CLOUD_FACTS) -> Path:
    """Regenerate the default table from the facts file."""
    facts = load_structured_file(facts_path)
    path.write_text(price_table_yaml(derive_default_prices(facts), accessed=str(facts.get("accessed"))),
                    encoding="utf-8")
    _shipped_table.cache_clear()
    return path


# --- prices of a cluster ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class GroupPrice:
    """The price one node group's GPUs are costed at, and where it comes from."""

    group: str
    gpu: str
    num_gpus: int
    usd_per_gpu_hour: float
    #: "cluster file" (an override) or "default: <provider instance, region, price date>"
    origin: str

    @property
    def usd_per_hour(self) -> float:
        """Every GPU of the group for one hour."""
        return self.num_gpus * self.usd_per_gpu_hour


def _is_catalog_gpu(group: NodeGroup) -> bool:
    from tangram_opt.specs.hardware import _BUILTIN

    return any(g == group.gpu for g in _BUILTIN)


def group_price(cluster: Cluster, group: str | NodeGroup) -> GroupPrice:
    """The price of one node group's GPUs: its ``price_per_gpu_hour`` if the cluster gives one, else the
    default of its (catalog) GPU type. Raises :class:`SpecError` naming
    ``node_groups[i].price_per_gpu_hour`` when there is neither."""
    name = group if isinstance(group, str) else group.name
    index = next((i for i, g in enumerate(cluster.node_groups) if g.name == name), None)
    if index is None:
        raise SpecError("node_group", name, f"is not a node group of cluster {cluster.name!r}",
                        f"use one of {', '.join(g.name for g in cluster.node_groups)}")
    g = cluster.node_groups[index]
    if g.usd_per_gpu_hour is not None:
        return GroupPrice(group=g.name, gpu=g.gpu.name, num_gpus=g.num_gpus, usd_per_gpu_hour=g.usd_per_gpu_hour,
                          origin="cluster file")
    default = default_price(g.gpu.name) if _is_catalog_gpu(g) else None
    if default is None:
        known = ", ".join(default_gpu_prices())
        why = ("is a custom GPU type" if not _is_catalog_gpu(g)
               else "has no sourced on-demand price in the default table")
        raise SpecError(f"node_groups[{index}].{GROUP_PRICE_FIELD}", None,
                        f"is needed for a dollar figure: node group {g.name!r} has no price and its GPU "
                        f"{g.gpu.name!r} {why} (defaults exist for {known})",
                        f"add {GROUP_PRICE_FIELD}: <USD per GPU-hour> to node group {g.name!r} in the cluster file")
    return GroupPrice(group=g.name, gpu=g.gpu.name, num_gpus=g.num_gpus, usd_per_gpu_hour=default.usd_per_gpu_hour,
                      origin=f"default: {default.origin}")


def cluster_prices(cluster: Cluster) -> dict[str, GroupPrice]:
    """Node group name -> :class:`GroupPrice` for every group (the first group without a price raises)."""
    return {g.name: group_price(cluster, g) for g in cluster.node_groups}


def price_steps(cluster: Cluster, node_groups: Sequence[str]) -> tuple[tuple[str, int, float], ...]:
    """The price curve of a set of node groups (an island's ``node_groups``), cheapest GPUs first:
    ``(group, GPUs, USD per GPU-hour)`` steps. Using ``n`` of these GPUs costs the first ``n`` along
    the steps (a convex, piecewise-linear function of ``n``); an island of one group, or of groups at
    one price, has a single step, i.e. one price per GPU. Ties keep the cluster's group order."""
    order = {g.name: i for i, g in enumerate(cluster.node_groups)}
    steps = [(p.group, p.num_gpus, p.usd_per_gpu_hour) for p in (group_price(cluster, n) for n in node_groups)]
    return tuple(sorted(steps, key=lambda s: (s[2], order[s[0]])))


def fill_cheapest(steps: Sequence[tuple[str, int, float]], gpus: int) -> dict[str, int]:
    """GPUs taken from each group when ``gpus`` are used along ``steps`` (cheapest first)."""
    out: dict[str, int] = {}
    left = gpus
    for group, n, _ in steps:
        take = min(n, left)
        out[group] = take
        left -= take
    if left > 0:
        raise ValueError(f"{gpus} GPUs asked of groups holding {sum(n for _, n, _ in steps)}")
    return out


def usd_per_hour_of(steps: Sequence[tuple[str, int, float]], gpus: int) -> float:
    """USD per hour of ``gpus`` GPUs taken cheapest first along ``steps``."""
    price = {g: p for g, _, p in steps}
    return sum(n * price[g] for g, n in fill_cheapest(steps, gpus).items())


__all__ = [
    "CLOUD_FACTS",
    "EGRESS_PRICE_FIELD",
    "GROUP_PRICE_FIELD",
    "PRICE_TABLE",
    "GPUPrice",
    "GroupPrice",
    "cluster_prices",
    "default_gpu_prices",
    "default_price",
    "derive_default_prices",
    "fill_cheapest",
    "group_price",
    "price_steps",
    "price_table_yaml",
    "reject_price_typos",
    "usd_amount",
    "usd_per_hour_of",
    "write_default_table",
]

