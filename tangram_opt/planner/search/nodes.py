"""What the branch and bound keeps: progress events, sub-problems, nodes (windows) and leaves in flight.

A sub-problem (:class:`SubProblem`) is one pipeline micro-batch size ``b``; a node (:class:`Node`)
is a window ``[lo, hi]`` on its bottleneck stage time (optionally also on the largest step tail,
or on the stage count) with a lower bound on every plan inside it; a :class:`LeafInFlight` is a
node whose MIP a worker process is solving.
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
from tangram_opt.solvers import SolveOptions, relative_gap
from tangram_opt.solvers.model import LinearModel


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
    info: dict[str, Any] = field(default_factory=lambda: {"windows": 0, "lp_solves": 0, "mip_solves": 0})


@dataclass(slots=True)
class LeafInFlight:
    """A leaf whose MIP is being solved by a worker process; ``done`` takes its result."""

    future: Future
    node: Node
    model: LinearModel
    options: SolveOptions
    done: Callable[[Any], None]
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


__all__ = ["LeafInFlight", "Node", "SearchEvent", "SubProblem"]
