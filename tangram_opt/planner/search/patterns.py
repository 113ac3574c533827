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

Once the orders around the incumbent are used up (or have stopped paying), the same time goes to
*dives* (:class:`Dive`): a depth-first search over the island of each position for one pipeline
micro-batch size and stage count, ends first, the islands of a position tried in the order of
their LP bounds, and a position's island dropped when its LP reaches the incumbent. A good plan
can be far from the incumbent's order: on "512 A100+L4+V100, dense" the 9.260 s plan (islands
``221010``, b = 16) is several edits from the 9.570 s incumbent (``00112``, b = 32); a dive at
b = 16 with 6 stages finds it after 5.3 s (formulations/pipeline_mip.md §5, thirteenth round).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager

from tangram_opt.planner.formulations.bounds import fluid_bottleneck_s
from tangram_opt.planner.formulations.problem import PipelineProblem, choices_timing
from tangram_opt.planner.formulations.stage_sequence import SequenceMIP
from tangram_opt.planner.formulations.ticks import rounding_ticks
from tangram_opt.planner.search import tuning
from tangram_opt.planner.search.nodes import SubProblem
from tangram_opt.solvers import SolveOptions, SolveResult, SolveStatus, solve_model
from tangram_opt.solvers.backends import lp_relaxation_bound

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


