"""Published end-to-end training runs (benchmarks/data/published_runs.yaml): loader and predictor.

``load_runs()`` reads the file, checks every field (types, GPU catalog names, preset names or shapes
that build a :class:`tangram_opt.ModelSpec`, parallel degrees that multiply to the GPU count, a
public source with a URL) and returns frozen :class:`PublishedRun` rows.

``predict(run, **solve_kwargs)`` plans a row the way a user would, through the public API only:
a homogeneous cluster of the row's GPUs (``tangram_opt.make_cluster``), the row's model and a
``TrainingSpec``, and ``tangram_opt.solve`` with a ``SearchSpace`` restricted to the published
tp / cp / ep / ZeRO stage / recomputation / micro-batch, at most ``pp`` pipeline stages and the
pipeline micro-batch ``micro_batch_size x dp`` (one pipeline, no multi-pipeline search). It returns
the plan's tokens/s per GPU, MFU, model TFLOP/s per GPU, step time and peak memory, and lists what
it had to approximate (virtual pipeline stages, the fp8 recipe, the network when the source does not state it,
GB200 NVL72 racks, fields the source leaves open and the planner chose).

Run ``python -m benchmarks.published_runs`` from the repository root to print every row's
prediction next to the published figure and the median absolute error (``--only ID`` for some
rows, ``--time-limit`` per row).

Modelling choices that are not facts from the sources (used only by ``predict``):

* a "node" of the cluster is the NVLink domain, capped to a divisor of the GPU count: 8 on HGX/DGX
  servers, 64 for 64 or 256 GPUs of GB200 NVL72 racks (72 GPUs per domain do not divide them);
* when a source does not state the scale-out network, ``DEFAULT_NIC_GBPS_PER_GPU`` (the reference
  DGX system of that generation: 200 Gb/s per A100, 400 Gb/s per H100/H200/B200/GB200) times the
  GPUs of a modelled node;
* intra-node links are the catalog default of the GPU (nvlink3/4/5).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import math
import re
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

import tangram_opt as to
from tangram_opt.cost import ATTENTION_KERNELS
from tangram_opt.errors import SpecError, TangramError

DATA_FILE = Path(__file__).resolve().parent / "data" / "published_runs.yaml"

#: GPU catalog name -> generation used for grouping the results.
GENERATIONS: dict[str, str] = {
    "V100-16": "V100", "V100-32": "V100", "A100-40": "A100", "A100-80": "A100", "H100-SXM": "H100",
    "GH200-96": "H100", "H200": "H200", "B200": "Blackwell", "GB200": "Blackwell",
}
#: Scale-out bandwidth per GPU when a source does not state the network [Gb/s] (a modelling choice:
#: the reference DGX system of each generation, 1 NIC per GPU).
DEFAULT_NIC_GBPS_PER_GPU: dict[str, float] = {"V100": 100.0, "A100": 200.0, "H100": 400.0, "H200": 400.0,
                                              "Blackwell": 400.0}

PRECISIONS = ("bf16", "fp16", "fp8")
RECOMPUTE = ("none", "selective", "full")
ZERO = (0, 1, 2, 3)
_ID_RE = re.compile(r"^[a-z0-9][a-z0-9.\-]*$")

_TOP_KEYS = {"schema_version", "shapes", "runs"}
_RUN_REQUIRED = (
    "id", "framework", "gpu", "num_gpus", "gpus_per_node", "nvlink_domain_gpus", "nic_gbps_per_node", "model",
    "model_name", "model_params_published", "seq_len", "global_batch_size", "micro_batch_size", "grad_accum",
    "tp", "pp", "cp", "ep", "dp", "zero", "fsdp", "virtual_pipeline", "recompute", "recompute_detail",
    "precision", "precision_detail", "attention", "measured", "representable", "note", "source",
)
_RUN_OPTIONAL = ("gpu_note", "gpu_memory_gib", "attention_kernel", "tp_comm_overlap")
_MEASURED_KEYS = ("tokens_per_s_per_gpu", "step_time_s", "mfu", "model_tflops_per_gpu", "peak_memory_gib")
_SOURCE_KEYS = ("url", "table", "version", "accessed", "note")


# --------------------------------------------------------------------------------------------------
# rows
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class Measured:
    """What the source publishes (``None``: not published)."""

    tokens_per_s_per_gpu: float | None
    step_time_s: float | None
    mfu: float | None
    model_tflops_per_gpu: float | None
    peak_memory_gib: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Source:
    url: str
    table: str
    version: str
    accessed: str
    note: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class PublishedRun:
    """One published run; field meanings and units are documented in the YAML file's header."""

    id: str
    framework: str
    gpu: str
    gpu_note: str | None
    #: memory of the part the run used when it differs from the catalog's [GiB] (gpu_note says why)
    gpu_memory_gib: float | None
    num_gpus: int
    gpus_per_node: int
    nvlink_domain_gpus: int
    nic_gbps_per_node: float | None
    model_ref: str  # "preset:<name>" or "shape:<name>"
    model: to.ModelSpec
    model_name: str
    model_params_published: int | None
    seq_len: int
    global_batch_size: int
    micro_batch_size: int | None
    grad_accum: int | None
    tp: int
    pp: int
    cp: int
    ep: int
    dp: int
    zero: int | None
    fsdp: str | None
    virtual_pipeline: int | None
    recompute: str | None
    recompute_detail: str | None
    precision: str
    precision_detail: str
    attention: str | None
    #: the attention kernel the run used when it is not the GPU's default (tangram_opt.cost.ATTENTION_KERNELS)
    attention_kernel: str | None
    #: the run overlapped TP communication with its GEMMs (Megatron --tp-comm-overlap), as the source states
    tp_comm_overlap: bool
    measured: Measured
    representable: bool
    note: str
    source: Source

    @property
    def cost_framework(self) -> str:
        """What the cost model's "selective" recomputation, loss and ZeRO-3 mean for this run
        (``CostModel(framework=...)``): torchtitan's own, else Megatron-LM's."""
        return "torchtitan" if self.framework.lower().startswith("torchtitan") else "megatron"

    @property
    def generation(self) -> str:
        return GENERATIONS.get(self.gpu, self.gpu)

    @property
    def is_moe(self) -> bool:
        return self.model.moe is not None

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch_size * self.seq_len


