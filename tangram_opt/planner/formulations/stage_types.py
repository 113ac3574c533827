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
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np

from tangram_opt.planner.candidates.table import Candidate
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


_END_FIELDS = ("static_bytes", "activation_bytes", "transient_bytes", "fwd_time_s", "bwd_time_s", "step_tail_time_s")
_LAYER_FIELDS = ("static_bytes", "activation_bytes", "fwd_time_s", "bwd_time_s", "step_tail_time_s")


class _Columns:
    """The candidates' numbers :func:`enumerate_types` reads, one array per field (candidate order)."""

    def __init__(self, cands: Sequence[Candidate], kinds: tuple[str, ...]):
        def row(c: Candidate) -> tuple[float, ...]:
            out = [c.capacity_bytes, c.layer_transient_bytes, c.island, c.gpus, c.p2p_nic_s, c.p2p_scale_up_s]
            for lc in (c.embedding, c.head):
                out += [lc.static_bytes, lc.activation_bytes, lc.transient_bytes, lc.fwd_time_s, lc.bwd_time_s,
                        lc.step_tail_time_s]
            for k in kinds:
                lc = c.layer[k]
                out += [lc.static_bytes, lc.activation_bytes, lc.fwd_time_s, lc.bwd_time_s, lc.step_tail_time_s]
            return tuple(out)

        width = 6 + 2 * len(_END_FIELDS) + len(kinds) * len(_LAYER_FIELDS)
        table = np.array([row(c) for c in cands], dtype=np.float64).reshape(len(cands), width)
        columns = iter(table.T.copy())
        self.capacity, self.transient = next(columns), next(columns)
        self.island, self.gpus = next(columns).astype(np.int64), next(columns).astype(np.int64)
        self.nic, self.scale_up = next(columns), next(columns)
        self.ends = {end: {name: next(columns) for name in _END_FIELDS} for end in ("embedding", "head")}
        self.layer = {k: {name: next(columns) for name in _LAYER_FIELDS} for k in kinds}


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

    The types are the ones :func:`stage_type` gives one at a time, to the last bit: the candidates
    are priced together, one layer count after another (numpy, the same floating-point operations
    in the same order as :meth:`Candidate.memory_bytes` and :func:`_type_of`), which on tables of
    thousands of candidates is what made every root of the search slow.
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
    cands = problem.candidates
    cols = _Columns(cands, kinds)
    main = kinds[-1]  # MoE layers on two-kind models, the only kind otherwise
    found: dict[str, list[tuple[int, int, list[StageType]]]] = {r: [] for r in ROLES}
    for role in ROLES:
        first, last = role == "first", role == "last"
        q = inflight_from_end(0, m, problem.schedule) if last else q_mid
        fixed = {kinds[0]: problem.layers[kinds[0]]} if (two_kinds and first) else {}
        ends = [cols.ends[e] for e, use in (("embedding", first), ("head", last)) if use]
        scratch = cols.transient
        for e in ends:
            scratch = np.maximum(scratch, e["transient_bytes"])
        alive = np.arange(len(cands))
        for n in range(0 if fixed else 1, problem.layers[main] + 1):
            if not len(alive):
                break
            layers = dict(fixed)
            layers[main] = layers.get(main, 0) + n
            if sum(layers.values()) < 1:
                continue
            counts = [(cols.layer[k], c) for k, c in layers.items() if c]
            tol = _tolerances(partial(_memory, ends, scratch, counts), cols.capacity, alive, q, m)
            keep = tol >= q  # the others break: more layers only need more memory
            alive, tol = alive[keep], tol[keep]
            fwd, bwd, tail = (_summed(cols, counts, ends, name, alive)
                              for name in ("fwd_time_s", "bwd_time_s", "step_tail_time_s"))
            time_s = fwd + bwd
            bottleneck = np.maximum(fwd, bwd) if gpipe else time_s
            keep = ~(bottleneck > tmax_cap * (2 if gpipe else 1))  # slower ones break too
            alive, tol, fwd, bwd, tail, time_s = (a[keep] for a in (alive, tol, fwd, bwd, tail, time_s))
            use = ~(time_s * m + tail > cutoff)  # its own tail, exposed or covered by its own step, reaches the cutoff
            if gpipe:
                use &= tol >= m
            sel = alive[use]
            if not len(sel):
                continue
            key = tuple(sorted(layers.items()))
            chosen = [a[use] for a in (time_s, fwd, bwd, tail, tol)]
            island = cols.island[sel]
            for isl in np.unique(island).tolist():
                part = np.flatnonzero(island == isl)
                ci = sel[part]
                t_, f_, b_, tl, tol_ = (a[part] for a in chosen)
                # the order of a stable sort on (time, GPUs, forward, tail, -tolerance), candidates in table order
                order = np.lexsort((-tol_, tl, f_, cols.gpus[ci], t_))
                ci, t_, f_, b_, tl, tol_ = (x[order] for x in (ci, t_, f_, b_, tl, tol_))
                crit = [t_, f_, tl, -tol_, cols.gpus[ci], cols.nic[ci], cols.scale_up[ci]] + ([b_] if gpipe else [])
                kept = ~_dominated(np.stack(crit, axis=1).astype(np.float64))
                group = [StageType(role=role, candidate=c, layers=key, time_s=x, fwd_s=f, bwd_s=bw, tail_s=tt,
                                   tolerance=q_)
                         for c, x, f, bw, tt, q_ in zip(ci[kept].tolist(), t_[kept].tolist(), f_[kept].tolist(),
                                                        b_[kept].tolist(), tl[kept].tolist(), tol_[kept].tolist())]
                found[role].append((int(ci.min()), n, group))
    # groups of (island, layers) in the order a loop over candidates, then layer counts, meets them
    return {role: [t for _, _, group in sorted(found[role], key=lambda x: (x[0], x[1])) for t in group]
            for role in ROLES}


