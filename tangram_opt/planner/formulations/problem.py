"""What every pipeline formulation reads and returns: numbers only, never the cost model.

- :class:`PipelineProblem`: one sub-problem (one pipeline micro-batch size ``b``, so a fixed number
  of micro-batches ``m``): the candidate rows, the layers to place, the GPUs per island and the p2p
  paths between islands;
- :class:`StageChoice`: a decoded stage (candidate index, layers per kind), what every model's
  ``decode`` returns and every ``hint_from`` reads;
- :class:`FormulationOptions`: how a model is built (cut families, cutoff, time unit);
- :func:`choices_timing`: the closed form (pipeline_model.py) of a list of stage choices.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from tangram_opt.planner.candidates.table import BoundaryLink, Candidate, boundary_time_s
from tangram_opt.planner.formulations.pipeline_model import PipelineTiming, pipeline_timing


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineProblem:
    """Everything the formulation sees: numbers only (no cost model).

    A stage boundary's p2p time depends on both stages' candidates and on the path between their
    islands (:func:`~tangram_opt.planner.candidates.table.boundary_time_s`): ``boundary_s`` gives it
    exactly; the models bound it linearly with the per-candidate side times and the island-pair
    tables ``link_lo_s`` / ``link_hi_s`` (the fastest / slowest boundary any two candidates of
    the two islands can have, formulations/pipeline_mip.md §1).
    """

    candidates: Sequence[Candidate]
    kinds: tuple[str, ...]  # layer kinds in model order (dense first)
    layers: dict[str, int]  # kind -> number of layers
    island_gpus: dict[int, int]  # island index -> GPUs available
    links: dict[tuple[int, int], BoundaryLink]  # (src island, dst island) -> path of the p2p traffic
    num_micro_batches: int  # m
    pipeline_micro_batch: int  # b
    max_stages: int
    min_stages: int = 1
    schedule: str = "1f1b"
    #: island index -> its price curve, cheapest GPUs first: ``((GPUs, USD per GPU-hour), ...)``.
    #: Using ``n`` GPUs of the island costs the first ``n`` along the steps (convex, piecewise
    #: linear; one step when the island has one price). Empty: no prices (the step-time objective)
    island_prices: dict[int, tuple[tuple[int, float], ...]] = field(default_factory=dict)
    #: (island, island) -> USD one micro-batch's stage boundary between them costs in cross-zone
    #: transfer (activations one way, their gradients back, at the zone link's ``egress_usd_per_gb``).
    #: Empty: no priced zone link. Only the cost-per-token objective charges it (USD per step)
    link_egress_usd: dict[tuple[int, int], float] = field(default_factory=dict)
    link_lo_s: dict[tuple[int, int], float] = field(init=False, repr=False, compare=False)
    link_hi_s: dict[tuple[int, int], float] = field(init=False, repr=False, compare=False)
    #: per island: which kinds of path (scale-up or not) touch it, and their smallest latency
    _path_kinds: dict[int, tuple[bool, ...]] = field(init=False, repr=False, compare=False)
    _latency_lo: dict[int, float] = field(init=False, repr=False, compare=False)
    #: candidate index -> ``link_floor_s``, filled on first use: every window's model reads it for
    #: each stage type of the candidate, and the windows of a sub-problem share its problem
    _link_floor: dict[int, float] = field(init=False, repr=False, compare=False, default_factory=dict)

    def __post_init__(self) -> None:
        lo_side: dict[tuple[int, bool], float] = {}
        hi_side: dict[tuple[int, bool], float] = {}
        for c in self.candidates:
            for scale_up, t in ((False, c.p2p_nic_s), (True, c.p2p_scale_up_s)):
                key = (c.island, scale_up)
                lo_side[key] = min(t, lo_side.get(key, math.inf))
                hi_side[key] = max(t, hi_side.get(key, 0.0))
        lo, hi = {}, {}
        for (i, j), lk in self.links.items():
            k_i, k_j = (i, lk.scale_up), (j, lk.scale_up)
            lo[i, j] = lk.latency_s + max(lo_side.get(k_i, 0.0), lo_side.get(k_j, 0.0), lk.shared_s)
            hi[i, j] = lk.latency_s + max(hi_side.get(k_i, 0.0), hi_side.get(k_j, 0.0), lk.shared_s)
        object.__setattr__(self, "link_lo_s", lo)
        object.__setattr__(self, "link_hi_s", hi)
        kinds: dict[int, set[bool]] = {}
        lat: dict[int, float] = {}
        for (i, j), lk in self.links.items():
            for end in (i, j):
                kinds.setdefault(end, set()).add(lk.scale_up)
                lat[end] = min(lk.latency_s, lat.get(end, math.inf))
        object.__setattr__(self, "_path_kinds", {i: tuple(sorted(k)) for i, k in kinds.items()})
        object.__setattr__(self, "_latency_lo", lat)

    @property
    def total_layers(self) -> int:
        return sum(self.layers.values())

    def usd_per_hour(self, choices: Sequence[StageChoice]) -> float:
        """USD per hour of the GPUs ``choices`` use, each island's taken cheapest first."""
        used: dict[int, int] = {}
        for st in choices:
            c = self.candidates[st.candidate]
            used[c.island] = used.get(c.island, 0) + c.gpus
        return sum(island_usd_per_hour(self.island_prices[i], n) for i, n in used.items())

    def egress_usd_per_step(self, choices: Sequence[StageChoice]) -> float:
        """USD of cross-zone transfer per step: every stage boundary between islands with a priced
        link, once per micro-batch."""
        if not self.link_egress_usd:
            return 0.0
        isl = [self.candidates[st.candidate].island for st in choices]
        return self.num_micro_batches * sum(self.link_egress_usd.get((a, b), 0.0) for a, b in zip(isl, isl[1:]))

    def boundary_s(self, src: Candidate, dst: Candidate) -> float:
        """Exact p2p time from a stage of candidate ``src`` to the next, of candidate ``dst``."""
        return boundary_time_s(self.links[src.island, dst.island], src, dst)

    def boundaries_s(self, stages: Sequence[StageChoice]) -> list[float]:
        """Exact p2p time of every boundary of ``stages`` (pipeline order)."""
        cands = self.candidates
        return [self.boundary_s(cands[a.candidate], cands[b.candidate]) for a, b in zip(stages, stages[1:])]

    def side_bounds_s(self, cand: Candidate) -> tuple[float, float]:
        """(smallest, largest) side time ``cand`` can have on any path from or to its island."""
        sides = [cand.p2p_scale_up_s if up else cand.p2p_nic_s for up in self._path_kinds.get(cand.island, ())]
        return min(sides, default=0.0), max(sides, default=0.0)

    def latency_lo_s(self, island: int) -> float:
        """The smallest latency of any path from or to ``island``."""
        return self._latency_lo.get(island, 0.0)

    def link_floor_s(self, ci: int) -> float:
        """A lower bound on every link of a stage of candidate ``ci``: its island's smallest latency
        plus its own side (a boundary takes at least either side's time)."""
        floor = self._link_floor.get(ci)
        if floor is None:
            c = self.candidates[ci]
            floor = self._link_floor[ci] = self.latency_lo_s(c.island) + self.side_bounds_s(c)[0]
        return floor