def _err(field_: str, value: Any, problem: str, fix: str = "", source: str = "") -> SpecError:
    return SpecError(field_, value, problem, fix, source=source)


def _int(where: str, v: Any, *, allow_none: bool = False, minimum: int = 1, src: str = "") -> int | None:
    if v is None and allow_none:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise _err(where, v, f"must be an integer >= {minimum}" + (" or null" if allow_none else ""), source=src)
    return v


def _num(where: str, v: Any, *, allow_none: bool = True, src: str = "") -> float | None:
    if v is None and allow_none:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise _err(where, v, "must be a positive number" + (" or null" if allow_none else ""), source=src)
    return float(v)


def _str(where: str, v: Any, *, allow_none: bool = False, src: str = "") -> str | None:
    if v is None and allow_none:
        return None
    if not isinstance(v, str) or not v.strip():
        raise _err(where, v, "must be a non-empty string" + (" or null" if allow_none else ""), source=src)
    return v


def _build_model(where: str, ref: Any, shapes: Mapping[str, Any], src: str) -> tuple[str, to.ModelSpec]:
    if not isinstance(ref, Mapping):
        raise _err(where, ref, "must be {preset: name} or {shape: name, overrides: {...}}", source=src)
    unknown = sorted(set(ref) - {"preset", "shape", "overrides"})
    if unknown or ("preset" in ref) == ("shape" in ref):
        raise _err(where, dict(ref), "needs exactly one of preset / shape (and optionally overrides)", source=src)
    overrides = ref.get("overrides") or {}
    if not isinstance(overrides, Mapping):
        raise _err(f"{where}.overrides", overrides, "must be a mapping of ModelSpec fields", source=src)
    if "preset" in ref:
        name = ref["preset"]
        if name not in to.list_presets():
            raise _err(f"{where}.preset", name, "is not a tangram_opt preset",
                       f"use one of {', '.join(to.list_presets())} or a shape", source=src)
        if overrides:
            raise _err(f"{where}.overrides", dict(overrides), "only shapes take overrides", source=src)
        return f"preset:{name}", to.load_model(name)
    name = ref["shape"]
    if name not in shapes:
        raise _err(f"{where}.shape", name, "is not defined under shapes:", f"define it or use {sorted(shapes)}",
                   source=src)
    d = {k: v for k, v in dict(shapes[name]).items() if k != "source"}
    d.update(overrides)
    try:
        return f"shape:{name}", to.load_model(d)
    except SpecError as e:
        raise _err(f"{where}.shape", name, f"does not build a ModelSpec ({e})", source=src) from e


