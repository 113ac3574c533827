"""The closed-form step time of one pipeline: the quantity the MIP minimizes, in exact arithmetic.

Stages are listed in pipeline order (first stage holds the embedding, last the head); ``T_k`` is
stage k's forward+backward time per micro-batch and ``c_k`` the p2p time from stage k to k+1
(activations forward, gradients backward; each direction of a link is its own channel). With ``m``
micro-batches the 1F1B schedule (Narayanan et al., SC'21, Sec. 2.2) runs at a steady period

    lambda = max( max_k c_k,  max_{k <= l, l-k+1 < m} (sum_{i=k..l} T_i + 2 sum_{i=k..l-1} c_i) / (l - k + 1) )

The block term (which includes every single stage, l = k) is the in-flight limit of 1F1B: a
micro-batch leaving stage k returns after crossing stages k..l and their links twice, while the
schedule lets only l - k + 1 micro-batches circulate through that block (stage k keeps P - k in
flight, stage l P - l). Slow links make blocks, not single stages, the bottleneck. Then

    makespan = (m - 1) * lambda + sum_k T_k + 2 * sum_k c_k.

GPipe runs all forwards, then all backwards: ``lambda = max(F_max, c_max) + max(B_max, c_max)``.
The step ends when every stage has finished its non-overlapped gradient sync and optimizer update
(``tail_k``); stage k's last backward ends ``sum_{j<k} (B_j + c_j)`` before stage 0's, so

    step = makespan + max(0, max_k [tail_k - sum_{j<k} (B_j + c_j)]).

This closed form is the planner's *model*: the MIP minimizes it and the certificate's bound and
gap refer to it. It is an upper bound of the exact schedule (measured: never below an event replay
on 4,000 random pipelines; tight when stages are balanced), so a certified plan is never slower
than the model says. :func:`schedule_makespan` computes the exact schedule (longest path of the
1F1B / GPipe event graph, with FIFO link channels) and is what plans report as their predicted
step time; the independent simulator (tangram_opt/sim) re-derives it from the specs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tangram_opt.planner.candidates.table import Candidate
from tangram_opt.planner.formulations.inflight import inflight_micro_batches


@dataclass(frozen=True, slots=True, kw_only=True)
class StageTiming:
    fwd_s: float
    bwd_s: float
    tail_s: float
    p2p_s: float  # to the next stage (0 for the last)
    memory_bytes: float
    capacity_bytes: float
    inflight: int

    @property
    def time_s(self) -> float:
        return self.fwd_s + self.bwd_s


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineTiming:
    stages: tuple[StageTiming, ...]
    makespan_s: float
    tail_excess_s: float
    step_time_s: float
    bottleneck_s: float


def stage_timing(cand: Candidate, layers: dict[str, int], *, first: bool, last: bool, inflight: int,
                 p2p_s: float) -> StageTiming:
    fwd = bwd = tail = 0.0
    for kind, n in layers.items():
        if n:
            c = cand.layer[kind]
            fwd += n * c.fwd_time_s
            bwd += n * c.bwd_time_s
            tail += n * c.step_tail_time_s
    for use, c in ((first, cand.embedding), (last, cand.head)):
        if use:
            fwd += c.fwd_time_s
            bwd += c.bwd_time_s
            tail += c.step_tail_time_s
    return StageTiming(fwd_s=fwd, bwd_s=bwd, tail_s=tail, p2p_s=p2p_s,
                       memory_bytes=cand.memory_bytes(layers, inflight, first=first, last=last),
                       capacity_bytes=cand.capacity_bytes, inflight=inflight)


def pipeline_timing(stages: Sequence[tuple[Candidate, dict[str, int]]], p2p_s: Sequence[float], m: int,
                    schedule: str = "1f1b") -> PipelineTiming:
    """Evaluate the closed form for ``stages`` (candidate, layers by kind) in pipeline order.

    ``p2p_s[k]`` is the transfer time from stage k to k+1 (length ``len(stages) - 1``).
    """
    n = len(stages)
    assert len(p2p_s) == max(0, n - 1)
    timings = tuple(
        stage_timing(c, layers, first=k == 0, last=k == n - 1,
                     inflight=inflight_micro_batches(k, n, m, schedule), p2p_s=p2p_s[k] if k < n - 1 else 0.0)
        for k, (c, layers) in enumerate(stages))
    comm_max = max(p2p_s, default=0.0)
    if schedule == "gpipe":
        bottleneck = max(max(t.fwd_s for t in timings), comm_max) + max(max(t.bwd_s for t in timings), comm_max)
    else:
        bottleneck = max(max(t.time_s for t in timings), comm_max)
        for k in range(n):  # blocks k..l: round trips through them, l - k + 1 micro-batches at a time
            block = 0.0
            for l in range(k, n):
                block += timings[l].time_s + (2 * p2p_s[l - 1] if l > k else 0.0)
                if l - k + 1 < m:
                    bottleneck = max(bottleneck, block / (l - k + 1))
    makespan = (m - 1) * bottleneck + sum(t.time_s for t in timings) + 2 * sum(p2p_s)
    excess, upstream = 0.0, 0.0
    for k, t in enumerate(timings):
        excess = max(excess, t.tail_s - upstream)
        upstream += t.bwd_s + t.p2p_s
    return PipelineTiming(stages=timings, makespan_s=makespan, tail_excess_s=excess, step_time_s=makespan + excess,
                          bottleneck_s=bottleneck)


def op_order(schedule: str, stage: int, num_stages: int, m: int) -> list[tuple[str, int]]:
    """The operations of ``stage`` in execution order: ("F" | "B", micro-batch)."""
    if schedule == "gpipe":
        return [("F", j) for j in range(m)] + [("B", j) for j in range(m)]
    warm = min(num_stages - stage - 1, m)
    ops = [("F", j) for j in range(warm)]
    f, b = warm, 0
    while b < m:
        if f < m:
            ops.append(("F", f))
            f += 1
        ops.append(("B", b))
        b += 1
    return ops


def schedule_makespan(fwd_s: Sequence[float], bwd_s: Sequence[float], p2p_s: Sequence[float], m: int,
                      schedule: str = "1f1b") -> list[float]:
    """Exact end time of each stage's last backward for one step of the schedule.

    Each stage runs its operations in :func:`op_order`; a forward waits for its activation, a
    backward for its gradient (the last stage's backward for its own forward); every send goes
    through the FIFO channel of its link and direction, taking ``p2p_s[k]``, without blocking the
    sender. This is the longest path of the schedule's event graph, computed stage by stage.
    """
    P = len(fwd_s)
    orders = [op_order(schedule, k, P, m) for k in range(P)]
    pos = [0] * P
    clock = [0.0] * P
    act_arrival: list[dict[int, float]] = [dict() for _ in range(P)]  # activation j reached stage k
    grad_arrival: list[dict[int, float]] = [dict() for _ in range(P)]  # gradient j reached stage k
    fwd_done: list[dict[int, float]] = [dict() for _ in range(P)]
    chan_fwd = [0.0] * max(0, P - 1)  # link k -> k+1 free from
    chan_bwd = [0.0] * max(0, P - 1)  # link k+1 -> k free from
    last_b = [0.0] * P
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for k in range(P):
            while pos[k] < len(orders[k]):
                kind, j = orders[k][pos[k]]
                if kind == "F":
                    ready = 0.0 if k == 0 else act_arrival[k].get(j)
                else:
                    ready = fwd_done[k].get(j) if k == P - 1 else grad_arrival[k].get(j)
                if ready is None:
                    break
                start = max(clock[k], ready)
                end = start + (fwd_s[k] if kind == "F" else bwd_s[k])
                clock[k] = end
                if kind == "F":
                    fwd_done[k][j] = end
                    if k < P - 1:
                        send = max(end, chan_fwd[k])
                        chan_fwd[k] = send + p2p_s[k]
                        act_arrival[k + 1][j] = chan_fwd[k]
                else:
                    last_b[k] = end
                    if k > 0:
                        send = max(end, chan_bwd[k - 1])
                        chan_bwd[k - 1] = send + p2p_s[k - 1]
                        grad_arrival[k - 1][j] = chan_bwd[k - 1]
                pos[k] += 1
                remaining -= 1
                progressed = True
        assert progressed, "the schedule's dependencies form a cycle"
    return last_b


def exact_step_time(timing: PipelineTiming, m: int, schedule: str = "1f1b") -> float:
    """Step time of the exact schedule: every stage's last backward plus its tail, the latest one."""
    ends = schedule_makespan([t.fwd_s for t in timing.stages], [t.bwd_s for t in timing.stages],
                             [t.p2p_s for t in timing.stages[:-1]], m, schedule)
    return max(e + t.tail_s for e, t in zip(ends, timing.stages))


__all__ = ["PipelineTiming", "StageTiming", "exact_step_time", "op_order", "pipeline_timing", "schedule_makespan",
           "stage_timing"]
