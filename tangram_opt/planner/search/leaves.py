"""Leaves of the branch and bound: narrow windows handed to the MIP backend, and what comes back.

- aggregated (or positional) leaves: :meth:`LeafSolves.solve_leaf` builds and hints the window's
  model, :meth:`LeafSolves.leaf_solved` scores every solution exactly, then either cuts off
  support classes whose exact best is known and re-solves (:meth:`LeafSolves.refine`) or looks
  for better orders of what it found (:meth:`LeafSolves.explore_alternatives`);
- sequence leaves (one window, one stage count; formulations/stage_sequence.py):
  :meth:`LeafSolves.solve_sequence` and :meth:`LeafSolves.sequence_solved`.

A leaf closes at a bound read from its model (lowered by ``ticks.rounding_ticks``), or goes back to
the queue with its better bound and twice the time. Solves go through
:meth:`BranchAndBound.dispatch`, which hands them to a worker process when one is idle.
"""

from __future__ import annotations

import copy
import heapq
import math
import time
from typing import Any

from tangram_opt.planner.formulations.aggregated import AggregatedMIP
from tangram_opt.planner.formulations.ordering import polish, reorder, support_class_best, turn_ends
from tangram_opt.planner.formulations.positional import PositionalMIP
from tangram_opt.planner.formulations.problem import PipelineProblem, StageChoice, choices_timing
from tangram_opt.planner.formulations.stage_sequence import SequenceMIP
from tangram_opt.planner.formulations.stage_types import StageType
from tangram_opt.planner.formulations.ticks import rounding_ticks
from tangram_opt.planner.search import tuning
from tangram_opt.planner.search.nodes import Node
from tangram_opt.planner.search.window_bounds import Window
from tangram_opt.solvers import SolveOptions, SolveStatus, solve_model
from tangram_opt.solvers.backends import lp_relaxation_bound
from tangram_opt.solvers.model import lsum


def island_link_spread(problem: PipelineProblem, types: dict[str, list[StageType]], hi_s: float) -> float:
    """How much the islands of a window's stage types differ in what their boundaries cost, as a
    share of the period's upper edge ``hi_s``: the largest of (the cheapest link of a stage on
    island ``i``) and (the cheapest link between two islands), less the smallest cheapest link of
    a stage. An LP that mixes islands at a position pays about the smallest; a plan pays what its
    islands cost. 0 with a single island."""
    floor: dict[int, float] = {}
    cands = problem.candidates
    for ts in types.values():
        for t in ts:
            i = cands[t.candidate].island
            floor[i] = min(floor.get(i, math.inf), problem.link_floor_s(t.candidate))
    if len(floor) < 2 or hi_s <= 0:
        return 0.0
    cross = max(problem.link_lo_s.get((i, j), 0.0) for i in floor for j in floor if i != j)
    return (max(max(floor.values()), cross) - min(floor.values())) / hi_s


