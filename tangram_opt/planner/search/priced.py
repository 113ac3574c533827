"""The search under a non-default :class:`~tangram_opt.planner.search.objective.Objective`
(formulations/pipeline_mip.md §4b).

A dollar objective or a limit changes what a bound is: the step-time bounds the branch and bound
prunes with (fluid, knapsack, window LPs, the one-stage optimum) bound no price. So this search
keeps only what stays valid: one sub-problem per pipeline micro-batch size, each solved as one
positional MIP (§4) that carries the prices of the islands' GPUs, the limits as rows and the
objective itself; a sub-problem's bound is its MIP's dual bound (or the target, when nothing in it
beats the incumbent). Every plan a MIP reports is re-scored exactly (closed form, exact prices) and
checked against the limits before it becomes the incumbent. Windows, knapsack bounds, sequence
leaves, the multi-pipeline level and launch targets do not run here (api.py refuses what was asked
for explicitly); the positional MIP grows as positions x candidates, so this search suits clusters
of a few islands and the default candidate pruning.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from tangram_opt import units as u
from tangram_opt.baselines.cheapest import (
    Pipelines,
    cheapest_first,
    first_meeting,
    greedy_on,
    node_order,
    plan_on,
    prefix,
)
from tangram_opt.baselines.greedy import greedy_by_micro_batch
from tangram_opt.errors import InfeasibleError, NoSolutionError
from tangram_opt.planner.assemble import make_plan, pipeline_plan
from tangram_opt.planner.context import PlanningContext
from tangram_opt.planner.diagnose import diagnose_infeasible
from tangram_opt.planner.formulations.bounds import quick_lower_bound
from tangram_opt.planner.formulations.positional import PositionalMIP
from tangram_opt.planner.formulations.problem import FormulationOptions, PipelineProblem, StageChoice, choices_timing
from tangram_opt.planner.formulations.ticks import rounding_ticks, tick_for
from tangram_opt.planner.multi_pipeline.generation import choices_of
from tangram_opt.planner.plan import Certificate, CertificateStatus, Plan
from tangram_opt.planner.search.nodes import SearchEvent
from tangram_opt.planner.search.objective import FORMULATION_OBJECTIVE, Objective, check_max_nodes
from tangram_opt.planner.search.priced_bounds import capacity_work, cheapest_stage_usd_h, priced_work
from tangram_opt.solvers import SolveOptions, SolveStatus, relative_gap
from tangram_opt.solvers.workers import DeadlineSolver
from tangram_opt.specs.pricing import fill_cheapest, price_steps

#: shares of the time limit for the node-selection warm start: greedy pipelines on cheapest-first
#: node selections, then the single-pipeline search on the best of them (:meth:`PricedSearch.select`)
SELECTION_GREEDY_SHARE, SELECTION_SEARCH_SHARE = 0.1, 0.4
#: the most stage binaries (positions x candidates) a priced MIP is built with: larger ones (e.g.
#: DeepSeek-V3 over 1,024 GPUs: 84,000-103,000 at b >= 8, ~10^7 nonzeros, 15-20 s to build in
#: Python and more memory in the solver than this machine has) keep their solver-free bound
PRICED_MIP_MAX_BINARIES = 60_000
#: ticks per step for the cost-per-token model: its objective multiplies prices by the step time,
#: and ~1e5 ticks keep those products (~1e10) easy for LP-based solvers (rounding ~1e-5, in the
#: bound's favour)
COST_STEP_TICKS = 1e7


def group_caps(ctx: PlanningContext, max_nodes: Mapping[str, int] | None) -> dict[str, int]:
    """Node group name -> GPUs a plan may use of it (all of them, or ``max_nodes`` of its nodes)."""
    check_max_nodes(dict(max_nodes) if max_nodes is not None else None, ctx.cluster)
    return {g.name: min(g.num_nodes, (max_nodes or {}).get(g.name, g.num_nodes)) * g.node.gpus_per_node
            for g in ctx.cluster.node_groups}


def capped_steps(ctx: PlanningContext, node_groups: Sequence[str], caps: Mapping[str, int]
                 ) -> tuple[tuple[str, int, float], ...]:
    """An island's price steps (:func:`~tangram_opt.specs.pricing.price_steps`) with each group
    cut to the GPUs the node budget leaves it."""
    return tuple((g, min(n, caps[g]), p) for g, n, p in price_steps(ctx.cluster, node_groups) if min(n, caps[g]) > 0)


def island_price_curves(ctx: PlanningContext, caps: Mapping[str, int]) -> dict[int, tuple[tuple[int, float], ...]]:
    """Island index -> price steps ``((GPUs, USD per GPU-hour), ...)``, cheapest first, within the
    node budget ``caps`` (raises the pricing layer's SpecError naming
    ``node_groups[i].price_per_gpu_hour`` for a group with no price)."""
    return {isl.index: tuple((n, p) for _, n, p in capped_steps(ctx, isl.node_groups, caps)) for isl in ctx.islands}


def link_egress_usd(ctx: PlanningContext, b: int) -> dict[tuple[int, int], float]:
    """(island, island) -> USD a stage boundary between them costs per micro-batch of ``b``
    sequences in cross-zone transfer: the activations one way and their gradients back
    (``2 x CostModel.p2p_bytes(b)``, the bytes :func:`tangram_opt.costing.plan_cost` counts) at the
    zone link's ``egress_usd_per_gb``; pairs without a priced link are left out."""
    out = {}
    for a in ctx.islands:
        for c in ctx.islands:
            link = ctx.cluster.zone_link(a.zone, c.zone) if a.zone != c.zone else None
            if link is not None and link.egress_usd_per_gb:
                out[a.index, c.index] = 2 * ctx.cost.p2p_bytes(b) / u.GB * link.egress_usd_per_gb
    return out


