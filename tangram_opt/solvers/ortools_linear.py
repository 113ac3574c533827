"""SCIP and CBC through OR-Tools' linear-solver wrapper (the solver protocol: protocol.py)."""

from __future__ import annotations

import math

from tangram_opt.errors import SolverUnavailableError
from tangram_opt.solvers.model import LinearModel
from tangram_opt.solvers.protocol import (Backend, SolveOptions, SolveResult, SolveStatus, Trajectory, cutoff_limit,
                                          optimal_bound)


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
        limit = cutoff_limit(model, options)
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
        traj = Trajectory(options)
        status = s.Solve(params)
        elapsed = traj.elapsed_s
        if status in (pywraplp.Solver.OPTIMAL, pywraplp.Solver.FEASIBLE):
            # Value() and BestBound() both include the offset (the objective's constant)
            val = obj.Value()
            mip = any(v.integer for v in model.vars)
            st = SolveStatus.OPTIMAL if status == pywraplp.Solver.OPTIMAL else SolveStatus.FEASIBLE
            if not mip:  # an LP: its optimum is its bound; stopped early, it has none
                bound = val if st == SolveStatus.OPTIMAL else None
            elif st == SolveStatus.OPTIMAL:
                bound = optimal_bound(val, obj.BestBound(), options.rel_gap)
            else:
                bound = obj.BestBound()
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


__all__ = ['LinearSolverBackend']
