"""Clusters: groups of identical nodes, zones, and the links between zones.

A :class:`Cluster` is a tuple of :class:`NodeGroup` (``num_nodes`` nodes of one :class:`NodeSpec`
in one zone) plus :class:`ZoneLink` figures between zones. File fields carry their units in their
names (``nic_gbps`` is Gb/s per node, ``intra_node_gbs`` GB/s per GPU per direction) and are
converted once, here, to bytes/s. Prices are optional and stay in US dollars
(``price_per_gpu_hour`` per node group, ``egress_usd_per_gb`` per zone link;
:mod:`tangram_opt.specs.pricing` resolves defaults and validates them).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tangram_opt import units as u
from tangram_opt.errors import SpecError
from tangram_opt.specs import _check
from tangram_opt.specs._io import load_structured_file, positive_number
from tangram_opt.specs.pricing import EGRESS_PRICE_FIELD, GROUP_PRICE_FIELD, reject_price_typos, usd_amount
from tangram_opt.specs.hardware import GPUType, catalog_name, get_gpu_type, get_link, gpu_type_from_dict

DEFAULT_ZONE = "default"
#: InfiniBand/RoCE NIC latency used when a file does not give one (typical ~2-5 us per message
#: for RDMA; we use 5 us to include the NCCL proxy).
DEFAULT_NIC_LATENCY_S = 5 * u.US


def _count(field: str, value: Any) -> None:
    """A count set from Python: what the file loader accepts (:func:`_check.positive_int`), as an int."""
    _check.positive_int(field, value)
    if not isinstance(value, int):
        raise SpecError(field, value, f"must be an int, not {type(value).__name__}", f"write {int(value)}")


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeSpec:
    """The shape of one node: what a homogeneous stage's cost depends on.

    ``intra_node_bw_bytes_per_s`` is per GPU and per direction (what a ring collective inside the
    node can drive); ``nic_bw_bytes_per_s`` is the node's total scale-out bandwidth per direction.

    PCIe topology, for GPUs without peer-to-peer access (``peer_to_peer``; ``None``: the GPU type's
    ``pcie_peer_to_peer`` on a PCIe link, always on NVLink / Infinity Fabric): NCCL then stages every
    intra-node transfer through host memory, so each GPU's traffic goes up to the CPU and back down
    even between two GPUs behind one PCIe switch. ``gpus_per_pcie_switch`` GPUs share one upstream
    x16 link of the node's PCIe generation (1: every GPU on its own CPU root port, nothing shared),
    and :func:`intra_node_bw_per_gpu` is what each gets while all of them communicate.
    """

    gpu: GPUType
    gpus_per_node: int
    intra_node_link: str
    intra_node_bw_bytes_per_s: float
    intra_node_latency_s: float
    nic_bw_bytes_per_s: float
    nic_latency_s: float = DEFAULT_NIC_LATENCY_S
    peer_to_peer: bool | None = None
    gpus_per_pcie_switch: int = 1

    def __post_init__(self) -> None:
        # the checks the file loader makes on the same figures (it names the file fields first);
        # the NIC bandwidth must be > 0 even on a one-node group: stage boundaries to other groups
        # and the sync between pipelines cross it
        _count("gpus_per_node", self.gpus_per_node)
        _check.text("intra_node_link", self.intra_node_link)
        for name in ("intra_node_bw_bytes_per_s", "nic_bw_bytes_per_s"):
            _check.positive_float(name, getattr(self, name))
        for name in ("intra_node_latency_s", "nic_latency_s"):
            _check.positive_float(name, getattr(self, name), allow_zero=True)
        if self.peer_to_peer is not None and not isinstance(self.peer_to_peer, bool):
            raise SpecError("peer_to_peer", self.peer_to_peer, "must be true, false or left out",
                            "write true or false (left out: the GPU type's default)")
        if not isinstance(self.gpus_per_pcie_switch, int) or isinstance(self.gpus_per_pcie_switch, bool) \
                or not 1 <= self.gpus_per_pcie_switch <= self.gpus_per_node:
            raise SpecError("gpus_per_pcie_switch", self.gpus_per_pcie_switch,
                            f"must be a whole number from 1 to gpus_per_node ({self.gpus_per_node})",
                            "give how many GPUs share one PCIe switch uplink (1: each on its own root port)")

    @property
    def has_peer_to_peer(self) -> bool:
        """Whether the node's GPUs reach each other directly (NVLink, xGMI, or PCIe with peer access)."""
        if self.peer_to_peer is not None:
            return self.peer_to_peer
        return not self.intra_node_link.startswith("pcie") or self.gpu.pcie_peer_to_peer

    @property
    def intra_node_bw_per_gpu(self) -> float:
        """Per GPU, per direction, while every GPU of the node runs the same collective (bytes/s).

        With peer-to-peer, ``intra_node_bw_bytes_per_s``. Without it each transfer is staged through
        host memory (NCCL's SHM transport): the sender writes over its PCIe path to the CPU and the
        receiver reads over its own, so the ``gpus_per_pcie_switch`` GPUs behind one switch all
        send through its one upstream link in one direction and receive through it in the other:
        each gets ``1 / gpus_per_pcie_switch`` of it (NCCL's own topology search charges the same
        shared PCIe links when it routes a ring through the CPU; src/graph/paths.cc, search.cc).
        """
        if self.has_peer_to_peer:
            return self.intra_node_bw_bytes_per_s
        return self.intra_node_bw_bytes_per_s / self.gpus_per_pcie_switch

    @property
    def nic_bw_per_gpu_bytes_per_s(self) -> float:
        return self.nic_bw_bytes_per_s / self.gpus_per_node

    @property
    def label(self) -> str:
        return f"{self.gpus_per_node}x{self.gpu.name}/{self.intra_node_link}"


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeGroup:
    """``num_nodes`` identical nodes in one zone.

    ``usd_per_gpu_hour`` is the cluster file's ``price_per_gpu_hour`` (reserved, spot or negotiated),
    or ``None`` for the default on-demand price of the GPU type (:func:`tangram_opt.specs.pricing.group_price`).
    It is not part of :class:`NodeSpec`: a price does not change what a stage costs in time.
    """

    name: str
    node: NodeSpec
    num_nodes: int
    zone: str = DEFAULT_ZONE
    usd_per_gpu_hour: float | None = None

    def __post_init__(self) -> None:
        _check.text("name", self.name)
        _count("num_nodes", self.num_nodes)
        _check.text("zone", self.zone)
        if self.usd_per_gpu_hour is not None:
            usd_amount("usd_per_gpu_hour", self.usd_per_gpu_hour)

    @property
    def num_gpus(self) -> int:
        return self.num_nodes * self.node.gpus_per_node

    @property
    def gpu(self) -> GPUType:
        return self.node.gpu