class LeafSolves:
    """The leaf solves of :class:`~tangram_opt.planner.search.branch_and_bound.BranchAndBound` (a mixin:
    it uses the search's subs, queue, budget, incumbent and :meth:`offer` / :meth:`close`)."""

    __slots__ = ()

    def solve_leaf(self, node: Node) -> None:
        sub = self.subs[node.b]
        mip = node.mip
        cutoff = node.built_cutoff_s
        if mip is None or (isinstance(mip, AggregatedMIP) and cutoff is not None
                           and self.inc_s < cutoff * (1 - tuning.REBUILD_CUTOFF_GAIN)):
            # the incumbent improved since this window's model was built: rebuild it with the new
            # cutoff (tighter time bounds, more columns fixed by reduced costs); MIP time dwarfs
            # this. A window a worker bounded has no model here: build it
            hi = min(node.hi_s, self.inc_s / sub.problem.num_micro_batches)
            fresh = self.evaluate(sub, node.lo_s, hi, node.tail_lo_s, node.tail_hi_s, excluded=node.excluded_types,
                                  stages=node.stages) if hi > node.lo_s else None
            if fresh is None or self.pruned(fresh.bound_s):
                self.close(node, self.target_s() if fresh is None else max(node.bound_s, fresh.bound_s))
                return
            node.mip, node.hi_s, node.bound_s = fresh.mip, hi, max(node.bound_s, fresh.bound_s)
            node.built_cutoff_s = fresh.built_cutoff_s
            mip = fresh.mip
            assert mip is not None
        n_open = 1 + len(self.open)
        budget = min(self.remaining(), max(2.0, self.remaining() / n_open) * 2 ** node.tries)
        for cand in ([self.inc[1]] if self.inc and self.inc[0] == sub.b else []) + (
                [self.seeds[sub.b][1]] if sub.b in self.seeds else []):
            hint = mip.hint_from(cand)
            # reduced-cost fixing may have excluded the hinted plan (it cannot beat the cutoff)
            if hint is not None and all(v.lb - 1e-9 <= val <= v.ub + 1e-9 for v, val in
                                        ((mip.model.vars[var.index], val) for var, val in hint.items())):
                mip.model.set_hint(hint)
                break
        options = SolveOptions(time_limit_s=budget, threads=self.solve_threads, seed=self.seed, rel_gap=self.rel_gap,
                               cutoff=self.cutoff_ticks(mip))
        base = self.elapsed()
        self.dispatch(node, mip.model, options, lambda res: self.leaf_solved(node, mip, budget, base, res))

    def leaf_solved(self, node: Node, mip: AggregatedMIP | PositionalMIP, budget: float, base: float,
                    res: Any) -> None:
        """An aggregated (or positional) leaf's solve came back: offer its plans, cut support
        classes off or explore alternatives, and close the window or queue it with more time."""
        sub = self.subs[node.b]
        tick = mip.options.tick_s
        sub.info["mip_solves"] += 1
        sub.solve_time_s += res.solve_time_s
        self.trajectories.append([(base + q.elapsed_s, None if q.incumbent is None else q.incumbent * tick,
                                   None if q.bound is None else q.bound * tick) for q in res.trajectory])
        if res.status == SolveStatus.ERROR:
            self.close(node, node.bound_s)
            sub.info["last_status"] = f"error: {res.message}"
            self.emit(f"{self.tag(node.b)}: window {node.describe()} {res.status.value}")
            return
        if res.values is not None:
            # the aggregated model relaxes p2p and tail terms: evaluate every reported solution exactly
            best: tuple[float, list[StageChoice]] | None = None
            for vals in [res.values] + [v for _, v in sorted(res.pool, key=lambda q: q[0])[:25]]:
                ch = mip.decode(vals)  # type: ignore[arg-type]
                t = choices_timing(sub.problem, ch).step_time_s
                if best is None or t < best[0]:
                    best = (t, ch)
            assert best is not None
            if isinstance(mip, AggregatedMIP) and len(best[1]) > 3:
                better = turn_ends(sub.problem, polish(sub.problem, reorder(sub.problem, best[1])))
                best = min(best, (choices_timing(sub.problem, better).step_time_s, better), key=lambda q: q[0])
            self.offer(sub.b, best[1], best[0])
            if isinstance(mip, AggregatedMIP) and res.objective is not None and res.status == SolveStatus.OPTIMAL \
                    and not self.pruned(res.objective * tick):
                # the model's optimum is below the incumbent but (often) no real plan is: cut off
                # its support class once the class's exact best is known, and re-solve
                res = self.refine(node, mip, res, budget)
            elif isinstance(mip, AggregatedMIP) and res.objective is not None and \
                    best[0] > res.objective * tick * (1 + 1e-3):
                self.explore_alternatives(node, mip, res.values, budget)
        if res.status == SolveStatus.INFEASIBLE:
            # nothing left in this window beats the cutoff but the support classes cut off it
            self.close(node, min(node.excluded_s, self.target_s()))
        elif res.status in (SolveStatus.OPTIMAL, SolveStatus.FEASIBLE, SolveStatus.NO_SOLUTION):
            slack = rounding_ticks(sub.problem.num_micro_batches) * tick
            model_b = res.bound * tick - slack if res.bound is not None else -math.inf
            # both the window's first LP bound and min(classes cut off, the cut model's bound)
            # hold for the whole window
            b = max(node.bound_s, min(model_b, node.excluded_s))
            if res.status == SolveStatus.OPTIMAL or self.pruned(b):
                self.close(node, min(b, self.inc_s))
            else:
                # time ran out: keep the window open with its better bound and more time next turn
                node.bound_s, node.tries = b, node.tries + 1
                heapq.heappush(self.open, node)
        self.emit(f"{self.tag(node.b)}: window {node.describe()} {res.status.value}")

    def solve_sequence(self, node: Node) -> None:
        """Solve a leaf of one window and one stage count with the sequence model (exact in the
        order of the stages; formulations/pipeline_mip.md §3b) against the target as cutoff.
        Optimal: the leaf closes at its optimum, whose plan is offered; infeasible: nothing in it
        beats the target; time limit: back to the queue with the model's dual bound and twice
        the time."""
        sub = self.subs[node.b]
        assert node.stages is not None and node.stages[0] == node.stages[1] and sub.types is not None
        P = node.stages[0]
        hi = min(node.hi_s, self.inc_s / sub.problem.num_micro_batches)
        if hi <= node.lo_s:
            self.close(node, self.inc_s)
            return
        built = node.built_cutoff_s
        if built is not None and self.inc_s < built * (1 - tuning.REBUILD_CUTOFF_GAIN):
            # the incumbent improved since this node's LP: re-bound it, fixing more stage types
            fresh = self.evaluate(sub, node.lo_s, hi, node.tail_lo_s, node.tail_hi_s, excluded=node.excluded_types,
                                  stages=node.stages)
            if fresh is None or self.pruned(fresh.bound_s):
                self.close(node, self.target_s() if fresh is None else max(node.bound_s, fresh.bound_s))
                return
            node.mip, node.excluded_types, node.built_cutoff_s = fresh.mip, fresh.excluded_types, fresh.built_cutoff_s
            node.bound_s = max(node.bound_s, fresh.bound_s)
        skip, tail_hi = node.excluded_types, node.tail_hi_s
        # a tail window's upper edge holds for every stage of its plans, its lower edge for one
        types = {role: [t for t in ts if (role, t.candidate, t.layers) not in skip and t.tail_s <= tail_hi]
                 for role, ts in sub.types.items()}
        relaxation = None
        branching = tuning.SEQUENCE_GROUP_BRANCHING and self.backend == "highs" and \
            island_link_spread(sub.problem, types, hi) >= tuning.SEQUENCE_BRANCHING_MIN_SPREAD
        weak = node.joined or sub.info.get("sequence_weak", 0) >= tuning.SEQUENCE_JOIN_AFTER
        if not branching and weak and node.bound_s < self.target_s() * (1 - tuning.SEQUENCE_JOIN_SLACK):
            # without the neighbour-class rows: with them the joined model's branch and bound is
            # slower (formulations/pipeline_mip.md §3b, twenty-first round)
            relaxation = self.build(sub, Window(node.lo_s, hi, node.tail_lo_s, tail_hi, skip, node.stages),
                                    classes=False)
            if relaxation is None:  # no stage type of the window is left: nothing in it beats the target
                self.close(node, self.target_s())
                return
        seq = SequenceMIP(self.with_stages(sub.problem, node.stages), self.formulation_options(sub), types, P,
                          node.lo_s, hi, integral=self.backend != "highs", lower_tail_s=node.tail_lo_s,
                          relaxation=relaxation).build()
        if seq.empty:  # some position has no stage type left: no plan of this size beats the target
            self.close(node, self.target_s())
            return
        if seq.columns > tuning.SEQUENCE_MAX_COLUMNS:
            sub.info["sequence_too_large"] = sub.info.get("sequence_too_large", 0) + 1
            self.solve_leaf(node)
            return
        if not branching and node.tries >= tuning.SEQUENCE_END_ISLANDS_TRY and not self.end_islands(seq):
            sub.info["end_island_closes"] = sub.info.get("end_island_closes", 0) + 1
            self.close(node, self.target_s())
            return
        for cand in ([self.inc[1]] if self.inc and self.inc[0] == sub.b else []) + (
                [self.seeds[sub.b][1]] if sub.b in self.seeds else []):
            hint = seq.hint_from(cand)
            if hint is not None:
                seq.model.set_hint(hint)
                break
        n_open = 1 + len(self.open)
        budget = min(self.remaining(), max(tuning.SEQUENCE_FIRST_BUDGET_S, self.remaining() / n_open) * 2 ** node.tries)
        heuristics = node.bound_s < self.target_s() * (1 - tuning.SEQUENCE_HEURISTICS_SLACK) and self.heuristics_turn()
        options = SolveOptions(time_limit_s=budget, threads=self.solve_threads, seed=self.seed, rel_gap=self.rel_gap,
                               cutoff=self.cutoff_ticks(seq), presolve=False, heuristics=heuristics,
                               group_branching=branching)
        base = self.elapsed()
        self.dispatch(node, seq.model, options, lambda res: self.sequence_solved(node, seq, base, res, heuristics))

    def end_islands(self, seq: SequenceMIP) -> bool:
        """Split a sequence leaf on the island of its first stage, then of its last: for each
        island with types at that end, the LP relaxation with the end restricted to that island.
        An island whose LP is infeasible or reaches the target's cutoff holds no plan below the
        target at that end, and its types there are fixed to 0 in ``seq`` (a valid tightening of
        the leaf). False when an end has no island left: the leaf holds no plan below the target.
        The LPs share ``END_ISLANDS_S`` seconds; an island not tried in them stays.

        The relaxation mixes islands at every position, a fraction of each (formulations/pipeline_mip.md
        §5, twelfth round); with one island at an end it often has no solution at all. On the
        leaves of "512 L4+A10G+V100, MoE" that came back unfinished after 5-10 s, the three LPs
        of the first stage (about 0.1 s each) were all infeasible."""
        md = seq.model
        cutoff = self.cutoff_ticks(seq)
        deadline = time.perf_counter() + min(tuning.END_ISLANDS_S, max(0.0, self.remaining()))
        for k in dict.fromkeys((0, seq.stages - 1)):
            by_island = seq.island_columns(k)
            if len(by_island) < 2:
                continue  # one island: its LP is the leaf's own relaxation
            kept = 0
            for island, mine in by_island.items():
                left = deadline - time.perf_counter()
                if left < 0.05:  # out of time: the islands not tried stay
                    kept += 1
                    continue
                # no reduced-cost fixing (cutoff=None): its fixings would hold under the restriction only
                with md.zeroed(j for i, cols in by_island.items() if i != island for j in cols):
                    lp = lp_relaxation_bound(md, time_limit_s=left)
                if lp is not None and lp >= (cutoff if cutoff is not None else math.inf):  # inf: infeasible
                    for j in mine:
                        md.set_upper_bound(j, 0.0)
                else:
                    kept += 1
            if not kept:
                return False
        return True

    def heuristics_turn(self) -> bool:
        """Whether a sequence leaf far below the target gets HiGHS's sub-MIP heuristics: yes until
        tuning.SEQUENCE_HEURISTICS_MISSES such leaves in a row found no better plan, then one such
        leaf in 2, 4, ... (at most tuning.SEQUENCE_HEURISTICS_MAX_EVERY) while they keep missing.
        Where the relaxation, not the incumbent, is loose (communication-bound MoE cases: every
        leaf 10% below a plan no leaf beats), the heuristics are time a leaf's infeasibility proof
        would not need: 60 s without an answer against 0.6 s without them on one such leaf."""
        over = self.heuristic_misses - tuning.SEQUENCE_HEURISTICS_MISSES
        if over < 0:
            return True
        self.heuristic_skips += 1
        if self.heuristic_skips >= min(2 ** (over + 1), tuning.SEQUENCE_HEURISTICS_MAX_EVERY):
            self.heuristic_skips = 0
            return True
        return False

    def sequence_solved(self, node: Node, seq: SequenceMIP, base: float, res: Any, heuristics: bool = False) -> None:
        """A sequence leaf's solve came back: offer its plan and close the leaf at its bound, or
        queue it with twice the time. A leaf solved with the heuristics counts as a miss unless its
        plan is the new incumbent (``heuristics_turn``)."""
        sub = self.subs[node.b]
        before = self.inc_s
        tick = seq.options.tick_s
        sub.info["sequence_solves"] = sub.info.get("sequence_solves", 0) + 1
        sub.solve_time_s += res.solve_time_s
        self.trajectories.append([(base + q.elapsed_s, None if q.incumbent is None else q.incumbent * tick,
                                   None if q.bound is None else q.bound * tick) for q in res.trajectory])
        slack = rounding_ticks(sub.problem.num_micro_batches) * tick
        if res.values is not None:
            choices = seq.decode(res.values)
            self.offer(sub.b, choices, choices_timing(sub.problem, choices).step_time_s)
        if heuristics:
            self.heuristic_misses = 0 if self.inc_s < before else self.heuristic_misses + 1
        if res.status == SolveStatus.INFEASIBLE:
            self.close(node, self.target_s())
        elif res.status == SolveStatus.OPTIMAL and res.objective is not None:
            # optimal within the solver's relative gap (rel_gap): its dual bound, not the objective
            proved = res.bound if res.bound is not None else res.objective
            self.close(node, min(self.inc_s, max(node.bound_s, proved * tick - slack)))
        elif res.status in (SolveStatus.FEASIBLE, SolveStatus.NO_SOLUTION):
            proved = res.bound * tick - slack if res.bound is not None else -math.inf
            bound = max(node.bound_s, proved)
            if self.pruned(bound):
                self.close(node, bound)
            else:
                # the sequence model's relaxation is the weaker one here: join the aggregated rows
                if tuning.SEQUENCE_JOIN_AGGREGATED and proved < node.bound_s and not node.joined:
                    node.joined = True
                    sub.info["sequence_weak"] = sub.info.get("sequence_weak", 0) + 1
                # this size's leaves narrow from now on (``leaf_ratio_of``): this one is split on
                # the period when next taken, unless it is narrow already
                sub.info["sequence_unfinished"] = sub.info.get("sequence_unfinished", 0) + 1
                node.bound_s, node.tries = bound, node.tries + 1
                heapq.heappush(self.open, node)
        else:
            self.close(node, node.bound_s)
            sub.info["last_status"] = f"error: {res.message}"
        self.emit(f"{self.tag(node.b)}: sequence {node.describe()} {res.status.value}")

    def refine(self, node: Node, mip: AggregatedMIP, res: Any, budget: float) -> Any:
        """Tighten a window whose model optimum lies below the incumbent.

        The aggregated model relaxes the order of the stages, so its optimum may price a multiset
        below every real plan made of it. Each round takes the optimum's *support class* (its
        first and last type and its set of middle types, any counts and orders), finds the class's
        exact best plan by enumeration (aggregated.support_class_best; offered as an incumbent),
        records it in ``node.excluded_s`` and cuts the class off the window's model; the re-solved
        model bounds everything else. The window's bound is min(excluded_s, the model's bound),
        valid for the whole window. Stops when the model's optimum reaches the incumbent, the
        window is exhausted (INFEASIBLE), a class is too large to enumerate, after tuning.REFINE_ROUNDS
        cuts, or when a re-solve runs out of time; returns the last optimal (or infeasible)
        result, so the window closes at that bound: no-good cuts make later solves slow, and a
        window left open with many of them would absorb the search's time."""
        sub = self.subs[node.b]
        tick = mip.options.tick_s
        deadline = time.perf_counter() + min(budget, self.remaining())
        # re-solves with more cuts get harder: each may take a few times the first solve
        per_solve = max(1.0, tuning.REFINE_SOLVE_FACTOR * res.solve_time_s)
        for _ in range(tuning.REFINE_ROUNDS):
            best = support_class_best(sub.problem, mip, res.values, max_orders=tuning.REFINE_MAX_ORDERS)
            if best is None:
                sub.info["refine_too_large"] = sub.info.get("refine_too_large", 0) + 1
                return res
            if best[1] is not None:
                self.offer(sub.b, best[1], best[0])
            node.excluded_s = min(node.excluded_s, best[0])
            mip.cut_support(res.values)
            sub.info["support_cuts"] = sub.info.get("support_cuts", 0) + 1
            left = min(deadline - time.perf_counter(), per_solve)
            if left < 0.2:
                return res  # its optimum still bounds everything the earlier cuts left
            mip.model.hint = {}
            nxt = solve_model(mip.model, self.backend, SolveOptions(time_limit_s=left, threads=self.solve_threads,
                                                                    seed=self.seed, rel_gap=self.rel_gap,
                                                                    cutoff=self.cutoff_ticks(mip)))
            sub.info["mip_solves"] += 1
            sub.solve_time_s += nxt.solve_time_s
            if nxt.values is not None:
                ch = mip.decode(nxt.values)
                self.offer(sub.b, ch, choices_timing(sub.problem, ch).step_time_s)
            if nxt.status == SolveStatus.INFEASIBLE:
                return nxt
            if nxt.status != SolveStatus.OPTIMAL or nxt.objective is None:
                return res  # out of time: the previous optimum still bounds the rest
            res = nxt
            if self.pruned(res.objective * tick):
                return res
        return res

    def explore_alternatives(self, node: Node, mip: AggregatedMIP, values: list[float], budget: float) -> None:
        """Primal search when the relaxation flattered the MIP's answer (its exact step time is
        worse than the MIP objective): on a copy of the window's model, cut off the used stage-type
        pattern (no-good on the binaries) and re-solve a few times, scoring each answer exactly.
        Only incumbents come out of this; the node's bound is the original model's."""
        sub = self.subs[node.b]
        model = copy.deepcopy(mip.model)
        binaries = [v for group in (mip.e, mip.h, mip.o) for v in group.values()]
        vals = values
        for _ in range(tuning.NOGOOD_ROUNDS):
            left = min(budget / 2, self.remaining())
            if left < 0.5:
                return
            ones = [v for v in binaries if vals[v.index] > 0.5]
            zeros = [v for v in binaries if vals[v.index] <= 0.5]
            model.add(lsum(1 - v for v in ones) + lsum(zeros) >= 1, f"nogood{len(model.constraints)}")
            model.hint = {}
            res = solve_model(model, self.backend, SolveOptions(time_limit_s=left, threads=self.solve_threads,
                                                                 seed=self.seed, rel_gap=self.rel_gap,
                                                                 cutoff=self.cutoff_ticks(mip)))
            sub.info["mip_solves"] += 1
            sub.solve_time_s += res.solve_time_s
            if res.values is None:
                return
            vals = res.values
            ch = mip.decode(vals)
            self.offer(sub.b, ch, choices_timing(sub.problem, ch).step_time_s)


__all__ = ["LeafSolves"]
