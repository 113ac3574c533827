"""Discrete-event replay of one training step, micro-batch by micro-batch (see docs/simulator.md).

The simulator is the independent check of a plan. It shares no code path with the planner's
formulation or closed form (``tangram_opt.planner.formulations.pipeline_model``): every stage's forward,
backward and tail durations and its memory terms are recomputed from the specs by the cost model
(:mod:`tangram_opt.sim._stages`), and the step time comes out of an event-driven replay of the
schedule, not a formula.

Model of one pipeline (Narayanan et al., SC'21, Sec. 2.2 for 1F1B; Huang et al. 2019 for GPipe):

- Each stage is one compute stream. Per micro-batch ``j`` it runs ``F(k, j)`` and ``B(k, j)``
  (backward includes recomputation) in a fixed per-stage order:
  1F1B: ``min(P - k - 1, m)`` warm-up forwards, then alternating F / B, then cool-down backwards;
  GPipe: all forwards, then all backwards (in micro-batch order).
- After ``F(k, j)`` the activation is sent ``k -> k+1``; after ``B(k+1, j)`` its gradient is sent
  ``k+1 -> k``. Each direction of each stage boundary is a FIFO channel (full duplex: the two
  directions are independent) whose transfer takes ``cost.p2p_time_s(src, dst, island_link(...))``
  (each side's GPUs send their shares at once; the slowest side or a shared zone link sets it).
  Sends are asynchronous: they do not occupy the compute stream. A receiving op waits for arrival.
- After a stage's last backward it runs its step tail (exposed gradient sync + optimizer update).
  A pipeline's step ends when every stage has finished its tail.
- Memory per GPU of a stage: static bytes, plus ``activation_bytes`` for every micro-batch whose
  forward has started and whose backward has not ended, plus the transient scratch while a forward
  or backward runs.

Several pipelines (data-parallel replicas, issue 10) run on disjoint GPUs and are replayed
independently. Each stage's tail is then only its exposed intra-stage gradient sync; when the
slowest pipeline is done, the gradients are all-reduced across the pipelines (the
``cross_pipeline_sync`` hook; by default :func:`tangram_opt.sim.cross_sync.cross_pipeline_allreduce`,
priced from the plan and the specs), and then every stage runs its optimizer update:
``step = max_p pipeline_p + cross sync + max_k optimizer_k``.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tangram_opt import units as u
from tangram_opt.cost import Calibration, CostModel
from tangram_opt.errors import SpecError
from tangram_opt.planner.plan import Plan
from tangram_opt.sim._stages import SCHEDULES, StageWork, island_by_name, p2p_times, stage_tail_parts, stage_work
from tangram_opt.sim.cross_sync import allreduce_hook
from tangram_opt.specs import load_cluster, load_model, load_training
from tangram_opt.specs.cluster import Cluster
from tangram_opt.specs.model import ModelSpec
from tangram_opt.specs.training import TrainingSpec

if TYPE_CHECKING:
    import pandas as pd

#: Kinds of :class:`TraceEvent`.
EVENT_KINDS = ("F", "B", "send_fwd", "send_bwd", "tail")
#: ``TraceEvent.micro_batch`` of events that belong to no micro-batch (the step tail).
NO_MICRO_BATCH = -1


# --- results ------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class TraceEvent:
    """One interval of the timeline.

    - ``kind == "F"`` / ``"B"``: forward / backward of ``micro_batch`` on the compute stream of
      ``stage`` of ``pipeline``;
    - ``kind == "send_fwd"``: the activation of ``micro_batch`` travelling from ``stage`` to
      ``stage + 1`` (``stage`` is the sender);
    - ``kind == "send_bwd"``: the gradient of ``micro_batch`` travelling from ``stage`` to
      ``stage - 1`` (``stage`` is the sender);
    - ``kind == "tail"``: the stage's gradient sync and optimizer step after its last backward
      (``micro_batch == -1``).

    ``start_s`` / ``end_s`` are seconds from the start of the step. A send starts when its channel
    is free and the data is ready, so a queued send starts later than the op that produced it.
    """

    pipeline: int
    stage: int
    kind: str
    micro_batch: int
    start_s: float
    end_s: float

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    @property
    def lane(self) -> str:
        """A timeline row name: ``p0.s1`` for a compute stream (F, B, tail), ``p0.s1>s2`` / ``p0.s2>s1``
        for a link channel."""
        if self.kind == "send_fwd":
            return f"p{self.pipeline}.s{self.stage}>s{self.stage + 1}"
        if self.kind == "send_bwd":
            return f"p{self.pipeline}.s{self.stage}>s{self.stage - 1}"
        return f"p{self.pipeline}.s{self.stage}"


@dataclass(frozen=True, slots=True, kw_only=True)
class StageResult:
    """What one stage did in the replay. Memory figures are per GPU of the stage (all its GPUs are
    symmetric: same layers, same shards)."""

    pipeline: int
    stage: int
    label: str
    gpus: int
    fwd_time_s: float
    bwd_time_s: float
    tail_time_s: float
    busy_s: float
    idle_s: float
    bubble_fraction: float
    first_forward_start_s: float
    last_backward_end_s: float
    end_s: float
    peak_memory_bytes: float
    capacity_bytes: float
    peak_inflight: int
    memory_timeline: tuple[tuple[float, float], ...]

    @property
    def stall_s(self) -> float:
        """Idle time of the compute stream between its first forward and its last backward (waiting for
        activations or gradients), i.e. the bubble without the pipeline fill and drain at its ends."""
        return max(0.0, self.last_backward_end_s - self.first_forward_start_s - self.busy_s)

    @property
    def memory_headroom_bytes(self) -> float:
        return self.capacity_bytes - self.peak_memory_bytes

    @property
    def fits(self) -> bool:
        return self.peak_memory_bytes <= self.capacity_bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineResult:
    """One pipeline's replay: ``makespan_s`` ends with the last backward, ``step_time_s`` with the last tail."""

    index: int
    schedule: str
    num_micro_batches: int
    p2p_time_s: tuple[float, ...]
    makespan_s: float
    step_time_s: float
    stages: tuple[StageResult, ...]

    @property
    def critical_stage(self) -> int:
        """The stage whose tail ends last (it sets the step time)."""
        return max(range(len(self.stages)), key=lambda k: self.stages[k].end_s)


