"""Solver backends behind one small protocol.

Every backend takes a :class:`~tangram_opt.solvers.model.LinearModel` and returns a
:class:`SolveResult` with a :class:`SolveStatus`, the incumbent objective, the dual bound and the
trajectory of both over time. Solver packages are imported only when a backend is used.

Tolerances are set explicitly: by default a solve stops only when the incumbent is proven optimal
up to ``rel_gap`` (1e-6) — solver defaults (HiGHS stops at 1e-4, CBC's integer tolerances) would
otherwise let two backends report different "optima" for the same model.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import re
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

from tangram_opt.errors import SolverUnavailableError, SpecError
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


#: HiGHS presolve for LP relaxations ("off": see the comment in HighsBackend.solve)
LP_PRESOLVE = "off"


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
    #: without it); the other backends keep their own default
    presolve: bool = True
    #: HiGHS: run its primal heuristics that solve sub-MIPs or walk the root (RENS, RINS, root
    #: reduced cost, feasibility jump). Leaves that mostly prove nothing beats the cutoff solve
    #: about three times faster without them (formulations/pipeline_mip.md §3b)
    heuristics: bool = True
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


class _Trajectory:
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


# --- CP-SAT --------------------------------------------------------------------------------
class CpSatBackend(Backend):
    """OR-Tools CP-SAT on an all-integer model (integer variables and coefficients).

    CP-SAT is exact only on integer data; a model with continuous variables or fractional
    coefficients is rejected rather than silently rounded.
    """

    name = "cp-sat"
    needs_integral_model = True

    def available(self) -> bool:
        try:
            from ortools.sat.python import cp_model  # noqa: F401
        except ImportError:
            return False
        return True

    def solve(self, model: LinearModel, options: SolveOptions) -> SolveResult:
        from ortools.sat.python import cp_model

        if not model.is_integral:
            raise SpecError("backend", self.name, "needs an all-integer model (integer variables and coefficients)",
                            "use scip, highs, cbc or pulp-cbc for models with continuous variables")
        cp = cp_model.CpModel()
        big = 2**52
        xs = []
        for v in model.vars:
            lb = -big if math.isinf(v.lb) else int(v.lb)
            ub = big if math.isinf(v.ub) else int(v.ub)
            xs.append(cp.new_int_var(lb, ub, v.name))
        for c in model.constraints:
            expr = sum(int(a) * xs[i] for i, a in c.coefs.items())
            lb = cp_model.INT_MIN if math.isinf(c.lb) else int(c.lb)
            ub = cp_model.INT_MAX if math.isinf(c.ub) else int(c.ub)
            cp.add_linear_constraint(expr, lb, ub)
        objective = sum(int(a) * xs[i] for i, a in model.objective.coefs.items()) + int(model.objective.const)
        cp.minimize(objective)
        # A complete, exactly feasible hint is an incumbent. CP-SAT's presolve often discards hints
        # (measured: a feasible hint on a 3,000-column planner model still gave "unknown" after
        # 5 s), so the incumbent is enforced instead: search only for strictly better solutions;
        # "infeasible" then proves the hint optimal, and "unknown" returns the hint with the bound.
        incumbent: tuple[float, list[float]] | None = None
        if options.use_hint and model.hint:
            for i, val in model.hint.items():
                cp.add_hint(xs[i], int(round(val)))
            if len(model.hint) == len(model.vars):
                hint = [float(round(model.hint[i])) for i in range(len(model.vars))]
                value = model.objective.value(hint)
                if not model.check(hint, tol=0.0) and (options.cutoff is None or value < options.cutoff):
                    incumbent = (value, hint)
                    cp.add(objective <= int(round(incumbent[0])) - 1)
        limit = _cutoff_limit(model, options)
        if incumbent is None and limit is not None:  # only solutions below the cutoff
            cp.add(objective <= int(limit) + int(model.objective.const))
        solver = cp_model.CpSolver()
        p = solver.parameters
        p.max_time_in_seconds = float(options.time_limit_s)
        p.num_workers = max(1, int(options.threads))
        p.random_seed = int(options.seed)
        p.relative_gap_limit = float(options.rel_gap)
        p.absolute_gap_limit = 0.5  # integer objective: a gap below 1 is a proof of optimality
        p.log_search_progress = bool(options.log)
        traj = _Trajectory(options)

        pool: list[tuple[float, list[float]]] = []

        class _CB(cp_model.CpSolverSolutionCallback):
            def on_solution_callback(self) -> None:  # noqa: D401 (OR-Tools name)
                traj.record(self.objective_value, self.best_objective_bound, self.wall_time)
                if len(pool) < 200:
                    pool.append((self.objective_value, [float(self.value(x)) for x in xs]))

        try:
            solver.best_bound_callback = lambda b: traj.record(None, b)
        except AttributeError:  # older OR-Tools
            pass
        if incumbent is not None:
            traj.record(incumbent[0], None, 0.0)
        status = solver.solve(cp, _CB())
        elapsed = traj.elapsed_s
        st = {cp_model.OPTIMAL: SolveStatus.OPTIMAL, cp_model.FEASIBLE: SolveStatus.FEASIBLE,
              cp_model.INFEASIBLE: SolveStatus.INFEASIBLE}.get(status)
        if st is None:
            st = SolveStatus.NO_SOLUTION if status == cp_model.UNKNOWN else SolveStatus.ERROR
        if incumbent is not None and st in (SolveStatus.INFEASIBLE, SolveStatus.NO_SOLUTION):
            obj, vals = incumbent
            if st == SolveStatus.INFEASIBLE:  # nothing strictly better: the hint is optimal
                traj.record(obj, obj, elapsed)
                return SolveResult(status=SolveStatus.OPTIMAL, backend=self.name, objective=obj, bound=obj,
                                   values=vals, solve_time_s=elapsed, trajectory=traj.points, pool=pool)
            bound = min(obj, solver.best_objective_bound)
            traj.record(obj, bound, elapsed)
            return SolveResult(status=SolveStatus.FEASIBLE, backend=self.name, objective=obj, bound=bound,
                               values=vals, solve_time_s=elapsed, trajectory=traj.points, pool=pool)
        if st.has_solution:
            obj, bound = solver.objective_value, solver.best_objective_bound
            traj.record(obj, bound, elapsed)
            vals = [float(solver.value(x)) for x in xs]
            if st == SolveStatus.OPTIMAL:
                bound = _optimal_bound(obj, bound, options.rel_gap)
            return SolveResult(status=st, backend=self.name, objective=obj, bound=bound, values=vals,
                               solve_time_s=elapsed, trajectory=traj.points, pool=pool)
        bound = solver.best_objective_bound if st == SolveStatus.NO_SOLUTION else None
        return SolveResult(status=st, backend=self.name, bound=bound, solve_time_s=elapsed, trajectory=traj.points,
                           message=solver.status_name(status))


# --- OR-Tools linear solver wrapper (SCIP, CBC, HiGHS) -------------------------------------
class LinearSolverBackend(Backend):
    """A MIP solver through OR-Tools' ``pywraplp`` (SCIP or CBC).

    HiGHS is driven through its own Python API instead (:class:`HighsBackend`): OR-Tools' wrapper
    crashes on solution hints for HiGHS and ignores HiGHS-specific parameters.
    """

    def __init__(self, name: str, solver_id: str):
        self.name = name
        self.solver_id = solver_id

    def available(self) -> bool:
        try:
            from ortools.linear_solver import pywraplp
        except ImportError:
            return False
        return pywraplp.Solver.CreateSolver(self.solver_id) is not None

    def _specific_params(self, options: SolveOptions, integral: bool) -> str:
        if self.solver_id == "SCIP":
            # an absolute gap below 1 proves optimality only when the objective is integral. On the
            # planner's integer-scaled models (coefficients ~1e8) SCIP's cutting planes ran into LP
            # numerical trouble: a window HiGHS proves infeasible in 0.07 s stayed open for 10 s;
            # without separation the same search closed in 6 s instead of timing out at 60 s
            extra = ("limits/absgap = 0.5\nseparating/maxroundsroot = 0\nseparating/maxrounds = 0\n"
                     if integral else "")
            return f"randomization/randomseedshift = {options.seed}\n{extra}"
        return ""

    def solve(self, model: LinearModel, options: SolveOptions) -> SolveResult:
        from ortools.linear_solver import pywraplp

        s = pywraplp.Solver.CreateSolver(self.solver_id)
        if s is None:
            raise SolverUnavailableError(f"OR-Tools was built without {self.solver_id}")
        inf = s.infinity()
        xs = [s.IntVar(-inf if math.isinf(v.lb) else v.lb, inf if math.isinf(v.ub) else v.ub, v.name) if v.integer
              else s.NumVar(-inf if math.isinf(v.lb) else v.lb, inf if math.isinf(v.ub) else v.ub, v.name)
              for v in model.vars]
        for c in model.constraints:
            row = s.RowConstraint(-inf if math.isinf(c.lb) else c.lb, inf if math.isinf(c.ub) else c.ub, c.name)
            for i, a in c.coefs.items():
                row.SetCoefficient(xs[i], a)
        limit = _cutoff_limit(model, options)
        if limit is not None:  # only solutions below the cutoff
            row = s.RowConstraint(-inf, limit, "cutoff")
            for i, a in model.objective.coefs.items():
                row.SetCoefficient(xs[i], a)
        obj = s.Objective()
        for i, a in model.objective.coefs.items():
            obj.SetCoefficient(xs[i], a)
        obj.SetOffset(model.objective.const)
        obj.SetMinimization()
        if options.use_hint and model.hint:
            idx = sorted(model.hint)
            s.SetHint([xs[i] for i in idx], [model.hint[i] for i in idx])
        s.SetTimeLimit(int(max(1, options.time_limit_s * 1000)))
        if options.threads > 1 and self.solver_id == "SCIP":
            s.SetNumThreads(int(options.threads))
        extra = self._specific_params(options, model.is_integral)
        if extra:
            s.SetSolverSpecificParametersAsString(extra)
        if options.log:
            s.EnableOutput()
        params = pywraplp.MPSolverParameters()
        params.SetDoubleParam(pywraplp.MPSolverParameters.RELATIVE_MIP_GAP, options.rel_gap)
        traj = _Trajectory(options)
        status = s.Solve(params)
        elapsed = traj.elapsed_s
        if status in (pywraplp.Solver.OPTIMAL, pywraplp.Solver.FEASIBLE):
            val = obj.Value()
            bound = obj.BestBound() if any(v.integer for v in model.vars) else val
            st = SolveStatus.OPTIMAL if status == pywraplp.Solver.OPTIMAL else SolveStatus.FEASIBLE
            if st == SolveStatus.OPTIMAL:
                bound = _optimal_bound(val, bound, options.rel_gap) if any(v.integer for v in model.vars) else val
            traj.record(val, bound, elapsed)
            return SolveResult(status=st, backend=self.name, objective=val, bound=bound,
                               values=[x.solution_value() for x in xs], solve_time_s=elapsed, trajectory=traj.points)
        if status == pywraplp.Solver.INFEASIBLE:
            return SolveResult(status=SolveStatus.INFEASIBLE, backend=self.name, solve_time_s=elapsed)
        if status == pywraplp.Solver.NOT_SOLVED:
            return SolveResult(status=SolveStatus.NO_SOLUTION, backend=self.name, solve_time_s=elapsed,
                               message="time limit before any solution")
        return SolveResult(status=SolveStatus.ERROR, backend=self.name, solve_time_s=elapsed,
                           message=f"pywraplp status {status}")


# --- HiGHS (highspy) ------------------------------------------------------------------------
@contextlib.contextmanager
def _quiet_stdout():
    """Silence C-level stdout (HiGHS prints a banner when constructed)."""
    try:
        fd = os.dup(1)
    except OSError:
        yield
        return
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            yield
    finally:
        os.dup2(fd, 1)
        os.close(fd)


#: thread count of HiGHS's process-wide scheduler (None before the first solve)
_HIGHS_POOL_THREADS: int | None = None


#: the HiGHS heuristics ``SolveOptions(heuristics=False)`` switches off
HIGHS_SUB_MIP_HEURISTICS = ("mip_heuristic_run_rens", "mip_heuristic_run_rins", "mip_heuristic_run_root_reduced_cost",
                            "mip_heuristic_run_feasibility_jump")


class HighsBackend(Backend):
    """HiGHS through ``highspy`` (its official Python API), with improving-solution and logging
    callbacks for the trajectory and the greedy plan passed as a starting solution."""

    name = "highs"

    def available(self) -> bool:
        try:
            import highspy  # noqa: F401
        except ImportError:
            return False
        return True

    def solve(self, model: LinearModel, options: SolveOptions, *, relax: bool = False) -> SolveResult:
        """Solve ``model`` (or, with ``relax``, its LP relaxation: integrality dropped)."""
        import highspy
        import numpy as np

        n = len(model.vars)
        with _quiet_stdout():
            h = highspy.Highs()
        threads = max(1, int(options.threads))
        global _HIGHS_POOL_THREADS
        if threads != _HIGHS_POOL_THREADS and hasattr(highspy.Highs, "resetGlobalScheduler"):
            # HiGHS sizes one thread pool per process at its first solve and fails every later solve
            # that asks for another thread count (model status "Not Set"): resize it on a change
            highspy.Highs.resetGlobalScheduler(True)
        _HIGHS_POOL_THREADS = threads
        h.setOptionValue("output_flag", bool(options.log))
        # the array form of passModel: numpy arrays go to HiGHS as buffers, where assigning them to
        # a HighsLp's fields converts element by element (14 -> 10 ms per window LP of ~30,000
        # nonzeros on the 512-GPU Mixtral-8x22B case)
        m = len(model.constraints)
        cost = np.zeros(n)
        for i, a in model.objective.coefs.items():
            cost[i] = a
        lengths = np.fromiter((len(c.coefs) for c in model.constraints), dtype=np.int32, count=m)
        start = np.zeros(m + 1, dtype=np.int32)
        np.cumsum(lengths, out=start[1:])
        nnz = int(start[-1])
        index = np.fromiter(itertools.chain.from_iterable(c.coefs.keys() for c in model.constraints),
                            dtype=np.int32, count=nnz)
        value = np.fromiter(itertools.chain.from_iterable(c.coefs.values() for c in model.constraints),
                            dtype=float, count=nnz)
        mip = not relax and any(v.integer for v in model.vars)
        integrality = np.fromiter((1 if mip and v.integer else 0 for v in model.vars), dtype=np.int32, count=n)
        passed = h.passModel(n, m, nnz, int(highspy.MatrixFormat.kRowwise), int(highspy.ObjSense.kMinimize),
                             float(model.objective.const), cost,
                             np.fromiter((v.lb for v in model.vars), dtype=float, count=n),
                             np.fromiter((v.ub for v in model.vars), dtype=float, count=n),
                             np.fromiter((c.lb for c in model.constraints), dtype=float, count=m),
                             np.fromiter((c.ub for c in model.constraints), dtype=float, count=m),
                             start[:-1], index, value, integrality)
        if passed == highspy.HighsStatus.kError:
            return SolveResult(status=SolveStatus.ERROR, backend=self.name, message="HiGHS rejected the model")
        for key, val in (("time_limit", float(options.time_limit_s)), ("mip_rel_gap", float(options.rel_gap)),
                         ("mip_abs_gap", 0.5 if not relax and model.is_integral else 1e-9), ("random_seed", int(options.seed)),
                         ("threads", threads)):
            h.setOptionValue(key, val)
        if options.cutoff is not None and not relax:
            h.setOptionValue("objective_bound", float(options.cutoff))
        if not options.presolve and not relax:
            h.setOptionValue("presolve", "off")
        if not options.heuristics and not relax:
            for name in HIGHS_SUB_MIP_HEURISTICS:
                h.setOptionValue(name, False)
        if relax:
            # the search's window relaxations are small and already tight in their bounds; HiGHS's
            # presolve cost more than it saved on them (six b = 8 windows of the 512-GPU
            # Llama-3-70B scaling case: 1.59 s -> 1.23 s, same optima)
            h.setOptionValue("presolve", LP_PRESOLVE)
        traj = _Trajectory(options)
        h.cbMipImprovingSolution.subscribe(lambda e: traj.record(
            e.data_out.objective_function_value, e.data_out.mip_dual_bound, e.data_out.running_time))
        h.cbMipLogging.subscribe(lambda e: traj.record(
            e.data_out.mip_primal_bound, e.data_out.mip_dual_bound, e.data_out.running_time))
        if options.use_hint and model.hint and len(model.hint) == n:
            sol = highspy.HighsSolution()
            sol.col_value = [model.hint[i] for i in range(n)]
            h.setSolution(sol)
        h.run()
        elapsed = traj.elapsed_s
        ms = h.getModelStatus()
        info = h.getInfo()
        has_sol = info.primal_solution_status == 2  # kSolutionStatusFeasible
        if ms == highspy.HighsModelStatus.kInfeasible:
            return SolveResult(status=SolveStatus.INFEASIBLE, backend=self.name, solve_time_s=elapsed)
        if has_sol:
            vals = list(h.getSolution().col_value)
            obj = model.objective.value(vals)
            optimal = ms == highspy.HighsModelStatus.kOptimal
            if optimal and mip and options.cutoff is not None and obj >= options.cutoff:
                # every node was pruned at the cutoff; what HiGHS kept is a solution above it
                return SolveResult(status=SolveStatus.INFEASIBLE, backend=self.name, solve_time_s=elapsed,
                                   message="no solution below the cutoff")
            dual = _num(str(info.mip_dual_bound))
            bound = obj if not mip else _optimal_bound(obj, dual, options.rel_gap) if optimal else dual
            traj.record(obj, bound, elapsed)
            rc = list(h.getSolution().col_dual) if (relax and optimal) else None
            return SolveResult(status=SolveStatus.OPTIMAL if optimal else SolveStatus.FEASIBLE, backend=self.name,
                               objective=obj, bound=bound, values=vals, solve_time_s=elapsed, trajectory=traj.points,
                               reduced_costs=rc)
        if ms in (highspy.HighsModelStatus.kTimeLimit, highspy.HighsModelStatus.kInterrupt):
            return SolveResult(status=SolveStatus.NO_SOLUTION, backend=self.name, solve_time_s=elapsed,
                               bound=_num(str(info.mip_dual_bound)), trajectory=traj.points,
                               message="time limit before any solution")
        return SolveResult(status=SolveStatus.ERROR, backend=self.name, solve_time_s=elapsed,
                           message=f"HiGHS status {h.modelStatusToString(ms)}")


# --- PuLP + CBC ----------------------------------------------------------------------------
_CBC_PROGRESS = re.compile(r"Cbc0010I After \d+ nodes, \d+ on tree, (\S+) best solution, best possible (\S+) "
                           r"\(([\d.]+) seconds\)")
_CBC_SOLUTION = re.compile(r"Cbc0012I Integer solution of (\S+) found .*\(([\d.]+) seconds\)")
_CBC_LOWER = re.compile(r"^Lower bound:\s+(\S+)", re.M)
_CBC_OBJ = re.compile(r"^Objective value:\s+(\S+)", re.M)


def _cutoff_limit(model: LinearModel, options: SolveOptions) -> float | None:
    """The largest value of ``sum a_i x_i`` (the objective without its constant) of a solution
    below ``options.cutoff``, for the backends that take the cutoff as a row; None without one."""
    if options.cutoff is None:
        return None
    limit = options.cutoff - model.objective.const
    if model.is_integral:  # integer objective: below the cutoff is at most ceil(cutoff) - 1
        return float(math.ceil(limit - 1e-9) - 1)
    return limit - 1e-9 * max(1.0, abs(limit))


def _optimal_bound(objective: float, dual: float | None, rel_gap: float) -> float:
    """The dual bound of a MIP its solver calls optimal. Solvers stop at their relative gap
    (``SolveOptions.rel_gap``), so the objective itself is not a bound: take the solver's dual
    bound, or, when it reports none, the objective less the gap it was allowed."""
    if dual is not None and math.isfinite(dual) and dual <= objective + 1e-9 * max(1.0, abs(objective)):
        return dual
    return objective - rel_gap * max(1.0, abs(objective))


def _num(s: str) -> float | None:
    try:
        v = float(s)
    except ValueError:
        return None
    return v if math.isfinite(v) and abs(v) < 1e49 else None


def _pulp_cbc(**kwargs):  # type: ignore[no-untyped-def]
    """PuLP's CBC command: the ``cbcbox`` binary (``pulp[cbc]``, PuLP >= 3.3) when installed,
    else the binary bundled with older PuLP releases (deprecated there, so its warning is muted)."""
    import warnings

    import pulp

    try:
        import cbcbox

        return pulp.COIN_CMD(path=cbcbox.cbc_bin_path(), **kwargs)
    except (ImportError, AttributeError, pulp.PulpSolverError):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            return pulp.PULP_CBC_CMD(**kwargs)


class PulpCbcBackend(Backend):
    """PuLP driving the CBC command-line solver. Progress and the dual bound are read from CBC's
    log file (CBC's command-line interface has no callback API)."""

    name = "pulp-cbc"

    def available(self) -> bool:
        try:
            return bool(_pulp_cbc(msg=False).available())
        except ImportError:
            return False

    def solve(self, model: LinearModel, options: SolveOptions) -> SolveResult:
        import pulp

        prob = pulp.LpProblem(model.name.replace(" ", "_") or "model", pulp.LpMinimize)
        new_var = getattr(prob, "add_variable", None) or pulp.LpVariable  # PuLP >= 3.3 prefers add_variable
        xs = [new_var(f"x{v.index}", lowBound=None if math.isinf(v.lb) else v.lb,
                      upBound=None if math.isinf(v.ub) else v.ub,
                      cat=pulp.LpInteger if v.integer else pulp.LpContinuous) for v in model.vars]
        prob += pulp.lpSum(a * xs[i] for i, a in model.objective.coefs.items()) + model.objective.const
        for k, c in enumerate(model.constraints):
            expr = pulp.lpSum(a * xs[i] for i, a in c.coefs.items())
            if c.lb == c.ub:
                prob += (expr == c.ub, f"c{k}")
            else:
                if not math.isinf(c.lb):
                    prob += (expr >= c.lb, f"c{k}_lo")
                if not math.isinf(c.ub):
                    prob += (expr <= c.ub, f"c{k}_up")
        limit = _cutoff_limit(model, options)
        if limit is not None:  # only solutions below the cutoff
            prob += (pulp.lpSum(a * xs[i] for i, a in model.objective.coefs.items()) <= limit, "cutoff")
        warm = bool(options.use_hint and model.hint)
        if warm:
            for i, val in model.hint.items():
                xs[i].setInitialValue(val)
        fd, log_path = tempfile.mkstemp(prefix="tangram_cbc_", suffix=".log")
        os.close(fd)
        cmd = _pulp_cbc(msg=bool(options.log), timeLimit=max(1, int(math.ceil(options.time_limit_s))),
                                threads=max(1, options.threads), gapRel=options.rel_gap,
                                gapAbs=0.5 if model.is_integral else 0.0,
                                warmStart=warm, logPath=log_path, options=[f"randomSeed {options.seed + 1}"])
        traj = _Trajectory(options)
        try:
            prob.solve(cmd)
            elapsed = traj.elapsed_s
            with open(log_path, encoding="utf-8", errors="replace") as f:
                log = f.read()
        finally:
            try:
                os.remove(log_path)
            except OSError:
                pass
        for line in log.splitlines():
            m = _CBC_PROGRESS.search(line)
            if m:
                traj.record(_num(m.group(1)), _num(m.group(2)), float(m.group(3)))
                continue
            m = _CBC_SOLUTION.search(line)
            if m:
                traj.record(_num(m.group(1)), None, float(m.group(2)))
        sol = prob.sol_status
        if sol in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
            vals = [float(x.value()) if x.value() is not None else 0.0 for x in xs]
            obj = model.objective.value(vals)
            lower = _CBC_LOWER.search(log)
            bound = _num(lower.group(1)) if lower else None
            optimal = sol == pulp.LpSolutionOptimal and "Stopped" not in log
            st = SolveStatus.OPTIMAL if optimal else SolveStatus.FEASIBLE
            if st == SolveStatus.OPTIMAL:
                bound = _optimal_bound(obj, bound, options.rel_gap)
            traj.record(obj, bound, elapsed)
            return SolveResult(status=st, backend=self.name, objective=obj, bound=bound, values=vals,
                               solve_time_s=elapsed, trajectory=traj.points)
        if sol == pulp.LpSolutionInfeasible or prob.status == pulp.LpStatusInfeasible:
            return SolveResult(status=SolveStatus.INFEASIBLE, backend=self.name, solve_time_s=elapsed)
        if sol == pulp.LpSolutionNoSolutionFound:
            return SolveResult(status=SolveStatus.NO_SOLUTION, backend=self.name, solve_time_s=elapsed,
                               message="time limit before any solution")
        return SolveResult(status=SolveStatus.ERROR, backend=self.name, solve_time_s=elapsed,
                           message=f"PuLP status {pulp.LpStatus.get(prob.status)}")


BACKENDS: dict[str, Backend] = {
    b.name: b for b in (CpSatBackend(), LinearSolverBackend("scip", "SCIP"), HighsBackend(),
                        LinearSolverBackend("cbc", "CBC"), PulpCbcBackend())
}
DEFAULT_BACKEND = "highs"


def get_backend(name: str) -> Backend:
    key = str(name).strip().lower().replace("_", "-")
    key = {"cpsat": "cp-sat", "pulp": "pulp-cbc", "pulp+cbc": "pulp-cbc", "ortools-cbc": "cbc"}.get(key, key)
    if key not in BACKENDS:
        raise SpecError("backend", name, "is not a known solver backend", f"use one of {', '.join(BACKENDS)}")
    b = BACKENDS[key]
    if not b.available():
        raise SolverUnavailableError(f"backend {key!r} is not installed or not usable on this machine")
    return b


def lp_relaxation_bound(model: LinearModel, time_limit_s: float = 10.0, *, cutoff: float | None = None) -> float | None:
    """Optimal value of the LP relaxation (a valid lower bound of the MILP), or None if HiGHS
    could not solve it in time. Infeasible relaxations return +inf.

    With ``cutoff`` (the objective of a known solution), reduced-cost fixing is applied to the
    model in place: an integer column at 0 in the LP optimum whose reduced cost exceeds
    ``cutoff - LP`` is 0 in every solution better than the cutoff, so its upper bound is set to 0.
    """
    b = HighsBackend()
    if not b.available():
        return None
    res = b.solve(model, SolveOptions(time_limit_s=time_limit_s, use_hint=False), relax=True)
    if res.status == SolveStatus.INFEASIBLE:
        return math.inf
    if res.status != SolveStatus.OPTIMAL or res.objective is None:
        return None
    if cutoff is not None and res.reduced_costs is not None and res.values is not None:
        slack = cutoff - res.objective
        for v, x, d in zip(model.vars, res.values, res.reduced_costs):
            if v.integer and v.lb == 0 and x <= 1e-9 and d > slack + 1e-6 * max(1.0, abs(slack)):
                model.set_upper_bound(v.index, 0.0)
    return res.objective


def available_backends() -> list[str]:
    return [n for n, b in BACKENDS.items() if b.available()]


def solve_model(model: LinearModel, backend: str = DEFAULT_BACKEND, options: SolveOptions | None = None) -> SolveResult:
    """Solve ``model`` with the named backend; the returned solution is re-checked against the model."""
    b = get_backend(backend)
    opts = options or SolveOptions()
    res = b.solve(model, opts)
    if res.values is not None:
        bad = model.check(res.values, tol=1e-5)
        if bad:
            res.status = SolveStatus.ERROR
            res.message = f"{b.name} returned a solution that violates the model: {bad[:3]}"
    return res
