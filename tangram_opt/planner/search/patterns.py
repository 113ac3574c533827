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
    or outside ``[min_stages, max_stages]`` stages are left out. The edits that keep the runs of
    islands (and so the links between them) come first: a run one stage longer (a stage more
    shortens the period, which the step multiplies by ``m - 1``), a run one stage shorter, a stage
    moved from a run to the next; then the others."""
    out: dict[Order, int] = {}

    def add(o: Order, rank: int) -> None:
        if max(2, min_stages) <= len(o) <= max_stages and o not in out:
            out[o] = rank

    n = len(order)
    add(order, 0)
    for k in range(n + 1):  # a run one longer: next to a stage of the same island
        for i in {order[k - 1] if k else None, order[k] if k < n else None} - {None}:
            add(order[:k] + (i,) + order[k:], 1)
    for k in range(n):  # a run one shorter (not a run of one: that would join two runs)
        if (k and order[k - 1] == order[k]) or (k + 1 < n and order[k + 1] == order[k]):
            add(order[:k] + order[k + 1:], 2)
    for k in range(n):  # the stage at the end of a run taken by the neighbouring run
        for j in (k - 1, k + 1):
            if 0 <= j < n and order[j] != order[k]:
                add(order[:k] + (order[j],) + order[k + 1:], 3)
    for k in range(n + 1):
        for i in islands:
            add(order[:k] + (i,) + order[k:], 4)
    for k in range(n):
        add(order[:k] + order[k + 1:], 5)
        for i in islands:
            if i != order[k]:
                add(order[:k] + (i,) + order[k + 1:], 6)
    return sorted(out, key=lambda o: out[o])


class IslandOrders:
    """The island-order search of :class:`~tangram_opt.planner.search.branch_and_bound.BranchAndBound`
    (a mixin: it uses the search's subs, incumbent, backend and :meth:`offer`). The orders tried are
    kept per sub-problem in ``order_tried`` and not tried again: one solved to the end against the
    incumbent of its time holds no better plan in its period window, since the incumbent only
    improves; one cut short by its time limit is left to the window search."""

    __slots__ = ()

    def order_turn(self) -> None:
        """Between nodes, once ``ORDER_START_SHARE`` of the time limit has passed (a search that
        closes sooner needs no better plan), while the gap is at least ``ORDER_MIN_GAP`` (a better
        plan could be worth it) and the island-order search has had less than ``ORDER_SHARE`` of
        the time so far, solve the next untried orders around the incumbent for one slice
        (``ORDER_SLICE_S``: no order starts after it), each for at most ``ORDER_SOLVE_S``. After
        ``ORDER_PATIENCE`` orders in a row without a plan ``ORDER_MIN_GAIN`` better it waits for one
        from elsewhere."""
        if (not tuning.ORDER_SEARCH or self.inc is None or self.formulation != "aggregated"
                or self.ctx.space.schedule != "1f1b" or self.remaining() <= 1.0
                or self.elapsed() < tuning.ORDER_START_SHARE * self.time_limit_s
                or self.order_spent >= tuning.ORDER_SHARE * self.elapsed()):
            return
        self.order_progress()
        inc = self.inc
        b, choices = inc
        sub = self.subs[b]
        if (sub.types is None or len(choices) < 2 or self.order_misses >= tuning.ORDER_PATIENCE
                or self.inc_s - self.global_bound() < tuning.ORDER_MIN_GAP * self.inc_s):  # the costly test last
            return
        start = time.perf_counter()
        deadline = start + min(tuning.ORDER_SLICE_S, self.remaining() - 1.0)
        cands = sub.problem.candidates
        order = tuple(cands[st.candidate].island for st in choices)
        tried = self.order_tried.setdefault(b, set())
        period = choices_timing(sub.problem, choices).bottleneck_s
        floor = fluid_bottleneck_s(sub.problem)
        for o in neighbour_orders(order, sorted(sub.problem.island_gpus), sub.problem.min_stages,
                                  sub.problem.max_stages):
            if time.perf_counter() >= deadline or self.inc is not inc:
                break  # out of time, or a new incumbent: the next turn starts from it
            if o in tried:
                continue
            tried.add(o)
            # each order gets its whole time (a slice ends after the order that overruns it)
            self.solve_order(sub, o, floor, period, min(tuning.ORDER_SOLVE_S, self.remaining() - 0.5))
            if not self.order_progress():
                self.order_misses += 1
                if self.order_misses >= tuning.ORDER_PATIENCE:
                    break
        self.order_spent += time.perf_counter() - start

    def order_progress(self) -> bool:
        """Whether the incumbent (from here or elsewhere) is better by at least ``ORDER_MIN_GAIN``
        than when the orders' patience last started; if so it starts anew."""
        if self.inc_s < self.order_from_s * (1 - tuning.ORDER_MIN_GAIN):
            self.order_from_s, self.order_misses = self.inc_s, 0
            return True
        return False

    def solve_order(self, sub: SubProblem, order: Order, floor_s: float, period_s: float, time_limit_s: float) -> None:
        """Solve ``sub``'s sequence model restricted to ``order``, with periods from ``floor_s`` (a
        lower bound on every plan's) up to a little above ``period_s``, below the incumbent, and
        offer its plan."""
        p: PipelineProblem = sub.problem
        m = p.num_micro_batches
        # a plan better than the incumbent has (m - 1) lambda below it (formulations/pipeline_mip.md §1);
        # the orders look for plans with a period near the incumbent's or below it (a heuristic
        # window: it keeps the model small, and a longer period rarely pays for itself)
        hi = min(self.inc_s / max(1, m - 1), period_s * (1 + tuning.ORDER_PERIOD_SLACK))
        lo = min(floor_s, hi)
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
