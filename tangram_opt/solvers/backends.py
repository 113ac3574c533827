"""The solver backends behind one small protocol (protocol.py), by name.

CP-SAT (cpsat.py), SCIP and CBC through OR-Tools (ortools_linear.py), HiGHS (highs.py, the
default) and PuLP + CBC (pulp_cbc.py). Solver packages are imported only when a backend is used.
:func:`solve_model` re-checks every answer against the model; :func:`lp_relaxation_bound` is the
LP bound (and reduced-cost fixing) the search uses.
"""

from __future__ import annotations

import math
import time

import numpy as np

from tangram_opt.errors import SolverUnavailableError, SpecError
from tangram_opt.solvers.model import LinearModel
from tangram_opt.solvers.cpsat import CpSatBackend
from tangram_opt.solvers.highs import HighsBackend
from tangram_opt.solvers.ortools_linear import LinearSolverBackend
from tangram_opt.solvers.protocol import Backend, SolveOptions, SolveResult, SolveStatus
from tangram_opt.solvers.pulp_cbc import PulpCbcBackend



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


def lp_relaxation_bound(model: LinearModel, time_limit_s: float = 10.0, *, cutoff: float | None = None,
                        presolve: bool = False) -> float | None:
    """Optimal value of the LP relaxation (a valid lower bound of the MILP), or None if HiGHS
    could not solve it in time. Infeasible relaxations return +inf.

    ``presolve``: run HiGHS's presolve, from a cold start (a warm basis would skip it). The
    search's window LPs are faster without; the level-2 zone-pattern LPs, large and with many
    variables fixed, 4x faster with it (multi_pipeline/level2.py, ``_branched_lp``).

    With ``cutoff`` (the objective of a known solution), reduced-cost fixing is applied to the
    model in place: an integer column at 0 in the LP optimum whose reduced cost exceeds
    ``cutoff - LP`` is 0 in every solution better than the cutoff, so its upper bound is set to 0.
    """
    b = HighsBackend()
    if not b.available():
        return None
    t0 = time.perf_counter()
    res = b.solve(model, SolveOptions(time_limit_s=time_limit_s, use_hint=False, presolve=presolve), relax=True)
    left = time_limit_s - (time.perf_counter() - t0)
    if res.status == SolveStatus.ERROR and not presolve and model.lp_cache.pop("basis", None) is not None \
            and left > 0.05:
        # a warm start from another model's basis can leave HiGHS without an answer (status
        # "Unknown" after 0.2 s on a level-2 zone pattern whose cold LP takes 0.9 s): start cold
        res = b.solve(model, SolveOptions(time_limit_s=left, use_hint=False), relax=True)
    if res.status == SolveStatus.INFEASIBLE:
        return math.inf
    if res.status != SolveStatus.OPTIMAL or res.objective is None:
        return None
    if cutoff is not None and res.reduced_costs is not None and res.values is not None:
        slack = cutoff - res.objective
        # the value and reduced-cost tests on arrays, the column's kind on the few that pass them
        x, d = np.asarray(res.values), np.asarray(res.reduced_costs)
        for j in np.flatnonzero((x <= 1e-9) & (d > slack + 1e-6 * max(1.0, abs(slack)))).tolist():
            v = model.vars[j]
            if v.integer and v.lb == 0:
                model.set_upper_bound(j, 0.0)
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


__all__ = ["BACKENDS", "DEFAULT_BACKEND", "available_backends", "get_backend", "lp_relaxation_bound", "solve_model"]
