"""Plans: what to run where, what it is predicted to cost, and how good it provably is.

A :class:`Plan` holds one or more :class:`PipelinePlan` (several pipelines are data-parallel
replicas of the model, each with its own share of the global batch). Each pipeline is a chain of
:class:`StagePlan`, each stage a homogeneous group of GPUs on one island. The :class:`Certificate`
records the solver's incumbent, dual bound and gap, and the plan space they refer to.

Plans round-trip through JSON (``Plan.to_json`` / ``Plan.from_json``) with a schema version; a plan
read from a file is checked field by field (``Plan.from_dict``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import MISSING, asdict, dataclass, field, fields
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tangram_opt import units as u
from tangram_opt.cost.config import RECOMPUTE_MODES, ZERO_STAGES, StageConfig
from tangram_opt.errors import FormatError, SpecError
from tangram_opt.planner.islands import find_islands
from tangram_opt.planner.space import SCHEDULES

if TYPE_CHECKING:
    from tangram_opt.specs.cluster import Cluster
    from tangram_opt.specs.model import ModelSpec
    from tangram_opt.specs.training import TrainingSpec

PLAN_SCHEMA_VERSION = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class StagePlan:
    """One pipeline stage: ``gpus = tp * cp * dp`` GPUs of one island running a contiguous range of
    transformer blocks (``first_layer`` .. ``first_layer + num_layers - 1``), plus the embedding
    if it is the first stage and the LM head if it is the last."""

    island: str
    gpu: str
    gpus: int
    tp: int
    cp: int
    dp: int
    ep: int
    zero: int
    recompute: str
    micro_batch_size: int
    first_layer: int
    num_dense_layers: int
    num_moe_layers: int
    has_embedding: bool
    has_head: bool
    fwd_time_s: float
    bwd_time_s: float
    tail_time_s: float
    p2p_time_s: float
    memory_bytes: float
    capacity_bytes: float
    inflight: int
    #: multi-pipeline plans only: the stage's optimizer update, which must wait for the gradient
    #: all-reduce across pipelines and so runs after it (``tail_time_s`` is then the exposed
    #: intra-stage gradient sync alone). 0 in single-pipeline plans, whose tail holds the update.
    post_sync_time_s: float = 0.0

    @property
    def num_layers(self) -> int:
        return self.num_dense_layers + self.num_moe_layers

    @property
    def layer_range(self) -> range:
        return range(self.first_layer, self.first_layer + self.num_layers)

    @property
    def time_s(self) -> float:
        return self.fwd_time_s + self.bwd_time_s

    @property
    def config(self) -> StageConfig:
        return StageConfig(tp=self.tp, cp=self.cp, dp=self.dp, ep=self.ep, zero=self.zero,
                           recompute=self.recompute, micro_batch_size=self.micro_batch_size)

    @property
    def memory_free_bytes(self) -> float:
        return self.capacity_bytes - self.memory_bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelinePlan:
    """A chain of stages processing ``num_micro_batches`` micro-batches of ``pipeline_micro_batch``
    sequences per step.

    ``step_time_s`` is the exact schedule (event-graph longest path plus step tails);
    ``model_step_time_s`` the closed-form model the MIP optimizes (an upper bound of it);
    ``makespan_s`` and ``bottleneck_s`` are the closed form's makespan and steady period.
    """

    stages: tuple[StagePlan, ...]
    pipeline_micro_batch: int
    num_micro_batches: int
    schedule: str
    makespan_s: float
    step_time_s: float
    bottleneck_s: float
    model_step_time_s: float = 0.0

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    @property
    def gpus(self) -> int:
        return sum(s.gpus for s in self.stages)

    @property
    def sequences_per_step(self) -> int:
        return self.pipeline_micro_batch * self.num_micro_batches

    @property
    def bubble_fraction(self) -> float:
        """Share of the step the average stage is idle (1 - busy / step time)."""
        if self.step_time_s <= 0:
            return 0.0
        busy = sum(s.time_s for s in self.stages) * self.num_micro_batches / len(self.stages)
        return max(0.0, 1.0 - busy / self.step_time_s)


class CertificateStatus(str, Enum):
    """What a certificate proves. A member compares equal to its value and prints as it, which is
    what plan files store (so ``cert.status == "optimal"`` holds)."""

    OPTIMAL = "optimal"
    """The gap is within the requested relative gap: no plan of the space is better by more."""
    FEASIBLE = "feasible"
    """A real plan and a valid bound, but the search stopped (time limit) above the requested gap."""
    HEURISTIC = "heuristic"
    """A plan without a bound (``bound_s`` and ``gap`` are None)."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


