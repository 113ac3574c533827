"""The placement MIP (mathematics in formulations/expert_placement.md; the names match).

    min  T + alpha * X + beta * M
    s.t. sum_r f[e,r] = w[e]                         serve[e]     every token of e is served
         f[e,r] <= min(w[e], U) * x[e,r]              link[e,r]    only replicas serve
         sum_e f[e,r] <= T                           load[r]      T is the hottest rank's load
         sum_e x[e,r] <= S[r]                        slots[r]
         sum_e b[e] x[e,r] <= B[r]                   memory[r]    (with expert_bytes)
         sum_{e,r} x[e,r] <= P                       budget       E + max_redundant replicas at most
         sum_r x[e,r] >= 1 + sum_{k>=2} y[e,k]       copies[e]    y[e,k] = "e has >= k replicas"
         y[e,k] <= y[e,k-1]
         T >= w[e] - sum_k (w[e]/(k-1) - w[e]/k) y[e,k]          spread[e]    T >= w[e] / c[e]
         T >= LB                                                  combinatorial bound (bounds.py)
         X = W - sum_{e,n} z[e,n],  z[e,n] <= sum_{r in n} f[e,r],  z[e,n] <= w[e] R_n / R
         M = sum_{(e,r) not in current} x[e,r]
         load[r] >= load[r+1] for interchangeable ranks r, r+1      symmetry breaking

Without redundant replicas (``P = E``: no spare slot, or ``max_redundant = 0``) every expert is whole and
its share is ``w[e] x[e,r]``: the *whole* model drops ``f``, ``link``, ``budget`` and ``y`` and writes
``sum_r x[e,r] = 1`` (``assign[e]``) and ``load[r] = sum_e w[e] x[e,r]``. Same solutions, same LP bound
(``f = w x`` is forced in the LP too), about half the columns; HiGHS proves full instances several times
faster with it (formulations/expert_placement.md). The objective's constant ``alpha * W`` is kept out of
the model and added back to the bound (a solver log may report its bound without the constant).

``U`` is the objective of the warm start (no better solution has ``T > U``): it caps the link
coefficients and gives the valid cut ``sum_r x[e,r] >= ceil(w[e] / U)``. The ``spread`` rows are the
convex (piecewise-linear) hull of ``T >= w[e] / c[e]`` over integer replica counts, much stronger in
the LP relaxation than the big-M links alone.

CP-SAT needs integers: shares become whole tokens (``f`` integer), ``spread`` is written as
``k T + w[e] y[e,k+1] >= w[e]`` and the objective is scaled. Its solutions are feasible for the
fractional problem; its bound ``b`` gives ``b - 1`` token for the fractional one (with fixed replicas,
an integral max-flow exists at capacity ``ceil(T*)``, so the integer optimum is at most ``ceil(T*)``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

from tangram_opt.errors import SpecError
from tangram_opt.experts.problem import PlacementProblem
from tangram_opt.solvers import (LinearModel, LinExpr, SolveOptions, SolveResult, SolveStatus, get_backend, lsum,
                                 solve_model)
from tangram_opt.solvers.model import Var

CP_SAT_OBJECTIVE_SCALE = 1000  # CP-SAT objective = 1000 T + round(1000 alpha) X + round(1000 beta) M


@dataclass(frozen=True, slots=True, kw_only=True)
class MipOutcome:
    result: SolveResult
    holders: list[list[int]] | None
    served: list[dict[int, float]] | None
    bound: float | None
    """Valid lower bound on the (unscaled, fractional-share) weighted objective, or None."""


def symmetric_classes(p: PlacementProblem, *, across_nodes: bool) -> list[list[int]]:
    """Groups of interchangeable ranks (same slots and memory; same node unless ``across_nodes``);
    none when a current placement distinguishes every rank."""
    if p.current is not None:
        return []
    classes: dict[tuple, list[int]] = {}
    for r in range(p.ranks):
        key = (p.slots_per_rank[r], p.memory_of(r), None if across_nodes else p.node_of(r))
        classes.setdefault(key, []).append(r)
    return [rs for rs in classes.values() if len(rs) > 1]


def build_and_solve(p: PlacementProblem, *, backend: str, options: SolveOptions, incumbent_objective: float,
                    lower_bound: float, hint_holders: Sequence[Sequence[int]] | None,
                    hint_served: Sequence[dict[int, float]] | None, cross_node_weight: float,
                    move_weight: float, deadline: float = math.inf) -> MipOutcome:
    """Build the model and solve it. ``deadline`` (a ``time.perf_counter`` value) bounds building and solving:
    the build is checked once per expert (``O(E R)`` columns in all) and gives up with ``NO_SOLUTION`` when
    the deadline passes; the solver gets ``options.time_limit_s`` or the time left, whichever is less."""
    integral = get_backend(backend).needs_integral_model

    def out_of_time() -> MipOutcome | None:
        if time.perf_counter() <= deadline:
            return None
        return MipOutcome(result=SolveResult(status=SolveStatus.NO_SOLUTION, backend=backend,
                                             message=f"time limit reached while building the model ({E} experts x "
                                                     f"{R} ranks)"),
                          holders=None, served=None, bound=None)

    E, R = p.experts, p.ranks
    w = [float(x) for x in p.loads]
    if integral and any(not x.is_integer() for x in w):
        raise SpecError("loads", "fractional", "cp-sat needs whole-token loads",
                        "round the loads to integers or use another backend")
    use_cross = cross_node_weight > 0 and p.nodes > 1
    use_move = move_weight > 0 and p.current is not None
    if integral:
        a_int = cross_node_weight * CP_SAT_OBJECTIVE_SCALE
        b_int = move_weight * CP_SAT_OBJECTIVE_SCALE
        if abs(a_int - round(a_int)) > 1e-9 or abs(b_int - round(b_int)) > 1e-9:
            raise SpecError("cross_node_weight" if abs(a_int - round(a_int)) > 1e-9 else "move_weight",
                            cross_node_weight if abs(a_int - round(a_int)) > 1e-9 else move_weight,
                            f"cp-sat needs weights that are multiples of 1/{CP_SAT_OBJECTIVE_SCALE}",
                            "round the weight to 3 decimals or use highs/scip")
    # U: no solution better than the incumbent has T above the incumbent's objective (other terms >= 0)
    U = incumbent_objective
    U_int = math.ceil(U - 1e-9) if integral and math.isfinite(U) else U
    LB = math.ceil(lower_bound - 1e-9) if integral else lower_bound  # integer T >= LB
    # no redundant replica possible (P = E): every expert is whole, its share is w[e] x[e,r] (the "whole" model)
    whole = p.max_replicas == E
    m = LinearModel("expert-placement")
    x: dict[tuple[int, int], Var] = {}
    f: dict[tuple[int, int], Var] = {}
    for e in range(E):
        if (late := out_of_time()) is not None:
            return late
        cap = min(w[e], U_int)
        for r in range(R):
            if p.fits(e, r):
                x[e, r] = m.add_binary(f"x[{e},{r}]")
                if not whole:
                    f[e, r] = m.add_var(f"f[{e},{r}]", 0.0, cap, integer=integral)

    def share(e: int, r: int) -> LinExpr:
        return LinExpr.of(x[e, r]) * w[e] if whole else LinExpr.of(f[e, r])
    T = m.add_var("T", LB, max(LB, U_int), integer=integral)
    by_e: list[list[int]] = [[r for r in range(R) if (e, r) in x] for e in range(E)]
    by_r: list[list[int]] = [[e for e in range(E) if (e, r) in x] for r in range(R)]
    for e in range(E):
        if (late := out_of_time()) is not None:
            return late
        if whole:
            m.add(lsum(x[e, r] for r in by_e[e]) == 1, f"assign[{e}]")
            continue
        m.add(lsum(f[e, r] for r in by_e[e]) == w[e], f"serve[{e}]")
        cap = min(w[e], U_int)
        for r in by_e[e]:
            m.add(f[e, r] - cap * x[e, r] <= 0, f"link[{e},{r}]")
    load = [lsum(share(e, r) for e in by_r[r]) for r in range(R)]
    for r in range(R):
        m.add(load[r] - T <= 0, f"load[{r}]")
        m.add(lsum(x[e, r] for e in by_r[r]) <= p.slots_per_rank[r], f"slots[{r}]")
        if p.expert_bytes is not None and sum(p.bytes_of(e) for e in by_r[r]) > p.memory_of(r):
            if integral:
                raise SpecError("backend", backend, "cp-sat does not take byte-sized memory limits",
                                "use highs or scip with expert_bytes")
            m.add(lsum(p.bytes_of(e) * x[e, r] for e in by_r[r]) <= p.memory_of(r), f"memory[{r}]")
    if not whole:
        m.add(lsum(x.values()) <= p.max_replicas, "budget")
    # replica counts: y[e,k] = e has >= k replicas; T >= w/c as a convex piecewise-linear function
    y: dict[tuple[int, int], Var] = {}
    for e in range(E) if not whole else ():
        if (late := out_of_time()) is not None:
            return late
        cmin = max(1, math.ceil(w[e] / U - 1e-9)) if U > 0 else 1
        kmax = min(len(by_e[e]), p.max_replicas - E + 1,
                   math.ceil(w[e] / lower_bound - 1e-9) if lower_bound > 0 else 1)
        ks = list(range(2, kmax + 1))
        for k in ks:
            y[e, k] = m.add_binary(f"y[{e},{k}]")
            if k > 2:
                m.add(y[e, k] - y[e, k - 1] <= 0, f"order[{e},{k}]")
            if k <= cmin:
                m.add(LinExpr.of(y[e, k]) >= 1, f"min_copies[{e},{k}]")
        m.add(lsum(x[e, r] for r in by_e[e]) - lsum(y[e, k] for k in ks) >= 1, f"copies[{e}]")
        if cmin > 1 and not ks:
            m.add(lsum(x[e, r] for r in by_e[e]) >= cmin, f"min_copies[{e}]")
        if not ks:
            continue
        if integral:
            for k in range(1, kmax):
                m.add(k * T + w[e] * y[e, k + 1] >= w[e], f"spread[{e},{k}]")
        else:
            m.add(T + lsum((w[e] / (k - 1) - w[e] / k) * y[e, k] for k in ks) >= w[e], f"spread[{e}]")
    # symmetry: interchangeable ranks carry non-increasing loads
    for rs in symmetric_classes(p, across_nodes=not use_cross):
        for a, b in zip(rs, rs[1:]):
            m.add(load[a] - load[b] >= 0, f"sym[{a},{b}]")
    # Objective scale: CP-SAT needs integers; SCIP and PuLP-CBC are run with an absolute gap of 0.5 (set in
    # tangram_opt.solvers for integer objectives), so a power of two puts the objective near 1e7 and makes that
    # absolute tolerance negligible (below 1e-7 relative).
    if integral:
        scale = CP_SAT_OBJECTIVE_SCALE
    else:
        scale = 2.0 ** round(math.log2(1e7 / max(lower_bound, 1e-9)))
    objective = LinExpr.of(T) * scale
    offset = 0.0  # constant part of the objective, kept out of the model (some solvers' logs drop it)
    z: dict[tuple[int, int], Var] = {}
    if use_cross:
        frac = p.ranks_per_node / R
        for e in range(E):
            if (late := out_of_time()) is not None:
                return late
            for n in range(p.nodes):
                rs = [r for r in by_e[e] if p.node_of(r) == n]
                if not rs:
                    continue
                origin = w[e] * frac
                if integral:
                    origin = math.floor(origin)  # whole tokens: a valid restriction, see module docstring
                z[e, n] = m.add_var(f"z[{e},{n}]", 0.0, origin, integer=integral)
                m.add(z[e, n] - lsum(share(e, r) for r in rs) <= 0, f"local[{e},{n}]")
        coef = round(cross_node_weight * CP_SAT_OBJECTIVE_SCALE) if integral else cross_node_weight * scale
        objective = objective - coef * lsum(z.values())
        offset = coef * p.total_load
    if use_move:
        coef = round(move_weight * CP_SAT_OBJECTIVE_SCALE) if integral else move_weight * scale
        objective = objective + coef * lsum(x[e, r] for (e, r) in x if e not in p.current[r])
    m.minimize(objective)
    if hint_holders is not None and hint_served is not None:
        m.set_hint(_hint(p, m, x, f, y, z, T, hint_holders, hint_served, integral, use_cross, lower_bound))
    if (late := out_of_time()) is not None:
        return late
    # a deadline passed meanwhile gives a negative limit, which the backends clamp (HiGHS and CP-SAT
    # stop at once, CBC and OR-Tools' linear solvers run their shortest limit)
    res = solve_model(m, backend, replace(options, time_limit_s=min(options.time_limit_s,
                                                                    deadline - time.perf_counter())))
    bound = None
    if res.bound is not None and math.isfinite(res.bound):
        bound = (res.bound + offset) / scale
        if integral:
            # whole-token optimum <= fractional optimum + 1 token of T; valid only without the cross-node term
            bound = bound - 1.0 if not use_cross else None
    if not res.status.has_solution or res.values is None:
        return MipOutcome(result=res, holders=None, served=None, bound=bound)
    vals = res.values
    holders = [[e for e in by_r[r] if vals[x[e, r].index] > 0.5] for r in range(R)]
    served = [{e: (w[e] if whole else max(0.0, vals[f[e, r].index])) for e in holders[r]} for r in range(R)]
    return MipOutcome(result=res, holders=holders, served=served, bound=bound)


def _hint(p: PlacementProblem, m: LinearModel, x, f, y, z, T, holders, served, integral: bool, use_cross: bool,
          lower_bound: float) -> dict[Var, float]:
    """A complete starting solution from a placement (ranks permuted to satisfy symmetry breaking)."""
    R = p.ranks
    order = list(range(R))  # order[slot r of the model] = rank of the hint placed there
    loads = [sum(served[r].values()) for r in range(R)]
    for rs in symmetric_classes(p, across_nodes=not use_cross):
        ranked = sorted(rs, key=lambda r: -loads[r])
        for dst, src in zip(rs, ranked):
            order[dst] = src
    sv = [dict(served[order[r]]) for r in range(R)]
    hd = [set(holders[order[r]]) for r in range(R)]
    if integral:
        sv = _integral_shares(p, hd, sv)
    hint: dict[Var, float] = {}
    for (e, r), v in x.items():
        hint[v] = 1.0 if e in hd[r] else 0.0
        if (e, r) in f:
            hint[f[e, r]] = sv[r].get(e, 0.0) if e in hd[r] else 0.0
    copies = [0] * p.experts
    for r in range(R):
        for e in hd[r]:
            copies[e] += 1
    for (e, k), v in y.items():
        hint[v] = 1.0 if copies[e] >= k else 0.0
    t = max(sum(d.values()) for d in sv)
    hint[T] = max(t, math.ceil(lower_bound - 1e-9) if integral else lower_bound)
    if z:
        frac = p.ranks_per_node / R
        for (e, n), v in z.items():
            share = sum(sv[r].get(e, 0.0) for r in range(R) if p.node_of(r) == n)
            val = min(share, p.loads[e] * frac)
            hint[v] = math.floor(val) if integral else val
    return hint


def _integral_shares(p: PlacementProblem, holders: list[set[int]], served: list[dict[int, float]]
                     ) -> list[dict[int, float]]:
    """Round shares to whole tokens keeping each expert's total (largest remainders per expert)."""
    out = [dict() for _ in range(p.ranks)]  # type: list[dict[int, float]]
    for e in range(p.experts):
        rs = [r for r in range(p.ranks) if e in holders[r]]
        raw = [served[r].get(e, 0.0) for r in rs]
        base = [math.floor(v) for v in raw]
        short = int(round(p.loads[e])) - sum(base)
        for i in sorted(range(len(rs)), key=lambda i: -(raw[i] - base[i]))[:max(0, short)]:
            base[i] += 1
        for r, v in zip(rs, base):
            out[r][e] = float(v)
    return out
