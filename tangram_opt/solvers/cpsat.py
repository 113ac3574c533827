"""OR-Tools CP-SAT: the all-integer models, with improving solutions pooled (the solver protocol: protocol.py)."""

from __future__ import annotations

import math

from tangram_opt.errors import SpecError
from tangram_opt.solvers.model import LinearModel
from tangram_opt.solvers.protocol import (Backend, SolveOptions, SolveResult, SolveStatus, Trajectory, cutoff_limit,
                                          optimal_bound)


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
        # CP-SAT takes integer objectives only. The objective's constant may be fractional (the integral
        # check covers coefficients, not the constant): CP-SAT gets its integer part ``k`` as the offset
        # (so its relative gap is measured on nearly the whole objective, as the other backends measure
        # it) and the fraction ``rem`` in [0, 1) is added back to every objective and bound it reports.
        # Rows on the objective (incumbent, cutoff) are written on ``terms`` alone, which is integral.
        terms = sum(int(a) * xs[i] for i, a in model.objective.coefs.items())
        const = model.objective.const
        k = math.floor(const) if abs(const) < 2.0**52 else 0
        rem = const - k
        cp.minimize(terms + k)
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
                    # strictly better than the hint: its (integer) sum of terms less one
                    cp.add(terms <= int(round(value - const)) - 1)
        limit = cutoff_limit(model, options)
        if incumbent is None and limit is not None:  # only solutions below the cutoff
            cp.add(terms <= int(limit))
        solver = cp_model.CpSolver()
        p = solver.parameters
        p.max_time_in_seconds = max(0.0, float(options.time_limit_s))  # CP-SAT calls a negative one invalid
        p.num_workers = max(1, int(options.threads))
        p.random_seed = int(options.seed)
        p.relative_gap_limit = float(options.rel_gap)
        p.absolute_gap_limit = 0.5  # integer objective: a gap below 1 is a proof of optimality
        p.log_search_progress = bool(options.log)
        traj = Trajectory(options)

        pool: list[tuple[float, list[float]]] = []

        class _CB(cp_model.CpSolverSolutionCallback):
            def on_solution_callback(self) -> None:  # noqa: D401 (OR-Tools name)
                traj.record(self.objective_value + rem, self.best_objective_bound + rem, self.wall_time)
                if len(pool) < 200:
                    pool.append((self.objective_value + rem, [float(self.value(x)) for x in xs]))

        try:
            solver.best_bound_callback = lambda b: traj.record(None, b + rem)
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
            bound = min(obj, solver.best_objective_bound + rem)
            traj.record(obj, bound, elapsed)
            return SolveResult(status=SolveStatus.FEASIBLE, backend=self.name, objective=obj, bound=bound,
                               values=vals, solve_time_s=elapsed, trajectory=traj.points, pool=pool)
        if st.has_solution:
            obj, bound = solver.objective_value + rem, solver.best_objective_bound + rem
            traj.record(obj, bound, elapsed)
            vals = [float(solver.value(x)) for x in xs]
            if st == SolveStatus.OPTIMAL:
                bound = optimal_bound(obj, bound, options.rel_gap)
            return SolveResult(status=st, backend=self.name, objective=obj, bound=bound, values=vals,
                               solve_time_s=elapsed, trajectory=traj.points, pool=pool)
        bound = solver.best_objective_bound + rem if st == SolveStatus.NO_SOLUTION else None
        return SolveResult(status=st, backend=self.name, bound=bound, solve_time_s=elapsed, trajectory=traj.points,
                           message=solver.status_name(status))


__all__ = ['CpSatBackend']