@dataclass(frozen=True, slots=True, kw_only=True)
class ZoneLink:
    """Aggregate bandwidth (per direction) and latency between two zones; optionally the price of
    moving data across (``egress_usd_per_gb``: USD per 10^9 bytes, both sides' charges included)."""

    zone_a: str
    zone_b: str
    bw_bytes_per_s: float
    latency_s: float
    egress_usd_per_gb: float | None = None

    def __post_init__(self) -> None:
        _check.text("zone_a", self.zone_a)
        _check.text("zone_b", self.zone_b)
        if self.zone_a == self.zone_b:
            raise SpecError("zone_b", self.zone_b, "is the same zone as zone_a",
                            "a zone link joins two different zones")
        _check.positive_float("bw_bytes_per_s", self.bw_bytes_per_s)
        _check.positive_float("latency_s", self.latency_s, allow_zero=True)
        if self.egress_usd_per_gb is not None:
            usd_amount("egress_usd_per_gb", self.egress_usd_per_gb, unit="USD per GB", example="0.02")

    def joins(self, a: str, b: str) -> bool:
        return {a, b} == {self.zone_a, self.zone_b}


@dataclass(frozen=True, slots=True, kw_only=True)
class Cluster:
    """A possibly heterogeneous GPU cluster."""

    name: str
    node_groups: tuple[NodeGroup, ...]
    zone_links: tuple[ZoneLink, ...] = ()
    description: str = ""

    def __post_init__(self) -> None:
        if not self.node_groups:
            raise SpecError("node_groups", [], "must list at least one group of nodes",
                            "add a node group with gpu, nodes, gpus_per_node and nic_gbps")
        first_index: dict[str, int] = {}
        for i, g in enumerate(self.node_groups):
            if g.name in first_index:
                raise SpecError(f"node_groups[{i}].name", g.name,
                                f"is already the name of node_groups[{first_index[g.name]}]",
                                "give every node group a distinct name (islands and plans refer to groups by name)")
            first_index[g.name] = i
        zones = self.zones
        for i, a in enumerate(zones):
            for b in zones[i + 1:]:
                if self.zone_link(a, b) is None:
                    raise SpecError("zone_links", [a, b], "no link is given between these two zones",
                                    f"add a zone_links entry with zones: [{a}, {b}], gbps: and latency_ms:")

    @property
    def num_gpus(self) -> int:
        return sum(g.num_gpus for g in self.node_groups)

    @property
    def zones(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(g.zone for g in self.node_groups))

    @property
    def gpu_types(self) -> tuple[GPUType, ...]:
        return tuple({g.gpu.name: g.gpu for g in self.node_groups}.values())

    def zone_link(self, a: str, b: str) -> ZoneLink | None:
        """The link between zones ``a`` and ``b`` (``None`` inside one zone)."""
        for link in self.zone_links:
            if link.joins(a, b):
                return link
        return None

    def peak_flops_per_s(self, precision: str) -> float:
        """Sum of dense peaks of every GPU: the denominator of cluster-level MFU."""
        return sum(g.num_gpus * g.gpu.peak_flops_per_s(precision) for g in self.node_groups)

    def describe(self) -> str:
        lines = [f"Cluster {self.name!r}: {self.num_gpus} GPUs in {len(self.node_groups)} node group(s)"]
        for g in self.node_groups:
            n = g.node
            lines.append(
                f"  {g.name:<14} {g.num_nodes:>4} x {n.gpus_per_node} {n.gpu.name:<9} zone={g.zone:<12} "
                f"intra={n.intra_node_link} {n.intra_node_bw_bytes_per_s / u.GB_PER_S:.0f} GB/s/GPU  "
                f"nic={n.nic_bw_bytes_per_s / u.GBIT_PER_S:.0f} Gb/s/node  "
                f"mem={n.gpu.hbm_bytes / u.GiB:.0f} GiB")
        for link in self.zone_links:
            lines.append(f"  zone link {link.zone_a} <-> {link.zone_b}: "
                         f"{link.bw_bytes_per_s / u.GBIT_PER_S:.0f} Gb/s, {link.latency_s / u.MS:.2f} ms")
        return "\n".join(lines)

    # --- serialization -------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """File form (the inverse of :func:`cluster_from_dict`); custom GPU types are embedded."""
        from tangram_opt.specs.hardware import builtin_gpu_types

        custom = {g.gpu.name: g.gpu for g in self.node_groups if builtin_gpu_types().get(g.gpu.name) != g.gpu}
        out: dict[str, Any] = {"name": self.name}
        if self.description:
            out["description"] = self.description
        if custom:
            out["gpu_types"] = [_gpu_to_dict(g) for g in custom.values()]
        out["node_groups"] = [
            {"name": g.name, "gpu": g.gpu.name, "nodes": g.num_nodes, "gpus_per_node": g.node.gpus_per_node,
             "intra_node_link": g.node.intra_node_link,
             "intra_node_gbs": g.node.intra_node_bw_bytes_per_s / u.GB_PER_S,
             "intra_node_latency_us": g.node.intra_node_latency_s / u.US,
             "nic_gbps": g.node.nic_bw_bytes_per_s / u.GBIT_PER_S,
             "nic_latency_us": g.node.nic_latency_s / u.US, "zone": g.zone,
             **({} if g.node.peer_to_peer is None else {"peer_to_peer": g.node.peer_to_peer}),
             **({} if g.node.gpus_per_pcie_switch == 1 else {"gpus_per_pcie_switch": g.node.gpus_per_pcie_switch}),
             **({} if g.usd_per_gpu_hour is None else {GROUP_PRICE_FIELD: g.usd_per_gpu_hour})}
            for g in self.node_groups]
        if self.zone_links:
            out["zone_links"] = [{"zones": [z.zone_a, z.zone_b], "gbps": z.bw_bytes_per_s / u.GBIT_PER_S,
                                  "latency_ms": z.latency_s / u.MS,
                                  **({} if z.egress_usd_per_gb is None else {EGRESS_PRICE_FIELD: z.egress_usd_per_gb})}
                                 for z in self.zone_links]
        return out


