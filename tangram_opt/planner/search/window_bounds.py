"""Bounding one window of the branch and bound: its aggregated model and LP relaxation.

A window (:class:`Window`: a period range, optionally a tail range, a stage-count range and the
stage types an enclosing window's LP excluded) is bounded by building its aggregated model
(formulations/aggregated.py) and solving that model's LP relaxation with the target as cutoff,
which also fixes the columns no better plan uses (reduced costs). :func:`bound_model` does the
second part for a model already built; :func:`bound_in_worker` both parts in a worker process
(solvers/workers.py), from the sub-problem and stage types the worker holds, and sends back only
the numbers (:class:`WindowBound`): a window's model is 3-19 MB pickled on the
communication-bound family, its bound and fixings a few kB. Either way the search gets the same
bound for the same window and cutoff (formulations/pipeline_mip.md, "Solver processes").
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from tangram_opt.planner.formulations.aggregated import AggregatedMIP
from tangram_opt.planner.formulations.positional import PositionalMIP
from tangram_opt.planner.formulations.problem import FormulationOptions, PipelineProblem
from tangram_opt.planner.formulations.stage_types import StageType, enumerate_types
from tangram_opt.planner.formulations.ticks import rounding_ticks
from tangram_opt.planner.search.nodes import InFlight, Node, SubProblem
from tangram_opt.solvers import lp_relaxation_bound
from tangram_opt.solvers.workers import Shared

#: keys of the sub-problems' stage types in the worker processes (``SubProblem.shared``)
_SHARED_KEYS = itertools.count()


@dataclass(frozen=True, slots=True)
class Window:
    """Plans whose slowest stage lies in [lo_s, hi_s], whose largest step tail lies in
    (tail_lo_s, tail_hi_s] (no lower edge when None), of ``stages`` stage counts (None: any),
    without the stage types in ``excluded``."""

    lo_s: float
    hi_s: float
    tail_lo_s: float | None = None
    tail_hi_s: float = math.inf
    excluded: frozenset = frozenset()
    stages: tuple[int, int] | None = None


@dataclass(slots=True)
class WindowBound:
    """What bounding a window found. ``bound_s`` is infinite when no plan in it beats the target
    (no stage type left, or an infeasible LP); ``model_size`` (rows, columns, integer columns) is
    None when no model was built; ``mip`` is the model itself where it was built in this process."""

    bound_s: float
    fixed: frozenset = frozenset()
    #: the largest step tail of the window's stage types (None: not an aggregated model)
    max_tail_s: float | None = None
    model_size: tuple[int, int, int] | None = None
    lp_solved: bool = False
    mip: AggregatedMIP | PositionalMIP | None = None
    #: seconds building the model (or restricting its parent's) and solving its LP relaxation
    #: (HiGHS's simplex and handing the model over): where a window's bound goes
    build_s: float = 0.0
    lp_s: float = 0.0


def with_stages(problem: PipelineProblem, stages: tuple[int, int] | None) -> PipelineProblem:
    """``problem`` restricted to pipelines of ``stages[0] .. stages[1]`` stages."""
    if stages is None:
        return problem
    return replace(problem, min_stages=max(problem.min_stages, stages[0]), max_stages=min(problem.max_stages, stages[1]))


def build_aggregated(problem: PipelineProblem, types: dict[str, list[StageType]], options: FormulationOptions,
                     window: Window) -> AggregatedMIP | None:
    """The window's aggregated model, or None when no stage type is left in it."""
    mip = AggregatedMIP(with_stages(problem, window.stages), options, all_types=types, lower_tmax_s=window.lo_s,
                        upper_tmax_s=window.hi_s, lower_tail_s=window.tail_lo_s, upper_tail_s=window.tail_hi_s,
                        excluded_types=window.excluded)
    mip.build()
    return None if mip.empty else mip


