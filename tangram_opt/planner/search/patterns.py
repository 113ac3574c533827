"""Primal search over island orders: the sequence model with the island of every position fixed.

The window models relax which island each position holds, and the neighbourhood moves of
formulations/neighbourhood.py change one or two stages at a time. A plan that needs one stage more
on an island *and* a new split of its layers and a new order of its neighbours is several moves
away from the incumbent: on "512 L4+A10G+V100, MoE" the 19.400 s plan (islands
``0000 11 2222``) has a 19.103 s neighbour ``0000 111 2222`` (one more A10G stage, the two small
ones either side of the large one, the V100 stages re-split), which neither found.

With the island of every position given, the sequence model (formulations/stage_sequence.py,
exact in the order) has only that island's types at each position, and none of the fractional
island mixes that make its relaxation weak; HiGHS solved each order of that case's neighbourhood
in 0.2-2.5 s (formulations/pipeline_mip.md §5, twelfth round). :meth:`IslandOrders.order_turn`
takes the orders one edit away from the incumbent's (the same order, one stage more, one stage
less, one stage on another island) and solves each against the incumbent as cutoff. Which orders
are tried is a heuristic; each solve is exact inside its order and window, and only its plan is
used (offered to :meth:`BranchAndBound.offer`), never its bound.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

from tangram_opt.planner.formulations.bounds import fluid_bottleneck_s
from tangram_opt.planner.formulations.problem import PipelineProblem, choices_timing
from tangram_opt.planner.formulations.stage_sequence import SequenceMIP
from tangram_opt.planner.formulations.ticks import rounding_ticks
from tangram_opt.planner.search import tuning
from tangram_opt.planner.search.nodes import SubProblem
from tangram_opt.solvers import SolveOptions, SolveStatus, solve_model

Order = tuple[int, ...]


def neighbour_orders(order: Order, islands: Sequence[int], min_stages: int, max_stages: int) -> list[Order]:
    """``order`` and the island orders one edit away from it, each once: one stage more (every
    island at every place), one stage less, one stage on another island; orders of fewer than two
    or outside ``[min_stages, max_stages]`` stages are left out. Insertions come first (a stage more
    shortens the period, which the step multiplies by ``m - 1``), then other islands, then removals,
    and edits at the ends of runs before edits inside one (they keep the number of runs, and so
    of links between islands)."""
    out: dict[Order, int] = {}

    def add(o: Order, rank: int) -> None:
        if max(2, min_stages) <= len(o) <= max_stages and o not in out:
            out[o] = rank

    def at_edge(k: int) -> bool:  # position k starts or ends a run of one island
        return k == 0 or k == len(order) - 1 or order[k - 1] != order[k] or order[k + 1] != order[k]

    add(order, 0)
    for k in range(len(order) + 1):
        for i in islands:
            edge = k == 0 or k == len(order) or order[k - 1] == i or order[k] == i or order[k - 1] != order[k]
            add(order[:k] + (i,) + order[k:], 1 if edge else 4)
    for k in range(len(order)):
        for i in islands:
            if i != order[k]:
                add(order[:k] + (i,) + order[k + 1:], 2 if at_edge(k) else 5)
    for k in range(len(order)):
        add(order[:k] + order[k + 1:], 3 if at_edge(k) else 6)
    return sorted(out, key=lambda o: out[o])


class IslandOrders:
    """The island-order search of :class:`~tangram_opt.planner.search.branch_and_bound.BranchAndBound`
    (a mixin: it uses the search's subs, incumbent, backend and :meth:`offer`). The orders tried are
    kept per sub-problem in ``order_tried`` and not tried again: one solved to the end against the
    incumbent of its time holds no better plan, since the incumbent only improves; one cut short by
    its time limit is left to the window search."""

    __slots__ = ()

    def order_turn(self) -> None:
        """Between nodes, once ``ORDER_START_SHARE`` of the time limit has passed (a search that
        closes sooner needs no better plan), while the gap is at least ``ORDER_MIN_GAP`` (a better
        plan could be worth it) and the island-order search has had less than ``ORDER_SHARE`` of
        the time so far, solve the next untried orders around the incumbent for one slice
        (``ORDER_SLICE_S``: no order starts after it), each for at most ``ORDER_SOLVE_S``."""
        if (not tuning.ORDER_SEARCH or self.inc is None or self.formulation != "aggregated"
                or self.ctx.space.schedule != "1f1b" or self.remaining() <= 1.0
                or self.elapsed() < tuning.ORDER_START_SHARE * self.time_limit_s
                or self.order_spent >= tuning.ORDER_SHARE * self.elapsed()
                or self.inc_s - self.global_bound() < tuning.ORDER_MIN_GAP * self.inc_s):
            return
        inc = self.inc
        b, choices = inc
        sub = self.subs[b]
        if sub.types is None or len(choices) < 2:
            return
        start = time.perf_counter()
        deadline = start + min(tuning.ORDER_SLICE_S, self.remaining() - 1.0)
        cands = sub.problem.candidates
        order = tuple(cands[st.candidate].island for st in choices)
        tried = self.order_tried.setdefault(b, set())
        period = choices_timing(sub.problem, choices).bottleneck_s
        for o in neighbour_orders(order, sorted(sub.problem.island_gpus), sub.problem.min_stages,
                                  sub.problem.max_stages):
            if time.perf_counter() >= deadline or self.inc is not inc:
                break  # out of time, or a new incumbent: the next turn starts from it
            if o in tried:
                continue
            tried.add(o)
            # each order gets its whole time (a slice ends after the order that overruns it)
            self.solve_order(sub, o, period, min(tuning.ORDER_SOLVE_S, self.remaining() - 0.5))
        self.order_spent += time.perf_counter() - start

    def solve_order(self, sub: SubProblem, order: Order, period_s: float, time_limit_s: float) -> None:
        """Solve ``sub``'s sequence model restricted to ``order``, with periods up to a little above
        ``period_s``, below the incumbent, and offer its plan."""
        p: PipelineProblem = sub.problem
        m = p.num_micro_batches
        # a plan better than the incumbent has (m - 1) lambda below it (formulations/pipeline_mip.md §1);
        # the orders look for plans with a period near the incumbent's or below it (a heuristic
        # window: it keeps the model small, and a longer period rarely pays for itself)
        hi = min(self.inc_s / max(1, m - 1), period_s * (1 + tuning.ORDER_PERIOD_SLACK))
        lo = min(fluid_bottleneck_s(p), hi)
        seq = SequenceMIP(p, self.formulation_options(sub), sub.types, len(order), lo, hi,
                          integral=self.backend != "highs", islands=order).build()
        if seq.empty:
            return
        # the model's objective may exceed a plan's step by the rounding margin (ticks.py)
        cutoff = self.inc_s / seq.options.tick_s + rounding_ticks(m) if math.isfinite(self.inc_s) else None
        options = SolveOptions(time_limit_s=time_limit_s, threads=1, seed=self.seed, presolve=False, cutoff=cutoff)
        res = solve_model(seq.model, self.backend, options)
        sub.info["order_solves"] = sub.info.get("order_solves", 0) + 1
        if res.values is not None and res.status in (SolveStatus.OPTIMAL, SolveStatus.FEASIBLE):
            choices = seq.decode(res.values)
            before = self.inc_s
            self.offer(sub.b, choices, choices_timing(p, choices).step_time_s)
            if self.inc_s < before:
                self.emit(f"{self.tag(sub.b)}: island order {''.join(map(str, order))}: {self.inc_s:.4f} s")


__all__ = ["IslandOrders", "neighbour_orders"]