@dataclass(slots=True, kw_only=True)
class StageChoice:
    """A decoded stage: candidate index and layers per kind."""

    candidate: int
    layers: dict[str, int]


@dataclass(frozen=True, slots=True, kw_only=True)
class FormulationOptions:
    """How a pipeline model is built: valid cut families, the cutoff, the time unit."""

    fluid_cuts: bool = True  # sum g*t*w <= N_i * Tmax per island (valid; tightens the LP)
    mccormick_cuts: bool = True  # aggregated model: per-candidate McCormick cut on Tmax * stages
    cutoff_s: float | None = None  # objective of a known plan: prunes layer caps
    tick_s: float = 1e-6
    #: aggregated model: the rows that price more of the stage order than pairs of neighbours
    #: (medium runs; the successors and out-links of tail windows). They only tighten bounds, and
    #: they slow the window MIPs, so the restricted primal search (whose bounds are not used) goes
    #: without them
    order_rows: bool = True
    #: aggregated model: the tail-average rows (``tail_gpus``; valid, tighten the LP where stage
    #: tails are long); off only to measure what they add
    tail_averages: bool = True
    #: aggregated model: the link rows per island (``comm_island``; valid, tighten the LP where one
    #: island's stages have much slower sides than the others'); off only to measure what they add
    island_links: bool = True
    #: aggregated model: the whole-pipeline block with each boundary priced by both its stages'
    #: sides (``island_sides``; valid, tighten the LP where slow-NIC stages sit between stages of
    #: other islands); off only to measure what they add
    island_sides: bool = True
    #: aggregated model: the neighbour-class rows (``neighbour_classes.py``: which classes of stage
    #: types can be neighbours, and the pairs of neighbours of a middle stage, inside a period
    #: window; valid, tighten the LP where slow links keep slow stages apart); off only to measure
    #: what they add
    neighbour_classes: bool = True
    #: what the model minimizes (formulations/pipeline_mip.md §4b): "step_time" (the default),
    #: "usd_per_hour" (of the GPUs used) or "usd_per_step" (USD/h x step time, exact via big-M
    #: products of the stage binaries and the step time). The last two need ``island_prices``
    objective: str = "step_time"
    #: limits: USD per hour of the GPUs used, and the step time (a throughput floor)
    budget_usd_per_h: float | None = None
    max_step_s: float | None = None
    #: money unit of the price rows (USD per hour); prices are rounded down to it (valid bounds)
    price_unit_usd_h: float = 1e-4