def _dominated(cols: np.ndarray) -> np.ndarray:
    """Which rows of ``cols`` (one type per row, in the sort order of :func:`enumerate_types`) some
    earlier row dominates: at most as large in every column (time, forward, tail, -tolerance, GPUs,
    both send sides, GPipe: backward; :func:`sends_no_slower`). Dominance is transitive, so this is
    what keeping each type unless a type kept before it dominates it leaves."""
    n = len(cols)
    dominated = np.zeros(n, dtype=bool)
    for lo in range(0, n, _FRONT_BLOCK):  # blocks of later types: the comparison table stays small
        hi = min(n, lo + _FRONT_BLOCK)
        earlier = np.arange(hi)[:, None] < np.arange(lo, hi)[None, :]
        for k in range(cols.shape[1]):
            earlier &= cols[:hi, k, None] <= cols[None, lo:hi, k]
        dominated[lo:hi] = earlier.any(axis=0)
    return dominated


#: later types compared at once in :func:`_dominated`
_FRONT_BLOCK = 512


def _memory(ends: list, scratch: np.ndarray, counts: list, inflight: np.ndarray | int, idx: np.ndarray
            ) -> np.ndarray:
    """:meth:`Candidate.memory_bytes` of candidates ``idx``, operation for operation (``fixed_bytes``,
    then each kind of layer)."""
    b: np.ndarray | float = 0.0
    for e in ends:
        b = b + (e["static_bytes"][idx] + e["activation_bytes"][idx] * inflight)
    total = b + scratch[idx]
    for lc, c in counts:
        total = total + c * (lc["static_bytes"][idx] + lc["activation_bytes"][idx] * inflight)
    return total


def _summed(cols: _Columns, counts: list, ends: list, name: str, idx: np.ndarray) -> np.ndarray:
    """:func:`_type_of`'s sum of one time over the layers (never none), then the embedding's and the head's."""
    total: np.ndarray | int = 0
    for lc, c in counts:
        total = total + c * lc[name][idx]
    for e in ends:
        total = total + e[name][idx]
    assert isinstance(total, np.ndarray)
    return total


def _tolerances(memory, capacity: np.ndarray, idx: np.ndarray, q_min: int, m: int) -> np.ndarray:  # type: ignore[no-untyped-def]
    """:func:`_tolerance` of every candidate ``idx`` at once: the largest in-flight count in
    ``[q_min, m]`` that fits (``q_min - 1`` if none). Memory never falls as the count grows, so
    stepping from any start to the edge of the same predicate gives :func:`_tolerance`'s answer."""
    cap = capacity[idx]
    out = np.full(len(idx), q_min - 1, dtype=np.int64)
    fits_min = memory(q_min, idx) <= cap
    if not fits_min.any():
        return out
    idx, cap, pos = idx[fits_min], cap[fits_min], np.flatnonzero(fits_min)
    base = memory(0, idx)
    per_q = memory(1, idx) - base
    with np.errstate(divide="ignore", invalid="ignore"):
        guess = np.floor_divide(cap - base, per_q)
    guess = np.where(per_q <= 0, m, np.clip(np.nan_to_num(guess, nan=q_min, posinf=m, neginf=q_min), q_min, m))
    q = guess.astype(np.int64)
    while True:
        down = (q > q_min) & ~(memory(q, idx) <= cap)
        if not down.any():
            break
        q[down] -= 1
    while True:
        up = q < m
        up[up] = memory(q[up] + 1, idx[up]) <= cap[up]
        if not up.any():
            break
        q[up] += 1
    out[pos] = q
    return out


__all__ = ["ROLES", "StageType", "enumerate_types", "stage_type"]