@dataclass(frozen=True, slots=True, kw_only=True)
class StageDifference:
    """Predicted (plan) vs simulated figures of one stage; relative differences are (sim - plan) / plan."""

    pipeline: int
    stage: int
    label: str
    predicted_fwd_s: float
    simulated_fwd_s: float
    predicted_bwd_s: float
    simulated_bwd_s: float
    predicted_tail_s: float
    simulated_tail_s: float
    predicted_end_s: float
    simulated_end_s: float
    predicted_stall_s: float
    simulated_stall_s: float
    predicted_memory_bytes: float
    simulated_memory_bytes: float
    capacity_bytes: float

    @property
    def rel_diffs(self) -> dict[str, float]:
        return {"fwd_time_s": _rel(self.simulated_fwd_s, self.predicted_fwd_s),
                "bwd_time_s": _rel(self.simulated_bwd_s, self.predicted_bwd_s),
                "tail_time_s": _rel(self.simulated_tail_s, self.predicted_tail_s),
                "end_s": _rel(self.simulated_end_s, self.predicted_end_s)}

    @property
    def worst(self) -> tuple[str, float]:
        """The figure that differs most, and by how much (relative)."""
        return max(self.rel_diffs.items(), key=lambda kv: abs(kv[1]))

    @property
    def fits(self) -> bool:
        return self.simulated_memory_bytes <= self.capacity_bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanComparison:
    """A plan's predictions next to the simulator's figures."""

    predicted_step_time_s: float
    simulated_step_time_s: float
    stages: tuple[StageDifference, ...]

    @property
    def step_rel_diff(self) -> float:
        return _rel(self.simulated_step_time_s, self.predicted_step_time_s)

    @property
    def worst_stage(self) -> StageDifference | None:
        """The stage with the largest relative difference in any timing figure."""
        return max(self.stages, key=lambda s: abs(s.worst[1]), default=None)

    def problems(self, rtol: float = 0.02) -> list[str]:
        """Every disagreement beyond ``rtol`` and every memory overflow, each naming its stage."""
        out: list[str] = []
        if abs(self.step_rel_diff) > rtol:
            we = max(self.stages, key=lambda s: abs(s.simulated_end_s - s.predicted_end_s))
            ws = max(self.stages, key=lambda s: abs(s.simulated_stall_s - s.predicted_stall_s))
            out.append(f"step time: simulated {_fs(self.simulated_step_time_s)} vs predicted "
                       f"{_fs(self.predicted_step_time_s)} ({100 * self.step_rel_diff:+.2f}%, tolerance "
                       f"{100 * rtol:.2f}%); largest per-stage disagreement at {_where(we)}: its tail ends at "
                       f"{_fs(we.simulated_end_s)} simulated vs {_fs(we.predicted_end_s)} predicted; "
                       f"{_where(ws)} stalls (idle between its first forward and last backward) "
                       f"{_fs(ws.simulated_stall_s)} in the replay vs {_fs(ws.predicted_stall_s)} the plan implies")
        for s in self.stages:
            for name, d in s.rel_diffs.items():
                if name != "end_s" and abs(d) > rtol:
                    sim, pred = {"fwd_time_s": (s.simulated_fwd_s, s.predicted_fwd_s),
                                 "bwd_time_s": (s.simulated_bwd_s, s.predicted_bwd_s),
                                 "tail_time_s": (s.simulated_tail_s, s.predicted_tail_s)}[name]
                    out.append(f"{_where(s)}: {name} recomputed from the specs is {_fs(sim)}, the plan says "
                               f"{_fs(pred)} ({100 * d:+.2f}%)")
            if not s.fits:
                out.append(f"{_where(s)}: simulated peak memory {u.fmt_bytes(s.simulated_memory_bytes)} per GPU "
                           f"exceeds the usable {u.fmt_bytes(s.capacity_bytes)} "
                           f"(plan says {u.fmt_bytes(s.predicted_memory_bytes)})")
        return out

    def describe(self) -> str:
        lines = [f"step time: simulated {_fs(self.simulated_step_time_s)}, predicted "
                 f"{_fs(self.predicted_step_time_s)} ({100 * self.step_rel_diff:+.3f}%)"]
        for s in self.stages:
            name, d = s.worst
            lines.append(f"  {_where(s)}: end {_fs(s.simulated_end_s)} vs {_fs(s.predicted_end_s)}; stall "
                         f"{_fs(s.simulated_stall_s)} vs {_fs(s.predicted_stall_s)}; worst {name} "
                         f"{100 * d:+.3f}%; memory {u.fmt_bytes(s.simulated_memory_bytes)} simulated, "
                         f"{u.fmt_bytes(s.predicted_memory_bytes)} planned, {u.fmt_bytes(s.capacity_bytes)} usable")
        return "\n".join(lines)


