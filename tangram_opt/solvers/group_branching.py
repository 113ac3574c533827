"""Branch and bound on choice groups, with HiGHS's LP relaxation at every node.

Some models choose one item per *position* (a column per item, the position's columns summing to
one in every solution), and their items fall into a few groups that matter far more than the
items themselves: the sequence model of the planner picks a stage type per pipeline position, and
what its relaxation gets wrong is mostly which island each position is on (the boundary times
between positions depend on it). Branching on single columns, as a MIP solver does, needs many
levels before the relaxation sees that; branching on the group of a position (which island serves
it) takes one level per position.

A model declares its groups in ``LinearModel.choice_groups``: per position, a partition of its
columns into groups, such that every integer solution has nonzero columns of at most one group
per position (the caller's promise; the planner's positions use exactly one column). This module
searches best first, plunging into the best child of each node it expands, over partial
assignments (position -> group): a node's LP is the model's with the other groups' columns of
every assigned position fixed to 0, and its children assign the first position, in the model's
order, whose LP mass is split over its groups, one child per group; a child whose reduced-cost
floor reaches the limit is closed without its LP. Reduced costs also fix columns: an integer
column at its lower bound whose reduced cost lifts the node's LP to the limit stays there in the
node's whole subtree (its LPs see it fixed). (The planner's positions run from the first
pipeline stage, and what a position's rows price, its step tail above all, depends on the
positions before it: assigning those first makes the rows exact in order.)
A node closes when its LP is infeasible, reaches the cutoff (or the best solution found, less the
gap tolerances), or is integral (a solution). A node with every position assigned and a
fractional LP is solved as a MIP. Each child is a restriction of its parent and the children of a
node cover every solution of it, so the least LP value over the open nodes is a valid bound when
the time runs out.

On the open sequence leaves of the communication-bound MoE cases this proves in a fraction of a
second most leaves that took HiGHS's own branch and bound seconds, or that it did not finish in
40 s (formulations/pipeline_mip.md §3b, "Island branching").
"""

from __future__ import annotations

import heapq
import math
import time
from dataclasses import replace
from typing import Any

from tangram_opt.solvers.model import LinearModel
from tangram_opt.solvers.protocol import SolveOptions, SolveResult, SolveStatus, Trajectory

#: integer columns within this of an integer count as integral in an LP solution
INTEGRAL_TOL = 1e-6
#: relative margin taken off a child's reduced-cost floor (the LP's dual values carry its tolerances)
FLOOR_TOL = 1e-7


class _Lp:
    """The model's LP relaxation in one HiGHS object, whose columns of assigned positions are
    fixed to 0 by bound changes."""

    def __init__(self, model: LinearModel):
        import highspy
        import numpy as np

        from tangram_opt.solvers.highs import _quiet_stdout, _rows, use_thread_pool

        self.np, self.highspy, self.use_thread_pool = np, highspy, use_thread_pool
        n, m = len(model.vars), len(model.constraints)
        cost = np.zeros(n)
        for i, a in model.objective.coefs.items():
            cost[i] = a
        start, index, value, row_lb, row_ub = _rows(model, np)
        self.lb = np.fromiter((v.lb for v in model.vars), dtype=float, count=n)
        self.ub = np.fromiter((v.ub for v in model.vars), dtype=float, count=n)
        with _quiet_stdout():
            self.h = highspy.Highs()
        self.h.setOptionValue("output_flag", False)
        self.h.setOptionValue("presolve", "off")
        # one thread, in a pool of one (sized before every LP, in solve)
        self.h.setOptionValue("threads", 1)
        self.h.passModel(n, m, int(start[-1]), int(highspy.MatrixFormat.kRowwise), int(highspy.ObjSense.kMinimize),
                         float(model.objective.const), cost, self.lb, self.ub, row_lb, row_ub, start[:-1], index,
                         value, np.zeros(n, dtype=np.int32))
        # per position, its groups' columns (index arrays); a group whose columns are all fixed to
        # 0 cannot be chosen and is left out
        self.groups = [[g for g in (np.asarray([j for j in grp if self.ub[j] > 0], dtype=np.int32) for grp in pos)
                        if len(g)] for pos in model.choice_groups]
        self.current_ub = self.ub.copy()
        self.solves = 0

    def assign(self, fixed: dict[int, int], zeroed: Any) -> None:
        """Make the LP's bounds those of the partial assignment ``fixed``, with the columns
        ``zeroed`` (indices) held at their lower bounds too."""
        ub = self.ub.copy()
        for p, g in fixed.items():
            ub[self.others(p, g)] = 0.0
        ub[zeroed] = self.lb[zeroed]
        cols = self.np.flatnonzero(ub != self.current_ub).astype(self.np.int32)
        if len(cols):
            self.h.changeColsBounds(len(cols), cols, self.lb[cols], ub[cols])
            self.current_ub = ub

    def others(self, p: int, g: int) -> Any:
        rest = [c for k, c in enumerate(self.groups[p]) if k != g]
        return self.np.concatenate(rest) if rest else self.np.zeros(0, dtype=self.np.int32)

    def solve(self, time_limit_s: float, start: Any = None) -> tuple[str, float, Any]:
        """("infeasible" | "optimal" | "unknown", objective, (column values, reduced costs, basis)),
        from the basis ``start`` if given (else from the last LP's)."""
        hs = self.highspy
        # HiGHS's time limit bounds the object's run time summed over all its runs (getRunTime)
        self.h.setOptionValue("time_limit", self.h.getRunTime() + max(0.0, time_limit_s))
        if start is not None:
            self.h.setBasis(start)
        # in a pool left larger by another solve of the process (island branching's restricted
        # MIPs run with the caller's threads) this LP would end without an answer
        self.use_thread_pool(1)
        self.solves += 1
        self.h.run()
        ms = self.h.getModelStatus()
        if ms == hs.HighsModelStatus.kInfeasible:
            return "infeasible", math.inf, None
        if ms == hs.HighsModelStatus.kOptimal:
            sol = self.h.getSolution()
            return "optimal", self.h.getInfo().objective_function_value, (self.np.array(sol.col_value),
                                                                            self.np.array(sol.col_dual),
                                                                            self.h.getBasis())
        return "unknown", -math.inf, None


