"""Backend-neutral MILP modelling and the solver backends (CP-SAT, SCIP, HiGHS, CBC, PuLP+CBC).

Layer: cost model and solver backends, right above the specs; the formulations build their models on
it.
"""

from tangram_opt.solvers.backends import (BACKENDS, DEFAULT_BACKEND, available_backends, get_backend, lp_relaxation_bound,
                                          solve_model)
from tangram_opt.solvers.protocol import ProgressPoint, SolveOptions, SolveResult, SolveStatus, relative_gap
from tangram_opt.solvers.model import ArrayConstraint, Constraint, LinearModel, LinExpr, ModelStats, Var, lsum

__all__ = ["BACKENDS", "DEFAULT_BACKEND", "ProgressPoint", "SolveOptions", "SolveResult", "SolveStatus",
           "available_backends", "get_backend", "lp_relaxation_bound", "relative_gap", "solve_model", "ArrayConstraint",
           "Constraint", "LinearModel", "LinExpr", "ModelStats", "Var", "lsum"]