def _parse_shapes(data: Any, src: str) -> dict[str, Any]:
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise _err("shapes", data, "must be a mapping name -> model shape", source=src)
    out = {}
    for name, shape in data.items():
        if not isinstance(shape, Mapping) or not isinstance(shape.get("source"), str):
            raise _err(f"shapes.{name}", shape, "must be a ModelSpec mapping with a `source` string", source=src)
        d = {k: v for k, v in shape.items() if k != "source"}
        try:
            to.load_model(d)
        except SpecError as e:
            raise _err(f"shapes.{name}", name, f"does not build a ModelSpec ({e})", source=src) from e
        out[str(name)] = dict(shape)
    return out


def _parse_run(i: int, row: Any, shapes: Mapping[str, Any], src: str) -> PublishedRun:
    w = f"runs[{i}]"
    if not isinstance(row, Mapping):
        raise _err(w, row, "must be a mapping", source=src)
    w = f"runs[{i}] ({row.get('id', '?')})"
    missing = [k for k in _RUN_REQUIRED if k not in row]
    if missing:
        raise _err(f"{w}.{missing[0]}", None, "is missing (write null if the source does not publish it)",
                   source=src)
    unknown = sorted(set(row) - set(_RUN_REQUIRED) - set(_RUN_OPTIONAL))
    if unknown:
        raise _err(f"{w}.{unknown[0]}", row[unknown[0]], "is not a field",
                   f"use {', '.join(_RUN_REQUIRED + _RUN_OPTIONAL)}", source=src)
    rid = _str(f"{w}.id", row["id"], src=src)
    if not _ID_RE.match(rid):
        raise _err(f"{w}.id", rid, "must be lower-case letters, digits, dots and dashes", source=src)
    gpu = to.get_gpu_type(row["gpu"], field=f"{w}.gpu", source=src).name
    if gpu != row["gpu"]:
        raise _err(f"{w}.gpu", row["gpu"], "must be written as the catalog name", f"write {gpu}", source=src)
    num_gpus = _int(f"{w}.num_gpus", row["num_gpus"], src=src)
    gpn = _int(f"{w}.gpus_per_node", row["gpus_per_node"], src=src)
    nvl = _int(f"{w}.nvlink_domain_gpus", row["nvlink_domain_gpus"], src=src)
    nic = _num(f"{w}.nic_gbps_per_node", row["nic_gbps_per_node"], src=src)
    model_ref, model = _build_model(f"{w}.model", row["model"], shapes, src)
    params = _int(f"{w}.model_params_published", row["model_params_published"], allow_none=True, src=src)
    if params is not None and params != model.total_params:
        raise _err(f"{w}.model_params_published", params, f"differs from the model's {model.total_params} parameters",
                   "check the model shape against the source", source=src)
    seq = _int(f"{w}.seq_len", row["seq_len"], src=src)
    gbs = _int(f"{w}.global_batch_size", row["global_batch_size"], src=src)
    mbs = _int(f"{w}.micro_batch_size", row["micro_batch_size"], allow_none=True, src=src)
    ga = _int(f"{w}.grad_accum", row["grad_accum"], allow_none=True, src=src)
    tp, pp, cp, ep, dp = (_int(f"{w}.{k}", row[k], src=src) for k in ("tp", "pp", "cp", "ep", "dp"))
    if tp * pp * cp * dp != num_gpus:
        raise _err(f"{w}.dp", dp, f"tp x pp x cp x dp = {tp * pp * cp * dp} is not num_gpus {num_gpus}",
                   "dp is num_gpus / (tp * pp * cp)", source=src)
    if model.moe is None and ep != 1:
        raise _err(f"{w}.ep", ep, "must be 1 for a dense model", source=src)
    if model.moe is not None and model.moe.num_experts % ep:
        raise _err(f"{w}.ep", ep, f"does not divide the {model.moe.num_experts} experts", source=src)
    if mbs is not None and gbs % (mbs * dp):
        raise _err(f"{w}.global_batch_size", gbs, f"is not a multiple of micro_batch_size x dp = {mbs * dp}",
                   source=src)
    if mbs is not None and ga is not None and gbs != mbs * dp * ga:
        raise _err(f"{w}.grad_accum", ga, f"micro_batch_size x dp x grad_accum = {mbs * dp * ga} != {gbs}",
                   source=src)
    if seq % (2 * cp):
        raise _err(f"{w}.cp", cp, "needs seq_len divisible by 2 cp", source=src)
    zero = row["zero"]
    if zero is not None and (isinstance(zero, bool) or zero not in ZERO):
        raise _err(f"{w}.zero", zero, "must be 0, 1, 2, 3 or null", source=src)
    vp = _int(f"{w}.virtual_pipeline", row["virtual_pipeline"], allow_none=True, src=src)
    rec = row["recompute"]
    if rec is not None and rec not in RECOMPUTE:
        raise _err(f"{w}.recompute", rec, f"must be one of {', '.join(RECOMPUTE)} or null", source=src)
    overlap = row.get("tp_comm_overlap", False)
    if not isinstance(overlap, bool):
        raise _err(f"{w}.tp_comm_overlap", overlap, "must be true or false (absent: false)", source=src)
    kernel = row.get("attention_kernel")
    if kernel is not None and kernel not in ATTENTION_KERNELS:
        raise _err(f"{w}.attention_kernel", kernel, f"must be one of {', '.join(ATTENTION_KERNELS)} or absent",
                   source=src)
    prec = row["precision"]
    if prec not in PRECISIONS:
        raise _err(f"{w}.precision", prec, f"must be one of {', '.join(PRECISIONS)}", source=src)
    if prec == "bf16" and to.get_gpu_type(gpu).bf16_flops_per_s is None:
        raise _err(f"{w}.precision", prec, f"{gpu} has no BF16 tensor cores", source=src)
    m = row["measured"]
    if not isinstance(m, Mapping) or set(m) != set(_MEASURED_KEYS):
        raise _err(f"{w}.measured", m, f"must have exactly the keys {', '.join(_MEASURED_KEYS)}", source=src)
    measured = Measured(**{k: _num(f"{w}.measured.{k}", m[k], src=src) for k in _MEASURED_KEYS})
    if measured.mfu is not None and measured.mfu > 1:
        raise _err(f"{w}.measured.mfu", measured.mfu, "is a fraction (0-1)", source=src)
    if not any(getattr(measured, k) is not None for k in ("tokens_per_s_per_gpu", "step_time_s", "mfu",
                                                           "model_tflops_per_gpu")):
        raise _err(f"{w}.measured", dict(m), "publishes no throughput, step time, MFU or TFLOP/s", source=src)
    if not isinstance(row["representable"], bool):
        raise _err(f"{w}.representable", row["representable"], "must be true or false", source=src)
    s = row["source"]
    if not isinstance(s, Mapping) or set(s) != set(_SOURCE_KEYS):
        raise _err(f"{w}.source", s, f"must have exactly the keys {', '.join(_SOURCE_KEYS)}", source=src)
    url = _str(f"{w}.source.url", s["url"], src=src)
    if not url.startswith("https://"):
        raise _err(f"{w}.source.url", url, "must be an https:// URL", source=src)
    accessed = s["accessed"]
    if isinstance(accessed, _dt.date):
        accessed = accessed.isoformat()
    try:
        _dt.date.fromisoformat(str(accessed))
    except ValueError as e:
        raise _err(f"{w}.source.accessed", accessed, "must be a date YYYY-MM-DD", source=src) from e
    source = Source(url=url, table=_str(f"{w}.source.table", s["table"], src=src),
                    version=_str(f"{w}.source.version", s["version"], src=src), accessed=str(accessed),
                    note=_str(f"{w}.source.note", s["note"], allow_none=True, src=src))
    return PublishedRun(
        id=rid, framework=_str(f"{w}.framework", row["framework"], src=src), gpu=gpu,
        gpu_note=_str(f"{w}.gpu_note", row.get("gpu_note"), allow_none=True, src=src),
        gpu_memory_gib=_num(f"{w}.gpu_memory_gib", row.get("gpu_memory_gib"), src=src), num_gpus=num_gpus,
        gpus_per_node=gpn, nvlink_domain_gpus=nvl, nic_gbps_per_node=nic, model_ref=model_ref, model=model,
        model_name=_str(f"{w}.model_name", row["model_name"], src=src), model_params_published=params, seq_len=seq,
        global_batch_size=gbs, micro_batch_size=mbs, grad_accum=ga, tp=tp, pp=pp, cp=cp, ep=ep, dp=dp, zero=zero,
        fsdp=_str(f"{w}.fsdp", row["fsdp"], allow_none=True, src=src), virtual_pipeline=vp, recompute=rec,
        recompute_detail=_str(f"{w}.recompute_detail", row["recompute_detail"], allow_none=True, src=src),
        precision=prec, precision_detail=_str(f"{w}.precision_detail", row["precision_detail"], src=src),
        attention=_str(f"{w}.attention", row["attention"], allow_none=True, src=src), attention_kernel=kernel,
        tp_comm_overlap=overlap, measured=measured,
        representable=row["representable"], note=_str(f"{w}.note", row["note"], src=src), source=source)


