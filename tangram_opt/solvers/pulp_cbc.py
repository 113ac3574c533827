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


def _printed_bound(s: str) -> float | None:
    """A lower bound as CBC printed it, less half a unit in its last printed digit. CBC rounds what it
    prints (``%.3f`` in CBC 2.10's "Lower bound:", 6 significant digits in newer logs), which may put
    the printed number above the bound it proved (1234.56789 prints as 1234.568 or as 1234.57)."""
    v = number_or_none(s)
    if v is None:
        return None
    mantissa, _, exponent = s.strip().lower().partition("e")
    try:
        exp = int(exponent or 0)
    except ValueError:
        return v
    if "." in mantissa:
        unit = 10.0 ** (exp - len(mantissa.partition(".")[2]))
    else:  # no decimals: C's %g (6 significant digits, trailing zeros dropped; zero is printed as 0)
        digits = mantissa.lstrip("+-").lstrip("0")
        unit = 10.0 ** (exp + len(digits) - 6) if digits else 0.0
    return v - 0.5 * unit


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


def read_log(log: str, traj: Trajectory, const: float) -> None:
    """Record CBC's progress lines (CBC 2.10's ``Cbc0010I``/``Cbc0012I`` messages) in ``traj``, with
    the objective's constant ``const`` (which CBC never sees) added to every incumbent and bound."""
    def plus(v: float | None) -> float | None:
        return None if v is None else v + const

    for line in log.splitlines():
        m = _CBC_PROGRESS.search(line)
        if m:
            traj.record(plus(number_or_none(m.group(1))), plus(_printed_bound(m.group(2))), float(m.group(3)))
            continue
        m = _CBC_SOLUTION.search(line)
        if m:
            traj.record(plus(number_or_none(m.group(1))), None, float(m.group(2)))


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
        # CBC is given the objective without its constant (PuLP leaves it out of the MPS file anyway):
        # every number CBC reports (its log: incumbents, bounds, "Lower bound:") is without it, and
        # the constant is added back below, whatever PuLP or CBC version runs
        const = model.objective.const
        prob += pulp.lpSum(a * xs[i] for i, a in model.objective.coefs.items())
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
        read_log(log, traj, const)
        sol = prob.sol_status
        if sol in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
            vals = [float(x.value()) if x.value() is not None else 0.0 for x in xs]
            obj = model.objective.value(vals)
            lower = _CBC_LOWER.search(log)
            dual = _printed_bound(lower.group(1)) if lower else None  # without the constant
            if not model.objective.coefs:  # nothing to minimize: the constant is the bound (CBC prints none)
                dual = 0.0
            if dual is not None and model.is_integral:  # the terms sum to an integer: round the bound up
                dual = float(math.ceil(dual - 1e-6))
            optimal = sol == pulp.LpSolutionOptimal and "Stopped" not in log
            st = SolveStatus.OPTIMAL if optimal else SolveStatus.FEASIBLE
            if st == SolveStatus.OPTIMAL and not any(v.integer for v in model.vars):
                bound = obj  # an LP solved to optimality, as the other backends report it
            elif st == SolveStatus.OPTIMAL:
                # CBC measured its gap on the objective without the constant: the bound is taken there
                bound = optimal_bound(obj - const, dual, options.rel_gap) + const
            else:
                bound = None if dual is None else dual + const
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
