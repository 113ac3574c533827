"""PuLP driving the CBC command-line solver (the solver protocol: protocol.py)."""

from __future__ import annotations

import math
import os
import re
import tempfile

from tangram_opt.solvers.model import LinearModel
from tangram_opt.solvers.protocol import (Backend, SolveOptions, SolveResult, SolveStatus, Trajectory, cutoff_limit,
                                          number_or_none, optimal_bound)


_CBC_PROGRESS = re.compile(r"Cbc0010I After \d+ nodes, \d+ on tree, (\S+) best solution, best possible (\S+) "
                           r"\(([\d.]+) seconds\)")
_CBC_SOLUTION = re.compile(r"Cbc0012I Integer solution of (\S+) found .*\(([\d.]+) seconds\)")
_CBC_LOWER = re.compile(r"^Lower bound:\s+(\S+)", re.M)
_CBC_OBJ = re.compile(r"^Objective value:\s+(\S+)", re.M)



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
        limit = cutoff_limit(model, options)
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
        traj = Trajectory(options)
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
                traj.record(number_or_none(m.group(1)), number_or_none(m.group(2)), float(m.group(3)))
                continue
            m = _CBC_SOLUTION.search(line)
            if m:
                traj.record(number_or_none(m.group(1)), None, float(m.group(2)))
        sol = prob.sol_status
        if sol in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
            vals = [float(x.value()) if x.value() is not None else 0.0 for x in xs]
            obj = model.objective.value(vals)
            lower = _CBC_LOWER.search(log)
            bound = number_or_none(lower.group(1)) if lower else None
            optimal = sol == pulp.LpSolutionOptimal and "Stopped" not in log
            st = SolveStatus.OPTIMAL if optimal else SolveStatus.FEASIBLE
            if st == SolveStatus.OPTIMAL:
                bound = optimal_bound(obj, bound, options.rel_gap)
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


__all__ = ['PulpCbcBackend']