@dataclass(frozen=True, slots=True, kw_only=True)
class SimulationResult:
    """The replay of one training step of a plan.

    ``step_time_s`` = max over pipelines of their step time + ``cross_pipeline_sync_s``.
    ``events`` is the full timeline (see :class:`TraceEvent`); :meth:`to_dataframe` gives it as a
    pandas table for plotting and :meth:`memory_dataframe` the per-GPU memory step functions.
    """

    step_time_s: float
    pipelines: tuple[PipelineResult, ...]
    events: tuple[TraceEvent, ...]
    cross_pipeline_sync_s: float = 0.0
    #: several pipelines: the slowest stage's optimizer update, after the cross-pipeline sync
    post_sync_time_s: float = 0.0

    # --- per-stage views ---------------------------------------------------------------------
    @property
    def stages(self) -> tuple[StageResult, ...]:
        """Every stage of every pipeline (pipeline order, then stage order)."""
        return tuple(s for p in self.pipelines for s in p.stages)

    @property
    def busy_s(self) -> tuple[float, ...]:
        return tuple(s.busy_s for s in self.stages)

    @property
    def idle_s(self) -> tuple[float, ...]:
        return tuple(s.idle_s for s in self.stages)

    @property
    def bubble_fraction(self) -> float:
        """Idle share of the compute streams over the pipelines' makespans (1 - busy / makespan, averaged)."""
        st = self.stages
        total = sum(p.makespan_s * len(p.stages) for p in self.pipelines)
        return 0.0 if total <= 0 else sum(s.idle_s for s in st) / total

    @property
    def peak_memory_bytes(self) -> tuple[float, ...]:
        return tuple(s.peak_memory_bytes for s in self.stages)

    @property
    def capacity_bytes(self) -> tuple[float, ...]:
        return tuple(s.capacity_bytes for s in self.stages)

    @property
    def fits(self) -> bool:
        """Whether every GPU stays within its usable memory throughout the step."""
        return all(s.fits for s in self.stages)

    def gpu_peak_memory(self) -> list[dict[str, Any]]:
        """One row per GPU: pipeline, stage, rank inside the stage, peak and usable bytes."""
        return [{"pipeline": s.pipeline, "stage": s.stage, "rank": r, "label": s.label,
                 "peak_memory_bytes": s.peak_memory_bytes, "capacity_bytes": s.capacity_bytes}
                for s in self.stages for r in range(s.gpus)]

    # --- tables ------------------------------------------------------------------------------
    def to_dataframe(self) -> pd.DataFrame:
        """The event trace: one row per :class:`TraceEvent` with ``duration_s`` and ``lane`` added."""
        import pandas as pd

        cols = ["pipeline", "stage", "kind", "micro_batch", "start_s", "end_s", "duration_s", "lane"]
        return pd.DataFrame([(e.pipeline, e.stage, e.kind, e.micro_batch, e.start_s, e.end_s, e.duration_s, e.lane)
                             for e in self.events], columns=cols)

    def memory_dataframe(self) -> pd.DataFrame:
        """Per-GPU memory of every stage as a step function: from ``time_s`` on, ``bytes``."""
        import pandas as pd

        rows = [(s.pipeline, s.stage, t, b, s.capacity_bytes) for s in self.stages for t, b in s.memory_timeline]
        return pd.DataFrame(rows, columns=["pipeline", "stage", "time_s", "bytes", "capacity_bytes"])

    # --- checking a plan ---------------------------------------------------------------------
    def compare_with(self, plan: Plan) -> PlanComparison:
        """Per-stage predicted vs simulated figures.

        The plan's predicted timeline of stage k follows its own stated assumptions (docstring of
        ``tangram_opt.planner.formulations.pipeline_model``): its first forward starts at ``sum_{j<k} (F_j + c_j)``,
        its last backward ends ``sum_{j<k} (B_j + c_j)`` before the pipeline's makespan, then its tail
        runs; in between, whatever is not ``m (F_k + B_k)`` of work is a stall.
        """
        if len(plan.pipelines) != len(self.pipelines):
            raise SpecError("plan.pipelines", len(plan.pipelines),
                            f"the simulation has {len(self.pipelines)} pipeline(s)", "compare with the simulated plan")
        rows = []
        for pp, sp in zip(plan.pipelines, self.pipelines):
            if len(pp.stages) != len(sp.stages):
                raise SpecError(f"plan.pipelines[{sp.index}].stages", len(pp.stages),
                                f"the simulation has {len(sp.stages)} stage(s)", "compare with the simulated plan")
            upstream = downstream_start = 0.0
            m = pp.num_micro_batches
            for ps, ss in zip(pp.stages, sp.stages):
                last_b = pp.makespan_s - upstream
                end = last_b + ps.tail_time_s
                stall = max(0.0, last_b - downstream_start - m * ps.time_s)
                upstream += ps.bwd_time_s + ps.p2p_time_s
                downstream_start += ps.fwd_time_s + ps.p2p_time_s
                rows.append(StageDifference(
                    pipeline=ss.pipeline, stage=ss.stage, label=ss.label, predicted_fwd_s=ps.fwd_time_s,
                    simulated_fwd_s=ss.fwd_time_s, predicted_bwd_s=ps.bwd_time_s, simulated_bwd_s=ss.bwd_time_s,
                    predicted_tail_s=ps.tail_time_s, simulated_tail_s=ss.tail_time_s, predicted_end_s=end,
                    simulated_end_s=ss.end_s, predicted_stall_s=stall, simulated_stall_s=ss.stall_s,
                    predicted_memory_bytes=ps.memory_bytes,
                    simulated_memory_bytes=ss.peak_memory_bytes, capacity_bytes=ss.capacity_bytes))
        return PlanComparison(predicted_step_time_s=plan.step_time_s, simulated_step_time_s=self.step_time_s,
                              stages=tuple(rows))

    def check(self, plan: Plan, rtol: float = 0.02) -> list[str]:
        """Disagreements with ``plan`` beyond ``rtol`` and memory overflows, each naming the stage
        (empty when the plan is confirmed)."""
        return self.compare_with(plan).problems(rtol)


