"""Fit a calibration to training steps you measured yourself (``tangram-opt calibrate``).

A few short runs on your own GPUs (any framework) say more about your stack than any datasheet: a
measurements file lists each run's configuration and its measured step time (or throughput), this
module plans each run as it was launched (``solve`` restricted to that configuration, one pipeline)
and fits, per GPU type, one factor that scales its compute efficiencies (tensor-core and fp32
GEMMs, fused attention forward and backward) so that the predicted step times match. Communication,
memory-bound kernels and the schedule keep their physical models: if your runs are off for those
reasons the fit shows it as a residual error, which the before/after table prints per run.

Measurements file (YAML or JSON; a CSV with the same column names also works)::

    format: tangram_opt.measurements
    version: 1
    runs:
      - name: llama8b-tp1-mbs2          # optional label
        gpu: A100-80                    # catalog name or alias
        nodes: 1                        # nodes of gpus_per_node GPUs (one homogeneous group)
        gpus_per_node: 8
        nic_gbps: 800                   # scale-out Gb/s per node (needed when nodes > 1)
        model: llama-3-8b               # preset, HF config.json, or tangram model file
        seq_len: 4096
        global_batch_size: 64           # sequences per step
        precision: bf16
        tp: 1                           # tp, pp, cp, ep default to 1; dp = GPUs / (tp pp cp)
        pp: 1
        zero: 1
        recompute: selective
        micro_batch_size: 2
        step_time_s: 6.1                # or tokens_per_s (the whole job), or tokens_per_s_per_gpu

``ep`` above 1 needs an MoE model. YAML reads exponent notation as a number only with a dot and a signed
exponent (``1.0e-3``; ``1e-3`` is a string and is refused).

The fit: for each GPU type, the factor ``s`` in [``MIN_SCALE``, ``MAX_SCALE``] minimizing the
mean squared log error ``mean(log(predicted / measured)^2)`` over that type's runs (golden-section
search; the predicted step time falls monotonically with ``s``). Every fitted efficiency must stay
a fraction of peak (at most 1.0); a fit that needs more means the measurement is faster than the
datasheet allows (another GPU type, another configuration, or a timing error) and is reported.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tangram_opt.cost.calibration import DEFAULT_CALIBRATION, Calibration, load_calibration
from tangram_opt.errors import FormatError, SpecError, TangramError
from tangram_opt.specs import _check
from tangram_opt.specs._io import load_structured_file, positive_number, read_text
from tangram_opt.specs.hardware import get_gpu_type
from tangram_opt.specs.training import TrainingSpec

MEASUREMENTS_FORMAT = "tangram_opt.measurements"
MEASUREMENTS_VERSION = 1
#: the range of the fitted compute factor
MIN_SCALE, MAX_SCALE = 0.2, 2.0
#: compute efficiencies the factor scales (their ratios keep the shipped table's)
SCALED_FIELDS = ("matmul_efficiency", "fp32_matmul_efficiency", "attention_efficiency", "attention_bwd_efficiency")

_REQUIRED = ("gpu", "model", "seq_len", "global_batch_size", "precision", "micro_batch_size")
_OPTIONAL = ("name", "nodes", "gpus_per_node", "nic_gbps", "tp", "pp", "cp", "ep", "zero", "recompute",
             "step_time_s", "tokens_per_s", "tokens_per_s_per_gpu", "note")
_MEASURES = ("step_time_s", "tokens_per_s", "tokens_per_s_per_gpu")


@dataclass(frozen=True, slots=True, kw_only=True)
class MeasuredRun:
    """One measured run: a homogeneous cluster, a fixed configuration and its step time."""

    name: str
    gpu: str  # catalog name
    nodes: int
    gpus_per_node: int
    nic_gbps: float
    model: Any  # ModelSpec
    training: TrainingSpec
    tp: int
    pp: int
    cp: int
    ep: int
    zero: int
    recompute: str
    micro_batch_size: int
    step_time_s: float

    @property
    def num_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def dp(self) -> int:
        return self.num_gpus // (self.tp * self.pp * self.cp)


@dataclass(frozen=True, slots=True)
class RunFit:
    run: MeasuredRun
    before_s: float | None  # predicted step time with the base calibration (None: no plan)
    after_s: float | None
    problem: str = ""

    @property
    def before_error(self) -> float | None:
        return None if self.before_s is None else self.before_s / self.run.step_time_s - 1

    @property
    def after_error(self) -> float | None:
        return None if self.after_s is None else self.after_s / self.run.step_time_s - 1


@dataclass(frozen=True, slots=True)
class CalibrationFit:
    """The fitted calibration, the factor per GPU type and every run before and after."""

    calibration: Calibration
    scales: dict[str, float]
    runs: tuple[RunFit, ...]
    warnings: tuple[str, ...] = field(default=())

    def median_abs_error(self, which: str) -> float | None:
        errs = [abs(e) for r in self.runs if (e := getattr(r, f"{which}_error")) is not None]
        return statistics.median(errs) if errs else None

    def sources(self) -> dict[str, str]:
        """Per GPU type: what its fitted entries came from (written into the calibration file)."""
        out = {}
        for gpu, s in self.scales.items():
            n = sum(1 for r in self.runs if r.run.gpu == gpu and r.after_s is not None)
            out[gpu] = (f"tangram-opt calibrate: compute efficiencies x {s:.3f} of the shipped table, fitted to "
                        f"{n} measured step(s)")
        return out


# --- reading -------------------------------------------------------------------------------------------
def load_measurements(path: str | Path) -> list[MeasuredRun]:
    """Read a measurements file (YAML/JSON, or CSV with one run per row); every field is checked."""
    p = Path(path)
    src = str(p)
    if p.suffix.lower() == ".csv":
        rows = [{k: _csv_value(v) for k, v in row.items() if not _missing(v)} for row in _read_csv(p)]
        data: Any = {"format": MEASUREMENTS_FORMAT, "version": MEASUREMENTS_VERSION, "runs": rows}
    else:
        data = load_structured_file(p)
    return measurements_from_dict(data, source=src)


def _read_csv(p: Path) -> list[dict[str, Any]]:
    """The rows of a measurements CSV (header line: the field names); pandas' parse errors become a
    :class:`FormatError` naming the file and, when pandas gives it, the line."""
    import io

    import pandas as pd

    _, text = read_text(p, field="measurements")
    try:
        df = pd.read_csv(io.StringIO(text))
    except pd.errors.EmptyDataError:
        raise FormatError("measurements", str(p), "is an empty CSV file (no header line, no runs)",
                          "write a header line with the field names, then one line per run "
                          "(see tangram_opt.calibrate)") from None
    except pd.errors.ParserError as e:
        msg = str(e).removeprefix("Error tokenizing data. C error: ").strip()
        where = ""
        if m := re.search(r"\bline (\d+)", msg):
            where = f" at line {m[1]}"
        elif m := re.search(r"\s*starting at row (\d+)", msg):  # pandas counts rows from 0 (the header line)
            where, msg = f" at line {int(m[1]) + 1}", msg.replace(m[0], "")
        raise FormatError("measurements", str(p), f"is not valid CSV{where}: {msg}",
                          "one run per line with as many comma-separated fields as the header; close every "
                          "double quote") from None
    return df.to_dict("records")


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def _csv_value(v: Any) -> Any:
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v


def measurements_from_dict(data: Any, *, source: str = "") -> list[MeasuredRun]:
    from tangram_opt.specs.presets import load_model

    if not isinstance(data, Mapping):
        raise FormatError("measurements", type(data).__name__, "must be a mapping with a runs: list",
                          "see tangram_opt.calibrate for the format", source=source)
    if data.get("format", MEASUREMENTS_FORMAT) != MEASUREMENTS_FORMAT:
        raise FormatError("measurements.format", data.get("format"), f"is not {MEASUREMENTS_FORMAT!r}",
                          "write format: tangram_opt.measurements", source=source)
    if data.get("version", MEASUREMENTS_VERSION) != MEASUREMENTS_VERSION:
        raise FormatError("measurements.version", data.get("version"), f"this tangram_opt reads version "
                          f"{MEASUREMENTS_VERSION}", "write version: 1", source=source)
    runs = data.get("runs")
    if not isinstance(runs, list) or not runs:
        raise FormatError("measurements.runs", runs, "must be a non-empty list of measured runs",
                          "add one entry per run (see tangram_opt.calibrate)", source=source)
    base = Path(source).parent if source else Path(".")
    out = []
    for i, row in enumerate(runs):
        w = f"runs[{i}]"
        if not isinstance(row, Mapping):
            raise FormatError(w, row, "must be a mapping", "one mapping per run", source=source)
        for k in _REQUIRED:
            if k not in row or _missing(row[k]):
                raise FormatError(f"{w}.{k}", None, "is required but missing", f"add {k}", source=source)
        unknown = sorted(set(row) - set(_REQUIRED) - set(_OPTIONAL))
        if unknown:
            raise FormatError(f"{w}.{unknown[0]}", row[unknown[0]], "is not a field of a measured run",
                              f"use {', '.join(_REQUIRED + _OPTIONAL)}", source=source)
        given = [k for k in _MEASURES if k in row and not _missing(row[k])]
        if len(given) != 1:
            raise FormatError(f"{w}.step_time_s", None if not given else ", ".join(given),
                              "give exactly one measurement", "one of step_time_s, tokens_per_s, "
                              "tokens_per_s_per_gpu", source=source)
        try:
            gpu = get_gpu_type(str(row["gpu"]), field=f"{w}.gpu", source=source).name
            ints = {k: _check.positive_int(f"{w}.{k}", row.get(k, 1)) for k in
                    ("nodes", "tp", "pp", "cp", "ep", "micro_batch_size", "seq_len", "global_batch_size")}
            gpn = _check.positive_int(f"{w}.gpus_per_node", row.get("gpus_per_node", 8))
            nic = positive_number(f"{w}.nic_gbps", row.get("nic_gbps", 400.0 * gpn))
            zero = row.get("zero", 0)
            if isinstance(zero, bool) or zero not in (0, 1, 2, 3):
                raise SpecError(f"{w}.zero", zero, "is not a ZeRO stage", "use 0, 1, 2 or 3")
            recompute = str(row.get("recompute", "none"))
            if recompute not in ("none", "selective", "full"):
                raise SpecError(f"{w}.recompute", recompute, "is not a recomputation mode",
                                "use none, selective or full")
            training = TrainingSpec(global_batch_size=ints["global_batch_size"], seq_len=ints["seq_len"],
                                    precision=str(row["precision"]))
            model_ref = str(row["model"])
            candidate = base / model_ref
            model = load_model(str(candidate) if candidate.exists() else model_ref)
            measure = given[0]
            value = positive_number(f"{w}.{measure}", row[measure])
        except FormatError:
            raise
        except SpecError as e:
            raise FormatError(e.field if e.field.startswith("runs[") else f"{w}.{e.field}", e.value, e.problem,
                              e.fix, source=source) from None
        if ints["ep"] > 1 and model.moe is None:
            raise FormatError(f"{w}.ep", ints["ep"], f"is expert parallelism but {model.name} is a dense model "
                              "(no MoE layers)", "write ep: 1, or leave it out", source=source)
        gpus = ints["nodes"] * gpn
        per = ints["tp"] * ints["pp"] * ints["cp"]
        if gpus % per:
            raise FormatError(f"{w}.tp", ints["tp"], f"tp x pp x cp = {per} does not divide the {gpus} GPUs",
                              "give the configuration the run used", source=source)
        dp = gpus // per
        if training.global_batch_size % (ints["micro_batch_size"] * dp):
            raise FormatError(f"{w}.global_batch_size", training.global_batch_size,
                              f"is not a multiple of micro_batch_size x dp = {ints['micro_batch_size'] * dp}",
                              "give the run's global batch in sequences", source=source)
        tokens = training.global_batch_size * training.seq_len
        step = {"step_time_s": value, "tokens_per_s": tokens / value,
                "tokens_per_s_per_gpu": tokens / (value * gpus)}[measure]
        out.append(MeasuredRun(name=str(row.get("name", f"run {i}")), gpu=gpu, nodes=ints["nodes"],
                               gpus_per_node=gpn, nic_gbps=nic, model=model, training=training, tp=ints["tp"],
                               pp=ints["pp"], cp=ints["cp"], ep=ints["ep"], zero=zero, recompute=recompute,
                               micro_batch_size=ints["micro_batch_size"], step_time_s=step))
    return out


def load_base_calibration(path: str | Path) -> Calibration:
    """The calibration ``calibrate --base`` starts from. A file that sets nothing (``{}``, or only format and
    version) is refused: it is the shipped table, the same as no ``--base``, so it is a wrong or truncated file."""
    return load_calibration(path)


def check_memory_reserve(cal: Calibration, gpus: Iterable[str], *, source: str = "") -> None:
    """Refuse a calibration whose memory reserve leaves a GPU type of ``gpus`` no memory
    (:meth:`Calibration.check_reserve`)."""
    for name in sorted(set(gpus)):
        cal.check_reserve(get_gpu_type(name), source=source)


# --- predicting ----------------------------------------------------------------------------------------
def predict_step_s(run: MeasuredRun, calibration: Calibration, *, time_limit_s: float = 10.0) -> float:
    """The step time ``solve`` predicts for ``run`` launched as measured (one pipeline of at most
    ``pp`` stages, the run's tp/cp/ep/dp, ZeRO stage, recomputation and micro-batch)."""
    from tangram_opt.planner.search import SearchOptions, solve
    from tangram_opt.planner.space import SearchSpace
    from tangram_opt.specs.cluster import make_cluster

    cluster = make_cluster(run.name, [{"name": "g", "gpu": run.gpu, "nodes": run.nodes,
                                       "gpus_per_node": run.gpus_per_node, "nic_gbps": run.nic_gbps}])
    space = SearchSpace(micro_batch_sizes=(run.micro_batch_size,), tp=(run.tp,), cp=(run.cp,),
                        ep=(run.ep,) if run.model.moe is not None else None,
                        zero=(run.zero,) if run.dp > 1 else (0,),  # ZeRO shards over dp: nothing to shard
                        recompute=(run.recompute,), pipeline_micro_batches=(run.micro_batch_size * run.dp,),
                        max_stages=run.pp)
    plan = solve(cluster, run.model, run.training, space=space, time_limit_s=time_limit_s, rel_gap=0.001,
                 calibration=calibration, options=SearchOptions(multi_pipeline=False))
    return plan.step_time_s


def scaled(base: Calibration, gpu: str, s: float) -> Calibration:
    """``base`` with the compute efficiencies of ``gpu`` multiplied by ``s``."""
    return base.with_gpu(gpu, **{f: getattr(base, f.removesuffix("_efficiency"))(gpu) * s for f in SCALED_FIELDS})


def _golden(f: Callable[[float], float], lo: float, hi: float, tol: float = 1e-3) -> float:
    g = (math.sqrt(5) - 1) / 2
    a, b = lo, hi
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = f(c), f(d)
    while b - a > tol:
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = f(d)
    return (a + b) / 2


def fit_measurements(runs: Sequence[MeasuredRun], base: Calibration | None = None, *,
                     time_limit_s: float = 10.0,
                     on_run: Callable[[str], None] | None = None) -> CalibrationFit:
    """Fit one compute factor per GPU type of ``runs`` on top of ``base`` (default: the shipped table)."""
    base = base or DEFAULT_CALIBRATION
    check_memory_reserve(base, (r.gpu for r in runs))
    memo: dict[tuple[int, float], float | None] = {}
    problems: dict[int, str] = {}

    def pred(i: int, cal: Calibration, key: float) -> float | None:
        if (i, key) not in memo:
            try:
                memo[i, key] = predict_step_s(runs[i], cal, time_limit_s=time_limit_s)
            except TangramError as e:
                memo[i, key] = None
                problems.setdefault(i, f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
        return memo[i, key]

    before = [pred(i, base, -1.0) for i in range(len(runs))]
    cal = base
    scales: dict[str, float] = {}
    warnings: list[str] = []
    for gpu in sorted({r.gpu for r in runs}):
        idx = [i for i, r in enumerate(runs) if r.gpu == gpu and before[i] is not None]
        if not idx:
            warnings.append(f"{gpu}: no measured run could be planned, nothing fitted")
            continue
        if on_run:
            on_run(f"fitting {gpu} to {len(idx)} run(s)")

        def loss(s: float, gpu: str = gpu, idx: list[int] = idx) -> float:
            c = scaled(cal, gpu, s)
            errs = [math.log(p / runs[i].step_time_s) for i in idx if (p := pred(i, c, round(s, 6))) is not None]
            return sum(e * e for e in errs) / max(1, len(errs))

        # no efficiency may pass the datasheet peak: the factor's range ends where the first reaches 1.0
        peak = min(MAX_SCALE, min(1.0 / getattr(cal, f.removesuffix("_efficiency"))(gpu) for f in SCALED_FIELDS))
        s = _golden(loss, MIN_SCALE, peak)
        if s > peak - 0.01:
            warnings.append(f"{gpu}: the measured runs are faster than the datasheet allows (the fit stops at "
                            f"x {s:.2f}, where an efficiency reaches 1.0 of peak); check the GPU type, the "
                            "configuration and the timing")
        elif s < MIN_SCALE + 0.01:
            warnings.append(f"{gpu}: the fit hit the bottom of its range (x {s:.2f}); check the GPU type, the "
                            "configuration and the timing of its runs")
        cal = scaled(cal, gpu, s)
        scales[gpu] = s
    after = [pred(i, cal, -2.0) if before[i] is not None else None for i in range(len(runs))]
    fits = tuple(RunFit(runs[i], before[i], after[i], problems.get(i, "")) for i in range(len(runs)))
    return CalibrationFit(calibration=cal, scales=scales, runs=fits, warnings=tuple(warnings))


def fit_table(fit: CalibrationFit) -> list[dict[str, Any]]:
    """One row per run: measured, predicted before and after, errors (for printing)."""
    return [{"run": r.run.name, "gpu": r.run.gpu, "gpus": r.run.num_gpus, "measured_s": r.run.step_time_s,
             "before_s": r.before_s, "before_error": r.before_error, "after_s": r.after_s,
             "after_error": r.after_error, "problem": r.problem} for r in fit.runs]


__all__ = ["MEASUREMENTS_FORMAT", "MeasuredRun", "RunFit", "CalibrationFit", "load_measurements",
           "measurements_from_dict", "load_base_calibration", "check_memory_reserve", "predict_step_s",
           "fit_measurements", "fit_table", "scaled"]