def _gpu_to_dict(g: GPUType) -> dict[str, Any]:
    return {"name": g.name, "fp16_tflops": g.fp16_flops_per_s / u.TFLOPS,
            "bf16_tflops": None if g.bf16_flops_per_s is None else g.bf16_flops_per_s / u.TFLOPS,
            "fp32_tflops": g.fp32_flops_per_s / u.TFLOPS, "memory_gib": g.hbm_bytes / u.GiB,
            "hbm_gbs": g.hbm_bw_bytes_per_s / u.GB_PER_S, "link": g.default_link,
            **({} if g.fp8_flops_per_s is None else {"fp8_tflops": g.fp8_flops_per_s / u.TFLOPS}),
            **({} if g.num_sms is None else {"num_sms": g.num_sms}),
            **({} if g.compute_capability is None else {"compute_capability": g.compute_capability}),
            **({} if g.pcie_peer_to_peer else {"pcie_p2p": False}),
            **({} if catalog_name(g.name) is None else {"replaces_catalog": True}), "vendor": g.vendor,
            "source": g.source, "notes": g.notes}


_GROUP_FIELDS = ("name", "gpu", "nodes", "gpus_per_node", "intra_node_link", "intra_node_gbs",
                 "intra_node_latency_us", "nic_gbps", "nic_latency_us", "zone", "peer_to_peer", "gpus_per_pcie_switch",
                 GROUP_PRICE_FIELD)