# --- the replay ---------------------------------------------------------------------------------
def op_order(schedule: str, stage: int, num_stages: int, num_micro_batches: int) -> list[tuple[str, int]]:
    """The order in which ``stage`` runs its forwards and backwards (``("F", j)`` / ``("B", j)``).

    1F1B (PipeDream-Flush, Narayanan et al. 2021, Fig. 4): ``min(P - k - 1, m)`` warm-up forwards,
    then one forward and one backward alternately, then the remaining backwards. GPipe: every
    forward, then every backward.
    """
    m, P, k = num_micro_batches, num_stages, stage
    if schedule == "gpipe":
        return [("F", j) for j in range(m)] + [("B", j) for j in range(m)]
    if schedule != "1f1b":
        raise SpecError("schedule", schedule, "is not a simulated schedule", f"use one of {', '.join(SCHEDULES)}")
    warm = min(P - k - 1, m)
    ops = [("F", j) for j in range(warm)]
    f, b = warm, 0  # next forward, next backward
    while f < m:
        ops.append(("F", f))
        f += 1
        ops.append(("B", b))
        b += 1
    ops += [("B", j) for j in range(b, m)]
    return ops


class _Channel:
    """One direction of one stage boundary: a FIFO link, one transfer at a time."""

    __slots__ = ("busy", "queue", "duration_s")

    def __init__(self, duration_s: float):
        self.busy = False
        self.queue: deque[int] = deque()
        self.duration_s = duration_s