def plan_prices(plan: Plan, ctx: PlanningContext, max_nodes: Mapping[str, int] | None = None) -> dict[str, Any]:
    """The dollar figures the plan summary prints: USD/h of the GPUs used, USD per 1M tokens (at the
    exact step time, with the cross-zone transfer of stage boundaries) and the whole nodes each node
    group leaves free. The same accounting as :func:`tangram_opt.costing.plan_cost`, except that a
    node budget (``max_nodes``) takes the budgeted groups' GPUs out of the cheapest-first fill, and
    that the gradient all-reduce between the pipelines of a multi-pipeline plan across zones is
    priced there only."""
    used = plan.gpus_by_island()
    usd_h, free = 0.0, []
    caps = group_caps(ctx, max_nodes)
    for isl in ctx.islands:
        steps = capped_steps(ctx, isl.node_groups, caps)
        taken = fill_cheapest(steps, used.get(isl.name, 0))
        price = {g: p for g, _, p in steps}
        usd_h += sum(n * price[g] for g, n in taken.items())
        for g, n_gpus, _ in price_steps(ctx.cluster, isl.node_groups):
            nodes = n_gpus // isl.gpus_per_node
            idle = nodes - math.ceil(taken.get(g, 0) / isl.gpus_per_node)
            if idle:
                free.append({"group": g, "nodes_free": idle, "nodes": nodes})
    tokens = plan.global_batch_size * plan.seq_len
    index = {isl.name: isl.index for isl in ctx.islands}
    egress = 0.0
    for pipe in plan.pipelines:
        usd = link_egress_usd(ctx, pipe.pipeline_micro_batch)
        egress += pipe.num_micro_batches * sum(usd.get((index[a.island], index[b.island]), 0.0)
                                               for a, b in zip(pipe.stages, pipe.stages[1:]))
    out = {"usd_per_hour": usd_h,
           "usd_per_1m_tokens": (usd_h * plan.step_time_s / u.HOUR + egress) / tokens * 1e6, "free_nodes": free}
    if egress:
        out["egress_usd_per_step"] = egress
    return out


