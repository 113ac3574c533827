"""The branch and bound over pipeline micro-batch sizes and bottleneck windows.

The plan space splits into sub-problems by pipeline micro-batch size ``b`` (the number of
micro-batches ``m = B / b`` is a constant inside one, which keeps the step time linear). Each
sub-problem is searched by branch and bound on the bottleneck stage time ``Tmax``: a node is a
window ``[lo, hi]``; its LP relaxation (the aggregated model with only stage types no slower than
``hi`` and ``Tmax >= lo``) bounds every plan inside it. Nodes whose bound cannot beat the incumbent
are pruned, wide nodes are split in two, and narrow ones are handed to the MIP backend (leaves.py).
Pipelines of one stage are enumerated exactly. The global bound is the minimum over every open,
pruned or solved node, so the reported gap is valid for the whole plan space
(formulations/pipeline_mip.md §5, docs/design.md).
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_COMPLETED, wait
from dataclasses import replace
from typing import Any

from tangram_opt.baselines.greedy import greedy_by_micro_batch
from tangram_opt.errors import InfeasibleError, NoSolutionError
from tangram_opt.planner.assemble import make_plan, pipeline_plan
from tangram_opt.planner.context import PlanningContext
from tangram_opt.planner.diagnose import diagnose_infeasible
from tangram_opt.planner.formulations.bounds import best_single_stage, fluid_bottleneck_s, quick_lower_bound
from tangram_opt.planner.formulations.knapsack_bound import LayerKnapsack
from tangram_opt.planner.formulations.neighbourhood import CandidateTimes
from tangram_opt.planner.formulations.problem import FormulationOptions, PipelineProblem, StageChoice, choices_timing
from tangram_opt.planner.formulations.stage_types import enumerate_types
from tangram_opt.planner.formulations.ticks import rounding_ticks, tick_for
from tangram_opt.planner.plan import Certificate, CertificateStatus, Plan
from tangram_opt.planner.search import tuning
from tangram_opt.planner.search.leaves import LeafSolves
from tangram_opt.planner.search.nodes import InFlight, Node, SearchEvent, SubProblem
from tangram_opt.planner.search.patterns import IslandOrders
from tangram_opt.planner.search.primal import PrimalHeuristics
from tangram_opt.planner.search.splitting import WindowSplits
from tangram_opt.planner.search.tables import price_ahead
from tangram_opt.planner.search.window_bounds import Window, WindowBounds
from tangram_opt.solvers import SolveOptions, relative_gap, solve_model
from tangram_opt.solvers.model import LinearModel
from tangram_opt.solvers.workers import SolverPool

#: status of a sub-problem whose root the time limit left out (its quick bound is its bound)
NOT_STARTED = "not started (time limit)"


class BranchAndBound(LeafSolves, PrimalHeuristics, IslandOrders, WindowSplits, WindowBounds):
    """One search: its sub-problems, queue of open nodes, incumbent and bounds, from roots to certificate.

    The leaf solves (leaves.py), primal heuristics (primal.py, and the island orders of patterns.py),
    node splits (splitting.py) and window bounds (window_bounds.py) are methods of this class kept
    in their own modules; what is here is the tree: roots, node selection, the worker processes and
    the certificate.
    """

    def __init__(self, ctx: PlanningContext, *, backend: str, time_limit_s: float, threads: int, seed: int,
                 rel_gap: float, formulation: str, windows: bool, fluid_cuts: bool, warm_start: bool,
                 knapsack: bool = True, order_rows: bool = True, leaf_ratio: float | None = None,
                 primal_backoff: bool = True, sequence: bool = True, first_pass: bool = True,
                 pool: SolverPool | None = None,
                 on_progress: Callable[[SearchEvent], None] | None, t0: float,
                 subproblems: Mapping[int, tuple[PipelineProblem, str]] | None = None,
                 plan_space: str | None = None):
        self.ctx = ctx
        #: the sub-problems to search instead of the context's (one per pipeline micro-batch size):
        #: key -> (problem, label), e.g. one per uniform configuration of a launch target
        #: (launch.py); their candidates are what a plan may use, their bounds make the certificate
        self.given_subs = dict(subproblems) if subproblems is not None else None
        self.plan_space = plan_space
        self.backend, self.time_limit_s, self.threads, self.seed = backend, time_limit_s, threads, seed
        self.rel_gap, self.formulation, self.fluid_cuts = rel_gap, formulation, fluid_cuts
        self.knapsack, self.order_rows, self.primal_backoff = knapsack, order_rows, primal_backoff
        self.windows = windows and formulation == "aggregated" and ctx.space.schedule == "1f1b"
        #: narrow windows are split on the stage count and solved by the sequence model
        self.sequence = sequence and self.windows
        self.leaf_ratio = leaf_ratio if leaf_ratio is not None else (
            tuning.SEQUENCE_WINDOW_RATIO if self.sequence else tuning.LEAF_WINDOW_RATIO)
        self.warm_start, self.on_progress, self.t0 = warm_start, on_progress, t0
        self.events: list[SearchEvent] = []
        self.subs: dict[int, SubProblem] = {}
        self.open: list[Node] = []  # heap by bound
        self.closed_bounds: dict[int, list[float]] = {}  # per b: bounds of pruned/solved nodes
        #: the relative gap of this pass (``tuning.FIRST_PASS_GAP`` first, then ``rel_gap``)
        self.gap = max(rel_gap, tuning.FIRST_PASS_GAP) if first_pass else rel_gap
        self.floor: dict[int, float] = {}  # per b: the bound an earlier pass proved
        self.inc_s = math.inf
        self.inc: tuple[int, list[StageChoice]] | None = None
        #: the incumbent's own objective while ``inc_s`` is a better plan's from outside this
        #: search's space (``resume(cutoff_s=...)``: only plans better than that one matter)
        self.inc_own_s: float | None = None
        self.seeds: dict[int, tuple[float, list[StageChoice]]] = {}
        #: the incumbent step time the neighbourhood search last started from, and each pipeline
        #: micro-batch size's candidate time table for it (primal.py)
        self.neighbourhood_from = math.inf
        self.candidate_times: dict[int, CandidateTimes] = {}
        #: seconds the neighbourhood search has had, and its slices between nodes so far
        self.neighbourhood_spent = 0.0
        self.kick_turns = 0
        #: the island-order search (patterns.py): its time so far, the orders tried per sub-problem,
        #: and how many in a row found nothing much better than the incumbent ``order_from_s``
        self.order_spent = 0.0
        self.order_tried: dict[int, set[tuple[int, ...]]] = {}
        self.order_misses = 0
        self.order_from_s = math.inf
        #: dives running in turns, the (size, stage count) pairs started, and the seconds of dives
        #: since the incumbent last improved by ORDER_MIN_GAIN (patterns.py)
        self.dives: list[Any] = []
        self.dived: set[tuple[int, int]] = set()
        self.dive_idle_s = 0.0
        #: sequence leaves solved with HiGHS's heuristics in a row that found no better plan, and
        #: eligible leaves skipped since the last one (``LeafSolves.heuristics_turn``)
        self.heuristic_misses = self.heuristic_skips = 0
        self.trajectories: list[list[tuple[float, float | None, float | None]]] = []
        self.spent: dict[int, float] = {}  # per b: seconds spent on its nodes (splits and leaves)
        #: solver processes for leaf MIPs (``run`` starts them with ``threads >= 2`` and HiGHS,
        #: whose branch and bound is serial); every solve then runs single-threaded
        self.pool = pool
        self.inflight: list[InFlight] = []

    # --- bookkeeping -----------------------------------------------------------------------
    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def remaining(self) -> float:
        return self.time_limit_s - self.elapsed()

    def offer(self, b: int, choices: list[StageChoice], t: float) -> None:
        sub = self.subs[b]
        if sub.objective_s is None or t < sub.objective_s:
            sub.objective_s = t
            stages = choices_timing(sub.problem, choices).stages
            sub.best_t_max_s = max(st.time_s for st in stages)
            sub.best_tail_max_s = max(st.tail_s for st in stages)
            sub.best_choices = list(choices)
        if t < self.inc_s:
            self.inc_s, self.inc, self.inc_own_s = t, (b, choices), None

    def sub_bound(self, sub: SubProblem) -> float:
        """Lower bound of everything in sub-problem ``sub`` (its one-stage optimum included)."""
        parts = [n.bound_s for n in self.pending() if n.b == sub.b] + self.closed_bounds.get(sub.b, [])
        multi = min(parts) if parts else (math.inf if sub.status != "open" else sub.lower_bound_s)
        single = sub.single_s if sub.single_s is not None else math.inf
        return max(self.floor.get(sub.b, -math.inf), min(multi, single))

    def tag(self, key: int) -> str:
        """How progress messages name a sub-problem: its pipeline micro-batch size, or its label."""
        sub = self.subs.get(key)
        label = sub.info.get("label") if sub is not None else None
        return label or f"b={key}"

    def pending(self) -> list[Node]:
        """Nodes not closed: open ones and leaves being solved by a worker."""
        return self.open + [f.node for f in self.inflight]

    @property
    def solve_threads(self) -> int:
        """Threads per MIP solve: one when leaves run in worker processes beside the search."""
        return 1 if self.pool is not None else self.threads

    def global_bound(self) -> float:
        return min([self.inc_s] + [self.sub_bound(s) for s in self.subs.values()])

    def emit(self, message: str) -> None:
        inc = self.inc_s if math.isfinite(self.inc_s) else None
        bnd = self.global_bound()
        ev = SearchEvent(self.elapsed(), inc, bnd if math.isfinite(bnd) else None, message)
        self.events.append(ev)
        if self.on_progress is not None:
            self.on_progress(ev)

    def target_s(self) -> float:
        """Plans at or above this are of no interest: the incumbent less the relative gap of this
        pass. A node with nothing below it closes at it, so the gap is at most that once every
        node is closed."""
        return self.inc_s * (1 - self.gap)

    def cutoff_ticks(self, mip: Any) -> float | None:
        """The target in the ticks of ``mip``'s objective, plus the rounding margin: a plan better
        than the target has a model objective below it."""
        if not math.isfinite(self.inc_s):
            return None
        return self.target_s() / mip.options.tick_s + rounding_ticks(mip.problem.num_micro_batches)

    def close(self, node: Node, bound_s: float) -> None:
        self.closed_bounds.setdefault(node.b, []).append(bound_s)

    def pruned(self, bound_s: float) -> bool:
        return bound_s >= self.target_s()

    # --- phases ----------------------------------------------------------------------------
    def run(self) -> Plan:
        return self.with_workers(self._run)

    def with_workers(self, search: Callable[[], Plan]) -> Plan:
        """``search()`` with solver processes for the leaves and windows, when none were handed in:
        with HiGHS, windows and ``threads >= 2``, the current pool (``solve``'s) or one of its own
        (:func:`leaf_pool`), closed after it."""
        owned = None
        if self.pool is None and self.threads >= 2 and self.backend == "highs" and self.windows:
            self.pool = SolverPool.current()
            if self.pool is None:
                self.pool = owned = leaf_pool(self.threads, self.backend)
        try:
            return search()
        finally:
            if owned is not None:
                owned.close()
            elif self.pool is not None:
                self.pool.stop_busy()  # a shared pool: its unfinished leaves would slow what follows
            self.pool = None

    def _run(self) -> Plan:
        ctx = self.ctx
        if self.given_subs is not None:
            for key, (prob, label) in self.given_subs.items():
                self.subs[key] = SubProblem(b=key, problem=prob, lower_bound_s=quick_lower_bound(prob))
                self.subs[key].info["label"] = label
        else:
            price_ahead(ctx, ctx.pipeline_micro_batches(), self.pool)
            for b in ctx.pipeline_micro_batches():
                prob = ctx.problem(b)
                self.subs[b] = SubProblem(b=b, problem=prob, lower_bound_s=quick_lower_bound(prob))
        live = [s for s in self.subs.values() if s.problem.candidates]
        for s in self.subs.values():
            if not s.problem.candidates:
                s.status = "no candidate fits"
        if not live:
            raise _nothing_fits(ctx)
        if self.warm_start and self.given_subs is None:
            # the greedy across islands, and the same construction on each island alone (so the
            # search starts no worse than a homogeneous plan of any island)
            self.seeds = greedy_by_micro_batch(ctx, thorough=True)
            for b, (t, ch) in self.seeds.items():
                self.offer(b, ch, t)
        for sub in live:  # exact one-stage pipelines: cheap, and they tighten the cutoff
            one = best_single_stage(sub.problem)
            if one is not None:
                sub.single_s = one[0]
                self.offer(sub.b, one[1], one[0])
        self.emit("start")
        self.neighbourhood_search(live)
        if self.warm_start and self.given_subs is None and tuning.RESTRICTED_PRIMAL_SHARE > 0 \
                and sum(len(s.problem.candidates) for s in live) > tuning.RESTRICTED_PRIMAL_CANDIDATES:
            self.restricted_primal(live)
        self.roots(live)
        self.emit("root bounds")
        return self._search(live)

    def roots(self, live: list[SubProblem]) -> None:
        """The root of every sub-problem, lowest quick bound first, while time is left. A
        sub-problem whose root the time limit left out closes at its quick lower bound (valid
        for every plan in it) with status ``NOT_STARTED``; :meth:`resume` starts it. (The launch
        spaces have thousands of sub-problems: 8,138 roots of DeepSeek-V3 on 1,024 GPUs took 21 s.)"""
        for sub in sorted(live, key=lambda s: s.lower_bound_s):
            if self.remaining() <= 0:
                sub.status = NOT_STARTED
                self.closed_bounds.setdefault(sub.b, []).append(sub.lower_bound_s)
                continue
            self.root(sub)

    def resume(self, until_s: float, cutoff_s: float | None = None) -> Plan:
        """Search on from where :meth:`run` stopped (its open nodes, closed bounds, floors and
        incumbent) until ``until_s`` seconds after the start; the plan with the new certificate.
        ``solve`` gives the single-pipeline search the time the multi-pipeline level left over.
        ``cutoff_s``: the objective of a better plan outside this space (the multi-pipeline
        level's): nodes then close at it, as they would at an incumbent, and the certificate's bound
        is a bound of this space that needs to be no higher than it."""
        self.time_limit_s = until_s
        if cutoff_s is not None and cutoff_s < self.inc_s:
            self.inc_own_s = self.inc_own_s if self.inc_own_s is not None else self.inc_s
            self.inc_s = cutoff_s
        live = [s for s in self.subs.values() if s.problem.candidates]
        for sub in live:
            if sub.status == "not finished (time limit)":
                sub.status = "open"
        waiting = [s for s in live if s.status == NOT_STARTED]
        for sub in waiting:  # their quick bound stood in for a root: search them now
            sub.status = "open"
            self.closed_bounds[sub.b] = []
        self.roots(waiting)
        self.emit("resumed")
        return self.with_workers(lambda: self._search(live))

    def _search(self, live: list[SubProblem]) -> Plan:
        """Branch and bound (both passes) from the open nodes until none is left or the time is up."""
        self.branch_and_bound()
        while not self.open and self.gap > self.rel_gap and self.remaining() > 1.0:
            self.next_pass(live)
            self.branch_and_bound()
        still_open = [n for n in self.open if not self.pruned(n.bound_s)]
        for n in self.open:
            if self.pruned(n.bound_s):
                self.close(n, n.bound_s)
        self.open = still_open
        heapq.heapify(self.open)
        for sub in live:
            if sub.status == "open":
                sub.status = "closed" if not any(n.b == sub.b for n in self.open) else "not finished (time limit)"
        return self.finish()

    def branch_and_bound(self) -> None:
        """Nodes by best bound (with primal turns) until none is open or the time is up."""
        turn, every, idle = 0, 2, 0  # a primal turn every ``every`` nodes (backs off while they find nothing)
        while self.open or self.inflight:
            if not self.collect(block=not self.open):
                break  # a worker overran the time limit
            if not self.open:
                continue
            primal = turn % every == every - 1
            node = self.next_node(primal)
            turn += 1
            started, before = time.perf_counter(), self.inc_s
            if self.pruned(node.bound_s):
                self.close(node, node.bound_s)
                continue
            if self.remaining() <= 0.05:
                heapq.heappush(self.open, node)
                break
            splits = self.windows and math.isfinite(node.hi_s) and self.splittable(node)
            if not splits and self.pool is not None and self.pool.idle_worker() is None:
                # the workers are busy: bound a window rather than solve this leaf here, so the
                # workers find leaves waiting when they are done
                other = self.next_split()
                if other is not None:
                    heapq.heappush(self.open, node)
                    node, splits = other, True
                elif tuning.EXTRA_LEAF_WORKERS and self.inflight:
                    # nothing to split: wait for a worker (a leaf solved here would leave a core
                    # idle once the workers finish before it)
                    heapq.heappush(self.open, node)
                    if not self.collect(block=True):
                        break
                    continue
            if splits:
                self.split(node)
            elif self.sequence and node.stages is not None and node.stages[0] == node.stages[1]:
                self.solve_sequence(node)
            else:
                self.solve_leaf(node)
            self.spent[node.b] = self.spent.get(node.b, 0.0) + time.perf_counter() - started
            if self.inc_s < before:
                every, idle = 2, 0
            elif primal and self.primal_backoff:
                idle += 1
                if idle >= tuning.PRIMAL_IDLE_TURNS:
                    every, idle = min(2 * every, tuning.PRIMAL_MAX_EVERY), 0
            self.improve_incumbent()
            self.kick_turn()
            self.order_turn()
        while self.inflight and self.collect(block=True):
            pass

    def dispatch(self, node: Node, model: LinearModel, options: SolveOptions, done: Callable[[Any], None]) -> None:
        """Solve a leaf's model and hand the result to ``done``: in an idle worker process while
        the search goes on with other nodes (the node counts as open until then), else here."""
        worker = self.pool.idle_worker() if self.pool is not None else None
        if worker is None:
            done(solve_model(model, self.backend, options))
            return

        def here() -> Any:
            left = max(0.1, min(options.time_limit_s, self.remaining()))
            return SolverPool.solve_here(model, self.backend, replace(options, time_limit_s=left))

        self.inflight.append(InFlight(worker.submit(model, self.backend, options), node, done, here,
                                      time.perf_counter()))

    def collect(self, block: bool) -> bool:
        """Finish the nodes whose worker has answered (with ``block``, after waiting for the first
        of them). A worker that failed has its work done here instead. False when a worker
        is still busy ``tuning.WORKER_GRACE_S`` after the time limit: its node goes back to the open
        nodes with the bound it had."""
        if not self.inflight:
            return True
        if block:
            _, busy = wait([f.future for f in self.inflight], timeout=max(0.0, self.remaining()) + tuning.WORKER_GRACE_S,
                           return_when=FIRST_COMPLETED)
            if len(busy) == len(self.inflight):
                for f in self.inflight:
                    heapq.heappush(self.open, f.node)
                self.inflight = []
                return False
        for f in [f for f in self.inflight if f.future.done()]:
            self.inflight.remove(f)
            try:
                res = f.future.result()
            except Exception:  # noqa: BLE001 (the worker failed: do its work here, in what time is left)
                res = f.here()
            f.done(res)
            self.spent[f.node.b] = self.spent.get(f.node.b, 0.0) + time.perf_counter() - f.started
        return True

    def next_pass(self, live: list[SubProblem]) -> None:
        """Every node of the first pass is closed: keep each sub-problem's bound as a floor and
        search again from the roots against ``rel_gap``. The first pass closes nodes at a target
        1% below the incumbent, so it fixes more stage types and proves far sooner; the floor
        keeps its proof if the second pass runs out of time. (Aggregated leaves may close below
        the target when their support-class cuts run out, so the first pass ends within 1% only
        when they do not.) The second pass's roots offer no knapsack plans (the first pass's
        did, under an incumbent no better), and a root the time limit leaves out stays closed at
        its floor: a pass that closes just before the limit would otherwise overrun it by the
        roots (4 s on "384 V100+A10G, MoE")."""
        for sub in self.subs.values():
            self.floor[sub.b] = self.sub_bound(sub)
        self.gap, self.closed_bounds = self.rel_gap, {}
        self.emit(f"first pass ({100 * tuning.FIRST_PASS_GAP:g}% below the incumbent) closed every node; "
                  f"searching again for {100 * self.rel_gap:g}%")
        for sub in sorted(live, key=lambda s: self.floor[s.b]):
            if self.pruned(self.floor[sub.b]) or self.remaining() <= tuning.SECOND_PASS_ROOT_MIN_S:
                self.closed_bounds[sub.b] = [self.floor[sub.b]]
            else:
                sub.status = "open"
                self.root(sub, plans=False)
        self.emit("root bounds (second pass)")

    def next_node(self, primal: bool) -> Node:
        """Best-bound (raises the global bound) or, on a primal turn, the pipeline
        micro-batch size that has had the least search time so far (finds plans in every
        sub-problem, not only the one with the lowest relaxation; a size whose windows are cheap
        gets more of them), and there the best-bound window on the slowest stage time of that
        size's best plan while one is open (and, among those, on the tail window holding that plan's
        largest step tail; a dive: that neighbourhood is split down to leaves and solved, so a
        heuristic plan is improved by the MIP early),
        else the best-bound window. Primal turns start at every second node; after
        tuning.PRIMAL_IDLE_TURNS of them find no better plan they come half as often (down to one in
        tuning.PRIMAL_MAX_EVERY), and a better plan from any turn resets them; not in the restricted
        search (``primal_backoff=False``), whose bounds are not used."""
        if not primal or len(self.open) < 2:
            return heapq.heappop(self.open)
        b = min({n.b for n in self.open}, key=lambda b: (self.spent.get(b, 0.0), b))
        mine = [n for n in self.open if n.b == b]
        t_max, tail = self.subs[b].best_t_max_s, self.subs[b].best_tail_max_s
        if t_max is not None:
            mine = [n for n in mine if n.lo_s * (1 - 1e-9) <= t_max <= n.hi_s * (1 + 1e-9)] or mine
        if tail is not None:  # and, after splits on the tail, the tail window of that plan
            mine = [n for n in mine if (n.tail_lo_s is None or n.tail_lo_s < tail * (1 + 1e-9))
                    and tail <= n.tail_hi_s * (1 + 1e-9)] or mine
        best = min(mine, key=lambda n: n.bound_s)
        self.open.remove(best)
        heapq.heapify(self.open)
        return best

    def next_split(self) -> Node | None:
        """The best-bound open node that is split rather than solved (taken off the queue), if any."""
        for node in sorted(self.open):
            if self.pruned(node.bound_s):
                break
            if math.isfinite(node.hi_s) and self.splittable(node):
                self.open.remove(node)
                heapq.heapify(self.open)
                return node
        return None


    def formulation_options(self, sub: SubProblem) -> FormulationOptions:
        cutoff = self.inc_s if math.isfinite(self.inc_s) else None
        ref = self.inc_s if math.isfinite(self.inc_s) else sub.lower_bound_s * 2
        return FormulationOptions(fluid_cuts=self.fluid_cuts, cutoff_s=cutoff, tick_s=tick_for(ref),
                                  order_rows=self.order_rows)

    def root(self, sub: SubProblem, plans: bool = True) -> None:
        """Bound ``sub``'s root window (its covering knapsack first, and with ``plans`` the
        knapsack's own covers offered as plans) and queue it."""
        if self.pruned(sub.lower_bound_s):
            sub.status = "pruned by bound"
            self.closed_bounds.setdefault(sub.b, []).append(sub.lower_bound_s)
            return
        if sub.problem.max_stages < 2:
            sub.status = "optimal (one stage)"
            return
        m = sub.problem.num_micro_batches
        lo = fluid_bottleneck_s(sub.problem) if self.windows else 0.0
        hi = self.inc_s / m if (self.windows and math.isfinite(self.inc_s)) else math.inf
        if self.formulation == "aggregated":
            self.set_types(sub, enumerate_types(sub.problem, self.inc_s if math.isfinite(self.inc_s) else None))
            if self.knapsack and sub.problem.schedule == "1f1b":
                # blocks are indivisible and stages come in the candidates' sizes: the covering
                # knapsack bounds the bottleneck of every pipeline of >= 2 stages (formulations/knapsack_bound.py)
                sack = LayerKnapsack(sub.problem, sub.types)
                knap = sack.bottleneck_bound_s()
                sub.info["knapsack_bottleneck_s"] = knap
                if not math.isfinite(knap) or knap > hi * (1 + 1e-12):
                    sub.status = "no multi-stage plan better than incumbent" if math.isfinite(self.inc_s) \
                        else "infeasible"
                    self.closed_bounds.setdefault(sub.b, []).append(self.inc_s)
                    return
                lo = max(lo, knap)
                if plans:
                    self.knapsack_plans(sub, sack, knap, hi)
        if self.windows and not math.isfinite(hi):  # no incumbent yet: the slowest stage type caps Tmax
            hi = max((t.time_s for ts in sub.types.values() for t in ts), default=lo)  # type: ignore[union-attr]
            hi = max(hi, max(sub.problem.link_hi_s.values()), lo)
        # bounded in a worker when one is idle, while this process starts the next root
        self.evaluate_then(sub, Window(lo, hi), sub.lower_bound_s, lambda node: self.root_bounded(sub, node))

    def root_bounded(self, sub: SubProblem, node: Node | None) -> None:
        if node is None:  # nothing in the root window beats the target
            sub.status = "no multi-stage plan better than incumbent" if math.isfinite(self.inc_s) else "infeasible"
            self.closed_bounds.setdefault(sub.b, []).append(self.target_s())
            return
        sub.info["lp_bound_s"] = node.bound_s
        heapq.heappush(self.open, node)

    def finish(self) -> Plan:
        ctx = self.ctx
        if self.inc is None:
            # nothing found: infeasible unless some sub-problem was cut short by the time limit
            if not self.open and not any(s.status.startswith("not finished") or s.status == NOT_STARTED
                                         for s in self.subs.values()):
                raise _nothing_fits(ctx)
            raise NoSolutionError(f"no plan found within {self.time_limit_s:.1f} s with backend "
                                  f"{self.backend!r}; raise time_limit_s or try another backend")
        bound = self.global_bound()
        objective = self.inc_s if self.inc_own_s is None else self.inc_own_s
        gap = relative_gap(objective, bound) if math.isfinite(bound) else None
        # nodes close at the target, incumbent * (1 - rel_gap): allow its floating-point rounding
        status = CertificateStatus.OPTIMAL if gap is not None and gap <= max(self.rel_gap, 1e-6) * (1 + 1e-9) \
            else CertificateStatus.FEASIBLE
        b, choices = self.inc
        pipe = pipeline_plan(ctx, self.subs[b].problem, choices)
        self.emit("done")
        space_text = self.plan_space or (ctx.space.describe() + f"; at most {ctx.max_stages} stages")
        if len(ctx.kinds) == 2 and self.formulation == "aggregated":
            space_text += "; dense-first layers all on the first stage"
        rows = []
        for s in self.subs.values():
            rows.append({"pipeline_micro_batch": s.problem.pipeline_micro_batch,
                         "micro_batches": s.problem.num_micro_batches,
                         "status": s.status, "quick_bound_s": s.lower_bound_s, "bound_s": self.sub_bound(s),
                         "objective_s": s.objective_s, "one_stage_s": s.single_s, "solve_time_s": s.solve_time_s,
                         "candidates": len(s.problem.candidates), **s.info})
        greedy_best = min((t for t, _ in self.seeds.values()), default=None)
        cert = Certificate(
            status=status, backend=self.backend, objective_s=objective, bound_s=bound, gap=gap,
            solve_time_s=self.elapsed(), plan_space=space_text, subproblems=tuple(rows),
            trajectory=tuple((e.elapsed_s, e.incumbent_s, e.bound_s) for e in self.events),
            notes=(f"formulation: {self.formulation}" + (" with bottleneck windows" if self.windows else "")
                   + (" and sequence leaves" if self.sequence else ""),
                   f"greedy warm start {greedy_best:.6f} s" if greedy_best is not None else "no warm start",
                   f"candidates kept after exact Pareto pruning: {_pruning_note(ctx)}"))
        return make_plan(ctx, [pipe], method="mip", certificate=cert)


def leaf_pool(threads: int, backend: str) -> SolverPool | None:
    """The solver processes of a search with ``threads`` threads: one per spare core and
    ``tuning.EXTRA_LEAF_WORKERS`` more, with HiGHS (whose branch and bound is serial) and
    ``threads >= 2``; None otherwise. Workers start when first used."""
    if threads < 2 or backend != "highs":
        return None
    return SolverPool(threads - 1 + tuning.EXTRA_LEAF_WORKERS)


def _pruning_note(ctx: PlanningContext) -> str:
    st = getattr(ctx.provider, "stats", None)
    if st is None:
        return "provided externally"
    return (f"{st.kept} of {st.enumerated} enumerated ({st.invalid} invalid, {st.no_fit} cannot hold a layer, "
            f"{st.dominated} dominated" + (f", {st.heuristic} dropped heuristically" if st.heuristic else "") + ")")


def _nothing_fits(ctx: PlanningContext) -> InfeasibleError:
    """Diagnose why no plan exists: the smallest footprint of one layer, per island."""
    return diagnose_infeasible(ctx)


__all__ = ["BranchAndBound", "leaf_pool"]