_OP_END, _XFER_END = 0, 1


def replay(stages: Sequence[StageWork], *, num_micro_batches: int, schedule: str = "1f1b",
           p2p_s: Sequence[float] | None = None, pipeline: int = 0) -> tuple[PipelineResult, list[TraceEvent]]:
    """Replay one pipeline of ``stages`` (in pipeline order) for ``num_micro_batches`` micro-batches.

    ``p2p_s[k]`` is the transfer time across the boundary between stage k and k+1 (each direction).
    Returns the pipeline's result and its events in the order they ended.
    """
    P, m = len(stages), num_micro_batches
    if P < 1 or m < 1:
        raise SpecError("pipeline", (P, m), "needs at least one stage and one micro-batch",
                        "give a non-empty pipeline and num_micro_batches >= 1")
    p2p = list(p2p_s) if p2p_s is not None else [0.0] * (P - 1)
    if len(p2p) != P - 1:
        raise SpecError("p2p_s", len(p2p), f"must have one entry per stage boundary ({P - 1})",
                        "pass the transfer time of each boundary")
    orders = [op_order(schedule, k, P, m) for k in range(P)]
    nxt = [0] * P
    running = [False] * P
    # arrivals: act_in[k][j] activation of j arrived at k (k >= 1); grad_in[k][j] gradient arrived (k < P-1)
    act_in = [[k == 0] * m for k in range(P)]
    grad_in = [[k == P - 1] * m for k in range(P)]
    fwd_ch = [_Channel(c) for c in p2p]  # boundary k: k -> k+1
    bwd_ch = [_Channel(c) for c in p2p]  # boundary k: k+1 -> k
    events: list[TraceEvent] = []
    heap: list[tuple[float, int, int, tuple]] = []
    seq = 0
    # memory bookkeeping per stage
    inflight = [0] * P
    peak_inflight = [0] * P
    mem = [s.static_bytes for s in stages]
    timeline: list[list[tuple[float, float]]] = [[(0.0, s.static_bytes)] for s in stages]
    last_b_end = [0.0] * P
    first_f_start = [math.inf] * P
    busy = [0.0] * P
    op_start: list[float] = [0.0] * P

    def push(t: float, kind: int, data: tuple) -> None:
        nonlocal seq
        heapq.heappush(heap, (t, seq, kind, data))
        seq += 1

    def set_mem(k: int, t: float, delta: float) -> None:
        mem[k] += delta
        timeline[k].append((t, mem[k]))

    def try_start(k: int, now: float) -> None:
        if running[k] or nxt[k] >= len(orders[k]):
            return
        kind, j = orders[k][nxt[k]]
        ready = act_in[k][j] if kind == "F" else grad_in[k][j]
        if not ready:
            return
        s = stages[k]
        running[k] = True
        op_start[k] = now
        if kind == "F":
            first_f_start[k] = min(first_f_start[k], now)
            inflight[k] += 1
            peak_inflight[k] = max(peak_inflight[k], inflight[k])
            set_mem(k, now, s.activation_bytes + s.transient_bytes)
        else:
            set_mem(k, now, s.transient_bytes)
        push(now + (s.fwd_time_s if kind == "F" else s.bwd_time_s), _OP_END, (k, kind, j))

    def send(ch: _Channel, now: float, j: int, data: tuple) -> None:
        if ch.busy:
            ch.queue.append(j)
            return
        ch.busy = True
        push(now + ch.duration_s, _XFER_END, data + (j, now))

    for k in range(P):
        try_start(k, 0.0)
    done_ops = 0
    total_ops = 2 * m * P
    while heap:
        now, _, ev, data = heapq.heappop(heap)
        if ev == _OP_END:
            k, kind, j = data
            s = stages[k]
            running[k] = False
            nxt[k] += 1
            done_ops += 1
            busy[k] += now - op_start[k]
            events.append(TraceEvent(pipeline=pipeline, stage=k, kind=kind, micro_batch=j, start_s=op_start[k],
                                     end_s=now))
            if kind == "F":
                set_mem(k, now, -s.transient_bytes)
                if k < P - 1:
                    send(fwd_ch[k], now, j, ("fwd", k))
            else:
                inflight[k] -= 1
                set_mem(k, now, -(s.transient_bytes + s.activation_bytes))
                last_b_end[k] = now
                if k > 0:
                    send(bwd_ch[k - 1], now, j, ("bwd", k - 1))
            try_start(k, now)
        else:
            direction, boundary, j, start = data
            ch = fwd_ch[boundary] if direction == "fwd" else bwd_ch[boundary]
            if direction == "fwd":
                dst = boundary + 1
                act_in[dst][j] = True
                events.append(TraceEvent(pipeline=pipeline, stage=boundary, kind="send_fwd", micro_batch=j,
                                         start_s=start, end_s=now))
            else:
                dst = boundary
                grad_in[dst][j] = True
                events.append(TraceEvent(pipeline=pipeline, stage=boundary + 1, kind="send_bwd", micro_batch=j,
                                         start_s=start, end_s=now))
            ch.busy = False
            if ch.queue:
                send(ch, now, ch.queue.popleft(), (direction, boundary))
            try_start(dst, now)
    # a correct schedule never deadlocks: every op must have run
    assert done_ops == total_ops, f"replay deadlocked after {done_ops} of {total_ops} ops ({schedule}, P={P}, m={m})"

    makespan = max(last_b_end)
    results = []
    for k, s in enumerate(stages):
        end = last_b_end[k] + s.tail_time_s
        if s.tail_time_s > 0:
            events.append(TraceEvent(pipeline=pipeline, stage=k, kind="tail", micro_batch=NO_MICRO_BATCH,
                                     start_s=last_b_end[k], end_s=end))
        idle = max(0.0, makespan - busy[k])
        results.append(StageResult(
            pipeline=pipeline, stage=k, label=s.label, gpus=s.gpus, fwd_time_s=s.fwd_time_s, bwd_time_s=s.bwd_time_s,
            tail_time_s=s.tail_time_s, busy_s=busy[k], idle_s=idle,
            bubble_fraction=idle / makespan if makespan > 0 else 0.0, first_forward_start_s=first_f_start[k],
            last_backward_end_s=last_b_end[k], end_s=end,
            peak_memory_bytes=max(b for _, b in timeline[k]), capacity_bytes=s.capacity_bytes,
            peak_inflight=peak_inflight[k], memory_timeline=tuple(timeline[k])))
    step = max(r.end_s for r in results)
    return (PipelineResult(index=pipeline, schedule=schedule, num_micro_batches=m, p2p_time_s=tuple(p2p),
                           makespan_s=makespan, step_time_s=step, stages=tuple(results)), events)