def branch_on_groups(model: LinearModel, options: SolveOptions) -> SolveResult:
    """Solve ``model`` (with ``model.choice_groups``) by branching on its groups; the
    :class:`SolveResult` of a MIP solve (objective and bound in the model's units, INFEASIBLE when
    nothing is below ``options.cutoff``)."""
    import numpy as np

    from tangram_opt.solvers.highs import HighsBackend

    traj = Trajectory(options)
    deadline = time.perf_counter() + max(0.0, options.time_limit_s)
    integer = np.fromiter((v.integer for v in model.vars), dtype=bool, count=len(model.vars))
    lp = _Lp(model)
    groups = lp.groups
    if any(not pos for pos in groups):  # a position with no column left
        return SolveResult(status=SolveStatus.INFEASIBLE, backend="highs", solve_time_s=traj.elapsed_s)
    cutoff = options.cutoff if options.cutoff is not None else math.inf
    abs_gap = 0.5 if model.is_integral else 1e-9
    best: list[Any] = [math.inf, None]  # objective, values

    def limit() -> float:
        """Nodes at or above this hold nothing of interest: the cutoff, or the best solution
        less HiGHS's gap tolerances (``mip_rel_gap``, ``mip_abs_gap``)."""
        b = best[0]
        if not math.isfinite(b):
            return cutoff
        return min(cutoff, b - max(abs_gap, options.rel_gap * abs(b)))

    def branch_position(fixed: dict[int, int], x: Any) -> int | None:
        """The first unassigned position (in the model's order) whose LP mass is split over its
        groups, else the first unassigned one of several groups (None: every position assigned)."""
        first = None
        for p, pos in enumerate(groups):
            if p in fixed or len(pos) < 2:
                continue
            if max(float(x[g].sum()) for g in pos) < 1 - INTEGRAL_TOL:
                return p
            first = p if first is None else first
        return first

    opened = 0
    fixings = 0
    heap: list[tuple[float, int, dict[int, int], Any, Any]] = []
    movable = integer & (lp.ub > lp.lb)

    def evaluate(fixed: dict[int, int], parent_value: float, zeroed: Any,
                 start: Any = None) -> tuple[float, int, dict[int, int], Any, Any] | None:
        """Solve the LP of ``fixed`` (with the columns ``zeroed`` at their lower bounds, from the
        basis ``start``): None when it closes (pruned, infeasible or a solution, which is
        recorded), else the open node (with the position it branches on next and the node's
        basis, None when every position is assigned, -1 when its LP ran out of time; and the
        columns its subtree holds at their lower bounds)."""
        nonlocal opened, fixings
        lp.assign(fixed, zeroed)
        status, value, solution = lp.solve(deadline - time.perf_counter(), start)
        if status == "infeasible" or value >= limit():
            return None
        opened += 1
        if status == "unknown":
            # out of time: the node stays open with its parent's bound; else (HiGHS without an
            # answer on this LP) it is solved as a MIP
            return (parent_value, opened, fixed, -1 if time.perf_counter() >= deadline else None, zeroed)
        x, reduced, basis = solution
        # reduced-cost fixing: an integer column at its lower bound whose reduced cost lifts the
        # LP to the limit when it rises by one holds its lower bound in every solution of interest
        # below this node (the limit only falls, so this stays true)
        free = movable & (lp.current_ub > lp.lb)
        lift = limit() - value + FLOOR_TOL * max(1.0, abs(value))
        at_lower = np.abs(x - lp.lb) <= INTEGRAL_TOL
        new = np.flatnonzero(free & at_lower & (reduced >= lift))
        if len(new):
            fixings += len(new)
            zeroed = np.union1d(zeroed, new).astype(np.int32)
        if bool(np.all(np.abs(x[integer] - np.round(x[integer])) <= INTEGRAL_TOL)):
            value = model.objective.value(x.tolist())  # as the MIP backends report it
            if value < min(best[0], cutoff):
                best[0], best[1] = value, x
                traj.record(value, None)
            return None
        p = branch_position(fixed, x)
        if p is None:
            return (value, opened, fixed, None, zeroed)
        # a child puts one unit on its group's columns, each of which (at its lower bound 0 here,
        # or basic with no reduced cost) raises the LP by at least its reduced cost: a child whose
        # least rise reaches the limit is pruned without its LP (as is one whose columns are all
        # held at 0)
        open_cols = lp.ub > 0
        open_cols[zeroed] = False
        floors = tuple(value + max(0.0, float(reduced[g][open_cols[g]].min())) - FLOOR_TOL * max(1.0, abs(value))
                       if open_cols[g].any() else math.inf for g in groups[p])
        return (value, opened, fixed, (p, floors, basis), zeroed)

    root = evaluate({}, -math.inf, np.zeros(0, dtype=np.int32))
    # best first, plunging into the best child of each node expanded; every child's LP starts
    # from its parent's optimal basis (kept with the node: after a jump across the tree the last
    # LP's basis is a distant one, and on the open leaves of the MoE cases the restart took 20%
    # less time)
    plunge = root
    finished = True
    while plunge is not None or heap:
        node = plunge if plunge is not None else heapq.heappop(heap)
        plunge = None
        value, _, fixed, p, zeroed = node
        if value >= limit():
            continue
        if time.perf_counter() >= deadline or p == -1:
            heapq.heappush(heap, node)
            finished = False
            break
        if p is None:
            # every position assigned and the LP still fractional (or without an answer): the
            # restricted MIP
            sub = model.fork()
            for q, g in fixed.items():
                for j in lp.others(q, g).tolist():
                    sub.set_upper_bound(j, 0.0)
            for j in zeroed.tolist():
                sub.set_upper_bound(j, float(lp.lb[j]))
            res = HighsBackend().solve(sub, replace(options, time_limit_s=deadline - time.perf_counter(),
                                                    cutoff=limit(), use_hint=False, group_branching=False))
            if res.values is not None and res.objective is not None and res.objective < best[0]:
                best[0], best[1] = res.objective, np.asarray(res.values)
                traj.record(res.objective, None)
            if res.status not in (SolveStatus.OPTIMAL, SolveStatus.INFEASIBLE):
                heapq.heappush(heap, (max(value, res.bound if res.bound is not None else value), 0, fixed, -1, zeroed))
                finished = False
                break
            continue
        p, floors, basis = p
        children = [c for c in (evaluate({**fixed, p: g}, value, zeroed, basis) for g, floor in enumerate(floors)
                                if floor < limit()) if c is not None]
        if children:
            plunge = min(children)
            for c in children:
                if c is not plunge:
                    heapq.heappush(heap, c)
    open_bound = min((v for v, *_ in heap if v < limit()), default=math.inf)
    # finished: every node closed at the cutoff or at the best solution less the tolerances
    bound = min(open_bound, best[0]) if not finished else limit()
    elapsed = traj.elapsed_s
    note = f"group branching: {lp.solves} LPs, {fixings} columns fixed by reduced costs"
    if best[1] is None:
        if finished:
            return SolveResult(status=SolveStatus.INFEASIBLE, backend="highs", solve_time_s=elapsed, message=note)
        traj.record(None, bound)
        return SolveResult(status=SolveStatus.NO_SOLUTION, backend="highs",
                           bound=bound if math.isfinite(bound) else None, solve_time_s=elapsed,
                           trajectory=traj.points, message=note)
    traj.record(best[0], bound)
    return SolveResult(status=SolveStatus.OPTIMAL if finished else SolveStatus.FEASIBLE, backend="highs",
                       objective=float(best[0]), bound=float(bound),
                       values=[float(v) for v in best[1]], solve_time_s=elapsed, trajectory=traj.points, message=note)


__all__ = ["INTEGRAL_TOL", "branch_on_groups"]