def bound_model(mip: AggregatedMIP | PositionalMIP | None, window: Window, *, quick_bound_s: float,
                target_s: float | None, lp_time_limit_s: float) -> WindowBound:
    """Bound a built window model by its LP relaxation, the target (``target_s``, None without an
    incumbent) as cutoff: the LP optimum less the rounding margin of the model's ticks, and never
    below the sub-problem's quick bound ``quick_bound_s`` when the window starts at 0."""
    if mip is None:
        return WindowBound(math.inf)
    size = mip.model.size()
    tick = mip.options.tick_s
    started = time.perf_counter()
    lp = lp_relaxation_bound(mip.model, time_limit_s=lp_time_limit_s,
                             cutoff=None if target_s is None else target_s / tick)
    lp_s = time.perf_counter() - started
    if lp is not None and math.isinf(lp):
        return WindowBound(math.inf, model_size=size, lp_solved=True, mip=mip, lp_s=lp_s)
    slack = rounding_ticks(mip.problem.num_micro_batches) * tick
    bound = quick_bound_s if lp is None else max(quick_bound_s if window.lo_s <= 0 else 0.0, lp * tick - slack)
    if isinstance(mip, AggregatedMIP):
        tails = [t.tail_s for ts in mip.types.values() for t in ts]
        return WindowBound(bound, mip.fixed_types(), max(tails, default=0.0), size, True, mip, lp_s=lp_s)
    return WindowBound(bound, model_size=size, lp_solved=True, mip=mip, lp_s=lp_s)


def bound_in_worker(shared: tuple[PipelineProblem, dict[str, list[StageType]]], options: FormulationOptions,
                    window: Window, arguments: dict[str, Any]) -> WindowBound:
    """:func:`build_aggregated` and :func:`bound_model` (with ``arguments``) in a worker process,
    from the sub-problem and stage types it holds (``shared``); the model stays behind."""
    problem, types = shared
    started = time.perf_counter()
    mip = build_aggregated(problem, types, options, window)
    build_s = time.perf_counter() - started
    found = bound_model(mip, window, **arguments)
    found.mip, found.build_s = None, build_s
    return found