def load_runs(path: str | Path = DATA_FILE) -> list[PublishedRun]:
    """Every row of ``path``, checked; raises :class:`tangram_opt.SpecError` naming the bad field."""
    path = Path(path)
    src = str(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise _err("file", src, f"is not valid YAML ({e})") from e
    if not isinstance(data, Mapping) or set(data) != _TOP_KEYS:
        raise _err("top level", sorted(data) if isinstance(data, Mapping) else data,
                   f"must have exactly the keys {', '.join(sorted(_TOP_KEYS))}", source=src)
    if data["schema_version"] != 1:
        raise _err("schema_version", data["schema_version"], "must be 1", source=src)
    shapes = _parse_shapes(data["shapes"], src)
    if not isinstance(data["runs"], list) or not data["runs"]:
        raise _err("runs", data["runs"], "must be a non-empty list", source=src)
    runs = [_parse_run(i, r, shapes, src) for i, r in enumerate(data["runs"])]
    seen: set[str] = set()
    for r in runs:
        if r.id in seen:
            raise _err("runs.id", r.id, "is used twice", "ids are stable and unique", source=src)
        seen.add(r.id)
    return runs


# --------------------------------------------------------------------------------------------------
# prediction
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class Prediction:
    """The planner's view of one row. Fields are ``None`` when no plan was found (``error`` says why)."""

    run_id: str
    tokens_per_s_per_gpu: float | None
    mfu: float | None
    model_tflops_per_gpu: float | None
    step_time_s: float | None
    peak_memory_gib: float | None
    gpus_used: int | None
    num_stages: int | None
    plan_config: str  # e.g. "pp 4 x [tp 1 cp 1 dp 16 ep 8 zero 1 full mbs 1]"
    matches_published: bool  # every stage has the published degrees (and pp stages)
    approximations: tuple[str, ...] = ()
    error: str | None = None
    solve_time_s: float = 0.0


def modelled_node_gpus(run: PublishedRun) -> int:
    """GPUs of one modelled node: the largest divisor of the GPU count within one NVLink domain."""
    cap = min(run.nvlink_domain_gpus, run.num_gpus)
    return max(d for d in range(1, cap + 1) if run.num_gpus % d == 0)


def build_cluster(run: PublishedRun, nic_gbps_per_node: float | None = None) -> tuple[to.Cluster, list[str]]:
    """A homogeneous cluster of the row's GPUs, and the approximations it makes."""
    notes: list[str] = []
    node = modelled_node_gpus(run)
    if nic_gbps_per_node is not None:
        nic = float(nic_gbps_per_node)
        notes.append(f"network given by the caller ({nic:g} Gb/s per node)")
    elif run.nic_gbps_per_node is not None:
        nic = run.nic_gbps_per_node / run.gpus_per_node * node
    else:
        nic = DEFAULT_NIC_GBPS_PER_GPU.get(run.generation, 400.0) * node
        notes.append("network not published: assumed")
    if node != run.gpus_per_node:
        notes.append(f"NVLink domain of {run.nvlink_domain_gpus} GPUs modelled as nodes of {node}")
    group = {"name": "g", "gpu": run.gpu, "nodes": run.num_gpus // node, "gpus_per_node": node, "nic_gbps": nic}
    gpu_types = []
    if run.gpu_memory_gib is not None:  # the catalog part under its own name (its calibration), the run's memory
        gpu_types.append(dataclasses.replace(to.get_gpu_type(run.gpu), hbm_bytes=run.gpu_memory_gib * 2**30))
        notes.append(f"{run.gpu_memory_gib:g} GiB per GPU as published (other figures the catalog's)")
    cluster = to.make_cluster(run.id, [group], gpu_types=gpu_types)
    return cluster, notes


def micro_batch_candidates(run: PublishedRun) -> tuple[int, ...]:
    """The published micro-batch, or (not published) 1, 2, 4, 8 where they divide the batch."""
    if run.micro_batch_size is not None:
        return (run.micro_batch_size,)
    return tuple(m for m in (1, 2, 4, 8) if run.global_batch_size % (m * run.dp) == 0) or (1,)


def search_space(run: PublishedRun, micro_batch_size: int | None = None) -> tuple[to.SearchSpace, list[str]]:
    """The planner's search space restricted to the published configuration.

    One micro-batch size per space: the pipeline micro-batch is ``micro_batch_size x dp``, so a
    single size pins every stage's data-parallel degree to the published ``dp`` (several sizes in
    one space would let a stage trade dp for micro-batch). ``micro_batch_size`` defaults to the
    published one (or the first candidate when it is not published).
    """
    notes = []
    if micro_batch_size is None:
        micro_batch_size = micro_batch_candidates(run)[0]
    if run.micro_batch_size is None:
        notes.append("micro-batch not published: planner chose")
    mbs = (micro_batch_size,)
    zero = (run.zero,) if run.zero is not None else (0, 1, 2, 3)
    if run.zero is None:
        notes.append("ZeRO stage not published: planner chose")
    rec = (run.recompute,) if run.recompute is not None else RECOMPUTE
    if run.recompute is None:
        notes.append("recomputation not published: planner chose")
    space = to.SearchSpace(micro_batch_sizes=mbs, tp=(run.tp,), cp=(run.cp,), ep=(run.ep,) if run.is_moe else None,
                           zero=zero, recompute=rec, pipeline_micro_batches=tuple(m * run.dp for m in mbs),
                           max_stages=run.pp)
    return space, notes


def predict(run: PublishedRun, *, time_limit_s: float = 20.0, nic_gbps_per_node: float | None = None,
            rel_gap: float = 0.01, **cost_model_kwargs: Any) -> Prediction:
    """Plan ``run`` as published with ``tangram_opt.solve`` and read off the predicted figures.

    ``cost_model_kwargs`` go to ``tangram_opt.solve`` unchanged (``calibration=``,
    ``moe_load_imbalance=``, ``backend=``, ...). The search is one pipeline of at most ``run.pp``
    stages with the published per-stage configuration; fp8 rows are planned as per-tensor-scaled FP8
    linear layers whatever the published recipe, and interleaved (virtual) pipeline stages as plain
    1F1B, both listed in ``approximations``.
    """
    cluster, notes = build_cluster(run, nic_gbps_per_node)
    if run.precision == "fp8":
        notes.append("fp8 priced as per-tensor-scaled FP8 linear layers")
    if run.virtual_pipeline is not None and run.virtual_pipeline > 1:
        notes.append(f"virtual pipeline {run.virtual_pipeline} planned as plain 1F1B")
    training = to.TrainingSpec(global_batch_size=run.global_batch_size, seq_len=run.seq_len, precision=run.precision)
    if run.tp_comm_overlap and run.tp > 1 and "calibration" not in cost_model_kwargs:
        from tangram_opt.cost import Calibration

        cost_model_kwargs = {**cost_model_kwargs, "calibration": Calibration(overlap_tp_comm=True)}
        notes.append("TP communication overlapped with the GEMMs (as published)")
    if run.attention_kernel is not None:
        notes.append(f"attention kernel {run.attention_kernel} (as published)")
    if run.cost_framework != "megatron" and (run.recompute == "selective" or run.zero == 3):
        notes.append(f"{run.cost_framework} recomputation / loss / FSDP memory")
    candidates = micro_batch_candidates(run)
    t0 = time.perf_counter()
    plan, failure, space_notes = None, None, []
    for mbs in candidates:  # one solve per micro-batch size (a single one when it is published)
        space, space_notes = search_space(run, mbs)
        try:
            provider = _provider(run, training, space, cost_model_kwargs)
            p = to.solve(cluster, run.model, training, space=space, time_limit_s=time_limit_s / len(candidates),
                         rel_gap=rel_gap, options=to.SearchOptions(multi_pipeline=False), provider=provider,
                         **cost_model_kwargs)
        except TangramError as e:
            failure = failure or e
            continue
        if plan is None or p.tokens_per_s / p.gpus_used > plan.tokens_per_s / plan.gpus_used:
            plan = p
    notes += space_notes
    solve_s = time.perf_counter() - t0
    if plan is None:
        text = str(failure).strip()
        first = text.splitlines()[0] if text else type(failure).__name__
        first = first if len(first) <= 300 else first[:297] + "..."
        return Prediction(run_id=run.id, tokens_per_s_per_gpu=None, mfu=None, model_tflops_per_gpu=None,
                          step_time_s=None, peak_memory_gib=None, gpus_used=None, num_stages=None, plan_config="",
                          matches_published=False, approximations=tuple(notes),
                          error=f"{type(failure).__name__}: {first}", solve_time_s=solve_s)
    stages = plan.stages
    gpus = plan.gpus_used
    cfgs = sorted({(s.tp, s.cp, s.dp, s.ep, s.zero, s.recompute, s.micro_batch_size) for s in stages})
    cfg_txt = " | ".join(f"tp {a} cp {b} dp {c} ep {d} zero {z} {r} mbs {m}" for a, b, c, d, z, r, m in cfgs)
    matches = (len(stages) == run.pp and len(plan.pipelines) == 1 and all(
        s.tp == run.tp and s.cp == run.cp and s.dp == run.dp and (s.ep == run.ep or not run.is_moe)
        and (run.zero is None or s.zero == run.zero) and (run.recompute is None or s.recompute == run.recompute)
        and (run.micro_batch_size is None or s.micro_batch_size == run.micro_batch_size) for s in stages))
    if len(stages) != run.pp:
        notes.append(f"planner used {len(stages)} of the published {run.pp} pipeline stages")
    return Prediction(
        run_id=run.id, tokens_per_s_per_gpu=plan.tokens_per_s / gpus, mfu=plan.mfu,
        model_tflops_per_gpu=plan.model_flops_per_step / plan.step_time_s / gpus / 1e12, step_time_s=plan.step_time_s,
        peak_memory_gib=max(s.memory_bytes for s in stages) / 2**30, gpus_used=gpus, num_stages=len(stages),
        plan_config=f"pp {len(stages)} x [{cfg_txt}]", matches_published=matches, approximations=tuple(notes),
        solve_time_s=solve_s)


def _provider(run: PublishedRun, training: to.TrainingSpec, space: to.SearchSpace, kwargs: Mapping[str, Any]) -> Any:
    """Candidates priced with the run's attention kernel when it is not the GPU's default (the public
    ``solve`` picks the kernel by GPU generation; a 2022 Megatron run had no flash attention) and with
    its framework's meaning of selective recomputation, loss and FSDP (torchtitan rows)."""
    if run.attention_kernel is None and run.cost_framework == "megatron":
        return None
    from tangram_opt.cost import CostModel
    from tangram_opt.planner.candidates import AnalyticalCandidates

    cm = CostModel(run.model, training, attention_kernel=run.attention_kernel or "auto", framework=run.cost_framework,
                   **{k: v for k, v in kwargs.items() if k in ("calibration", "moe_load_imbalance", "profiles")})
    return AnalyticalCandidates(run.model, cm, space)


@dataclass(frozen=True, slots=True)
class Comparison:
    run: PublishedRun
    prediction: Prediction
    metric: str | None  # tokens_per_s_per_gpu | mfu | model_tflops_per_gpu
    published: float | None
    predicted: float | None
    error: float | None = field(default=None)  # predicted / published - 1


def compare(run: PublishedRun, pred: Prediction) -> Comparison:
    """Predicted vs published on the best metric the source publishes (tokens/s per GPU, else step
    time converted back to tokens/s per GPU, else MFU, else model TFLOP/s per GPU; the last two use
    the source's own FLOP count, which need not match tangram_opt's)."""
    m = run.measured
    if m.tokens_per_s_per_gpu is not None:
        metric, pub, val = "tokens_per_s_per_gpu", m.tokens_per_s_per_gpu, pred.tokens_per_s_per_gpu
    elif m.step_time_s is not None:
        metric, pub, val = "tokens_per_s_per_gpu", run.tokens_per_step / m.step_time_s / run.num_gpus, \
            pred.tokens_per_s_per_gpu
    elif m.mfu is not None:
        metric, pub, val = "mfu", m.mfu, pred.mfu
    else:
        metric, pub, val = "model_tflops_per_gpu", m.model_tflops_per_gpu, pred.model_tflops_per_gpu
    err = val / pub - 1 if (val is not None and pub) else None
    return Comparison(run, pred, metric, pub, val, err)


def table_cells(c: Comparison, p: Prediction) -> tuple[str, str, str, str, str]:
    """The printed cells of one run: metric, published, predicted, error and predicted MFU."""
    short = {"tokens_per_s_per_gpu": "tok/s", "mfu": "MFU", "model_tflops_per_gpu": "TFLOP/s"}[c.metric]
    fmt = (lambda v: f"{v:.3f}") if c.metric == "mfu" else (lambda v: f"{v:,.0f}")
    pub = fmt(c.published) if c.published is not None else "-"
    val = fmt(c.predicted) if c.predicted is not None else "-"
    err = f"{100 * c.error:+.0f}%" if c.error is not None else "-"
    mfu = f"{p.mfu:.3f}" if p.mfu is not None else "-"
    return short, pub, val, err, mfu


def summarize(comparisons: Iterable[Comparison]) -> dict[str, dict[str, float]]:
    """Median |error| and median signed error per group (all, generation, precision, dense/MoE)."""
    groups: dict[str, list[float]] = defaultdict(list)
    for c in comparisons:
        if c.error is None or not math.isfinite(c.error):
            continue
        for g in ("all", c.run.generation, c.run.precision, "moe" if c.run.is_moe else "dense"):
            groups[g].append(c.error)
    return {g: {"n": len(v), "median_abs": statistics.median(abs(x) for x in v), "median": statistics.median(v)}
            for g, v in groups.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--file", default=str(DATA_FILE))
    ap.add_argument("--only", nargs="*", help="row ids (prefixes) to run")
    ap.add_argument("--time-limit", type=float, default=20.0, help="solver time limit per row [s]")
    args = ap.parse_args(argv)
    runs = load_runs(args.file)
    if args.only:
        runs = [r for r in runs if any(r.id.startswith(p) for p in args.only)]
    print(f"{len(runs)} published runs; tangram_opt {to.__version__}; solver time limit {args.time_limit:g} s per row")
    hdr = (f"{'id':<46} {'GPUs':>5} {'metric':<7} {'published':>10} {'predicted':>10} {'err':>7} {'MFU':>6} "
           f"{'mem GiB':>7} {'as pub':>6}  notes")
    print(hdr)
    print("-" * len(hdr))
    comps = []
    t0 = time.perf_counter()
    for r in runs:
        p = predict(r, time_limit_s=args.time_limit)
        c = compare(r, p)
        comps.append(c)
        short, pub, val, err, mfu = table_cells(c, p)
        mem = f"{p.peak_memory_gib:.1f}" if p.peak_memory_gib is not None else "-"
        notes = "; ".join(([p.error] if p.error else []) + list(p.approximations))
        print(f"{r.id:<46} {r.num_gpus:>5} {short:<7} {pub:>10} {val:>10} {err:>7} {mfu:>6} {mem:>7} "
              f"{'yes' if p.matches_published else 'no':>6}  {notes}")
        if p.plan_config and (not p.matches_published or any("planner chose" in a for a in p.approximations)):
            print(f"{'':<6}plan: {p.plan_config}")
        sys.stdout.flush()
    print()
    print("median |error| (predicted / published - 1), by group:")
    for g, s in sorted(summarize(comps).items(), key=lambda kv: (kv[0] != "all", kv[0])):
        print(f"  {g:<10} n={s['n']:>3}  median |err| {100 * s['median_abs']:5.1f}%   median err {100 * s['median']:+6.1f}%")
    failed = [c.run.id for c in comps if c.prediction.error]
    print(f"no plan: {len(failed)} row(s){': ' + ', '.join(failed) if failed else ''}")
    print(f"total time {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