_CLUSTER_FIELDS = ("name", "description", "gpu_types", "node_groups", "zone_links")
_ZONE_FIELDS = ("zones", "gbps", "latency_ms", EGRESS_PRICE_FIELD)


def cluster_from_dict(data: Any, *, source: str = "") -> Cluster:
    """Build a :class:`Cluster` from its file form, validating every field."""
    _check.mapping("cluster", data, source=source)
    _check.no_unknown_keys("", data, _CLUSTER_FIELDS, source=source)
    name = str(data.get("name") or (Path(source).stem if source else "cluster"))
    custom: dict[str, GPUType] = {}
    gpu_list = data.get("gpu_types") or []
    if not isinstance(gpu_list, list):
        raise SpecError("gpu_types", gpu_list, "must be a list of GPU type definitions",
                        "write '- name: ...' entries", source=source)
    first: dict[str, tuple[int, str]] = {}
    for i, gd in enumerate(gpu_list):
        g = gpu_type_from_dict(gd, field=f"gpu_types[{i}]", source=source)
        key = g.name.strip().lower()  # node groups name GPU types case-insensitively (get_gpu_type)
        if key in first:
            j, earlier = first[key]
            raise SpecError(f"gpu_types[{i}].name", g.name, f"is already the name of gpu_types[{j}] ({earlier!r}; "
                            "GPU type names are case-insensitive)", "give every GPU type a distinct name",
                            source=source)
        first[key] = (i, g.name)
        custom[g.name] = g
    groups_raw = _check.required("", data, "node_groups", source=source,
                                 hint="add node_groups: with at least one entry")
    if not isinstance(groups_raw, list) or not groups_raw:
        raise SpecError("node_groups", groups_raw, "must be a non-empty list", "add '- gpu: ...' entries",
                        source=source)
    groups = tuple(_group_from_dict(g, i, custom, source) for i, g in enumerate(groups_raw))
    links_raw = data.get("zone_links") or []
    if not isinstance(links_raw, list):
        raise SpecError("zone_links", links_raw, "must be a list", "write '- zones: [a, b]' entries", source=source)
    links = tuple(_zone_link_from_dict(z, i, source) for i, z in enumerate(links_raw))
    known_zones = {g.zone for g in groups}
    for i, link in enumerate(links):
        for z in (link.zone_a, link.zone_b):
            if z not in known_zones:
                raise SpecError(f"zone_links[{i}].zones", [link.zone_a, link.zone_b],
                                f"zone {z!r} has no node group", f"use one of {sorted(known_zones)}", source=source)
        for j, earlier in enumerate(links[:i]):
            if earlier.joins(link.zone_a, link.zone_b):
                raise SpecError(f"zone_links[{i}].zones", [link.zone_a, link.zone_b],
                                f"joins the same two zones as zone_links[{j}]",
                                f"keep one of zone_links[{j}] and zone_links[{i}] (a pair of zones has one link)",
                                source=source)
    try:
        return Cluster(name=name, node_groups=groups, zone_links=links, description=str(data.get("description", "")))
    except SpecError as e:
        if source and not e.source:
            raise SpecError(e.field, e.value, e.problem, e.fix, source=source) from None
        raise