@dataclass(slots=True)
class _Sub:
    problem: PipelineProblem
    status: str = "open"
    bound: float = -math.inf
    objective: float | None = None
    solve_time_s: float = 0.0
    capacity_work: float | None = None  # capacity_work at the step cap, once computed


class PricedSearch:
    """One search under ``objective``: a priced positional MIP per pipeline micro-batch size."""

    def __init__(self, ctx: PlanningContext, objective: Objective, *, backend: str, time_limit_s: float,
                 threads: int, seed: int, rel_gap: float, fluid_cuts: bool = True, warm_start: bool = True,
                 on_progress: Callable[[SearchEvent], None] | None = None, t0: float | None = None,
                 solver: Callable[..., Plan] | None = None):
        self.ctx, self.obj = ctx, objective
        self.backend, self.time_limit_s, self.threads, self.seed, self.rel_gap = (backend, time_limit_s, threads,
                                                                                 seed, rel_gap)
        self.fluid_cuts, self.warm_start, self.on_progress = fluid_cuts, warm_start, on_progress
        self.solver = solver  # the single-pipeline search, for the node-selection warm start
        self.t0 = time.perf_counter() if t0 is None else t0
        self.tokens = ctx.training.global_batch_size * ctx.training.seq_len
        self.max_step_s = self.tokens / objective.min_tokens_per_s if objective.min_tokens_per_s else None
        self.caps = group_caps(ctx, objective.max_nodes)
        self.island_gpus = {isl.index: sum(self.caps[g] for g in isl.node_groups) for isl in ctx.islands}
        self.prices = island_price_curves(ctx, self.caps) if objective.needs_prices else {}
        self.form_objective = FORMULATION_OBJECTIVE[objective.kind]
        self.subs: dict[int, _Sub] = {}
        self.inc: tuple[int, list[StageChoice]] | None = None
        self.inc_plan: Plan | None = None  # a start plan of several pipelines, when it is the incumbent
        self.inc_value = math.inf
        self.inc_step_s = math.inf
        self.events: list[SearchEvent] = []
        self.rejected = 0  # MIP solutions whose exact closed form broke a limit (relaxation slack)
        self.deadline = DeadlineSolver()

    # --- values ----------------------------------------------------------------------------
    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def value(self, problem: PipelineProblem, choices: list[StageChoice]) -> tuple[float, float, bool]:
        """(objective value in the objective's unit, closed-form step time, meets the limits)."""
        step = choices_timing(problem, choices).step_time_s
        used: dict[int, int] = {}
        for st in choices:
            c = problem.candidates[st.candidate]
            used[c.island] = used.get(c.island, 0) + c.gpus
        if any(n > problem.island_gpus[i] for i, n in used.items()):  # a seed beyond the node budget
            return math.inf, step, False
        usd_h = problem.usd_per_hour(choices) if problem.island_prices else 0.0
        v, ok = self.score(usd_h, step, problem.egress_usd_per_step(choices))
        return v, step, ok

    def score(self, usd_h: float, step: float, egress_usd: float) -> tuple[float, bool]:
        """(objective value, meets the limits) of a plan of ``usd_h`` USD/h for its GPUs, a
        closed-form step of ``step`` s and ``egress_usd`` of cross-zone transfer per step."""
        ok = (self.max_step_s is None or step <= self.max_step_s * (1 + 1e-12)) and (
            self.obj.budget_usd_per_h is None or usd_h <= self.obj.budget_usd_per_h * (1 + 1e-12))
        kind = self.obj.kind
        v = (step if kind == "throughput" else usd_h if kind == "min_cost"
             else (usd_h * step / u.HOUR + egress_usd) / self.tokens * 1e6)
        return v, ok

    def offer(self, b: int, choices: list[StageChoice]) -> bool:
        sub = self.subs[b]
        v, step, ok = self.value(sub.problem, choices)
        if not ok:
            return False
        if sub.objective is None or v < sub.objective:
            sub.objective = v
        if v < self.inc_value or (v == self.inc_value and step < self.inc_step_s):
            self.inc_value, self.inc_step_s, self.inc, self.inc_plan = v, step, (b, list(choices)), None
        return True

    def offer_plan(self, plan: Plan) -> bool:
        """A plan given to start from (``solve(start=...)``): a single pipeline whose stages are in
        the candidate table is offered as stage choices; any other plan is scored whole (its exact
        step time and prices) and kept as the incumbent if it is the best, so the certificate's
        bound covers the single-pipeline space and that plan."""
        if len(plan.pipelines) == 1:
            pipe = plan.pipelines[0]
            ch = choices_of(self.ctx, pipe)
            if ch is not None and pipe.pipeline_micro_batch in self.subs:
                return self.offer(pipe.pipeline_micro_batch, ch)
        names = {isl.name: isl.index for isl in self.ctx.islands}
        used = plan.gpus_by_island()
        if any(name not in names or n > self.island_gpus[names[name]] for name, n in used.items()):
            return False
        if self.obj.kind == "cost_per_token" and len(plan.pipelines) > 1 and any(
                z.egress_usd_per_gb for z in self.ctx.cluster.zone_links):
            return False  # its cross-pipeline transfer is priced by costing.plan_cost only
        prices = plan_prices(plan, self.ctx, self.obj.max_nodes) if self.prices else {}
        v, ok = self.score(prices.get("usd_per_hour", 0.0), plan.step_time_s, prices.get("egress_usd_per_step", 0.0))
        if not ok:
            return False
        if v < self.inc_value:
            self.inc_value, self.inc_step_s, self.inc, self.inc_plan = v, plan.step_time_s, None, plan
        return True

    def target(self) -> float:
        return self.inc_value * (1 - self.rel_gap)

    def global_bound(self) -> float:
        return min([self.inc_value] + [s.bound for s in self.subs.values()])

    def emit(self, message: str) -> None:
        inc = self.inc_value if math.isfinite(self.inc_value) else None
        bnd = self.global_bound()
        ev = SearchEvent(self.elapsed(), inc, bnd if math.isfinite(bnd) else None, message)
        self.events.append(ev)
        if self.on_progress is not None:
            self.on_progress(ev)

    # --- the MIP of one sub-problem --------------------------------------------------------
    def options_for(self, sub: _Sub) -> FormulationOptions:
        p = sub.problem
        cap = self.max_step_s
        if self.obj.kind == "cost_per_token" and math.isfinite(self.inc_value):
            # an improving plan has step <= its cost / the cheapest stage's USD per second
            cheapest = cheapest_stage_usd_h(p)
            if cheapest > 0:
                usd_step = self.target() * self.tokens / 1e6
                cap = min(cap if cap is not None else math.inf, usd_step * u.HOUR / cheapest)
        ref = cap if cap is not None else 2 * quick_lower_bound(p)
        tick = tick_for(ref, COST_STEP_TICKS) if self.obj.kind == "cost_per_token" else tick_for(ref)
        return FormulationOptions(fluid_cuts=self.fluid_cuts, cutoff_s=cap, tick_s=tick,
                                  objective=self.form_objective, budget_usd_per_h=self.obj.budget_usd_per_h,
                                  max_step_s=cap)

    def to_value(self, mip: PositionalMIP, x: float, *, bound: bool) -> float:
        """A model objective (or bound) in the objective's unit; bounds lose the rounding slack."""
        o, p = mip.options, mip.problem
        slack = rounding_ticks(p.num_micro_batches) if bound else 0
        if self.obj.kind == "throughput":
            return (x - slack) * o.tick_s
        if self.obj.kind == "min_cost":
            return x * o.price_unit_usd_h
        top = sum(n * p_ for steps in p.island_prices.values() for n, p_ in steps) / o.price_unit_usd_h
        usd_step = (x - slack * top) * o.price_unit_usd_h * o.tick_s / u.HOUR
        return usd_step / self.tokens * 1e6

    def cutoff(self, mip: PositionalMIP) -> float | None:
        """The target in the model's objective units (plus the rounding margin)."""
        if not math.isfinite(self.inc_value):
            return None
        o, p = mip.options, mip.problem
        t = self.target()
        slack = rounding_ticks(p.num_micro_batches)
        if self.obj.kind == "throughput":
            return t / o.tick_s + slack
        if self.obj.kind == "min_cost":
            return t / o.price_unit_usd_h
        top = sum(n * p_ for steps in p.island_prices.values() for n, p_ in steps) / o.price_unit_usd_h
        return t * self.tokens / 1e6 * u.HOUR / (o.price_unit_usd_h * o.tick_s) + slack * top

    def solve_sub(self, b: int, budget_s: float) -> None:
        sub = self.subs[b]
        size = sub.problem.max_stages * len(sub.problem.candidates)
        if size > PRICED_MIP_MAX_BINARIES:
            sub.status = f"too large (a MIP of ~{size:,} stage binaries; at most {PRICED_MIP_MAX_BINARIES:,})"
            sub.bound = max(sub.bound, self.trivial_bound(sub))
            self.emit(f"b={b}: too large for the priced MIP")
            return
        started = time.perf_counter()
        mip = PositionalMIP(sub.problem, self.options_for(sub)).build()
        cutoff = self.cutoff(mip)
        limit = max(0.5, budget_s)
        options = SolveOptions(time_limit_s=limit, threads=self.threads, seed=self.seed, rel_gap=self.rel_gap,
                               cutoff=cutoff)
        # in a worker process stopped at a hard deadline: HiGHS can overrun its limit by minutes here
        res = self.deadline.solve(mip.model, self.backend, options, hard_s=limit + max(2.0, 0.25 * limit))
        sub.solve_time_s += time.perf_counter() - started
        if res is None:
            sub.status = "not finished (the solver overran its time limit and was stopped)"
            sub.bound = max(sub.bound, self.trivial_bound(sub))
            self.emit(f"b={b}: stopped at the deadline")
            return
        target = self.target() if cutoff is not None else math.inf
        if res.values is not None:
            if not self.offer(b, mip.decode(res.values)):
                self.rejected += 1
        if res.status == SolveStatus.INFEASIBLE:
            sub.status = "no plan better than the incumbent" if cutoff is not None else "no plan meets the limits"
            sub.bound = target
        elif res.status == SolveStatus.ERROR:
            sub.status = f"error: {res.message}"
            sub.bound = max(sub.bound, self.trivial_bound(sub))
        else:
            model_bound = (self.to_value(mip, res.bound, bound=True) if res.bound is not None
                           else self.trivial_bound(sub))
            sub.bound = min(max(model_bound, self.trivial_bound(sub)), target)
            sub.status = "optimal" if res.status == SolveStatus.OPTIMAL else "not finished (time limit)"
        self.emit(f"b={b}: {res.status.value}")

    def trivial_bound(self, sub: _Sub) -> float:
        """A bound without a solver: the quick step-time bound; the cheapest stage's USD/h (every
        plan has one); their product per token; and the priced work (``priced_bounds.priced_work``,
        and under a step cap ``priced_bounds.capacity_work``) over the budget, the step cap or per
        token."""
        p = sub.problem
        step = quick_lower_bound(p)
        work = p.num_micro_batches * priced_work(p)  # <= USD/h x step of every plan (USD/h x s)
        if self.max_step_s is not None and self.prices:
            if sub.capacity_work is None:
                sub.capacity_work = capacity_work(p, self.max_step_s)
            work = max(work, p.num_micro_batches * sub.capacity_work)
        if self.obj.kind == "throughput":
            budget = self.obj.budget_usd_per_h
            return max(step, work / budget) if budget else step
        usd_h = cheapest_stage_usd_h(p)
        if self.obj.kind == "min_cost":
            return max(usd_h, work / self.max_step_s) if self.max_step_s else usd_h
        return max(usd_h * step, work) / u.HOUR / self.tokens * 1e6

    # --- the search ------------------------------------------------------------------------
    def run(self, start: Sequence[Plan] = ()) -> Plan:
        """The search; ``start``: plans to start from (:meth:`offer_plan`)."""
        try:
            return self._run(start)
        finally:
            self.deadline.close()

    def _run(self, start: Sequence[Plan]) -> Plan:
        ctx = self.ctx
        for b in ctx.pipeline_micro_batches():
            egress = link_egress_usd(ctx, b) if self.obj.kind == "cost_per_token" else {}
            self.subs[b] = _Sub(problem=replace(ctx.problem(b), island_prices=self.prices,
                                                island_gpus=dict(self.island_gpus), link_egress_usd=egress))
        live = [b for b, s in self.subs.items() if s.problem.candidates]
        for b, s in self.subs.items():
            if not s.problem.candidates:
                s.status, s.bound = "no candidate fits", math.inf
        if not live:
            raise diagnose_infeasible(ctx)
        for plan in start:
            self.offer_plan(plan)
        if self.warm_start:
            for b, (_, ch) in greedy_by_micro_batch(ctx, thorough=True).items():
                self.offer(b, ch)
            if self.prices:
                self.select()
        self.emit("start")
        for k, b in enumerate(sorted(live, key=lambda b: quick_lower_bound(self.subs[b].problem))):
            left = self.time_limit_s - self.elapsed()
            if left <= 0.05:
                self.subs[b].bound = self.trivial_bound(self.subs[b])
                self.subs[b].status = "not started (time limit)"
                continue
            self.solve_sub(b, left / (len(live) - k))
        # the time sub-problems that closed early left: to those stopped by their share, lowest
        # bound first, each solved again (with the better cutoff) on a share of what is left
        while self.time_limit_s - self.elapsed() > 1.0:
            again = sorted((s.bound, b) for b, s in self.subs.items()
                           if s.status.startswith("not") and s.bound < self.target())
            if not again:
                break
            _, b = again[0]
            before = self.subs[b].bound
            self.solve_sub(b, (self.time_limit_s - self.elapsed()) / len(again))
            self.subs[b].bound = max(before, self.subs[b].bound)  # both are valid bounds
        return self.finish()

    # --- the node-selection warm start ------------------------------------------------------
    def offer_all(self, pipes: Pipelines) -> float:
        """Offer every pipeline; the best value among those that meet the limits."""
        best = math.inf
        for b, (_, ch) in pipes.items():
            if b in self.subs and self.offer(b, ch):
                best = min(best, self.value(self.subs[b].problem, ch)[0])
        return best

    def select(self) -> None:
        """Plans on node selections (tangram_opt/baselines/cheapest.py): the first k nodes,
        cheapest USD per peak FLOP/s first. Greedy pipelines on prefixes of 1, 2, 4, ... nodes,
        at each node group's end and, under a throughput floor, on the prefixes a bisection for
        the fewest nodes meeting it visits, and the cheapest-first baseline's plan; then the
        single-pipeline search (``solver``) on the best prefixes and, under a floor, a bisection
        below the best one with that search. Each plan is offered as an incumbent (re-scored
        exactly); none of this bounds anything."""
        order = node_order(self.ctx, self.obj.max_nodes)
        n, limit = len(order), self.time_limit_s
        if n == 0:  # the node budget leaves no node
            return
        greedy_until = self.elapsed() + SELECTION_GREEDY_SHARE * limit
        value: dict[int, float] = {}

        def greedy_value(k: int) -> float:
            if k not in value:
                value[k] = self.offer_all(greedy_on(self.ctx, prefix(order, k), thorough=True)) \
                    if self.elapsed() < greedy_until else math.inf
            return value[k]

        group_ends = {i + 1 for i in range(n) if i + 1 == n or order[i + 1] != order[i]}
        ks = sorted({min(2 ** j, n) for j in range(n.bit_length() + 1)} | group_ends)
        for k in ks:
            greedy_value(k)
        if self.max_step_s is not None:
            first_meeting(n, lambda k: math.isfinite(greedy_value(k)))
            try:  # the cheapest-first baseline itself: the search starts no dearer than it
                base = cheapest_first(self.ctx, min_tokens_per_s=self.obj.min_tokens_per_s,
                                      max_nodes=self.obj.max_nodes)
                self.offer_plan(base.plan)
            except InfeasibleError:
                pass
        self.emit(f"node selections: greedy plans on {len(value)} prefixes")
        if self.solver is None:
            return
        search_until = self.elapsed() + SELECTION_SEARCH_SHARE * limit

        def searched(k: int, share: float) -> float:
            left = search_until - self.elapsed()
            if left < 0.5:
                return math.inf
            pipes = plan_on(self.ctx, prefix(order, k), self.solver, time_limit_s=max(0.5, left * share),
                            backend=self.backend, threads=self.threads, seed=self.seed, rel_gap=max(self.rel_gap, 1e-3))
            return self.offer_all(pipes)

        # the best two prefixes, or every node when no greedy plan meets the limits (a floor the
        # greedy pipelines miss may still be met by the search's)
        ranked = [k for k in sorted(value, key=value.get) if math.isfinite(value[k])][:2] or [n]
        found = [math.isfinite(searched(k, 0.5 if i == 0 else 1.0 / 3)) for i, k in enumerate(ranked)]
        if self.max_step_s is not None and found[0]:
            # the search's plans run faster than the greedy's: fewer nodes may meet the floor
            lo, hi = 0, ranked[0]
            while hi - lo > 1 and search_until - self.elapsed() > 0.5:
                mid = (lo + hi) // 2
                if math.isfinite(searched(mid, 0.5)):
                    hi = mid
                else:
                    lo = mid
        self.emit("node selections: searched")

    def finish(self) -> Plan:
        ctx = self.ctx
        if self.inc is None and self.inc_plan is None:
            if self.rejected:
                raise NoSolutionError(f"no plan found ({self.obj.describe()}): the {self.rejected} plan(s) the MIPs "
                                      "found break a limit in the exact closed form (the model relaxes the step "
                                      "time by a few ticks and the p2p side times); loosen the limit slightly")
            if any(s.status.startswith(("not", "error", "too large")) for s in self.subs.values()):
                raise NoSolutionError(f"no plan found within {self.time_limit_s:.1f} s with backend {self.backend!r} "
                                      f"({self.obj.describe()}); raise time_limit_s or try another backend")
            raise InfeasibleError(self.limits_diagnosis(), closest={"limits": self.obj.limits()})
        bound = self.global_bound()
        gap = relative_gap(self.inc_value, bound) if math.isfinite(bound) else None
        status = CertificateStatus.OPTIMAL if gap is not None and gap <= max(self.rel_gap, 1e-6) * (1 + 1e-9) \
            else CertificateStatus.FEASIBLE
        self.emit("done")
        space = ctx.space.describe() + f"; at most {ctx.max_stages} stages; single pipelines"
        rows = tuple({"pipeline_micro_batch": s.problem.pipeline_micro_batch,
                      "micro_batches": s.problem.num_micro_batches, "status": s.status, "bound": s.bound,
                      "objective": s.objective, "solve_time_s": s.solve_time_s,
                      "candidates": len(s.problem.candidates)} for s in self.subs.values())
        throughput = self.obj.kind == "throughput"
        notes = [f"objective: {self.obj.describe()}",
                 "formulation: positional, one priced MIP per pipeline micro-batch size "
                 "(formulations/pipeline_mip.md §4b)",
                 "the multi-pipeline level does not run under a non-default objective"]
        if self.inc_plan is not None:
            notes.append(f"the plan is the start plan ({len(self.inc_plan.pipelines)} pipelines): nothing the "
                         "search found beats it; the bound covers single pipelines and that plan")
        if self.rejected:
            notes.append(f"{self.rejected} MIP solution(s) broke a limit in the exact closed form and were dropped")
        if self.obj.kind == "cost_per_token" and status != CertificateStatus.OPTIMAL and self.backend != "cp-sat":
            notes.append("cost per token: CP-SAT closes these models much faster than LP-based backends "
                         "(formulations/pipeline_mip.md §4b); try backend='cp-sat'")
        cert = Certificate(
            status=status, backend=self.backend, objective_s=self.inc_step_s,
            bound_s=bound if throughput else None, gap=gap, solve_time_s=self.elapsed(), plan_space=space,
            subproblems=rows, trajectory=tuple((e.elapsed_s, e.incumbent_s, e.bound_s) for e in self.events),
            notes=tuple(notes), objective=self.obj.kind, objective_value=self.inc_value,
            objective_bound=bound if math.isfinite(bound) else None, objective_unit=self.obj.unit,
            limits=self.obj.limits())
        if self.inc is None:
            assert self.inc_plan is not None
            return replace(self.inc_plan, certificate=cert)
        b, choices = self.inc
        return make_plan(ctx, [pipeline_plan(ctx, self.subs[b].problem, choices)], method="mip", certificate=cert)

    def limits_diagnosis(self) -> str:
        """Why no plan meets the limits, with the number that misses (a short search without it)."""
        o, left = self.obj, max(1.0, min(10.0, self.time_limit_s))
        parts = [f"no plan meets the limits ({o.describe()})"]
        if o.budget_usd_per_h is not None:
            try:
                cheap = PricedSearch(self.ctx, Objective(kind="min_cost", min_tokens_per_s=o.min_tokens_per_s,
                                                            max_nodes=o.max_nodes),
                                     backend=self.backend, time_limit_s=left, threads=self.threads, seed=self.seed,
                                     rel_gap=self.rel_gap).run()
                floor = " that meets the throughput floor" if o.min_tokens_per_s else ""
                parts.append(f"the cheapest plan{floor} costs ${cheap.certificate.objective_value:,.2f}/h "
                             f"> budget ${o.budget_usd_per_h:,.2f}/h: raise budget_usd_per_h"
                             + (" or lower min_tokens_per_s" if o.min_tokens_per_s else ""))
            except InfeasibleError:
                pass
            except NoSolutionError:
                parts.append("no plan was found without the budget either within the time")
        if o.min_tokens_per_s is not None and len(parts) == 1:
            try:
                fast = PricedSearch(self.ctx, Objective(budget_usd_per_h=o.budget_usd_per_h, max_nodes=o.max_nodes),
                                    backend=self.backend, time_limit_s=left, threads=self.threads, seed=self.seed,
                                    rel_gap=self.rel_gap).run()
                best = self.tokens / fast.certificate.objective_bound if fast.certificate.objective_bound else math.inf
                within = " within the budget" if o.budget_usd_per_h else ""
                parts.append(f"the fastest plan{within} reaches {self.tokens / fast.certificate.objective_s:,.0f} "
                             f"tokens/s (no plan above {best:,.0f}) < floor {o.min_tokens_per_s:,.0f}: lower "
                             "min_tokens_per_s" + (" or raise budget_usd_per_h" if o.budget_usd_per_h else ""))
            except (InfeasibleError, NoSolutionError):
                pass
        return "; ".join(parts)


__all__ = ["COST_STEP_TICKS", "PricedSearch", "island_price_curves", "link_egress_usd", "plan_prices"]