#: ``FormulationOptions.objective`` values
FORMULATION_OBJECTIVES = ("step_time", "usd_per_hour", "usd_per_step")


def island_usd_per_hour(steps: Sequence[tuple[int, float]], gpus: int) -> float:
    """USD per hour of ``gpus`` GPUs taken cheapest first along an island's price ``steps``."""
    total, left = 0.0, gpus
    for n, price in steps:
        take = min(n, left)
        total += take * price
        left -= take
    if left > 0:
        raise ValueError(f"{gpus} GPUs asked of an island of {sum(n for n, _ in steps)}")
    return total


def largest_total(limit: int, sizes: Iterable[int]) -> int:
    """The largest sum of ``sizes`` (each any number of times) that is at most ``limit``: how many
    of an island's ``limit`` GPUs stages of these sizes can occupy at once. With stages of 24 and
    48 GPUs on a 128-GPU island it is 120, and every island row of a model (GPUs, fluid work, tail
    averages) may read it instead of 128: a Chvatal-Gomory rounding of the capacity row that the
    LP relaxation, which fills the island to its last GPU with fractional stages, does not see
    (formulations/pipeline_mip.md §3, "Island capacity")."""
    reach, mask = 1, (1 << (limit + 1)) - 1  # bit x: some stages occupy exactly x GPUs
    for s in sorted(set(sizes)):
        shift = s
        while 0 < shift <= limit:  # doubling: after shifts s, 2s, ..., 2^k s every multiple up to (2^(k+1) - 1) s
            reach |= (reach << shift) & mask
            shift *= 2
    return reach.bit_length() - 1


def capacities(limits: dict[int, int], sized: Iterable[tuple[int, int]]) -> dict[int, int]:
    """Per island ``i``, :func:`largest_total` of ``limits[i]`` over the sizes that ``sized``
    (pairs ``(island, size)``) gives it."""
    sizes: dict[int, set[int]] = {i: set() for i in limits}
    for i, g in sized:
        sizes[i].add(g)
    return {i: largest_total(n, sizes[i]) for i, n in limits.items()}


def island_capacities(problem: PipelineProblem, columns: Iterable[int]) -> dict[int, int]:
    """Per island, :func:`largest_total` of its GPUs over the sizes of the candidates in
    ``columns`` (candidate indices: a model's stage types) on that island."""
    cands = problem.candidates
    return capacities(problem.island_gpus, ((cands[ci].island, cands[ci].gpus) for ci in columns))


def choices_timing(problem: PipelineProblem, choices: Sequence[StageChoice]) -> PipelineTiming:
    """The closed form of the pipeline ``choices`` (pipeline order) with its exact boundaries."""
    cands = problem.candidates
    return pipeline_timing([(cands[c.candidate], c.layers) for c in choices], problem.boundaries_s(choices),
                           problem.num_micro_batches, problem.schedule)


__all__ = ["FORMULATION_OBJECTIVES", "FormulationOptions", "PipelineProblem", "StageChoice", "capacities",
           "choices_timing", "island_capacities", "island_usd_per_hour", "largest_total"]