def _group_from_dict(d: Any, i: int, custom: Mapping[str, GPUType], source: str) -> NodeGroup:
    f = f"node_groups[{i}]"
    _check.mapping(f, d, source=source)
    reject_price_typos(f, d, _GROUP_FIELDS, price_field=GROUP_PRICE_FIELD, unit="USD per GPU-hour", source=source)
    _check.no_unknown_keys(f, d, _GROUP_FIELDS, source=source)
    gpu = get_gpu_type(_check.required(f, d, "gpu", source=source, hint="add gpu: (e.g. A100-80)"),
                       field=f"{f}.gpu", extra=custom, source=source)
    nodes = _check.positive_int(f"{f}.nodes", _check.required(f, d, "nodes", source=source), source=source)
    per_node = _check.positive_int(f"{f}.gpus_per_node", d.get("gpus_per_node", 8), source=source)
    link = get_link(d.get("intra_node_link", gpu.default_link), field=f"{f}.intra_node_link", source=source)
    intra_bw = (positive_number(f"{f}.intra_node_gbs", d["intra_node_gbs"], source=source) * u.GB_PER_S
                if d.get("intra_node_gbs") is not None else link.bw_bytes_per_s)
    intra_lat = (positive_number(f"{f}.intra_node_latency_us", d["intra_node_latency_us"], source=source,
                                 allow_zero=True) * u.US
                 if d.get("intra_node_latency_us") is not None else link.latency_s)
    nic = positive_number(f"{f}.nic_gbps", _check.required(
        f, d, "nic_gbps", source=source, hint="add nic_gbps: total scale-out Gb/s per node, e.g. 400"),
        source=source) * u.GBIT_PER_S
    nic_lat = (positive_number(f"{f}.nic_latency_us", d["nic_latency_us"], source=source, allow_zero=True) * u.US
               if d.get("nic_latency_us") is not None else DEFAULT_NIC_LATENCY_S)
    zone = d.get("zone", DEFAULT_ZONE)
    if not isinstance(zone, str) or not zone:
        raise SpecError(f"{f}.zone", zone, "must be a non-empty string", "name the zone, e.g. us-central1-a",
                        source=source)
    p2p = (None if d.get("peer_to_peer") is None
           else _check.boolean(f"{f}.peer_to_peer", d["peer_to_peer"], source=source))
    per_switch = _check.positive_int(f"{f}.gpus_per_pcie_switch", d.get("gpus_per_pcie_switch", 1), source=source)
    if per_switch > per_node:
        raise SpecError(f"{f}.gpus_per_pcie_switch", per_switch, f"is more than gpus_per_node ({per_node})",
                        "give how many of the node's GPUs share one PCIe switch uplink", source=source)
    spec = NodeSpec(gpu=gpu, gpus_per_node=per_node, intra_node_link=link.name, intra_node_bw_bytes_per_s=intra_bw,
                    intra_node_latency_s=intra_lat, nic_bw_bytes_per_s=nic, nic_latency_s=nic_lat,
                    peer_to_peer=p2p, gpus_per_pcie_switch=per_switch)
    name = d.get("name") or f"{gpu.name.lower()}-{i}"
    price = (None if d.get(GROUP_PRICE_FIELD) is None
             else usd_amount(f"{f}.{GROUP_PRICE_FIELD}", d[GROUP_PRICE_FIELD], source=source))
    return NodeGroup(name=str(name), node=spec, num_nodes=nodes, zone=zone, usd_per_gpu_hour=price)