# --- the public entry point ---------------------------------------------------------------------
#: ``cross_pipeline_sync(plan, pipeline_results) -> seconds`` added to the step after the slowest
#: pipeline: the gradient all-reduce between data-parallel pipeline replicas.
CrossPipelineSync = Callable[[Plan, Sequence[PipelineResult]], float]


def no_cross_pipeline_sync(plan: Plan, pipelines: Sequence[PipelineResult]) -> float:
    """A hook that prices the cross-pipeline all-reduce at 0 s (for what-if studies)."""
    return 0.0


def simulate(plan: Plan, cluster: Cluster | str | Path | Mapping[str, Any],
             model: ModelSpec | str | Path | Mapping[str, Any],
             training: TrainingSpec | str | Path | Mapping[str, Any] | None = None, *, cost: CostModel | None = None,
             calibration: Calibration | None = None, moe_load_imbalance: float = 1.0, profiles: Any = None,
             schedule: str | None = None,
             cross_pipeline_sync: CrossPipelineSync | None = None) -> SimulationResult:
    """Replay one training step of ``plan`` on ``cluster`` (see the module docstring).

    ``cluster``, ``model`` and ``training`` take the forms ``solve`` takes (a spec, a built-in name, a
    file or a dict); ``training=None`` is the plan's own run (its global batch, sequence length and
    precision). A plan made for other specs (another model, its layers, batch, sequence length or
    precision, islands the cluster lacks or holds other GPUs on) is refused with a :class:`SpecError`
    naming every difference (:meth:`Plan.spec_mismatches`).

    Stage costs come from ``cost`` (default: ``CostModel(model, training, calibration=...,
    moe_load_imbalance=..., profiles=...)``, what ``solve`` uses with the same options); pass the
    same options the plan was made with. ``schedule`` overrides each pipeline's schedule (e.g. replay a 1F1B plan
    under GPipe). The plan should pass :func:`tangram_opt.sim.validate.validate` first; a plan
    naming an unknown island or an invalid configuration raises :class:`SpecError`.

    With several pipelines, each stage's tail is its exposed gradient sync only; the step adds
    ``cross_pipeline_sync(plan, pipeline_results)`` (default: the all-reduce priced by
    :mod:`tangram_opt.sim.cross_sync`) and then the slowest stage's optimizer update.
    """
    cluster, model, training = _replay_inputs(plan, cluster, model, training)
    cost = cost or CostModel(model, training, calibration=calibration, moe_load_imbalance=moe_load_imbalance,
                             profiles=profiles)
    islands = island_by_name(cluster)
    results: list[PipelineResult] = []
    events: list[TraceEvent] = []
    several = len(plan.pipelines) > 1
    post_sync = 0.0
    for pi, pipe in enumerate(plan.pipelines):
        works = []
        for k, st in enumerate(pipe.stages):
            if st.island not in islands:
                raise SpecError(f"pipelines[{pi}].stages[{k}].island", st.island, "is not an island of the cluster",
                                f"use one of {', '.join(islands)}")
            work = stage_work(cost, islands[st.island], st)
            if several:  # the optimizer waits for the all-reduce across pipelines
                grad_sync_s, optimizer_s = stage_tail_parts(cost, islands[st.island], st)
                work = replace(work, tail_time_s=grad_sync_s)
                post_sync = max(post_sync, optimizer_s)
            works.append(work)
        sched = schedule or pipe.schedule
        res, evs = replay(works, num_micro_batches=pipe.num_micro_batches, schedule=sched,
                          p2p_s=p2p_times(cost, cluster, islands, pipe), pipeline=pi)
        results.append(res)
        events.extend(evs)
    hook = cross_pipeline_sync or allreduce_hook(cluster, cost)
    sync = hook(plan, results) if several or cross_pipeline_sync is not None else 0.0
    step = max(r.step_time_s for r in results) + sync + post_sync
    events.sort(key=lambda e: (e.start_s, e.pipeline, e.stage, EVENT_KINDS.index(e.kind), e.micro_batch))
    return SimulationResult(step_time_s=step, pipelines=tuple(results), events=tuple(events),
                            cross_pipeline_sync_s=sync, post_sync_time_s=post_sync)


