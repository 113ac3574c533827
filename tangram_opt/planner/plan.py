"""Plans: what to run where, what it is predicted to cost, and how good it provably is.

A :class:`Plan` holds one or more :class:`PipelinePlan` (several pipelines are data-parallel
replicas of the model, each with its own share of the global batch). Each pipeline is a chain of
:class:`StagePlan`, each stage a homogeneous group of GPUs on one island. The :class:`Certificate`
records the solver's incumbent, dual bound and gap, and the plan space they refer to.

Plans round-trip through JSON (``Plan.to_json`` / ``Plan.from_json``) with a schema version.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from enum import Enum
from pathlib import Path
from typing import Any

from tangram_opt import units as u
from tangram_opt.cost.config import StageConfig
from tangram_opt.errors import FormatError, SpecError

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
    def from_dict(cls, d: dict[str, Any]) -> Plan:
        try:
            version = d.get("schema_version")
            if version != PLAN_SCHEMA_VERSION:
                raise SpecError("schema_version", version, f"this tangram_opt reads plan schema {PLAN_SCHEMA_VERSION}",
                                "re-create the plan with this version")
            pipes = tuple(
                PipelinePlan(stages=tuple(StagePlan(**s) for s in p["stages"]),
                             **{k: v for k, v in p.items() if k != "stages"})
                for p in d["pipelines"])
            cert = d.get("certificate")
            if cert is not None:
                cert = Certificate(**{**cert, "subproblems": tuple(cert.get("subproblems", ())),
                                      "trajectory": tuple(tuple(t) for t in cert.get("trajectory", ())),
                                      "notes": tuple(cert.get("notes", ()))})
            names = {f.name for f in fields(cls)} - {"pipelines", "certificate"}
            return cls(pipelines=pipes, certificate=cert, **{k: v for k, v in d.items() if k in names})
        except (KeyError, TypeError) as e:
            raise FormatError("plan", type(e).__name__, f"is not a valid plan document ({e})",
                              "pass a file written by Plan.save or `tangram-opt plan --output`") from None

    @classmethod
    def from_json(cls, text: str) -> Plan:
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise FormatError("plan", "JSON", f"is not valid JSON (line {e.lineno}: {e.msg})",
                              "pass a file written by Plan.save") from None
        if not isinstance(d, dict):
            raise FormatError("plan", type(d).__name__, "must be a JSON object", "pass a file written by Plan.save")
        return cls.from_dict(d)

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        p = Path(path)
        if not p.is_file():
            raise FormatError("plan", str(path), "file not found", "check the path")
        return cls.from_json(p.read_text(encoding="utf-8"))
