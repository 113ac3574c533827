"""Stage types: a candidate holding a fixed number of layers in one role, priced exactly.

The aggregated model (aggregated.py) and the sequence model (stage_sequence.py) choose stage types
instead of (candidate, layer count) pairs, and the layer-covering knapsack (knapsack_bound.py)
packs them. A type's ``tolerance`` is the most micro-batches it can hold in flight and still fit
in memory (inflight.py gives how many a position holds), which is all its position changes.
:func:`enumerate_types` lists every type that fits in its role, Pareto-pruned exactly
(formulations/pipeline_mip.md §3).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tangram_opt.planner.candidates.table import Candidate, sends_no_slower
from tangram_opt.planner.formulations.inflight import inflight_from_end
from tangram_opt.planner.formulations.problem import PipelineProblem

ROLES = ("first", "mid", "last")


@dataclass(frozen=True, slots=True)
class StageType:
    """A candidate with a fixed layer count in one role; ``tolerance`` = most micro-batches in
    flight that still fit in memory (capped at m)."""

    role: str
    candidate: int
    layers: tuple[tuple[str, int], ...]
    time_s: float
    fwd_s: float
    bwd_s: float
    tail_s: float
    tolerance: int

    @property
    def layer_dict(self) -> dict[str, int]:
        return dict(self.layers)

    @property
    def num_layers(self) -> int:
        return sum(n for _, n in self.layers)


def _tolerance(c: Candidate, layers: dict[str, int], *, first: bool, last: bool, q_min: int, m: int) -> int:
    """Largest in-flight count q in [q_min, m] at which the stage fits (q_min - 1 if none)."""
    def fits(q: int) -> bool:
        return c.memory_bytes(layers, q, first=first, last=last) <= c.capacity_bytes

    if not fits(q_min):
        return q_min - 1
    # memory is affine and non-decreasing in q: start from the closed form, then step to the
    # exact boundary of the same predicate (floating-point rounding may put it one off)
    base = c.memory_bytes(layers, 0, first=first, last=last)
    per_q = c.memory_bytes(layers, 1, first=first, last=last) - base
    q = m if per_q <= 0 else max(q_min, min(m, int((c.capacity_bytes - base) // per_q)))
    while q > q_min and not fits(q):
        q -= 1
    while q < m and fits(q + 1):
        q += 1
    return q


def stage_type(problem: PipelineProblem, ci: int, role: str, layers: dict[str, int]) -> StageType | None:
    """Candidate ``ci`` holding ``layers`` in ``role``, priced as :func:`enumerate_types` does (None
    if it does not fit even with the fewest micro-batches in flight its role can have)."""
    m = problem.num_micro_batches
    # the fewest micro-batches a stage of this role holds: the last stage's, or a middle one's
    q = inflight_from_end(0 if role == "last" else 1, m, problem.schedule)
    c = problem.candidates[ci]
    tol = _tolerance(c, layers, first=role == "first", last=role == "last", q_min=q, m=m)
    return None if tol < q else _type_of(c, ci, role, layers, m, tol)


def _type_of(c: Candidate, ci: int, role: str, layers: dict[str, int], m: int, tolerance: int) -> StageType:
    first, last = role == "first", role == "last"
    fwd = sum(n * c.layer[k].fwd_time_s for k, n in layers.items() if n)
    bwd = sum(n * c.layer[k].bwd_time_s for k, n in layers.items() if n)
    tail = sum(n * c.layer[k].step_tail_time_s for k, n in layers.items() if n)
    for use, lc in ((first, c.embedding), (last, c.head)):
        if use:
            fwd += lc.fwd_time_s
            bwd += lc.bwd_time_s
            tail += lc.step_tail_time_s
    return StageType(role=role, candidate=ci, layers=tuple(sorted(layers.items())), time_s=fwd + bwd, fwd_s=fwd,
                     bwd_s=bwd, tail_s=tail, tolerance=tolerance)


def enumerate_types(problem: PipelineProblem, cutoff_s: float | None = None) -> dict[str, list[StageType]]:
    """Every (candidate, layer count) that fits in its role, Pareto-pruned per (island, layers).

    Pruning is exact: a type is dropped only if another type of the same island and layers uses no
    more GPUs, is no slower (forward and forward+backward; GPipe: forward and backward), no worse
    in tail, no slower on either side of a stage boundary, and tolerates at least as many
    micro-batches in flight. Swapping it in keeps a plan feasible and never lengthens its
    closed-form step: the sum of stage times (and twice that of the links) drops by at least as
    much as a smaller backward (or link) can expose of downstream tails
    (formulations/pipeline_mip.md §3). With ``cutoff_s``, types that no plan of a smaller step can
    use are left out: a stage slower than ``cutoff_s / m``, or with ``m T_s + tail_s`` above it.
    """
    m = problem.num_micro_batches
    gpipe = problem.schedule == "gpipe"
    q_mid = inflight_from_end(1, m, problem.schedule)  # the fewest a middle or first stage holds
    kinds = problem.kinds
    two_kinds = len(kinds) == 2
    # a plan of step below the cutoff has every stage at most cutoff / m (the period is at least
    # the slowest stage), and m T_s + tail_s at most the cutoff (step >= makespan + the stage's tail
    # less its upstream backward and links, which the makespan holds: formulations/pipeline_mip.md §3)
    cutoff = cutoff_s if cutoff_s else math.inf
    tmax_cap = cutoff / m
    out: dict[str, list[StageType]] = {r: [] for r in ROLES}
    for ci, c in enumerate(problem.candidates):
        for role in ROLES:
            first, last = role == "first", role == "last"
            q = inflight_from_end(0, m, problem.schedule) if last else q_mid
            main = kinds[-1]  # MoE layers on two-kind models, the only kind otherwise
            fixed = {kinds[0]: problem.layers[kinds[0]]} if (two_kinds and first) else {}
            lo = 0 if fixed else 1
            for n in range(lo, problem.layers[main] + 1):
                layers = dict(fixed)
                layers[main] = layers.get(main, 0) + n
                if sum(layers.values()) < 1:
                    continue
                tol = _tolerance(c, layers, first=first, last=last, q_min=q, m=m)
                if tol < q:
                    break  # more layers only need more memory
                t = _type_of(c, ci, role, layers, m, tol)
                bottleneck = max(t.fwd_s, t.bwd_s) if gpipe else t.time_s
                if bottleneck > tmax_cap * (2 if gpipe else 1):
                    break
                if gpipe and tol < m:
                    continue
                if t.time_s * m + t.tail_s > cutoff:
                    continue  # its own tail, exposed or covered by its own step, reaches the cutoff
                out[role].append(t)
    cands = problem.candidates
    for role in ROLES:
        groups: dict[tuple, list[StageType]] = {}
        for t in out[role]:
            c = cands[t.candidate]
            groups.setdefault((c.island, t.layers), []).append(t)
        kept = []
        for group in groups.values():
            group.sort(key=lambda t: (t.time_s, cands[t.candidate].gpus, t.fwd_s, t.tail_s, -t.tolerance))
            front: list[StageType] = []
            for t in group:
                g = cands[t.candidate].gpus
                if not any(f.time_s <= t.time_s and f.fwd_s <= t.fwd_s and f.tail_s <= t.tail_s
                           and f.tolerance >= t.tolerance and cands[f.candidate].gpus <= g
                           and (not gpipe or f.bwd_s <= t.bwd_s)
                           and sends_no_slower(cands[f.candidate], cands[t.candidate]) for f in front):
                    front.append(t)
            kept.extend(front)
        out[role] = kept
    return out


__all__ = ["ROLES", "StageType", "enumerate_types", "stage_type"]
