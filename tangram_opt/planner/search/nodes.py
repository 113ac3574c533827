"""What the branch and bound keeps: progress events, sub-problems, nodes (windows) and leaves in flight.

A sub-problem (:class:`SubProblem`) is one pipeline micro-batch size ``b``; a node (:class:`Node`)
is a window ``[lo, hi]`` on its bottleneck stage time (optionally also on the largest step tail,
or on the stage count) with a lower bound on every plan inside it; an :class:`InFlight` is a
node a worker process is working on: a leaf whose MIP it solves, or a window it bounds.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from tangram_opt.planner.formulations.aggregated import AggregatedMIP
from tangram_opt.planner.formulations.positional import PositionalMIP
from tangram_opt.planner.formulations.problem import PipelineProblem, StageChoice
from tangram_opt.planner.formulations.stage_types import StageType
from tangram_opt.solvers import relative_gap
from tangram_opt.solvers.workers import Shared


@dataclass(frozen=True, slots=True)
class SearchEvent:
    """Progress of the whole search: global incumbent and bound after ``elapsed_s`` seconds."""

    elapsed_s: float
    incumbent_s: float | None
    bound_s: float | None
    message: str = ""

    @property
    def gap(self) -> float | None:
        if self.incumbent_s is None or self.bound_s is None:
            return None
        return relative_gap(self.incumbent_s, self.bound_s)


@dataclass(slots=True)
class SubProblem:
    """One pipeline micro-batch size and what the search learned about it."""

    b: int
    problem: PipelineProblem
    lower_bound_s: float
    status: str = "open"
    single_s: float | None = None
    objective_s: float | None = None
    #: the best plan's slowest stage time: the bottleneck window it lies in
    best_t_max_s: float | None = None
    #: largest step tail of a stage of that plan (primal dives follow it into tail windows)
    best_tail_max_s: float | None = None
    #: that plan's stages (the neighbourhood search starts from it)
    best_choices: list[StageChoice] | None = None
    solve_time_s: float = 0.0
    types: dict[str, list[StageType]] | None = None
    #: ``(problem, types)`` as worker processes receive it (solvers/workers.py ``Shared``): made
    #: when a window first goes to a worker, dropped when ``types`` changes
    shared: Shared | None = None
    info: dict[str, Any] = field(default_factory=lambda: {"windows": 0, "lp_solves": 0, "mip_solves": 0})


@dataclass(slots=True)
class InFlight:
    """A node a worker process is working on (it counts as open, with its bound, until then):
    ``done`` takes the future's result; ``here`` does the same work in this process, for when
    the worker failed."""

    future: Future
    node: Node
    done: Callable[[Any], None]
    here: Callable[[], Any]
    started: float


@dataclass(order=True, slots=True)
class Node:
    """A window [lo, hi] on the bottleneck time of sub-problem ``b`` with a lower bound."""

    bound_s: float
    b: int = field(compare=False)
    lo_s: float = field(compare=False)
    hi_s: float = field(compare=False)
    mip: AggregatedMIP | PositionalMIP | None = field(default=None, compare=False)
    tries: int = field(default=0, compare=False)
    #: lower bound of the support classes cut off this window's model (their exact best plans)
    excluded_s: float = field(default=math.inf, compare=False)
    #: window on the largest step tail of any stage: (tail_lo, tail_hi]; None: no lower edge
    tail_lo_s: float | None = field(default=None, compare=False)
    tail_hi_s: float = field(default=math.inf, compare=False)
    #: stage types no plan of this window better than the incumbent uses (``AggregatedMIP.fixed_types``)
    excluded_types: frozenset = field(default=frozenset(), compare=False)
    #: stage counts (first, last) of the plans this node holds; None: any
    stages: tuple[int, int] | None = field(default=None, compare=False)
    #: the largest step tail of the window's stage types (None: not known, e.g. no aggregated model)
    max_tail_s: float | None = field(default=None, compare=False)
    #: the incumbent the window's model was built against (its cutoff; None: none)
    built_cutoff_s: float | None = field(default=None, compare=False)
    #: a sequence leaf solves with the aggregated rows joined (``SequenceMIP.relaxation``): it came
    #: back unfinished with a dual bound below the window's aggregated bound
    joined: bool = field(default=False, compare=False)

    def describe(self) -> str:
        text = f"[{1e3 * self.lo_s:.2f}, {1e3 * self.hi_s:.2f}] ms"
        if self.stages is not None:
            a, z = self.stages
            text += f", {a} stages" if a == z else f", {a}-{z} stages"
        if self.tail_lo_s is not None or math.isfinite(self.tail_hi_s):
            lo = 0.0 if self.tail_lo_s is None else self.tail_lo_s
            hi = "inf" if not math.isfinite(self.tail_hi_s) else f"{1e3 * self.tail_hi_s:.0f}"
            text += f", tail ({1e3 * lo:.0f}, {hi}] ms"
        return text


__all__ = ["InFlight", "Node", "SearchEvent", "SubProblem"]