class WindowBounds:
    """The window bounds of :class:`~tangram_opt.planner.search.branch_and_bound.BranchAndBound` (a
    mixin: it uses the search's sub-problems, incumbent, target, formulation options and workers)."""

    __slots__ = ()

    with_stages = staticmethod(with_stages)

    def set_types(self, sub: SubProblem, types: dict[str, list[StageType]]) -> None:
        sub.types, sub.shared = types, None
        sub.info["stage_types"] = {r: len(v) for r, v in types.items()}

    def build(self, sub: SubProblem, window: Window, *, classes: bool = True) -> AggregatedMIP | PositionalMIP | None:
        """``window``'s model; without the neighbour-class rows unless ``classes`` (and the options have them)."""
        fopts = self.formulation_options(sub)
        if not classes:
            fopts = replace(fopts, neighbour_classes=False)
        if self.formulation == "positional":
            return PositionalMIP(sub.problem, fopts).build()
        if sub.types is None:
            self.set_types(sub, enumerate_types(sub.problem, fopts.cutoff_s))
        assert sub.types is not None
        return build_aggregated(sub.problem, sub.types, fopts, window)

    def bound_here(self, sub: SubProblem, window: Window, parent: AggregatedMIP | None = None) -> WindowBound:
        """Build ``window``'s model (or restrict ``parent``, the model of the same window over all
        stage counts, to its stage counts) and bound it by its LP relaxation."""
        started = time.perf_counter()
        if parent is not None and window.stages is not None:
            mip: AggregatedMIP | PositionalMIP | None = parent.with_stage_range(*window.stages)
            if mip.empty:  # type: ignore[union-attr]
                mip = None
        else:
            mip = self.build(sub, window)
        build_s = time.perf_counter() - started
        found = bound_model(mip, window, **self.bound_arguments(sub))
        found.build_s = build_s
        return found

    def bound_arguments(self, sub: SubProblem) -> dict[str, Any]:
        """``bound_model``'s arguments. An LP gets at most the time left (at least 0.1 s), where
        its floor of a second let an LP started near the end (or in the multi-pipeline level's
        sub-cluster searches of half a second) run past the limit; one that stops unfinished
        leaves its window at its enclosing window's bound."""
        return {"quick_bound_s": sub.lower_bound_s,
                "target_s": self.target_s() if math.isfinite(self.inc_s) else None,
                "lp_time_limit_s": min(max(1.0, self.time_limit_s / 10), max(0.1, self.remaining()))}

    def window_node(self, sub: SubProblem, window: Window, found: WindowBound, built_cutoff_s: float | None
                    ) -> Node | None:
        """The node of a bounded window (None: nothing in it beats the target), counted in the
        sub-problem's statistics."""
        sub.info["windows"] += 1
        if found.model_size is not None:
            for name, value in zip(("rows", "columns", "integers"), found.model_size):
                sub.info.setdefault(name, value)
        if found.lp_solved:
            sub.info["lp_solves"] += 1
        for key, seconds in (("window_build_s", found.build_s), ("window_lp_s", found.lp_s)):
            sub.info[key] = sub.info.get(key, 0.0) + seconds
        if math.isinf(found.bound_s):
            return None
        return Node(bound_s=found.bound_s, b=sub.b, lo_s=window.lo_s, hi_s=window.hi_s, mip=found.mip,
                    tail_lo_s=window.tail_lo_s, tail_hi_s=window.tail_hi_s, excluded_types=found.fixed,
                    stages=window.stages, max_tail_s=found.max_tail_s, built_cutoff_s=built_cutoff_s)

    def evaluate(self, sub: SubProblem, lo: float, hi: float, tail_lo: float | None = None, tail_hi: float = math.inf,
                 excluded: frozenset = frozenset(), stages: tuple[int, int] | None = None,
                 parent: AggregatedMIP | None = None) -> Node | None:
        """Build the window's model and bound it by its LP relaxation, here (None: nothing in it).
        ``excluded``: stage types an enclosing window's LP fixed to 0 (reduced costs); ``stages``:
        only pipelines of that many stages; ``parent``: the model of the same window (all stage
        counts), restricted instead of built again."""
        window = Window(lo, hi, tail_lo, tail_hi, excluded, stages)
        built = self.formulation_options(sub).cutoff_s
        return self.window_node(sub, window, self.bound_here(sub, window, parent), built)

    def evaluate_then(self, sub: SubProblem, window: Window, bound_s: float, done: Callable[[Node | None], None],
                      parent: AggregatedMIP | None = None) -> None:
        """Bound ``window`` and hand its node (None: nothing in it) to ``done``: in an idle worker
        process while the search goes on (the window counts as open at ``bound_s``, its enclosing
        window's bound, until then), else here. A window a worker bounds has no model in this
        process (``Node.mip`` None): a leaf builds its own, and its children are built anew."""
        worker = self.pool.idle_worker() if self.pool is not None and self.formulation == "aggregated" else None
        options = self.formulation_options(sub)
        built = options.cutoff_s
        if worker is None or sub.types is None:
            done(self.window_node(sub, window, self.bound_here(sub, window, parent), built))
            return
        if sub.shared is None:
            types = sub.types
            sub.shared = Shared(key=next(_SHARED_KEYS), make=lambda: (sub.problem, types))
        future = worker.call(bound_in_worker, (options, window, self.bound_arguments(sub)), shared=sub.shared)
        waiting = Node(bound_s=bound_s, b=sub.b, lo_s=window.lo_s, hi_s=window.hi_s, tail_lo_s=window.tail_lo_s,
                       tail_hi_s=window.tail_hi_s, excluded_types=window.excluded, stages=window.stages)
        self.inflight.append(InFlight(future, waiting, lambda found: done(self.window_node(sub, window, found, built)),
                                      lambda: self.bound_here(sub, window), time.perf_counter()))


__all__ = ["Window", "WindowBound", "WindowBounds", "bound_in_worker", "bound_model", "build_aggregated", "with_stages"]