@dataclass(frozen=True, slots=True, kw_only=True)
class Certificate:
    """How good the plan provably is, and within which plan space.

    ``objective`` names what was optimized (``"throughput"``, ``"min_cost"``, ``"cost_per_token"``;
    formulations/pipeline_mip.md §4b) and ``limits`` the limits it was subject to. ``objective_value``
    and ``objective_bound`` are the plan's value and the lower bound over every plan of
    ``plan_space`` that meets the limits, in ``objective_unit``; ``gap = (objective_value -
    objective_bound) / objective_value``. ``objective_s`` is the plan's closed-form step time; under
    the throughput objective ``bound_s`` bounds it (and the ``objective_*`` fields may be left out),
    under a dollar objective ``bound_s`` is None. ``prices``: the plan's USD/h, USD per 1M tokens and
    free nodes when the cluster's GPUs have prices. ``status`` is a :class:`CertificateStatus` (a
    string given here is read as one).
    """

    status: CertificateStatus
    backend: str
    objective_s: float
    bound_s: float | None
    gap: float | None
    solve_time_s: float
    plan_space: str
    subproblems: tuple[dict[str, Any], ...] = ()
    trajectory: tuple[tuple[float, float | None, float | None], ...] = ()
    notes: tuple[str, ...] = ()
    objective: str = "throughput"
    objective_value: float | None = None
    objective_bound: float | None = None
    objective_unit: str = "s per step"
    limits: dict[str, Any] = field(default_factory=dict)
    prices: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.objective == "throughput":  # the objective is the step time: one figure, kept in sync
            object.__setattr__(self, "objective_value", self.objective_s)
            object.__setattr__(self, "objective_bound", self.bound_s)
        if not isinstance(self.status, CertificateStatus):
            try:
                object.__setattr__(self, "status", CertificateStatus(self.status))
            except ValueError:
                raise SpecError("certificate.status", self.status, "is not a certificate status",
                                f"use one of {', '.join(s.value for s in CertificateStatus)}") from None

    def describe(self) -> str:
        if self.gap is None:
            return f"{self.status} ({self.backend}, {self.solve_time_s:.1f} s): no bound"
        if self.objective != "throughput" or self.limits:
            lim = limits_text(self.limits)
            return (f"{self.status}: objective {self.objective}{lim}: {self.objective_value:.6g} "
                    f"{self.objective_unit}, "
                    f"within {100 * self.gap:.2f}% of the best plan in the model (bound {self.objective_bound:.6g}, "
                    f"{self.backend}, {self.solve_time_s:.1f} s)")
        return (f"{self.status}: within {100 * self.gap:.2f}% of the best plan in the model "
                f"(bound {self.bound_s:.4f} s, {self.backend}, {self.solve_time_s:.1f} s)")


