"""Primal heuristics of the branch and bound: finding good plans early, so the cutoff prunes more.

- :meth:`PrimalHeuristics.restricted_primal`: on large instances, the same search over a
  heuristically pruned candidate table first (its plans are real plans of the full table);
- :meth:`PrimalHeuristics.knapsack_plans`: the layer-covering knapsack's own covers near its bound,
  ordered for memory and neighbours and scored exactly;
- :meth:`PrimalHeuristics.neighbourhood_search`, :meth:`PrimalHeuristics.kick_turn` and
  :meth:`PrimalHeuristics.improve_incumbent`: replace / merge / split / relocate moves from each
  sub-problem's best plan before the roots, in slices between nodes, from every new incumbent and
  from a knapsack plan that improves its sub-problem (formulations/neighbourhood.py).

The greedy warm start (tangram_opt/baselines/greedy.py) and the diving primal turns of node
selection (:meth:`BranchAndBound.next_node`) are the other primal parts. Nothing here touches a
bound: only :meth:`BranchAndBound.offer` is called with what is found.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import replace

import numpy as np

from tangram_opt.errors import InfeasibleError, NoSolutionError
from tangram_opt.planner.candidates import Candidate, HeuristicallyPruned
from tangram_opt.planner.context import PlanningContext
from tangram_opt.planner.formulations.knapsack_bound import LayerKnapsack
from tangram_opt.planner.formulations.neighbourhood import CandidateTimes, improve
from tangram_opt.planner.formulations.ordering import polish, try_order, turn_ends
from tangram_opt.planner.formulations.problem import StageChoice, choices_timing
from tangram_opt.planner.formulations.stage_types import StageType
from tangram_opt.planner.islands import Island
from tangram_opt.planner.search import tuning
from tangram_opt.planner.search.nodes import SubProblem


class _ContextTables:
    """A context's candidate tables (computed once per pipeline micro-batch size) as a provider."""

    def __init__(self, ctx: PlanningContext):
        self.ctx = ctx

    def candidates(self, island: Island, pipeline_micro_batch: int) -> list[Candidate]:
        return [c for c in self.ctx.candidates(pipeline_micro_batch) if c.island == island.index]


