"""Optimal load shares for a fixed set of replicas (an LP).

Given which ranks hold a replica of each expert (``holders``), the best split of every expert's tokens
over its replicas is a transportation problem: minimize ``T`` subject to ``sum_r f[e, r] = w[e]`` over
the holders of ``e`` and ``sum_e f[e, r] <= T`` (a parametric max-flow; we solve it as an LP). A second
LP then keeps ``T`` and minimizes cross-node tokens (definition in :mod:`.placement`), so splits returned
to the user are lexicographically best: balance first, then locality.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from tangram_opt.errors import NoSolutionError
from tangram_opt.experts.problem import PlacementProblem
from tangram_opt.solvers import LinearModel, SolveOptions, lsum, solve_model


def optimal_split(p: PlacementProblem, holders: Sequence[Sequence[int]], *, locality: bool = True,
                  max_load_cap: float | None = None, time_limit_s: float = 60.0
                  ) -> tuple[float, list[dict[int, float]]]:
    """Best shares for fixed replicas: ``(max rank load, served[r][e])``.

    With ``locality`` and more than one node, cross-node tokens are minimized among the splits that
    keep the optimal maximum load (up to a relative 1e-9). ``max_load_cap`` replaces the first stage
    by a given cap on rank loads (it must be feasible).

    ``time_limit_s`` covers building and solving both LPs: the first raises :class:`NoSolutionError` when
    it is not solved in time, the second (locality) is skipped or its answer dropped. Building an LP is
    checked once per expert, and the LP solver's own time limit is the time left; the backend's model
    check after a solve is not interruptible (about 1 s for 25,000 replicas)."""
    deadline = time.perf_counter() + time_limit_s

    def left() -> float:
        return deadline - time.perf_counter()

    hold = [sorted(set(h)) for h in holders]
    by_expert: list[list[int]] = [[] for _ in range(p.experts)]
    for r, es in enumerate(hold):
        for e in es:
            by_expert[e].append(r)
    if any(not rs for rs in by_expert):
        missing = [e for e, rs in enumerate(by_expert) if not rs]
        raise ValueError(f"experts without a replica: {missing[:5]}")
    m = LinearModel("split")
    f = {(e, r): m.add_var(f"f[{e},{r}]", 0.0, p.loads[e]) for e in range(p.experts) for r in by_expert[e]}
    T = m.add_var("T", 0.0)
    for e in range(p.experts):
        if left() <= 0:
            raise NoSolutionError(f"split LP: no time left to build it ({time_limit_s:.2f} s)")
        m.add(lsum(f[e, r] for r in by_expert[e]) == p.loads[e], f"serve[{e}]")
    for r in range(p.ranks):
        m.add(lsum(f[e, r] for e in hold[r]) - T <= 0.0, f"load[{r}]")
    if max_load_cap is None:
        if left() <= 0:
            raise NoSolutionError(f"split LP: no time left to solve it ({time_limit_s:.2f} s)")
        m.minimize(T)
        res = solve_model(m, "highs", SolveOptions(time_limit_s=left()))
        if not res.status.has_solution:
            raise NoSolutionError(f"split LP failed: {res.status.value} {res.message}")
        t_best = float(res.objective)
        vals = res.values
    else:
        t_best, vals = float(max_load_cap), None
    if locality and p.nodes > 1 and left() > 0:
        # stage 2: keep T, maximize locally served tokens z[e, n] <= min(F[e, n], o[e, n])
        T_cap = t_best * (1 + 1e-9) + 1e-9
        m.add(T <= T_cap, "keep_max_load")
        frac = p.ranks_per_node / p.ranks
        z = []
        for e in range(p.experts):
            if left() <= 0:
                break
            by_node: dict[int, list[int]] = {}
            for r in by_expert[e]:
                by_node.setdefault(p.node_of(r), []).append(r)
            for n, rs in sorted(by_node.items()):
                zv = m.add_var(f"z[{e},{n}]", 0.0, p.loads[e] * frac)
                m.add(zv - lsum(f[e, r] for r in rs) <= 0.0, f"local[{e},{n}]")
                z.append(zv)
        if left() > 0:
            m.minimize(-lsum(z))
            res = solve_model(m, "highs", SolveOptions(time_limit_s=left()))
            if res.status.has_solution:
                vals = res.values
    if vals is None:  # only a cap was given and the locality LP did not run
        raise NoSolutionError(f"split LP: not solved in {time_limit_s:.2f} s")
    served: list[dict[int, float]] = [{} for _ in range(p.ranks)]
    for (e, r), v in f.items():
        served[r][e] = max(0.0, vals[v.index])
    # exact conservation: put rounding residue on the largest share
    for e in range(p.experts):
        rs = by_expert[e]
        tot = sum(served[r][e] for r in rs)
        rmax = max(rs, key=lambda r: served[r][e])
        served[rmax][e] += p.loads[e] - tot
    return max(sum(d.values()) for d in served), served