def limits_text(limits: dict[str, Any]) -> str:
    """A certificate's limits as ``", budget_usd_per_h 12, max_nodes v100=0"`` (empty without any)."""
    parts = []
    for k, v in limits.items():
        if isinstance(v, dict):
            parts.append(f", {k} " + ",".join(f"{g}={n}" for g, n in v.items()))
        else:
            parts.append(f", {k} {v:,.6g}")
    return "".join(parts)


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """A complete training plan for one step."""

    cluster: str
    model: str
    method: str
    global_batch_size: int
    seq_len: int
    precision: str
    pipelines: tuple[PipelinePlan, ...]
    step_time_s: float
    model_flops_per_step: float
    used_peak_flops_per_s: float
    cluster_peak_flops_per_s: float
    island_gpus: dict[str, int] = field(default_factory=dict)
    certificate: Certificate | None = None
    expert_placement: dict[str, Any] | None = None
    schema_version: int = PLAN_SCHEMA_VERSION
    #: multi-pipeline plans: seconds of the gradient all-reduce across the pipelines (not overlapped;
    #: docs/multi_pipeline.md). ``step_time_s = max(pipeline step) + cross_sync_s + post_sync_s``.
    cross_sync_s: float = 0.0

    # --- metrics ---------------------------------------------------------------------------
    @property
    def tokens_per_s(self) -> float:
        return self.global_batch_size * self.seq_len / self.step_time_s

    @property
    def mfu(self) -> float:
        """Model FLOPs utilization over the dense peak of the GPUs the plan uses."""
        return self.model_flops_per_step / self.step_time_s / self.used_peak_flops_per_s

    @property
    def cluster_mfu(self) -> float:
        """Model FLOPs utilization over the dense peak of every GPU in the cluster."""
        return self.model_flops_per_step / self.step_time_s / self.cluster_peak_flops_per_s

    @property
    def gpus_used(self) -> int:
        return sum(p.gpus for p in self.pipelines)

    @property
    def stages(self) -> tuple[StagePlan, ...]:
        """All stages of all pipelines (pipeline order, then stage order)."""
        return tuple(s for p in self.pipelines for s in p.stages)

    @property
    def gap(self) -> float | None:
        return self.certificate.gap if self.certificate else None

    @property
    def post_sync_s(self) -> float:
        """Multi-pipeline plans: the slowest stage's optimizer update after the cross-pipeline sync."""
        return max((s.post_sync_time_s for s in self.stages), default=0.0)

    @property
    def sequences_per_pipeline(self) -> tuple[int, ...]:
        """Each pipeline's share of the global batch (sequences per step)."""
        return tuple(p.sequences_per_step for p in self.pipelines)

    def gpus_by_island(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for s in self.stages:
            out[s.island] = out.get(s.island, 0) + s.gpus
        return out

    def describe(self) -> str:
        lines = [f"Plan for {self.model} on {self.cluster} ({self.method}): step {self.step_time_s:.3f} s, "
                 f"{self.tokens_per_s:,.0f} tokens/s, MFU {100 * self.mfu:.1f}% "
                 f"({self.gpus_used} GPUs used)"]
        for pi, p in enumerate(self.pipelines):
            lines.append(f"  pipeline {pi}: {p.num_stages} stages, micro-batch {p.pipeline_micro_batch} seq x "
                         f"{p.num_micro_batches}, {p.schedule}, bubble {100 * p.bubble_fraction:.1f}%")
            for k, s in enumerate(p.stages):
                extra = ("+emb" if s.has_embedding else "") + ("+head" if s.has_head else "")
                lines.append(
                    f"    [{k}] {s.island:<10} {s.gpus:>4}x{s.gpu:<9} tp{s.tp} cp{s.cp} dp{s.dp} ep{s.ep} "
                    f"z{s.zero} rc={s.recompute:<9} mb{s.micro_batch_size} layers {s.first_layer}-"
                    f"{s.first_layer + s.num_layers - 1}{extra}  T={1e3 * s.time_s:.1f} ms  "
                    f"mem {s.memory_bytes / u.GiB:.1f}/{s.capacity_bytes / u.GiB:.1f} GiB")
        if len(self.pipelines) > 1:
            lines.append(f"  cross-pipeline gradient all-reduce {1e3 * self.cross_sync_s:.1f} ms, then optimizer "
                         f"{1e3 * self.post_sync_s:.1f} ms; batch shares "
                         f"{' + '.join(map(str, self.sequences_per_pipeline))} sequences")
        if self.certificate:
            lines.append("  " + self.certificate.describe() + " [closed-form model "
                         f"{self.certificate.objective_s:.4f} s; exact schedule {self.step_time_s:.4f} s]")
        return "\n".join(lines)

    def summary(self, width: int = 120) -> str:
        """A readable text table: stages, parallelism, memory, times, tokens/s, MFU and the gap."""
        from tangram_opt.planner.plan_summary import summary_text

        return summary_text(self, width=width)

    def to_dataframe(self):  # type: ignore[no-untyped-def]
        """One row per stage (pandas), plan-level figures in ``.attrs``; for notebooks."""
        from tangram_opt.planner.plan_summary import plan_table

        return plan_table(self)

    # --- serialization ---------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["schema_version"] = PLAN_SCHEMA_VERSION
        d["metrics"] = {"tokens_per_s": self.tokens_per_s, "mfu": self.mfu, "cluster_mfu": self.cluster_mfu,
                        "gpus_used": self.gpus_used}
        return d

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json() + "\n", encoding="utf-8")

    @classmethod
    def from_dict(cls, d: Any, *, source: str = "") -> Plan:
        """A plan from its file form (:meth:`to_dict`), or from a plan file ``tangram-opt plan --output``
        wrote (its ``plan`` part; the cluster, model and training run it also holds are read by
        ``tangram_opt.export.read_plan_file``).

        Every field is checked: its type, its range (parallel degrees, GPU counts and batch sizes
        >= 1, layer indices and counts >= 0, finite times and bytes >= 0, known schedule, ZeRO stage
        and recomputation mode), and the plan's own structure (at least one pipeline and one stage,
        ``tp x cp x dp == gpus``, stages covering the layers contiguously from 0, each once, the
        embedding first and the head last, the pipelines' sequences summing to the global batch).
        Anything else raises :class:`FormatError` / :class:`SpecError` naming the field's path
        (``pipelines[0].stages[2].tp``) and ``source``.
        """
        if isinstance(d, Mapping) and "schema" in d and "pipelines" not in d:  # the CLI's plan file
            schema = d["schema"]
            if schema != PLAN_FILE_SCHEMA:
                raise FormatError("schema", schema, f"this tangram_opt reads plan files of schema "
                                  f"{PLAN_FILE_SCHEMA!r}", "re-create the plan with this version, or upgrade "
                                  "tangram_opt", source=source)
            if "plan" not in d:
                raise FormatError("plan", None, "is missing from the plan file", _FILE_FIX, source=source)
            d = d["plan"]
        if not isinstance(d, Mapping):
            raise FormatError("plan", type(d).__name__, "must be a JSON object (a plan)", _FILE_FIX, source=source)
        version = d.get("schema_version")
        if version != PLAN_SCHEMA_VERSION:
            raise FormatError("schema_version", version, f"this tangram_opt reads plan schema {PLAN_SCHEMA_VERSION}",
                              "re-create the plan with this version" if "schema_version" in d else _FILE_FIX,
                              source=source)
        plan = _read(cls, d, "", source)
        _check_structure(plan, source)
        return plan

    @classmethod
    def from_json(cls, text: str, *, source: str = "") -> Plan:
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise FormatError("plan", "JSON", f"is not valid JSON (line {e.lineno}: {e.msg})", _FILE_FIX,
                              source=source) from None
        return cls.from_dict(d, source=source)

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        """A plan from a file :meth:`save` or ``tangram-opt plan --output`` wrote (see :meth:`from_dict`)."""
        p = Path(path)
        if not p.is_file():
            raise FormatError("plan", str(path), "file not found", "check the path")
        try:
            text = p.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise FormatError("plan", str(path), "is not a text (UTF-8) file", _FILE_FIX) from None
        return cls.from_json(text, source=str(path))

    def spec_mismatches(self, *, cluster: Cluster | None = None, model: ModelSpec | None = None,
                        training: TrainingSpec | None = None) -> list[str]:
        """How this plan differs from the specs it is shown, exported or replayed against (empty when it
        matches them; a spec left None is not compared): the model's name and layers (every pipeline holds
        the model's dense and MoE layers), the training run's global batch, sequence length and precision,
        and the cluster's islands (every stage's island exists and has the stage's GPU type).
        ``tangram_opt.validate`` checks every other rule."""
        out: list[str] = []
        if model is not None:
            if self.model != model.name:
                out.append(f"model: the plan is for {self.model!r}, the model given is {model.name!r}")
            held: dict[tuple[int, int], list[int]] = {}  # (dense, MoE layers) -> the pipelines holding them
            for pi, p in enumerate(self.pipelines):
                held.setdefault((sum(s.num_dense_layers for s in p.stages),
                                 sum(s.num_moe_layers for s in p.stages)), []).append(pi)
            for (dense, moe), pis in held.items():
                if (dense, moe) != (model.num_dense_layers, model.num_moe_layers):
                    out.append(f"layers: pipeline {', '.join(map(str, pis))} holds {dense + moe} layers ({dense} dense "
                               f"+ {moe} MoE), model {model.name!r} has {model.num_layers} "
                               f"({model.num_dense_layers} dense + {model.num_moe_layers} MoE)")
        if training is not None:
            for name in ("global_batch_size", "seq_len", "precision"):
                mine, want = getattr(self, name), getattr(training, name)
                if mine != want:
                    out.append(f"{name}: the plan has {mine!r}, the training run {want!r}")
        if cluster is not None:
            islands = {isl.name: isl for isl in find_islands(cluster)}
            for name, gpu in sorted({(s.island, s.gpu) for s in self.stages}):
                if name not in islands:
                    out.append(f"island {name!r}: not an island of cluster {cluster.name!r} "
                               f"(islands: {', '.join(islands)})")
                elif islands[name].gpu_name != gpu:
                    out.append(f"island {name!r}: the plan runs {gpu} GPUs there, cluster {cluster.name!r} has "
                               f"{islands[name].gpu_name}")
        return out


