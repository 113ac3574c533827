"""HiGHS through highspy: the default backend, and the LP relaxations of the search (the solver protocol:
protocol.py)."""

from __future__ import annotations

import contextlib
import itertools
import os
from typing import Any

from tangram_opt.solvers.model import ArrayConstraint, LinearModel
from tangram_opt.solvers.protocol import (Backend, SolveOptions, SolveResult, SolveStatus, Trajectory, number_or_none,
                                          optimal_bound)


#: HiGHS presolve for LP relaxations unless ``SolveOptions.presolve`` asks for it, which
#: ``lp_relaxation_bound(..., presolve=True)`` does ("off": see the comment in HighsBackend.solve)
LP_PRESOLVE = "off"


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


def use_thread_pool(threads: int) -> None:
    """Size HiGHS's process-wide thread pool for a solve with ``threads`` threads. HiGHS sizes it at
    its first solve, and a later solve that asks for another thread count ends at once without an
    answer (model status "Not Set"): after a two-thread MIP solve, every one-thread LP of island
    branching did, and it fell back to solving whole subtrees as MIPs. So the pool is resized
    on every change."""
    import highspy

    global _HIGHS_POOL_THREADS
    if threads != _HIGHS_POOL_THREADS and hasattr(highspy.Highs, "resetGlobalScheduler"):
        highspy.Highs.resetGlobalScheduler(True)
    _HIGHS_POOL_THREADS = threads


#: the HiGHS heuristics ``SolveOptions(heuristics=False)`` switches off
HIGHS_SUB_MIP_HEURISTICS = ("mip_heuristic_run_rens", "mip_heuristic_run_rins", "mip_heuristic_run_root_reduced_cost",
                            "mip_heuristic_run_feasibility_jump")