def _replay_inputs(plan: Any, cluster: Any, model: Any, training: Any) -> tuple[Cluster, ModelSpec, TrainingSpec]:
    """``simulate``'s specs, loaded by the loaders ``solve`` uses (this layer does not import the search, so
    not through its ``planning_inputs``), and checked to be the ones ``plan`` was made for."""
    if not isinstance(plan, Plan):
        raise SpecError("plan", type(plan).__name__, "is not a Plan",
                        "pass a plan from solve(...) or tangram_opt.Plan.load(path)")
    if not plan.pipelines or not all(p.stages for p in plan.pipelines):
        raise SpecError("plan.pipelines", len(plan.pipelines), "the plan has a pipeline without a stage, or none",
                        "pass a plan from solve(...) or tangram_opt.Plan.load(path)")
    cluster, model = load_cluster(cluster), load_model(model)
    training = (TrainingSpec(global_batch_size=plan.global_batch_size, seq_len=plan.seq_len, precision=plan.precision)
                if training is None else load_training(training))
    diffs = plan.spec_mismatches(cluster=cluster, model=model, training=training)
    if diffs:
        raise SpecError("plan", f"{plan.model} on {plan.cluster}", "was made for other specs than it is replayed "
                        "against:\n" + "\n".join(f"  - {d}" for d in diffs),
                        "replay it against the cluster, model and training run it was planned for (a plan file "
                        "holds them: tangram_opt.export.read_plan_file), or re-plan with solve(...)")
    return cluster, model, training


def _rel(sim: float, pred: float) -> float:
    if pred == 0:
        return 0.0 if sim == 0 else math.copysign(math.inf, sim)
    return (sim - pred) / pred


def _fs(t: float) -> str:
    return u.fmt_seconds(t)


def _where(s: StageDifference) -> str:
    return f"pipeline {s.pipeline} stage {s.stage} ({s.label})"


__all__ = ["EVENT_KINDS", "NO_MICRO_BATCH", "TraceEvent", "StageResult", "PipelineResult", "StageDifference",
           "PlanComparison", "SimulationResult", "op_order", "replay", "simulate", "CrossPipelineSync",
           "no_cross_pipeline_sync"]