#: the CLI's plan file envelope (``tangram_opt.export.envelope.PLAN_FILE_SCHEMA``, a layer above this one;
#: tests/test_plan_inputs.py holds the two equal)
PLAN_FILE_SCHEMA = "tangram_opt.plan/1"
_FILE_FIX = "pass a file written by Plan.save or `tangram-opt plan --output`"
_EDIT_FIX = "restore the value the planner wrote, or re-plan"
#: integers of the file form that must be >= 1 (every other integer must be >= 0)
_AT_LEAST_ONE = frozenset({"gpus", "tp", "cp", "dp", "ep", "micro_batch_size", "pipeline_micro_batch",
                           "num_micro_batches", "global_batch_size", "seq_len", "schema_version"})
#: plan figures that divide (tokens/s, MFU): > 0 (every other number must be >= 0)
_POSITIVE = frozenset({"step_time_s", "used_peak_flops_per_s", "cluster_peak_flops_per_s"})
_CHOICES: dict[str, tuple[str, tuple[Any, ...]]] = {"zero": ("ZeRO stage", ZERO_STAGES),
                                                    "recompute": ("recomputation mode", RECOMPUTE_MODES),
                                                    "schedule": ("pipeline schedule", SCHEDULES)}
#: keys of the file form written for readers and ignored when read
_DERIVED = {Plan: ("metrics",)}
_WHAT = {Plan: "a plan", PipelinePlan: "a pipeline", StagePlan: "a stage", Certificate: "a certificate"}


