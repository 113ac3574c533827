"""The solver-backend protocol: what a backend is given and what it returns.

Every backend takes a :class:`~tangram_opt.solvers.model.LinearModel` and :class:`SolveOptions` and
returns a :class:`SolveResult` with a :class:`SolveStatus`, the incumbent objective, the dual bound
and the trajectory of both over time (:class:`Trajectory`). The backends (cpsat.py,
ortools_linear.py, highs.py, pulp_cbc.py) and their registry (backends.py) build on this module.

Tolerances are set explicitly: by default a solve stops only when the incumbent is proven optimal
up to ``rel_gap`` (1e-6) — solver defaults (HiGHS stops at 1e-4, CBC's integer tolerances) would
otherwise let two backends report different "optima" for the same model.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

from tangram_opt.solvers.model import LinearModel


class SolveStatus(Enum):
    """Outcome of one solve (never ``None``)."""

    OPTIMAL = "optimal"
    """The incumbent is proven optimal (gap <= the requested tolerance)."""
    FEASIBLE = "feasible"
    """Stopped on the time limit with an incumbent; ``bound`` and ``gap`` say how good it is."""
    INFEASIBLE = "infeasible"
    """Proven that no solution exists."""
    NO_SOLUTION = "no_solution"
    """Stopped on the time limit before any solution was found (nothing proven)."""
    ERROR = "error"
    """The solver failed (numerical trouble, invalid model); ``message`` says why."""

    @property
    def has_solution(self) -> bool:
        return self in (SolveStatus.OPTIMAL, SolveStatus.FEASIBLE)




@dataclass(frozen=True, slots=True)
class ProgressPoint:
    """Incumbent and dual bound known ``elapsed_s`` seconds into a solve (either may be None)."""

    elapsed_s: float
    incumbent: float | None
    bound: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class SolveOptions:
    time_limit_s: float = 60.0
    threads: int = 1
    seed: int = 0
    rel_gap: float = 1e-6
    #: objective value at or above which no solution is of interest (the search's incumbent):
    #: a solve that finds nothing below it reports INFEASIBLE. HiGHS prunes every node whose
    #: bound reaches it (``objective_bound``); the other backends get it as a row on the objective
    cutoff: float | None = None
    use_hint: bool = True
    #: HiGHS: run its MIP presolve (the search's sequence models solve about twice as fast
    #: without it), or with ``relax=True`` its LP presolve from a cold start (``lp_relaxation_bound``
    #: asks for it only where it pays); the other backends keep their own default
    presolve: bool = True
    #: HiGHS: run its primal heuristics that solve sub-MIPs or walk the root (RENS, RINS, root
    #: reduced cost, feasibility jump). Leaves that mostly prove nothing beats the cutoff solve
    #: about three times faster without them (formulations/pipeline_mip.md §3b)
    heuristics: bool = True
    #: HiGHS: when the model declares ``choice_groups``, branch on them first, with an LP at every
    #: node, and solve a node as a MIP only once every group is chosen (solvers/group_branching.py)
    group_branching: bool = False
    log: bool = False
    on_progress: Callable[[ProgressPoint], None] | None = field(default=None, compare=False)


@dataclass(slots=True, kw_only=True)
class SolveResult:
    status: SolveStatus
    backend: str
    objective: float | None = None
    #: the solver's dual bound: no solution is below it (also when the solver calls its answer
    #: optimal, which it does within ``SolveOptions.rel_gap``)
    bound: float | None = None
    values: list[float] | None = None
    solve_time_s: float = 0.0
    trajectory: list[ProgressPoint] = field(default_factory=list)
    message: str = ""
    #: every improving solution seen (objective, values), when the backend reports them (CP-SAT);
    #: formulations that relax part of the exact objective re-evaluate them all
    pool: list[tuple[float, list[float]]] = field(default_factory=list)
    #: LP reduced costs per column (LP relaxations solved by HiGHS only)
    reduced_costs: list[float] | None = None

    @property
    def gap(self) -> float | None:
        """Relative gap ``(incumbent - bound) / |incumbent|`` (at most the solver's ``rel_gap`` when
        optimal, None without both)."""
        if self.status == SolveStatus.OPTIMAL:
            return 0.0
        if self.objective is None or self.bound is None:
            return None
        return relative_gap(self.objective, self.bound)


def relative_gap(incumbent: float, bound: float) -> float:
    if incumbent == bound:
        return 0.0
    return max(0.0, (incumbent - bound) / max(abs(incumbent), 1e-12))


class Backend:
    """Protocol of a solver backend."""

    name: str = "?"
    needs_integral_model: bool = False

    def available(self) -> bool:
        raise NotImplementedError

    def solve(self, model: LinearModel, options: SolveOptions) -> SolveResult:
        raise NotImplementedError


class Trajectory:
    """Records (time, incumbent, bound) points and forwards them to a user callback."""

    def __init__(self, options: SolveOptions):
        self.t0 = time.perf_counter()
        self.points: list[ProgressPoint] = []
        self.cb = options.on_progress
        self.best: float | None = None
        self.bound: float | None = None

    def record(self, incumbent: float | None, bound: float | None, elapsed_s: float | None = None) -> None:
        if incumbent is not None and math.isfinite(incumbent):
            self.best = incumbent if self.best is None else min(self.best, incumbent)
        if bound is not None and math.isfinite(bound):
            self.bound = bound if self.bound is None else max(self.bound, bound)
        p = ProgressPoint(time.perf_counter() - self.t0 if elapsed_s is None else elapsed_s, self.best, self.bound)
        if self.points and (self.points[-1].incumbent, self.points[-1].bound) == (p.incumbent, p.bound):
            return
        self.points.append(p)
        if self.cb is not None:
            self.cb(p)

    @property
    def elapsed_s(self) -> float:
        return time.perf_counter() - self.t0


def cutoff_limit(model: LinearModel, options: SolveOptions) -> float | None:
    """The largest value of ``sum a_i x_i`` (the objective without its constant) of a solution
    below ``options.cutoff``, for the backends that take the cutoff as a row; None without one."""
    if options.cutoff is None:
        return None
    limit = options.cutoff - model.objective.const
    if model.is_integral:  # integer objective: below the cutoff is at most ceil(cutoff) - 1
        return float(math.ceil(limit - 1e-9) - 1)
    return limit - 1e-9 * max(1.0, abs(limit))


def optimal_bound(objective: float, dual: float | None, rel_gap: float) -> float:
    """The dual bound of a MIP its solver calls optimal. Solvers stop at their relative gap
    (``SolveOptions.rel_gap``), so the objective itself is not a bound: take the solver's dual
    bound, or, when it reports none, the objective less the gap it was allowed."""
    if dual is not None and math.isfinite(dual) and dual <= objective + 1e-9 * max(1.0, abs(objective)):
        return dual
    return objective - rel_gap * max(1.0, abs(objective))


def number_or_none(s: str) -> float | None:
    try:
        v = float(s)
    except ValueError:
        return None
    return v if math.isfinite(v) and abs(v) < 1e49 else None


__all__ = ["Backend", "ProgressPoint", "SolveOptions", "SolveResult", "SolveStatus", "Trajectory", "cutoff_limit",
           "number_or_none", "optimal_bound", "relative_gap"]
