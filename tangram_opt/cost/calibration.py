"""Achievable fractions of datasheet peaks, and fitting them to measured profiles.

A :class:`Calibration` says how close real kernels get to the :class:`~tangram_opt.specs.GPUType`
datasheet figures. Every efficiency is a mapping from GPU type name to a fraction, with ``"*"`` as
the fallback for types not listed. The defaults are one table per GPU type, shipped as
tangram_opt/data/calibration/defaults.yaml with the public source of every entry (docs/cost_model.md
§5): large-GEMM efficiencies measured per accelerator (the MAMF table of stas00/ml-engineering),
fused-attention efficiencies from the FlashAttention-2/3 papers, generic figures elsewhere:

- NCCL collectives reach about 80% of the link figure as bus bandwidth (nccl-tests PERFORMANCE.md
  defines bus bandwidth; DGX A100 all-reduce busbw is ~230 of 300 GB/s per direction);
- every kernel launch costs a few microseconds that no roofline captures.

Users override any of them per GPU type; :func:`fit_calibration` fits the compute and memory
efficiencies of one GPU type to measured per-layer times (used by benchmarks/validate_cost_model.py
to report the error "after calibration").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from tangram_opt import units as u
from tangram_opt.errors import FormatError, SpecError
from tangram_opt.specs import _check
from tangram_opt.specs._io import load_structured_file
from tangram_opt.specs.hardware import GPUType, get_gpu_type


def _frozen(d: Mapping[str, float]) -> Mapping[str, float]:
    return MappingProxyType(dict(d))


#: The shipped per-GPU calibration table (tangram_opt/data/calibration/defaults.yaml): the default of
#: every Calibration field. Read once, raw; tests check that the file also passes
#: ``calibration_from_dict`` unchanged.
DEFAULTS_FILE = Path(__file__).resolve().parent.parent / "data" / "calibration" / "defaults.yaml"


def _shipped() -> dict[str, Any]:
    data = yaml.safe_load(DEFAULTS_FILE.read_text(encoding="utf-8"))
    tables: dict[str, dict[str, float]] = {}
    sources: dict[str, str] = {"*": data["default"].get("source", "")}
    for name, value in data["default"].items():
        if name != "source":
            tables.setdefault(name, {})["*"] = float(value)
    for gpu, entry in data.get("gpus", {}).items():
        sources[gpu] = entry.get("source", "")
        for name, value in entry.items():
            if name != "source":
                tables.setdefault(name, {})[gpu] = float(value)
    return {"tables": tables, "sources": sources, "scalars": data}


_SHIPPED = _shipped()
#: where each shipped per-GPU entry comes from (GPU type name, or "*" for the default entry)
DEFAULT_SOURCES: Mapping[str, str] = MappingProxyType(_SHIPPED["sources"])


def _table(name: str):  # type: ignore[no-untyped-def]
    return field(default_factory=lambda: _frozen(_SHIPPED["tables"][name]))


@dataclass(frozen=True, slots=True, kw_only=True)
class Calibration:
    """Achievable fractions of peak, per GPU type name (``"*"`` is the default for other types).

    - ``matmul_efficiency``: large dense GEMMs on tensor cores (bf16/fp16, and TF32 when enabled),
      measured in isolation (the best shape of a shape search).
    - ``fp32_matmul_efficiency``: GEMMs on CUDA cores in IEEE fp32 (no tensor cores).
    - ``attention_efficiency`` / ``attention_bwd_efficiency``: fused (flash) attention forward /
      backward, as a fraction of the tensor peak.
    - ``step_efficiency``: the share of those isolated tensor-core rates (GEMMs and fused attention)
      a training step keeps: what the first-principles terms leave unexplained on published
      end-to-end runs of that GPU generation (docs/cost_model.md §5).
    - ``memory_efficiency``: memory-bound kernels, as a fraction of HBM bandwidth.
    - ``network_efficiency``: collectives and p2p, as a fraction of the link figure (bus bandwidth).
    - ``kernel_overhead_s``: fixed cost per kernel (launch plus tail), added to every operation.
    - ``memory_reserve_fraction`` / ``memory_reserve_bytes``: HBM kept back for the CUDA context,
      NCCL buffers, the allocator's fragmentation and cuBLAS workspaces.
    - ``overlap_grad_reduce``: data-parallel gradient reduction overlaps the last backward
      (Megatron ``--overlap-grad-reduce``); when False it is fully exposed.
    - ``overlap_tp_comm``: tensor-parallel all-gathers and reduce-scatters (sequence parallelism)
      run chunk by chunk under the GEMMs next to them (Megatron ``--tp-comm-overlap``, Transformer
      Engine userbuffers); when False (Megatron's default) they are fully exposed.
    """

    matmul_efficiency: Mapping[str, float] = _table("matmul_efficiency")
    fp32_matmul_efficiency: Mapping[str, float] = _table("fp32_matmul_efficiency")
    attention_efficiency: Mapping[str, float] = _table("attention_efficiency")
    attention_bwd_efficiency: Mapping[str, float] = _table("attention_bwd_efficiency")
    step_efficiency: Mapping[str, float] = _table("step_efficiency")
    memory_efficiency: Mapping[str, float] = _table("memory_efficiency")
    network_efficiency: float = float(_SHIPPED["scalars"]["network_efficiency"])
    kernel_overhead_s: float = float(_SHIPPED["scalars"]["kernel_overhead_us"]) * u.US
    memory_reserve_fraction: float = float(_SHIPPED["scalars"]["memory_reserve_fraction"])
    memory_reserve_bytes: float = float(_SHIPPED["scalars"]["memory_reserve_gib"]) * u.GiB
    overlap_grad_reduce: bool = bool(_SHIPPED["scalars"]["overlap_grad_reduce"])
    overlap_tp_comm: bool = bool(_SHIPPED["scalars"].get("overlap_tp_comm", False))

    def __post_init__(self) -> None:
        for name in ("matmul_efficiency", "fp32_matmul_efficiency", "attention_efficiency",
                     "attention_bwd_efficiency", "step_efficiency", "memory_efficiency"):
            table = getattr(self, name)
            if not isinstance(table, Mapping):
                raise SpecError(f"calibration.{name}", table, "must map GPU type names to fractions",
                                'write e.g. {"*": 0.8, "A100-80": 0.75}')
            for gpu, v in table.items():
                if not isinstance(v, (int, float)) or not (0.0 < v <= 1.5):
                    raise SpecError(f"calibration.{name}[{gpu!r}]", v, "must be a fraction in (0, 1.5]",
                                    "efficiencies are achieved / datasheet peak")
            if "*" not in table:
                raise SpecError(f"calibration.{name}", dict(table), 'has no "*" default entry',
                                'add "*": <fraction> for GPU types not listed')
            object.__setattr__(self, name, _frozen(table))
        if not (0.0 < self.network_efficiency <= 1.5):
            raise SpecError("calibration.network_efficiency", self.network_efficiency, "must be in (0, 1.5]",
                            "use the achieved fraction of the link bandwidth, e.g. 0.8")
        if not (0.0 <= self.kernel_overhead_s < 1e-3):
            raise SpecError("calibration.kernel_overhead_s", self.kernel_overhead_s, "must be in [0, 1 ms)",
                            "a kernel launch costs a few microseconds")
        if not (0.0 <= self.memory_reserve_fraction < 1.0):
            raise SpecError("calibration.memory_reserve_fraction", self.memory_reserve_fraction,
                            "must be in [0, 1)", "reserve e.g. 0.05 of HBM")
        if self.memory_reserve_bytes < 0:
            raise SpecError("calibration.memory_reserve_bytes", self.memory_reserve_bytes, "must be >= 0",
                            "reserve e.g. 1.5 GiB")

    def __reduce__(self) -> tuple[Any, tuple[dict[str, Any]]]:
        """Pickled as its fields with plain dicts (a MappingProxyType does not pickle): the search's
        worker processes receive the cost model (planner/search/tables.py)."""
        return _calibration_of, ({n: dict(v) if isinstance(v, Mapping) else v
                                  for n, v in ((n, getattr(self, n)) for n in self.__dataclass_fields__)},)

    def __hash__(self) -> int:  # MappingProxyType is not hashable; hash the contents
        return hash(tuple(tuple(sorted(getattr(self, n).items())) if isinstance(getattr(self, n), Mapping)
                          else getattr(self, n) for n in self.__dataclass_fields__))

    @staticmethod
    def _lookup(table: Mapping[str, float], gpu_name: str) -> float:
        return float(table.get(gpu_name, table["*"]))

    def matmul(self, gpu_name: str) -> float:
        return self._lookup(self.matmul_efficiency, gpu_name)

    def fp32_matmul(self, gpu_name: str) -> float:
        return self._lookup(self.fp32_matmul_efficiency, gpu_name)

    def attention(self, gpu_name: str) -> float:
        return self._lookup(self.attention_efficiency, gpu_name)

    def step(self, gpu_name: str) -> float:
        return self._lookup(self.step_efficiency, gpu_name)

    def attention_bwd(self, gpu_name: str) -> float:
        return self._lookup(self.attention_bwd_efficiency, gpu_name)

    def memory(self, gpu_name: str) -> float:
        return self._lookup(self.memory_efficiency, gpu_name)

    def check_reserve(self, gpu: GPUType, *, where: str = "", source: str = "") -> None:
        """Refuse a memory reserve that leaves ``gpu`` nothing to plan with: the cost model plans with
        ``HBM x (1 - memory_reserve_fraction) - memory_reserve_gib`` per GPU (``where``: e.g. the node
        group, for the message)."""
        after = gpu.hbm_bytes * (1.0 - self.memory_reserve_fraction)
        if after <= self.memory_reserve_bytes:
            at = f" in {where}" if where else ""
            raise SpecError("calibration.memory_reserve_gib", self.memory_reserve_bytes / u.GiB,
                            f"is at least the memory of {gpu.name}{at} ({gpu.hbm_bytes / u.GiB:g} GiB, "
                            f"{after / u.GiB:.2f} GiB after memory_reserve_fraction {self.memory_reserve_fraction:g}): "
                            "nothing would be left to plan with",
                            f"reserve less than {after / u.GiB:.2f} GiB (1-2 GiB is typical)", source=source)

    def with_gpu(self, gpu_name: str, **fractions: float) -> Calibration:
        """A copy with per-GPU entries set, e.g. ``cal.with_gpu("A100-80", matmul_efficiency=0.7)``."""
        changes = {}
        for name, v in fractions.items():
            table = getattr(self, name, None)
            if not isinstance(table, Mapping):
                raise SpecError(f"calibration.{name}", v, "is not a per-GPU efficiency table",
                                "use matmul_efficiency, fp32_matmul_efficiency, attention_efficiency or "
                                "memory_efficiency")
            changes[name] = {**table, gpu_name: v}
        return replace(self, **changes)


def _calibration_of(fields: dict[str, Any]) -> Calibration:
    """A calibration from its fields (how it unpickles: ``Calibration.__reduce__``)."""
    return Calibration(**fields)


DEFAULT_CALIBRATION = Calibration()

# --- calibration files ---------------------------------------------------------------------------
CALIBRATION_FORMAT = "tangram_opt.calibration"
CALIBRATION_VERSION = 1
#: scalar fields as they are written in files (units in the key, converted here, once)
_FILE_SCALARS: dict[str, tuple[str, float]] = {
    "network_efficiency": ("network_efficiency", 1.0),
    "kernel_overhead_us": ("kernel_overhead_s", u.US),
    "memory_reserve_fraction": ("memory_reserve_fraction", 1.0),
    "memory_reserve_gib": ("memory_reserve_bytes", u.GiB),
}
_FILE_FLAGS = ("overlap_grad_reduce", "overlap_tp_comm")


def _table_fields() -> tuple[str, ...]:
    """The per-GPU-type efficiency tables of :class:`Calibration` (mappings with a "*" entry)."""
    return tuple(n for n in Calibration.__dataclass_fields__ if n.endswith("_efficiency") and n != "network_efficiency")


def calibration_to_dict(cal: Calibration, *, gpus: Iterable[str] | None = None,
                        sources: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The file form of ``cal``: scalars with their units in the key, and per GPU type its fractions
    (``gpus`` limits which types are written; ``"*"`` is written as ``default``)."""
    out: dict[str, Any] = {"format": CALIBRATION_FORMAT, "version": CALIBRATION_VERSION}
    for key, (name, scale) in _FILE_SCALARS.items():
        out[key] = getattr(cal, name) / scale
    for name in _FILE_FLAGS:
        out[name] = getattr(cal, name)
    tables = {name: getattr(cal, name) for name in _table_fields()}
    names = sorted({g for t in tables.values() for g in t if g != "*"}) if gpus is None else list(gpus)
    out["default"] = {name: float(t["*"]) for name, t in tables.items()}
    out["gpus"] = {}
    for g in names:
        entry: dict[str, Any] = {name: float(t.get(g, t["*"])) for name, t in tables.items()}
        if sources and g in sources:
            entry["source"] = sources[g]
        out["gpus"][g] = entry
    return out


def calibration_from_dict(data: Any, *, base: Calibration | None = None, source: str = "") -> Calibration:
    """Build a :class:`Calibration` from its file form, on top of ``base`` (default: the shipped
    defaults): fields a file leaves out keep the base's values. Every field is checked and named
    in the error (``calibration.gpus.H100-SXM.matmul_efficiency``)."""
    base = base or DEFAULT_CALIBRATION
    _check.mapping("calibration", data, source=source)
    tables = _table_fields()
    allowed = ("format", "version", "default", "gpus", "source", *_FILE_SCALARS, *_FILE_FLAGS)
    _check.no_unknown_keys("calibration", data, allowed, source=source)
    if data.get("format", CALIBRATION_FORMAT) != CALIBRATION_FORMAT:
        raise SpecError("calibration.format", data.get("format"), f"is not {CALIBRATION_FORMAT!r}",
                        f"write format: {CALIBRATION_FORMAT} (or leave it out)", source=source)
    if data.get("version", CALIBRATION_VERSION) != CALIBRATION_VERSION:
        raise SpecError("calibration.version", data.get("version"), f"is not {CALIBRATION_VERSION}",
                        "upgrade tangram_opt or rewrite the file with `tangram-opt calibrate`", source=source)
    changes: dict[str, Any] = {}
    for key, (name, scale) in _FILE_SCALARS.items():
        if key in data:
            changes[name] = _check.positive_float(f"calibration.{key}", data[key], source=source,
                                                  allow_zero=True) * scale
    for name in _FILE_FLAGS:
        if name in data:
            changes[name] = _check.boolean(f"calibration.{name}", data[name], source=source)
    new_tables = {name: dict(getattr(base, name)) for name in tables}

    def read_entry(path: str, entry: Any, key: str) -> None:
        _check.mapping(path, entry, source=source)
        _check.no_unknown_keys(path, entry, (*tables, "source"), source=source)
        for name in tables:
            if name in entry:
                new_tables[name][key] = _check.positive_float(f"{path}.{name}", entry[name], source=source)

    if "default" in data:
        read_entry("calibration.default", data["default"], "*")
    gpus = data.get("gpus") or {}
    _check.mapping("calibration.gpus", gpus, source=source)
    for name, entry in gpus.items():
        gpu = get_gpu_type(str(name), field=f"calibration.gpus.{name}", source=source).name
        read_entry(f"calibration.gpus.{name}", entry, gpu)
    changes.update(new_tables)
    try:
        return replace(base, **changes)
    except SpecError as e:  # range checks of Calibration itself, named as the file writes them
        for key, (name, scale) in _FILE_SCALARS.items():
            if e.field == f"calibration.{name}":
                raise SpecError(f"calibration.{key}", e.value / scale, e.problem, e.fix, source=source) from None
        raise SpecError(e.field, e.value, e.problem, e.fix, source=source) from None


def load_calibration(path: str | Path, *, base: Calibration | None = None) -> Calibration:
    """Read a calibration file (YAML or JSON, the form :func:`save_calibration` writes). A file that
    sets nothing (``{}``, or only its format and version) is refused: it would plan with the shipped
    table while the user believes a measured one is in use (a wrong or truncated file)."""
    data = load_structured_file(path)
    if isinstance(data, Mapping) and not set(data) - {"format", "version"}:
        raise FormatError("calibration", str(path), "is empty: it sets no field, so it would change nothing",
                          "give the file 'tangram-opt calibrate' wrote, or leave the calibration out")
    return calibration_from_dict(data, base=base, source=str(path))


def save_calibration(cal: Calibration, path: str | Path, *, gpus: Iterable[str] | None = None,
                     sources: Mapping[str, str] | None = None, header: str = "") -> Path:
    """Write ``cal`` as YAML (``gpus``: only these types' entries; the defaults are always written)."""
    p = Path(path)
    text = yaml.safe_dump(calibration_to_dict(cal, gpus=gpus, sources=sources), sort_keys=False)
    lines = "".join(f"# {line}\n" for line in header.splitlines()) if header else ""
    p.write_text(lines + text, encoding="utf-8")
    return p


@dataclass(frozen=True, slots=True, kw_only=True)
class FitResult:
    """Outcome of :func:`fit_calibration` for one GPU type."""

    gpu_name: str
    compute_scale: float  # multiplier applied to the compute efficiencies in use
    memory_efficiency: float
    median_abs_error: float
    points: int


def fit_calibration(
    gpu_name: str,
    base: Calibration,
    error_of: Callable[[Calibration], Iterable[float]],
    *,
    compute_scales: Iterable[float] | None = None,
    memory_efficiencies: Iterable[float] | None = None,
) -> tuple[Calibration, FitResult]:
    """Grid-search one GPU type's compute and memory efficiencies to minimize the median |error|.

    ``error_of(calibration)`` returns the relative errors (predicted / measured - 1) of every
    measurement of that GPU type under a candidate calibration. The compute efficiencies
    (tensor-core, CUDA-core fp32 and attention) are scaled by one common factor, so their ratios keep
    their documented defaults; the memory efficiency is set directly. A coarse grid is enough: the
    point is to show how much of the error is a per-GPU constant, not to tune digits.
    """
    scales = tuple(compute_scales or [round(0.4 + 0.05 * i, 2) for i in range(19)])  # 0.40 .. 1.30
    mems = tuple(memory_efficiencies or [round(0.4 + 0.05 * i, 2) for i in range(13)])  # 0.40 .. 1.00
    best: tuple[float, float, float, int] | None = None
    for s in scales:
        for m in mems:
            cal = base.with_gpu(
                gpu_name,
                matmul_efficiency=min(1.5, base.matmul(gpu_name) * s),
                fp32_matmul_efficiency=min(1.5, base.fp32_matmul(gpu_name) * s),
                attention_efficiency=min(1.5, base.attention(gpu_name) * s),
                memory_efficiency=m,
            )
            errs = sorted(abs(e) for e in error_of(cal))
            if not errs:
                continue
            med = _median(errs)
            if best is None or med < best[0] - 1e-12:
                best = (med, s, m, len(errs))
    if best is None:
        raise SpecError("fit_calibration", gpu_name, "no measurement to fit", "pass measurements of this GPU type")
    med, s, m, n = best
    cal = base.with_gpu(gpu_name, matmul_efficiency=min(1.5, base.matmul(gpu_name) * s),
                        fp32_matmul_efficiency=min(1.5, base.fp32_matmul(gpu_name) * s),
                        attention_efficiency=min(1.5, base.attention(gpu_name) * s), memory_efficiency=m)
    return cal, FitResult(gpu_name=gpu_name, compute_scale=s, memory_efficiency=m, median_abs_error=med, points=n)


def _median(sorted_values: list[float]) -> float:
    n = len(sorted_values)
    mid = n // 2
    return sorted_values[mid] if n % 2 else 0.5 * (sorted_values[mid - 1] + sorted_values[mid])


def percentile(values: Iterable[float], q: float) -> float:
    """Linear-interpolated percentile (``q`` in [0, 100]) of ``values``."""
    xs = sorted(values)
    if not xs:
        return math.nan
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)