class PrimalHeuristics:
    """The primal heuristics of :class:`~tangram_opt.planner.search.branch_and_bound.BranchAndBound`
    (a mixin: it uses the search's context, subs, time budget and :meth:`offer`)."""

    __slots__ = ()

    def restricted_primal(self, live: list[SubProblem]) -> None:
        """Primal heuristic for large instances: the same search on a heuristically pruned candidate
        set (the fastest candidates per island and size) with a share of the time. Its plans are
        real plans of the full space (their candidates are full-space candidates), so they become
        incumbents and sharpen the cutoff; its bounds are not used."""
        ctx = self.ctx
        # the full context's candidate tables, cut: nothing is priced twice, and the rows are the
        # very objects of the full tables (whatever the provider returns on a second call)
        small_space = replace(ctx.space, heuristic_keep=tuning.RESTRICTED_PRIMAL_KEEP)
        small = PlanningContext(ctx.cluster, ctx.model, ctx.training, space=small_space, cost=ctx.cost,
                                provider=HeuristicallyPruned(_ContextTables(ctx), ctx.kinds, tuning.RESTRICTED_PRIMAL_KEEP))
        inner = type(self)(small, backend=self.backend, time_limit_s=self.remaining() * tuning.RESTRICTED_PRIMAL_SHARE,
                                threads=self.threads, seed=self.seed, rel_gap=tuning.RESTRICTED_PRIMAL_GAP,
                                formulation=self.formulation,
                                windows=self.windows, fluid_cuts=self.fluid_cuts, knapsack=self.knapsack,
                                warm_start=False, order_rows=False, leaf_ratio=tuning.RESTRICTED_PRIMAL_LEAF_RATIO,
                                primal_backoff=False, sequence=False, first_pass=False, pool=self.pool,
                                on_progress=None,
                                t0=time.perf_counter())
        if tuning.RESTRICTED_PRIMAL_CUTOFF and math.isfinite(self.inc_s):
            # it looks only for plans better than the incumbent (the neighbourhood search's, run
            # before it): the incumbent is its cutoff, and its nodes close at that target
            inner.inc_s = self.inc_s / (1 - tuning.RESTRICTED_PRIMAL_GAP)
        try:
            inner.run()
        except (InfeasibleError, NoSolutionError):
            inner.inc = None
        if inner.inc is None:
            self.emit(f"restricted search (fastest {tuning.RESTRICTED_PRIMAL_KEEP} candidates per island and size): "
                      "nothing better than the incumbent")
            return
        b, choices = inner.inc
        full = {id(c): i for i, c in enumerate(self.subs[b].problem.candidates)}
        small_cands = inner.subs[b].problem.candidates
        mapped = [StageChoice(candidate=full[id(small_cands[ch.candidate])], layers=dict(ch.layers))
                  for ch in choices]
        t = choices_timing(self.subs[b].problem, mapped).step_time_s
        self.offer(b, mapped, t)
        self.emit(f"restricted search (fastest {tuning.RESTRICTED_PRIMAL_KEEP} candidates per island and size): "
                  f"{t:.4f} s")

    def knapsack_plans(self, sub: SubProblem, sack: LayerKnapsack, knap: float, hi: float) -> None:
        """Primal heuristic: the knapsack's own covers for caps a little above its bound.

        For a few caps between ``knap`` and 1.1 ``knap`` (or the incumbent's period) and a few
        minimum memory tolerances, take the stages the covering knapsack picks, order them for
        memory and neighbours (``try_order``) and score them exactly; the best
        tuning.KNAPSACK_PLAN_POLISH also get their layer split polished and other end stages tried
        (``turn_ends``: the plan reversed, its island blocks reordered). Balanced by construction,
        these plans are often better than what the window MIPs find in their time; when they improve
        the sub-problem's best plan to within ``KNAPSACK_DESCENT_NEAR`` of the incumbent, the
        neighbourhood search descends from it at once. Each cap is tried as is, with one island
        capped lower (separator covers), with k small stages set aside on one island for each
        placement of the first and last stage (reserved separators: large stages of every island,
        that island's included, alternate with them). Island caps: for caps up to
        ``KNAPSACK_PLAN_ISLAND_SPAN`` times the bound, every island's cap a fraction
        (``KNAPSACK_PLAN_ISLAND_CAPS``) of it. Where slow NICs make gradient syncs long, stages of a
        slow-NIC island are best kept small, so that their tails hide behind the backward upstream,
        and the period then lies well above the knapsack's bound: the best plan known of
        "384 V100+A10G, MoE" at b = 8 has V100-16 stages of half its period, which is 1.21 times
        the bound.
        """
        budget = min(self.remaining(), max(tuning.KNAPSACK_PLAN_MIN_S, tuning.KNAPSACK_PLAN_SHARE * self.time_limit_s))
        if budget <= 0:
            return
        deadline = time.perf_counter() + budget
        before = sub.objective_s if sub.objective_s is not None else math.inf

        def caps_up_to(span: float) -> np.ndarray:
            """About KNAPSACK_PLAN_CAPS of the knapsack's stage times in [knap, min(hi, span knap)]."""
            times = sack.times[(sack.times >= knap) & (sack.times <= min(hi, knap * span))]
            return times[::max(1, len(times) // tuning.KNAPSACK_PLAN_CAPS)]

        caps = caps_up_to(tuning.KNAPSACK_PLAN_SPAN)
        seen: set[tuple] = set()
        p2p = sub.problem.link_lo_s
        islands = sorted(sub.problem.island_gpus)
        # separators: island j capped so that its stages may neighbour a stage at the full cap
        # across j's cheapest link to another island (T_a + T_b + 2 c <= 2 lam), so large stages elsewhere
        # need not neighbour each other and pay their link
        link_in = {j: min(min(p2p[i, j], p2p[j, i]) for i in islands if i != j) for j in islands} \
            if len(islands) > 1 else {}
        ordered: list[tuple[float, list[StageChoice]]] = []

        def order(cover: tuple[StageType, list[StageType], StageType] | None) -> None:
            if cover is None:
                return
            first, mids, last = cover
            key = (first.candidate, first.layers, tuple(sorted((t.candidate, t.layers) for t in mids)),
                   last.candidate, last.layers)
            if key in seen:
                return
            seen.add(key)
            choices = try_order(sub.problem, first, mids, last, polish_split=False)
            if choices is not None:
                ordered.append((choices_timing(sub.problem, choices).step_time_s, choices))

        for lam in caps:
            if time.perf_counter() > deadline:
                break
            for tol, sep in itertools.product(tuning.KNAPSACK_PLAN_TOLERANCES, [None, *link_in]):
                order(sack.cover(float(lam), tol, None if sep is None else {sep: float(lam) - 2 * link_in[sep]}))
            # reserved separators: k small stages on island j, the rest covered at the full cap, for
            # every island pair holding the first and last stage; k follows the count of full-cap
            # stages the cover needs separated (#full <= #small + 1 lets them alternate)
            for j, ends in itertools.product(link_in, itertools.product(islands, islands)):
                sep_cap = float(lam) - 2 * link_in[j]
                k, tried = 1, set()
                while k not in tried:
                    tried.add(k)
                    cover = sack.cover(float(lam), 0, None, (j, k, sep_cap), ends)
                    if cover is None:
                        break
                    order(cover)
                    stages = [cover[0], *cover[1], cover[2]]
                    full = sum(t.time_s > sep_cap * (1 + 1e-12) for t in stages)
                    k = max(1, k + full - 1 - (len(stages) - full))
        # island caps: every island within its own fraction of the cap, one at the full cap
        fractions = [f for f in itertools.product(tuning.KNAPSACK_PLAN_ISLAND_CAPS, repeat=len(islands))
                     if max(f) == 1 and min(f) < 1] if len(islands) > 1 else []
        for lam in caps_up_to(tuning.KNAPSACK_PLAN_ISLAND_SPAN):
            if time.perf_counter() > deadline:
                break
            for frac in fractions:
                order(sack.cover(float(lam), 0, {i: float(lam) * f for i, f in zip(islands, frac)}))
        # the layer split is polished (the costly part) on the best few orders only
        ordered.sort(key=lambda q: q[0])
        for rank, (t, choices) in enumerate(ordered):
            if rank < tuning.KNAPSACK_PLAN_POLISH:
                choices = turn_ends(sub.problem, polish(sub.problem, choices))
                t = choices_timing(sub.problem, choices).step_time_s
            self.offer(sub.b, choices, t)
        sub.info["knapsack_plans"] = len(ordered)
        if sub.objective_s is not None and sub.objective_s < before \
                and sub.objective_s <= self.inc_s * (1 + tuning.KNAPSACK_DESCENT_NEAR):
            # a better plan of this size near the incumbent: one descent from it now, not when the
            # kicks between nodes come round to it (on "384 V100+A10G, MoE" a cover of 19.75 s
            # descends to 19.11 s in under a second, 40 s before the kicks got there)
            self.improve_plan(sub, time.perf_counter() + min(self.remaining(), max(
                tuning.NEIGHBOURHOOD_TURN_MIN_S, tuning.KNAPSACK_DESCENT_SHARE * self.time_limit_s)), kicks=0)

    def neighbourhood_search(self, live: list[SubProblem]) -> None:
        """Before the roots: one descent from each sub-problem's best plan (the greedy's, the
        one-stage optimum), best plans first, then kicks (iterated local search) on the
        ``tuning.NEIGHBOURHOOD_KICK_SUBS`` best, sharing at most ``NEIGHBOURHOOD_START_S`` seconds
        (and ``NEIGHBOURHOOD_SHARE`` of the limit, and ``NEIGHBOURHOOD_START_PER_CANDIDATE_S`` per
        candidate) in all. A better incumbent before the roots
        tightens every root window and the stage types' cutoff; later kicks are
        :meth:`kick_turn`'s."""
        start = time.perf_counter()
        size = sum(len(s.problem.candidates) for s in live)
        deadline = start + min(self.remaining(), tuning.NEIGHBOURHOOD_SHARE * self.time_limit_s,
                               tuning.NEIGHBOURHOOD_START_S, tuning.NEIGHBOURHOOD_START_PER_CANDIDATE_S * size)
        subs = sorted((s for s in live if s.best_choices is not None), key=lambda s: s.objective_s)
        for sub in subs:
            if time.perf_counter() >= deadline:
                break
            self.improve_plan(sub, deadline, kicks=0)
        best = sorted(subs, key=lambda s: s.objective_s)[:tuning.NEIGHBOURHOOD_KICK_SUBS]
        for i, sub in enumerate(best):
            now = time.perf_counter()
            if now >= deadline:
                break
            self.improve_plan(sub, now + (deadline - now) / (len(best) - i))
        self.neighbourhood_from = self.inc_s

    def kick_turn(self) -> None:
        """Between nodes: while the neighbourhood search has had less than ``NEIGHBOURHOOD_SHARE``
        of the time so far, one slice (``NEIGHBOURHOOD_SLICE_S``) of kicks from the best plan of
        the next of the ``NEIGHBOURHOOD_KICK_SUBS`` best open sub-problems, in turn (a new seed
        each slice). A search that closes early has spent little on it; a long one keeps
        looking for plans the window MIPs have not found."""
        if self.neighbourhood_spent >= tuning.NEIGHBOURHOOD_SHARE * self.elapsed() or self.remaining() <= 0.5:
            return
        subs = sorted((s for s in self.subs.values() if s.status == "open" and s.best_choices is not None
                       and not self.pruned(self.sub_bound(s))),
                      key=lambda s: s.objective_s)[:tuning.NEIGHBOURHOOD_KICK_SUBS]
        if not subs:
            return
        self.kick_turns += 1
        self.improve_plan(subs[self.kick_turns % len(subs)], time.perf_counter() + tuning.NEIGHBOURHOOD_SLICE_S,
                          seed=self.seed + self.kick_turns)

    def improve_incumbent(self) -> None:
        """A new incumbent (from any heuristic or leaf) is improved by the neighbourhood search for
        ``tuning.NEIGHBOURHOOD_TURN_SHARE`` of the time limit (at least ``NEIGHBOURHOOD_TURN_MIN_S``)."""
        if self.inc is None or self.inc_s >= self.neighbourhood_from:
            return
        budget = min(self.remaining(), max(tuning.NEIGHBOURHOOD_TURN_MIN_S,
                                           tuning.NEIGHBOURHOOD_TURN_SHARE * self.time_limit_s))
        self.improve_plan(self.subs[self.inc[0]], time.perf_counter() + budget)
        self.neighbourhood_from = self.inc_s

    def improve_plan(self, sub: SubProblem, deadline: float, kicks: int | None = None, seed: int | None = None) -> None:
        """Offer the best plan the neighbourhood search reaches from ``sub``'s best plan by ``deadline``
        (at most ``kicks`` kicks when given: 0 is one descent; kicks seeded by ``seed``, else the
        search's seed). Its time counts in ``neighbourhood_spent`` (what :meth:`kick_turn` rations)."""
        if sub.best_choices is None:
            return
        start = time.perf_counter()
        table = self.candidate_times.get(sub.b)
        if table is None:
            table = self.candidate_times[sub.b] = CandidateTimes(sub.problem)
        choices, t = improve(sub.problem, sub.best_choices, deadline, table,
                             seed=self.seed if seed is None else seed, kicks=kicks)
        self.offer(sub.b, choices, t)
        self.neighbourhood_spent += time.perf_counter() - start


__all__ = ["PrimalHeuristics"]