def _zone_link_from_dict(d: Any, i: int, source: str) -> ZoneLink:
    f = f"zone_links[{i}]"
    _check.mapping(f, d, source=source)
    reject_price_typos(f, d, _ZONE_FIELDS, price_field=EGRESS_PRICE_FIELD, unit="USD per GB", source=source)
    _check.no_unknown_keys(f, d, _ZONE_FIELDS, source=source)
    zones = _check.required(f, d, "zones", source=source, hint="add zones: [zone-a, zone-b]")
    if not isinstance(zones, list) or len({str(z) for z in zones} - {""}) != 2:
        raise SpecError(f"{f}.zones", zones, "must name exactly two different zones", "write zones: [a, b]",
                        source=source)
    bw = positive_number(f"{f}.gbps", _check.required(f, d, "gbps", source=source), source=source)
    lat = positive_number(f"{f}.latency_ms", d.get("latency_ms", 1.0), source=source, allow_zero=True)
    egress = (None if d.get(EGRESS_PRICE_FIELD) is None
              else usd_amount(f"{f}.{EGRESS_PRICE_FIELD}", d[EGRESS_PRICE_FIELD], source=source, unit="USD per GB",
                              example="0.02"))
    return ZoneLink(zone_a=str(zones[0]), zone_b=str(zones[1]), bw_bytes_per_s=bw * u.GBIT_PER_S,
                    latency_s=lat * u.MS, egress_usd_per_gb=egress)


_EXAMPLES = Path(__file__).resolve().parent.parent / "data" / "clusters"


def example_clusters() -> tuple[str, ...]:
    """Names of the clusters shipped with the package."""
    return tuple(sorted(p.stem for p in _EXAMPLES.glob("*.yaml")))


def load_cluster(spec: str | Path | Mapping[str, Any] | Cluster) -> Cluster:
    """A cluster from a file path, a built-in example name, a dict, or a Cluster (returned as is)."""
    if isinstance(spec, Cluster):
        return spec
    if isinstance(spec, Mapping):
        return cluster_from_dict(spec)
    if not isinstance(spec, (str, Path)):
        raise SpecError("cluster", spec, f"cannot be read from a {type(spec).__name__}",
                        "give a YAML/JSON path, an example name, a dict or a Cluster")
    path = Path(spec)
    if not path.is_file() and (_EXAMPLES / f"{spec}.yaml").is_file():
        path = _EXAMPLES / f"{spec}.yaml"
    if not path.is_file():
        raise SpecError("cluster", str(spec), "is neither a file nor a built-in example cluster",
                        f"give a YAML/JSON path or one of: {', '.join(example_clusters())}")
    return cluster_from_dict(load_structured_file(path), source=str(path))


def make_cluster(name: str, groups: Iterable[Mapping[str, Any]], zone_links: Iterable[Mapping[str, Any]] = (), *,
                 description: str = "", gpu_types: Iterable[Mapping[str, Any] | GPUType] = ()) -> Cluster:
    """Python shorthand with the same fields (and units) as the file form::

        make_cluster("mine", [dict(gpu="A100-80", nodes=2, nic_gbps=800), dict(gpu="V100-16", nodes=4, nic_gbps=100)])

    ``gpu_types`` takes custom GPU definitions, either in file form (``fp16_tflops``, ``memory_gib``...)
    or as :class:`GPUType` objects.
    """
    data: dict[str, Any] = {"name": name, "node_groups": list(groups), "zone_links": list(zone_links)}
    if description:
        data["description"] = description
    custom = [_gpu_to_dict(g) if isinstance(g, GPUType) else g for g in gpu_types]
    if custom:
        data["gpu_types"] = custom
    return cluster_from_dict(data)