def dive_positions(stages: int) -> list[int]:
    """The order a dive fixes positions in: the ends first (the first stage's step tail is
    exposed whole, the last stage's link and head are its own), then inwards."""
    return list(dict.fromkeys(k for a in range(stages) for k in ((a // 2,) if a % 2 == 0 else (stages - 1 - a // 2,))))


class Dive:
    """A resumable depth-first search over the island of every position of one sequence model.

    ``step()`` runs one LP or leaf solve, so a caller can spend a dive in slices. At a node
    the next position (:func:`dive_positions`) is restricted to each of its islands in turn, the
    LP relaxation solved, islands whose LP reaches ``cutoff()`` (the model's objective a plan must
    beat, read anew at every step) dropped, and the rest visited in the order of their LPs. With
    every position's island fixed, the model is solved for at most ``leaf_s()`` seconds and
    ``found`` gets its solution. The model's bounds are changed in place and put back on the way
    up; nothing else may use the model while the dive runs. Its bounds are not a proof: a leaf cut
    short by its time limit is left behind."""

    def __init__(self, seq: SequenceMIP, cutoff: Callable[[], float], leaf_s: Callable[[], float],
                 solve: Callable[[float], SolveResult], found: Callable[[SolveResult], None]):
        self.seq, self.cutoff, self.leaf_s, self.solve, self.found = seq, cutoff, leaf_s, solve, found
        #: per position, island -> its columns still allowed
        self.columns = [seq.island_columns(k) for k in range(seq.stages)]
        self.positions = dive_positions(seq.stages)
        self.lps = self.leaves = 0
        self._steps = self._visit(0)
        self.done = False

    def step(self) -> bool:
        """One LP or leaf solve; False once the dive is over."""
        if not self.done:
            self.done = next(self._steps, True) is True
        return not self.done

    def _only(self, k: int, island: int) -> AbstractContextManager[None]:
        """Position ``k`` restricted to ``island`` (its other columns at 0) inside a ``with`` block."""
        return self.seq.model.zeroed(j for i, cols in self.columns[k].items() if i != island for j in cols)

    def _visit(self, depth: int) -> Iterator[bool]:
        if depth == len(self.positions):
            self.leaves += 1
            self.found(self.solve(self.leaf_s()))
            yield False
            return
        k = self.positions[depth]
        kids: list[tuple[float, int]] = []
        islands = list(self.columns[k])
        for island in islands:
            if len(islands) == 1:
                kids.append((-math.inf, island))
                break
            with self._only(k, island):
                lp = lp_relaxation_bound(self.seq.model, time_limit_s=max(0.05, self.leaf_s()))
            self.lps += 1
            if lp is None or lp < self.cutoff():
                kids.append((-math.inf if lp is None else lp, island))
            yield False
        for lp, island in sorted(kids):
            if lp >= self.cutoff():  # the incumbent improved since
                continue
            with self._only(k, island):
                yield from self._visit(depth + 1)


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
        ``ORDER_PATIENCE`` orders in a row without a plan ``ORDER_MIN_GAIN`` better, or once every
        order around the incumbent was tried, the slices go to dives (:meth:`dive_turn`)."""
        if (not tuning.ORDER_SEARCH or self.inc is None or self.formulation != "aggregated"
                or self.ctx.space.schedule != "1f1b" or self.remaining() <= 1.0
                or self.elapsed() < tuning.ORDER_START_SHARE * self.time_limit_s
                or self.order_spent >= tuning.ORDER_SHARE * self.elapsed()):
            return
        if (not self.order_progress() and self.order_misses >= tuning.ORDER_PATIENCE
                and self.dive_idle_s >= tuning.DIVE_PATIENCE_S):
            return  # orders and dives both wait for a better plan from elsewhere
        inc = self.inc
        b, choices = inc
        sub = self.subs[b]
        if (sub.types is None or len(choices) < 2
                or self.inc_s - self.global_bound() < tuning.ORDER_MIN_GAP * self.inc_s):  # the costly test last
            return
        start = time.perf_counter()
        deadline = start + min(tuning.ORDER_SLICE_S, self.remaining() - 1.0)
        cands = sub.problem.candidates
        order = tuple(cands[st.candidate].island for st in choices)
        tried = self.order_tried.setdefault(b, set())
        period = choices_timing(sub.problem, choices).bottleneck_s
        floor = fluid_bottleneck_s(sub.problem)
        untried = [o for o in neighbour_orders(order, sorted(sub.problem.island_gpus), sub.problem.min_stages,
                                               sub.problem.max_stages) if o not in tried]
        for o in untried if self.order_misses < tuning.ORDER_PATIENCE else []:
            if time.perf_counter() >= deadline or self.inc is not inc:
                break  # out of time, or a new incumbent: the next turn starts from it
            tried.add(o)
            # each order gets its whole time (a slice ends after the order that overruns it)
            self.solve_order(sub, o, floor, period, min(tuning.ORDER_SOLVE_S, self.remaining() - 0.5))
            if not self.order_progress():
                self.order_misses += 1
                if self.order_misses >= tuning.ORDER_PATIENCE:
                    break
        if self.inc is inc and (self.order_misses >= tuning.ORDER_PATIENCE or all(o in tried for o in untried)):
            self.dive_turn(deadline)
        self.order_spent += time.perf_counter() - start

    def dive_keys(self) -> list[tuple[int, int]]:
        """The (pipeline micro-batch size, stage count) pairs to dive into, best first: the
        ``DIVE_SUBS`` sub-problems with the lowest bounds below the target, each at the stage count
        of its best plan (of the incumbent's when it has none), then one more, one less, two more;
        every size at one offset before any at the next."""
        bounds = {s.b: self.sub_bound(s) for s in self.subs.values()
                  if s.types is not None and s.problem.max_stages >= 2}  # each walks the open nodes
        subs = sorted((self.subs[b] for b, bound in bounds.items() if not self.pruned(bound)),
                      key=lambda s: bounds[s.b])[:tuning.DIVE_SUBS]
        assert self.inc is not None
        keys: list[tuple[int, int]] = []
        for offset in (0, 1, -1, 2):
            for s in subs:
                stages = len(s.best_choices or self.inc[1]) + offset
                if max(2, s.problem.min_stages) <= stages <= s.problem.max_stages:
                    keys.append((s.b, stages))
        return keys

    def dive_turn(self, deadline: float) -> None:
        """Spend the slice until ``deadline`` on dives (:class:`Dive`), in turns: the dive that
        ran last goes behind the others, and a new one (the next of :meth:`dive_keys` not started)
        joins while fewer than ``DIVE_ACTIVE`` run. A dive ends when it has visited every island
        order its LPs leave. After ``DIVE_PATIENCE_S`` of dives without a plan ``ORDER_MIN_GAIN``
        better than the incumbent, they wait for one from elsewhere (``order_progress``)."""
        while time.perf_counter() < deadline and self.remaining() > 1.0 and self.dive_idle_s < tuning.DIVE_PATIENCE_S:
            if len(self.dives) < tuning.DIVE_ACTIVE:
                key = next((k for k in self.dive_keys() if k not in self.dived), None)
                if key is not None:
                    self.dived.add(key)
                    started = time.perf_counter()
                    dive = self.start_dive(*key)
                    self.dive_idle_s += time.perf_counter() - started  # a 24-stage model takes 0.4 s
                    if dive is not None:
                        self.dives.append(dive)
                    continue
            if not self.dives:
                return
            dive = self.dives.pop(0)
            inc, started = self.inc, time.perf_counter()
            while (time.perf_counter() < deadline and self.remaining() > 1.0
                   and self.dive_idle_s + time.perf_counter() - started < tuning.DIVE_PATIENCE_S and dive.step()):
                if self.inc is not inc:
                    break  # a better plan: the next turn may dive elsewhere
            self.dive_idle_s += time.perf_counter() - started
            if not dive.done:
                self.dives.append(dive)
            if self.inc is not inc:
                return

    def start_dive(self, b: int, stages: int) -> Dive | None:
        """A dive into sub-problem ``b``'s plans of ``stages`` stages with periods below the
        incumbent's step over ``m - 1`` (a plan better than it has one), or None when its
        sequence model is empty or too large."""
        sub = self.subs[b]
        p: PipelineProblem = self.with_stages(sub.problem, (stages, stages))
        m = p.num_micro_batches
        hi = self.inc_s / max(1, m - 1)
        seq = SequenceMIP(p, self.formulation_options(sub), sub.types, stages, min(fluid_bottleneck_s(p), hi), hi,
                          integral=self.backend != "highs").build()
        if seq.empty or seq.columns > tuning.SEQUENCE_MAX_COLUMNS:
            return None
        tick = seq.options.tick_s

        def cutoff() -> float:  # a plan better than the incumbent has a model objective below this
            return self.inc_s / tick + rounding_ticks(m)

        def solve(limit_s: float) -> SolveResult:
            return solve_model(seq.model, self.backend, SolveOptions(time_limit_s=limit_s, threads=1, seed=self.seed,
                                                                     presolve=False, cutoff=cutoff()))

        def found(res: SolveResult) -> None:
            sub.info["dive_leaves"] = sub.info.get("dive_leaves", 0) + 1
            if res.values is not None and res.status in (SolveStatus.OPTIMAL, SolveStatus.FEASIBLE):
                choices = seq.decode(res.values)
                before = self.inc_s
                self.offer(b, choices, choices_timing(sub.problem, choices).step_time_s)
                if self.inc_s < before:
                    order = "".join(str(p.candidates[st.candidate].island) for st in choices)
                    self.emit(f"{self.tag(b)}: dive, {stages} stages, islands {order}: {self.inc_s:.4f} s")

        return Dive(seq, cutoff, lambda: max(0.05, min(tuning.DIVE_LEAF_S, self.remaining() - 0.5)), solve, found)

    def order_progress(self) -> bool:
        """Whether the incumbent (from here or elsewhere) is better by at least ``ORDER_MIN_GAIN``
        than when the orders' patience last started; if so it starts anew, and so does the dives'."""
        if self.inc_s < self.order_from_s * (1 - tuning.ORDER_MIN_GAIN):
            self.order_from_s, self.order_misses, self.dive_idle_s = self.inc_s, 0, 0.0
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


__all__ = ["Dive", "IslandOrders", "dive_positions", "neighbour_orders"]