def _at(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _read(cls: type, d: Any, path: str, source: str) -> Any:
    """An instance of plan dataclass ``cls`` from its file form ``d`` found at ``path``: every key a field,
    every field without a default present, each value of its field's type and range."""
    what = _WHAT[cls]
    if not isinstance(d, Mapping):
        raise FormatError(path or "plan", type(d).__name__, f"must be a JSON object ({what})", _FILE_FIX,
                          source=source)
    names = [f.name for f in fields(cls)]
    for key in d:
        if key not in names and key not in _DERIVED.get(cls, ()):
            raise FormatError(_at(path, str(key)), d[key], f"is not a field of {what}",
                              f"remove it (the fields are {', '.join(names)}), or upgrade tangram_opt if a newer "
                              "version wrote the file", source=source)
    kw = {}
    for f in fields(cls):
        where = _at(path, f.name)
        if f.name not in d:
            if f.default is MISSING and f.default_factory is MISSING:
                raise FormatError(where, None, f"is missing from {what}", _FILE_FIX, source=source)
            continue
        kw[f.name] = _value(where, f.name, d[f.name], str(f.type), cls is not Certificate, source)
    return cls(**kw)


def _value(where: str, name: str, v: Any, kind: str, ranged: bool, source: str) -> Any:
    """One field's value, checked against its annotation ``kind`` (and, with ``ranged``, its range)."""
    if kind.endswith(" | None"):
        if v is None:
            return None
        kind = kind.removesuffix(" | None")
    nested = {"tuple[StagePlan, ...]": StagePlan, "tuple[PipelinePlan, ...]": PipelinePlan,
              "Certificate": Certificate}.get(kind)
    if nested is Certificate:
        return _read(Certificate, v, where, source)
    if kind.startswith("tuple["):
        if not isinstance(v, (list, tuple)) or (nested is not None and not v):  # a tuple: to_dict() unserialized
            raise FormatError(where, v, "must be a non-empty list" if nested else "must be a list",
                              _FILE_FIX, source=source)
        if nested is not None:
            return tuple(_read(nested, x, f"{where}[{i}]", source) for i, x in enumerate(v))
        item, want = {"tuple[str, ...]": (str, "a string"),
                      "tuple[dict[str, Any], ...]": (Mapping, "a JSON object")}.get(kind, ((list, tuple), "a list"))
        for i, x in enumerate(v):
            if not isinstance(x, item):
                raise FormatError(f"{where}[{i}]", x, f"must be {want}", _FILE_FIX, source=source)
        return tuple(tuple(x) if isinstance(x, list) else x for x in v)
    if kind.startswith("dict["):
        if not isinstance(v, Mapping):
            raise FormatError(where, v, "must be a JSON object", _FILE_FIX, source=source)
        if kind == "dict[str, int]":
            for key, x in v.items():
                _value(f"{where}.{key}", name, x, "int", ranged, source)
        return dict(v)
    if kind in ("str", "CertificateStatus"):
        ok, want = isinstance(v, str) and (bool(v) or not ranged), "a non-empty string" if ranged else "a string"
    elif kind == "bool":
        ok, want = isinstance(v, bool), "true or false"
    elif kind == "int":
        ok, want = isinstance(v, int) and not isinstance(v, bool), "an integer"
    else:
        assert kind == "float", f"no reader for {kind}"
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and (math.isfinite(v) or not ranged)
        want = "a finite number" if ranged else "a number"
    if not ok:
        raise FormatError(where, v, f"must be {want}", _EDIT_FIX, source=source)
    if not ranged:
        return v
    if name in _CHOICES and v not in _CHOICES[name][1]:
        what, choices = _CHOICES[name]
        raise SpecError(where, v, f"is not a {what}", f"use one of {', '.join(map(str, choices))}", source=source)
    low = 1 if (kind == "int" and name in _AT_LEAST_ONE) else 0
    if kind in ("int", "float") and (v < low or (kind == "float" and name in _POSITIVE and v <= 0)):
        raise SpecError(where, v, f"must be {'> 0' if name in _POSITIVE else f'>= {low}'}", _EDIT_FIX, source=source)
    return v


def _check_structure(plan: Plan, source: str) -> None:
    """The rules a plan read from a file must follow without its specs (see :meth:`Plan.from_dict`)."""
    fix = _EDIT_FIX
    for pi, pipe in enumerate(plan.pipelines):
        end, last = 0, len(pipe.stages) - 1
        for k, s in enumerate(pipe.stages):
            where = f"pipelines[{pi}].stages[{k}]"
            if s.tp * s.cp * s.dp != s.gpus:
                raise SpecError(f"{where}.gpus", s.gpus, f"is not tp({s.tp}) x cp({s.cp}) x dp({s.dp}) = "
                                f"{s.tp * s.cp * s.dp}", fix, source=source)
            if s.num_layers < 1:
                raise SpecError(f"{where}.num_dense_layers", s.num_dense_layers, "the stage holds no layer "
                                f"(num_dense_layers + num_moe_layers = {s.num_layers})", fix, source=source)
            if s.first_layer != end:
                raise SpecError(f"{where}.first_layer", s.first_layer,
                                f"must be {end}: the stages hold the layers contiguously from 0, each once"
                                + (f" (stage {k - 1} ends at layer {end - 1})" if k else ""), fix, source=source)
            end += s.num_layers
            if s.has_embedding != (k == 0) or s.has_head != (k == last):
                field_ = "has_embedding" if s.has_embedding != (k == 0) else "has_head"
                raise SpecError(f"{where}.{field_}", getattr(s, field_), "the embedding is on the first stage "
                                "only and the LM head on the last only", fix, source=source)
    seqs = [p.pipeline_micro_batch * p.num_micro_batches for p in plan.pipelines]
    if sum(seqs) != plan.global_batch_size:
        terms = " + ".join(f"{p.pipeline_micro_batch} x {p.num_micro_batches}" for p in plan.pipelines)
        raise SpecError("pipelines", terms, f"pipeline_micro_batch x num_micro_batches summed over the pipelines "
                        f"is {sum(seqs)} sequences, but global_batch_size is {plan.global_batch_size}", fix,
                        source=source)