def _rows(model: LinearModel, np: Any) -> tuple[Any, Any, Any, Any, Any]:
    """The rows in the arrays of HiGHS's row-wise ``passModel``: starts (with the end), column
    indices, values, lower and upper bounds. Rows never change once added (``LinearModel.add``), so
    the arrays of a prefix are kept in ``model.lp_cache`` and a fork converts only its new rows
    (on a window's stage-range children, most of what an LP relaxation cost in Python). Rows held as
    arrays (``ArrayConstraint``) are copied as they are, the others read from their dicts."""
    rows = model.constraints
    m = len(rows)
    cached = model.lp_cache.get("rows")
    k = 0
    if cached is not None and 0 < cached[0] <= m and rows[cached[0] - 1] is cached[1]:
        k = cached[0]
    new = rows[k:]
    arrays = [c for c in new if type(c) is ArrayConstraint]
    sparse = [c for c in new if type(c) is not ArrayConstraint] if arrays else new
    lengths = np.fromiter((len(c.coefs) for c in sparse), dtype=np.int32, count=len(sparse))
    index = np.fromiter(itertools.chain.from_iterable(c.coefs.keys() for c in sparse), dtype=np.int32,
                        count=int(lengths.sum()))
    value = np.fromiter(itertools.chain.from_iterable(c.coefs.values() for c in sparse), dtype=float, count=len(index))
    if arrays:  # array rows as they are, interleaved with the others in row order
        dense = np.fromiter((type(c) is ArrayConstraint for c in new), dtype=bool, count=m - k)
        lengths_all = np.empty(m - k, dtype=np.int32)
        lengths_all[dense] = [len(c.index) for c in arrays]
        lengths_all[~dense] = lengths
        lengths = lengths_all
        at = np.repeat(dense, lengths)
        index_all, value_all = np.empty(len(at), dtype=np.int32), np.empty(len(at))
        index_all[at] = np.concatenate([c.index for c in arrays])
        value_all[at] = np.concatenate([c.value for c in arrays])
        index_all[~at], value_all[~at] = index, value
        index, value = index_all, value_all
    lb = np.fromiter((c.lb for c in new), dtype=float, count=m - k)
    ub = np.fromiter((c.ub for c in new), dtype=float, count=m - k)
    if k:
        start0, index0, value0, lb0, ub0 = cached[2]
        start = np.concatenate((start0, start0[-1] + np.cumsum(lengths, dtype=np.int32)))
        index, value = np.concatenate((index0, index)), np.concatenate((value0, value))
        lb, ub = np.concatenate((lb0, lb)), np.concatenate((ub0, ub))
    else:
        start = np.zeros(m + 1, dtype=np.int32)
        np.cumsum(lengths, out=start[1:])
    if m:
        model.lp_cache["rows"] = (m, rows[m - 1], (start, index, value, lb, ub))
    return start, index, value, lb, ub


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
        if options.group_branching and model.choice_groups and not relax:
            from tangram_opt.solvers import group_branching

            return group_branching.branch_on_groups(model, options)
        import highspy
        import numpy as np

        n = len(model.vars)
        with _quiet_stdout():
            h = highspy.Highs()
        threads = max(1, int(options.threads))
        use_thread_pool(threads)
        h.setOptionValue("output_flag", bool(options.log))
        # the array form of passModel: numpy arrays go to HiGHS as buffers, where assigning them to
        # a HighsLp's fields converts element by element (14 -> 10 ms per window LP of ~30,000
        # nonzeros on the 512-GPU Mixtral-8x22B case)
        m = len(model.constraints)
        cost = np.zeros(n)
        for i, a in model.objective.coefs.items():
            cost[i] = a
        start, index, value, row_lb, row_ub = _rows(model, np)
        nnz = int(start[-1])
        mip = not relax and any(v.integer for v in model.vars)
        integrality = (np.fromiter((1 if v.integer else 0 for v in model.vars), dtype=np.int32, count=n) if mip
                       else np.zeros(n, dtype=np.int32))
        passed = h.passModel(n, m, nnz, int(highspy.MatrixFormat.kRowwise), int(highspy.ObjSense.kMinimize),
                             float(model.objective.const), cost,
                             np.fromiter((v.lb for v in model.vars), dtype=float, count=n),
                             np.fromiter((v.ub for v in model.vars), dtype=float, count=n),
                             row_lb, row_ub, start[:-1], index, value, integrality)
        if passed == highspy.HighsStatus.kError:
            return SolveResult(status=SolveStatus.ERROR, backend=self.name, message="HiGHS rejected the model")
        # a basis skips HiGHS's presolve: an LP solved with it starts cold
        basis = model.lp_cache.get("basis") if relax and not options.presolve else None
        if basis is not None and len(basis[0]) == n and len(basis[1]) <= m:
            # the last optimal basis of this model or of the model it was forked from (the same
            # columns, a prefix of the rows; the new rows' slacks enter basic): a window's child LP
            # starts where its parent's ended instead of from scratch
            status = [highspy.HighsBasisStatus(i) for i in range(5)]
            warm = highspy.HighsBasis()
            warm.col_status = [status[i] for i in basis[0].tolist()]
            warm.row_status = [status[i] for i in basis[1].tolist()] + [highspy.HighsBasisStatus.kBasic] * (
                m - len(basis[1]))
            warm.valid = True
            h.setBasis(warm)  # a basis HiGHS rejects leaves it to start cold
        # a negative limit (a deadline already passed) is stop-at-once: HiGHS refuses it and keeps none
        for key, val in (("time_limit", max(0.0, float(options.time_limit_s))), ("mip_rel_gap", float(options.rel_gap)),
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
            h.setOptionValue("presolve", "on" if options.presolve else LP_PRESOLVE)
        traj = Trajectory(options)
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
        if relax and ms == highspy.HighsModelStatus.kOptimal and info.dual_solution_status == 2:
            # HiGHS can call an LP optimal whose primal point misses its tolerance after unscaling
            # (5e-6 on a window LP of 10^8 ticks): its dual point is feasible, so the objective
            # is still the relaxation's bound, which the search would otherwise lose to the
            # window's weaker quick bound
            has_sol = True
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
            # HiGHS reports objectives and its MIP dual bound with the objective's constant (the offset
            # passed with the model). An LP has no MIP dual bound (HiGHS leaves it at 0): its optimum is
            # its bound, and an LP stopped early has none
            dual = number_or_none(str(info.mip_dual_bound))
            if not mip:
                bound = obj if optimal else None
            else:
                bound = optimal_bound(obj, dual, options.rel_gap) if optimal else dual
            traj.record(obj, bound, elapsed)
            rc = list(h.getSolution().col_dual) if (relax and optimal) else None
            if relax and optimal:
                got = h.getBasis()
                if got.valid:
                    model.lp_cache["basis"] = (np.fromiter((int(x) for x in got.col_status), dtype=np.int8, count=n),
                                               np.fromiter((int(x) for x in got.row_status), dtype=np.int8, count=m))
            return SolveResult(status=SolveStatus.OPTIMAL if optimal else SolveStatus.FEASIBLE, backend=self.name,
                               objective=obj, bound=bound, values=vals, solve_time_s=elapsed, trajectory=traj.points,
                               reduced_costs=rc)
        if ms in (highspy.HighsModelStatus.kTimeLimit, highspy.HighsModelStatus.kInterrupt):
            return SolveResult(status=SolveStatus.NO_SOLUTION, backend=self.name, solve_time_s=elapsed,
                               bound=number_or_none(str(info.mip_dual_bound)) if mip else None, trajectory=traj.points,
                               message="time limit before any solution")
        return SolveResult(status=SolveStatus.ERROR, backend=self.name, solve_time_s=elapsed,
                           message=f"HiGHS status {h.modelStatusToString(ms)}")


__all__ = ['HIGHS_SUB_MIP_HEURISTICS', 'HighsBackend', 'LP_PRESOLVE']
