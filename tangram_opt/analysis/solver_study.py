"""Data for studying how hard the planner's MIPs are: search traces, anytime gaps and model sizes.

These helpers turn what :func:`tangram_opt.solve` already exposes (the ``on_progress`` callback,
``Plan.certificate.trajectory`` and ``Plan.certificate.subproblems``) into pandas tables, and build
the per-sub-problem models *without solving them* so their size and LP bound can be compared across
formulations and cluster sizes. docs/notebooks/solver_gaps.ipynb is written on top of them::

    from tangram_opt.analysis.solver_study import solve_traced, formulation_sizes
    run = solve_traced("tiny-mixed", "opt-350m", time_limit_s=5, backend="highs")
    run.trajectory            # elapsed_s, incumbent_s, bound_s, gap, message (one row per search event)
    run.summary()             # objective, bound, gap, root bound, time to 1% gap, model size, ...
    formulation_sizes("tiny-mixed", "opt-350m", formulation="positional")   # rows, columns, LP bound

Times are wall-clock seconds from the start of ``solve`` (candidate generation included), as in
the certificate. The "root bound" is the global bound once every sub-problem's root LP is solved
(the search's ``"root bounds"`` event), i.e. what the formulation gives before any branching.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

import pandas as pd

from tangram_opt.errors import NoSolutionError, SpecError
from tangram_opt.planner.context import PlanningContext
from tangram_opt.planner.formulations.aggregated import AggregatedMIP
from tangram_opt.planner.formulations.bounds import fluid_bottleneck_s, quick_lower_bound
from tangram_opt.planner.formulations.knapsack_bound import knapsack_bottleneck_s
from tangram_opt.planner.formulations.positional import PositionalMIP
from tangram_opt.planner.formulations.problem import FormulationOptions
from tangram_opt.planner.formulations.stage_types import enumerate_types
from tangram_opt.planner.formulations.ticks import tick_for
from tangram_opt.planner.plan import Plan
from tangram_opt.planner.search import FORMULATIONS, SearchEvent, SearchOptions, solve
from tangram_opt.planner.search.api import planning_inputs
from tangram_opt.planner.space import SearchSpace
from tangram_opt.solvers import lp_relaxation_bound, relative_gap
from tangram_opt.specs.cluster import Cluster
from tangram_opt.specs.model import ModelSpec
from tangram_opt.specs.training import TrainingSpec

#: message of the search event emitted once every sub-problem's root LP is solved (branch_and_bound.py)
ROOT_EVENT = "root bounds"

TRAJECTORY_COLUMNS = ("elapsed_s", "incumbent_s", "bound_s", "gap", "message")
#: the keywords :func:`solve_traced` puts into ``options=SearchOptions(...)``
_OPTION_FIELDS = frozenset(f.name for f in fields(SearchOptions))


# --- traces of one solve ---------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class SolveTrace:
    """One ``solve`` call: the plan (None if no plan was found in time), every progress event the
    search reported, and the wall time of the call.

    ``error`` holds the message of a :class:`~tangram_opt.errors.NoSolutionError` (time ran out
    before any plan); other errors are raised, not recorded.
    """

    plan: Plan | None
    events: tuple[SearchEvent, ...]
    wall_s: float
    error: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)

    @property
    def trajectory(self) -> pd.DataFrame:
        """One row per search event: elapsed_s, incumbent_s, bound_s, gap, message."""
        return trajectory_frame(self.events)

    @property
    def root_bound_s(self) -> float | None:
        """Global lower bound after the root LPs of every sub-problem (before any branching)."""
        for ev in self.events:
            if ev.message == ROOT_EVENT:
                return ev.bound_s
        return None

    def summary(self, targets: Iterable[float] = (0.01,)) -> dict[str, Any]:
        """One flat row: outcome, bounds, times to reach each relative gap in ``targets``, and the
        work done (LP/MIP solves, windows, largest sub-problem model) from the certificate."""
        row: dict[str, Any] = {"wall_s": self.wall_s, "error": self.error}
        cert = self.plan.certificate if self.plan is not None else None
        if cert is None:
            row.update(status="no plan", objective_s=math.nan, bound_s=math.nan, gap=math.nan)
        else:
            row.update(status=cert.status, objective_s=cert.objective_s,
                       bound_s=math.nan if cert.bound_s is None else cert.bound_s,
                       gap=math.nan if cert.gap is None else cert.gap, solve_time_s=cert.solve_time_s)
        root = self.root_bound_s
        row["root_bound_s"] = math.nan if root is None else root
        row["root_gap"] = (relative_gap(row["objective_s"], root)
                           if root is not None and math.isfinite(row["objective_s"]) else math.nan)
        traj = self.trajectory
        for g in targets:
            t = time_to_gap(traj, g)
            row[f"time_to_{_pct(g)}_s"] = math.nan if t is None else t
        subs = subproblem_frame(self.plan) if self.plan is not None else pd.DataFrame()
        for col, how in (("lp_solves", "sum"), ("mip_solves", "sum"), ("windows", "sum"), ("solve_time_s", "sum"),
                         ("rows", "max"), ("columns", "max"), ("integers", "max")):
            row[("backend_time_s" if col == "solve_time_s" else col) + ("_max" if how == "max" else "")] = (
                float(getattr(subs[col], how)()) if col in subs and subs[col].notna().any() else math.nan)
        row["subproblems"] = len(subs)
        return row


def solve_traced(cluster: Cluster | str, model: ModelSpec | str, training: TrainingSpec | dict | None = None,
                 **solve_kwargs: Any) -> SolveTrace:
    """Run :func:`tangram_opt.solve` with a progress recorder; every keyword goes to ``solve``, and the
    research knobs may be given by name too (``warm_start=False``, ``windows=False``, ...: the fields
    of :class:`~tangram_opt.planner.search.SearchOptions`, put into ``options``).

    A user ``on_progress`` callback is still called. A run that found no plan in time returns a
    trace with ``plan=None`` and the error message instead of raising.
    """
    given = dict(solve_kwargs)
    knobs = {k: solve_kwargs.pop(k) for k in list(solve_kwargs) if k in _OPTION_FIELDS}
    if knobs:
        solve_kwargs["options"] = replace(solve_kwargs.get("options") or SearchOptions(), **knobs)
    events: list[SearchEvent] = []
    user_cb = solve_kwargs.pop("on_progress", None)

    def record(ev: SearchEvent) -> None:
        events.append(ev)
        if user_cb is not None:
            user_cb(ev)

    t0 = time.perf_counter()
    plan, error = None, None
    try:
        plan = solve(cluster, model, training, on_progress=record, **solve_kwargs)
    except NoSolutionError as e:
        error = str(e)
    given.pop("on_progress", None)
    return SolveTrace(plan=plan, events=tuple(events), wall_s=time.perf_counter() - t0, error=error, options=given)


# --- trajectories ----------------------------------------------------------------------------
def trajectory_frame(source: Plan | Iterable[SearchEvent] | Iterable[tuple]) -> pd.DataFrame:
    """Incumbent and bound over time as a DataFrame (columns :data:`TRAJECTORY_COLUMNS`).

    ``source`` is a plan (its ``certificate.trajectory``, without messages), search events from an
    ``on_progress`` callback, or ``(elapsed_s, incumbent_s, bound_s)`` tuples.
    """
    if isinstance(source, Plan):
        source = source.certificate.trajectory if source.certificate is not None else ()
    rows = []
    for p in source:
        if isinstance(p, SearchEvent):
            t, inc, bnd, msg = p.elapsed_s, p.incumbent_s, p.bound_s, p.message
        else:
            t, inc, bnd = p[:3]
            msg = ""
        rows.append({"elapsed_s": float(t), "incumbent_s": math.nan if inc is None else float(inc),
                     "bound_s": math.nan if bnd is None else float(bnd), "message": msg})
    df = pd.DataFrame(rows, columns=["elapsed_s", "incumbent_s", "bound_s", "message"])
    df["gap"] = [relative_gap(i, b) if math.isfinite(i) and math.isfinite(b) else math.nan
                 for i, b in zip(df["incumbent_s"], df["bound_s"])]
    return df[list(TRAJECTORY_COLUMNS)]


def gap_at(trajectory: pd.DataFrame, t_s: float) -> float:
    """Relative gap known ``t_s`` seconds into the run (the last event at or before ``t_s``;
    NaN before the first event or while there is no incumbent)."""
    known = trajectory[trajectory["elapsed_s"] <= t_s]
    return float(known["gap"].iloc[-1]) if len(known) else math.nan


def time_to_gap(trajectory: pd.DataFrame, target: float) -> float | None:
    """First elapsed time at which the gap is at most ``target`` (None if never reached)."""
    hit = trajectory[trajectory["gap"] <= target + 1e-12]
    return float(hit["elapsed_s"].iloc[0]) if len(hit) else None


def subproblem_frame(plan: Plan) -> pd.DataFrame:
    """``plan.certificate.subproblems`` as a DataFrame, one row per pipeline micro-batch size.

    The ``stage_types`` dict (aggregated formulation: types per role) becomes ``stage_types``, the
    total. ``rows``/``columns``/``integers`` are those of the sub-problem's first window model (built
    with the incumbent known at that point as cutoff); NaN where no model was built.
    """
    cert = plan.certificate
    rows = []
    for s in (cert.subproblems if cert is not None else ()):
        r = dict(s)
        st = r.pop("stage_types", None)
        r["stage_types"] = sum(st.values()) if isinstance(st, Mapping) else math.nan
        rows.append(r)
    df = pd.DataFrame(rows)
    for col in ("rows", "columns", "integers", "lp_bound_s"):
        if col not in df:
            df[col] = math.nan
    return df


# --- model sizes without solving -------------------------------------------------------------
#: the modelling options of :func:`formulation_sizes` (defaults: the planner's)
SIZE_OPTIONS = ("formulation", "windows", "fluid_cuts", "mccormick_cuts", "tail_averages", "knapsack", "cutoff_s",
                "lp_bound")


def formulation_sizes(cluster: Cluster | str, model: ModelSpec | str, training: TrainingSpec | dict | None = None, *,
                      space: SearchSpace | None = None, formulation: str = "aggregated", windows: bool = True,
                      fluid_cuts: bool = True, mccormick_cuts: bool = True, tail_averages: bool = True,
                      knapsack: bool = True,
                      cutoff_s: float | None = None,
                      lp_bound: bool = True, lp_time_limit_s: float = 60.0,
                      pipeline_micro_batches: Iterable[int] | None = None,
                      variants: Iterable[Mapping[str, Any]] | None = None) -> pd.DataFrame:
    """Build (without solving) each sub-problem's root model and report its size and LP bound.

    One row per pipeline micro-batch size ``b`` (and per variant): candidates, stage types
    (aggregated), rows, columns, integer and binary columns, nonzeros, the quick (solver-free)
    bound, the LP relaxation bound (HiGHS) in seconds, and the build / LP times. Like the MIPs,
    the LP bounds cover pipelines of two or more stages (one-stage pipelines are enumerated
    exactly by the search, outside the models).

    - ``windows``: the root node of ``SearchOptions(windows=True)`` (aggregated, 1F1B): the bottleneck in
      ``[fluid bound, cutoff / m]``, or up to the slowest stage type without a cutoff. False: the
      window ``[0, inf)`` of ``SearchOptions(windows=False)``. The positional formulation has no windows
      (its rows report ``windows=None``).
    - ``knapsack`` (aggregated, 1F1B): raise the window's lower end to the layer-covering knapsack
      bound on the bottleneck (planner/formulations/knapsack_bound.py), as ``SearchOptions(knapsack=True)`` does.
    - ``cutoff_s`` (the step time of a known plan) drops columns that cannot beat it, as the
      search does with its incumbent; None builds the full model.
    - ``mccormick_cuts`` (aggregated only; None in positional rows) is not a ``solve`` option: it
      shows what that family of cuts adds to the LP bound; so does ``tail_averages`` (aggregated only:
      the rows that average the stages' tails, formulations/pipeline_mip.md §3).
    - ``variants``: several option sets (mappings over :data:`SIZE_OPTIONS`, the keywords giving the
      defaults) compared on one candidate table, which is built only once.
    """
    base = {"formulation": formulation, "windows": windows, "fluid_cuts": fluid_cuts,
            "mccormick_cuts": mccormick_cuts, "tail_averages": tail_averages, "knapsack": knapsack,
            "cutoff_s": cutoff_s, "lp_bound": lp_bound}
    configs = []
    for v in (variants if variants is not None else [{}]):
        unknown = set(v) - set(SIZE_OPTIONS)
        if unknown:
            raise SpecError("variants", sorted(unknown), "are not options of formulation_sizes",
                            f"use keys among {', '.join(SIZE_OPTIONS)}")
        cfg = {**base, **v}
        if cfg["formulation"] not in FORMULATIONS:
            raise SpecError("formulation", cfg["formulation"], "is not a known formulation",
                            f"use one of {', '.join(FORMULATIONS)}")
        configs.append(cfg)
    cluster, model, training = planning_inputs(cluster, model, training)
    ctx = PlanningContext(cluster, model, training, space=space or SearchSpace())
    bs = ctx.pipeline_micro_batches() if pipeline_micro_batches is None else sorted(set(pipeline_micro_batches))
    out = []
    for b in bs:
        t0 = time.perf_counter()
        prob = ctx.problem(b)
        quick = quick_lower_bound(prob)
        cands_s = time.perf_counter() - t0
        types_by_cutoff: dict[float | None, Any] = {}  # stage types depend only on the cutoff
        for cfg in configs:
            row: dict[str, Any] = {"pipeline_micro_batch": b, "micro_batches": prob.num_micro_batches, **cfg,
                                   "candidates": len(prob.candidates), "candidates_s": cands_s,
                                   "quick_bound_s": quick, "stage_types": math.nan}
            if cfg["formulation"] == "positional":  # options it does not have are reported as None
                row.update(windows=None, mccormick_cuts=None, tail_averages=None, knapsack=None)
            if not prob.candidates or ctx.max_stages < 2:
                row["status"] = "no candidate" if not prob.candidates else "one stage only"
            else:
                row.update(_root_model_row(prob, ctx.space.schedule, cfg, quick, lp_time_limit_s, types_by_cutoff))
            out.append(row)
    return pd.DataFrame(out)


def _root_model_row(prob: Any, schedule: str, cfg: Mapping[str, Any], quick_s: float, lp_time_limit_s: float,
                    types_by_cutoff: dict[float | None, Any]) -> dict[str, Any]:
    """Build one sub-problem's root model with the options ``cfg``; its size and LP bound."""
    row: dict[str, Any] = {"window_lo_s": 0.0, "window_hi_s": math.inf}
    t1 = time.perf_counter()
    cutoff = cfg["cutoff_s"]
    ref = cutoff if cutoff is not None else quick_s * 2  # the search's time unit (BranchAndBound.formulation_options)
    opts = FormulationOptions(fluid_cuts=cfg["fluid_cuts"], mccormick_cuts=cfg["mccormick_cuts"], cutoff_s=cutoff,
                              tick_s=tick_for(ref), tail_averages=cfg["tail_averages"])
    if cfg["formulation"] == "positional":
        mip: AggregatedMIP | PositionalMIP = PositionalMIP(prob, opts).build()
        empty = False
    else:
        if cutoff not in types_by_cutoff:
            types_by_cutoff[cutoff] = enumerate_types(prob, cutoff)
        types = types_by_cutoff[cutoff]
        row["stage_types"] = sum(len(v) for v in types.values())
        lo, hi = 0.0, math.inf
        if cfg["windows"] and schedule == "1f1b":
            m = prob.num_micro_batches
            lo = fluid_bottleneck_s(prob)
            if cutoff is not None:
                hi = cutoff / m
            else:
                hi = max((t.time_s for ts in types.values() for t in ts), default=lo)
                hi = max(hi, max(prob.link_hi_s.values()), lo)
        if cfg["knapsack"] and schedule == "1f1b":
            lo = max(lo, knapsack_bottleneck_s(prob, types))
            if not math.isfinite(lo) or lo > hi:
                row.update(window_lo_s=lo, window_hi_s=hi, build_s=time.perf_counter() - t1,
                           status="no multi-stage plan (knapsack bound above the window)")
                return row
        row.update(window_lo_s=lo, window_hi_s=hi)
        agg = AggregatedMIP(prob, opts, all_types=types, lower_tmax_s=lo, upper_tmax_s=hi)
        agg.build()
        mip, empty = agg, agg.empty
    row["build_s"] = time.perf_counter() - t1
    if empty:
        row["status"] = "no multi-stage model (no stage type fits)"
        return row
    st = mip.model.stats()
    row.update(rows=st.rows, columns=st.columns, integers=st.integer_columns, binaries=st.binary_columns,
               nonzeros=st.nonzeros, status="built")
    if cfg["lp_bound"]:
        t2 = time.perf_counter()
        lp = lp_relaxation_bound(mip.model, time_limit_s=lp_time_limit_s)
        row["lp_s"] = time.perf_counter() - t2
        row["lp_bound_s"] = math.nan if lp is None else lp * opts.tick_s
        if lp is not None and math.isinf(lp):
            row["status"] = "LP infeasible (nothing in the window)"
    return row


def _pct(g: float) -> str:
    """0.01 -> '1pct', 0.001 -> '0.1pct' (column names)."""
    return f"{100 * g:g}pct"


__all__ = ["ROOT_EVENT", "SIZE_OPTIONS", "TRAJECTORY_COLUMNS", "SolveTrace", "formulation_sizes", "gap_at",
           "solve_traced", "subproblem_frame", "time_to_gap", "trajectory_frame"]
