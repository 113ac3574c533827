"""Level 2 of the multi-pipeline search: how many replicas of each template, with how many micro-batches.

An all-integer MIP (formulations/multi_pipeline.md) over (template, micro-batch count) pairs:
the shares sum to the global batch, the replicas fit every island's GPUs, and the objective is the
slowest pipeline's closed form plus the cross-pipeline all-reduce (bounded below by its ring
factor, latency and zone-link terms, :class:`_ZoneBounds`) plus the slowest optimizer update. Times
are integer ticks (ticks.py, ``LEVEL2_TICKS``) rounded so that the optimum is a valid lower bound;
every answer is re-priced exactly (:meth:`TemplatePricer.objective`). A greedy plan
(:func:`~tangram_opt.planner.multi_pipeline.warm_start.greedy_level2`) warm-starts it.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tangram_opt.planner.context import PlanningContext
from tangram_opt.planner.formulations.problem import capacities
from tangram_opt.planner.formulations.ticks import LEVEL2_TICKS, rounders, tick_for
from tangram_opt.planner.multi_pipeline.sync_model import latency_steps, ring_factor
from tangram_opt.planner.multi_pipeline.templates import Template, TemplatePricer
from tangram_opt.planner.multi_pipeline.warm_start import (GREEDY_CHOICES, greedy_level2, split_micro_batches,
                                                          uniform_replicas)
from tangram_opt.solvers import (LinearModel, SolveOptions, SolveStatus, Var, lp_relaxation_bound, lsum, relative_gap,
                                 solve_model)
from tangram_opt.solvers.workers import solve_by_deadline


@dataclass(slots=True)
class Level2Result:
    """What the level-2 search found over the template space with 2..R_max pipelines."""

    #: "optimal", "feasible", "nothing better than the cutoff", "no solution", "not run", "model not
    #: built (too large for the time left)[; greedy plan]"
    status: str
    pipes: list[tuple[Template, int]] | None
    objective_s: float | None  # exact model objective of ``pipes``
    bound_s: float  # valid lower bound over the template space (R >= 2), capped by the cutoff
    pairs: int = 0
    templates: int = 0
    solve_time_s: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)


#: share of the level-2 time left after the root LP that the branched LP bound may use (issue 27:
#: with 0.3 of the whole level-2 time its four zone-pattern LPs ran out of time on issue 27's
#: two-zone case and the bound fell back to the root LP, formulations/pipeline_mip.md §5; 0.7 until
#: the tenth round, when on a slower machine the four LPs took 5.0-5.3 s of a 5.4 s share and
#: missed it in some runs, while the MIP after them found nothing in every run)
BRANCHED_LP_SHARE = 0.9
#: seconds one (template, micro-batch count) pair costs to build into the level-2 model with its
#: rows (measured: 258,087 pairs of a 65,536-sequence batch took 26 s, then 6 s of LP, on a 2-core
#: machine that runs this package about half as fast as the one of the planner pages). A model
#: whose pairs would take longer than the time left is not built: the level's bound is then the
#: fluid bound, and its plan the warm start's
BUILD_S_PER_PAIR = 1e-4
#: a level-2 MIP with more nonzeros than this is solved in a worker process stopped
#: DEADLINE_GRACE_S after its time limit (``solve_by_deadline``): HiGHS's presolve does not stop at
#: the limit, and on "384 V100+A10G, MoE" of the communication-bound family (167,742 nonzeros) a
#: 3.6 s limit ran 13 s, so a 60 s solve took 68 s. Smaller models are solved here: a process
#: costs a fraction of a second to start
DEADLINE_NONZEROS = 20_000
DEADLINE_GRACE_S = 1.0
#: "optimal" means a gap within the solver's tolerance or this resolution (three level-2 ticks; the
#: level-2 MIP counts time in ticks of about cutoff / LEVEL2_TICKS, ticks.py)
OPTIMAL_RESOLUTION = 3 / LEVEL2_TICKS
#: least time of a level-2 MIP that can only improve the plan: its LP bound is at or above the
#: single-pipeline level's bound (``floor_s``), which then limits the certificate whatever the MIP
#: proves. It gets the share of the time left that its possible gain on the plan (cutoff - LP
#: bound) is of the whole gap (cutoff - floor), at least this; the rest goes back to the
#: single-pipeline search (formulations/pipeline_mip.md §5, fourteenth round)
PRIMAL_ONLY_MIN_S = 1.0


def _replica_capacities(ctx: PlanningContext, templates: Sequence[Template]) -> dict[int, int]:
    """Per island, the most of its GPUs that replicas of ``templates`` can hold at once: the largest
    sum of the templates' GPU counts there that is at most the island's GPUs
    (formulations/problem.py ``largest_total``; formulations/multi_pipeline.md, "Island capacity")."""
    return capacities({i.index: i.num_gpus for i in ctx.islands},
                      ((i, g) for t in templates for i, g in t.gpus.items() if g))


def fluid_throughput(ctx: PlanningContext, templates: Sequence[Template]) -> float:
    """Most sequences per second any set of replicas can sustain (LP over fractional replica counts).

    A replica of t with m micro-batches needs ``CF'(m) >= m * min_period`` seconds, so it runs at
    most ``b / min_period`` sequences per second; GPUs per island bound the replicas.
    """
    md = LinearModel(name="fluid")
    x = [md.add_var(f"x{t.index}", 0.0, math.inf) for t in templates]
    cap = _replica_capacities(ctx, templates)
    for isl in ctx.islands:
        terms = [t.gpus[isl.index] * v for t, v in zip(templates, x) if t.gpus.get(isl.index)]
        if terms:
            md.add(lsum(terms) <= cap[isl.index], f"gpus[{isl.index}]")
    md.minimize(lsum(-(t.b / max(t.min_period_s, 1e-12)) * v for t, v in zip(templates, x)))
    lp = lp_relaxation_bound(md, 10.0)
    if lp is not None and math.isfinite(lp):
        return -lp * (1 + 1e-7)
    # no LP solver: every GPU at the best per-GPU rate of any template touching its island
    best = {i.index: 0.0 for i in ctx.islands}
    for t in templates:
        rate = t.b / max(t.min_period_s, 1e-12) / t.total_gpus
        for i in t.gpus:
            best[i] = max(best[i], rate)
    return sum(best[i.index] * cap[i.index] for i in ctx.islands)


def solve_level2(ctx: PlanningContext, templates: Sequence[Template], pricer: TemplatePricer, *, cutoff_s: float,
                 max_pipelines: int, backend: str, time_limit_s: float, threads: int = 1, seed: int = 0,
                 rel_gap: float = 1e-4, strengthen: bool = True, floor_s: float | None = None) -> Level2Result:
    """Choose replica counts of (template, micro-batch count) pairs; see formulations/multi_pipeline.md.

    Only plans with 2..``max_pipelines`` pipelines and objective below ``cutoff_s`` are searched
    (pairs that cannot be part of one are left out, which keeps the bound valid: it is capped at
    the cutoff). ``strengthen=False`` leaves out the issue-27 strengthenings (the constant lower
    bounds of ``Rho`` and ``Opt`` and the branched LP bound), for comparisons. ``floor_s``: a bound
    the certificate has anyway (the single-pipeline level's); a MIP whose LP bound is at or above
    it can only find a better plan, and gets a share of the time by what that can gain
    (``PRIMAL_ONLY_MIN_S``), returning early.
    """
    t0 = time.perf_counter()
    B = ctx.training.global_batch_size
    Rmax = max_pipelines
    if not templates:
        return Level2Result(status="not run", pipes=None, objective_s=None, bound_s=cutoff_s)
    lat_min = min(i.node.nic_latency_s for i in ctx.islands)
    b_min = min(t.b for t in templates)
    # a pair is in a plan of R >= 2 pipelines only with X >= c_2 ratio + latency and the optimizer after
    floor = {t.index: t.optimizer_s + ring_factor(2) * t.ratio_s + latency_steps(2) * lat_min for t in templates}
    pairs: list[tuple[Template, int, float]] = []
    for t in templates:
        for m in range(1, min(t.m_cap, (B - b_min) // t.b) + 1):
            v = pricer.cf(t, m)
            if v + floor[t.index] >= cutoff_s:
                break  # CF' is increasing in m
            pairs.append((t, m, v))
            if len(pairs) % 4096 == 0 and len(pairs) * BUILD_S_PER_PAIR > time_limit_s - (time.perf_counter() - t0):
                # more pairs than the time left could build (a batch of 10^5-10^6 sequences: one pair
                # per micro-batch count): the fluid bound over every template, and the greedy's plan
                warm = greedy_level2(ctx, templates, pricer, Rmax, deadline=t0 + time_limit_s)
                return _not_built(ctx, templates, warm, cutoff_s, f"more than {len(pairs)} pairs", t0,
                                  pairs=len(pairs))
    if not pairs:
        return Level2Result(status="nothing better than the cutoff", pipes=None, objective_s=None,
                            bound_s=cutoff_s, templates=len(templates))
    warm = greedy_level2(ctx, sorted({id(t): t for t, _, _ in pairs}.values(), key=lambda t: t.index), pricer, Rmax,
                         deadline=t0 + time_limit_s)
    if warm is not None and warm[0] >= cutoff_s:
        warm = None
    # the warm start is a better cutoff: the MIP searches plans strictly better than it
    cut = min(cutoff_s, warm[0]) if warm is not None else cutoff_s
    pairs = [(t, m, v) for t, m, v in pairs if v + floor[t.index] < cut]
    if not pairs:
        assert warm is not None
        return Level2Result(status="optimal", pipes=warm[1], objective_s=warm[0], bound_s=warm[0],
                            templates=len(templates), solve_time_s=time.perf_counter() - t0,
                            info={"warm_start_s": warm[0], "note": "no pair can beat the warm start"})
    used_t = sorted({id(t): t for t, _, _ in pairs}.values(), key=lambda t: t.index)
    thr = fluid_throughput(ctx, used_t)
    fluid_s = B / thr if thr > 0 else 0.0
    if len(pairs) * BUILD_S_PER_PAIR > time_limit_s - (time.perf_counter() - t0):
        return _not_built(ctx, used_t, warm, cut, f"{len(pairs)} pairs", t0, pairs=len(pairs),
                          templates_count=len(templates))
    reference = min(cut, max(cf for _, _, cf in pairs))
    tick = tick_for(reference, LEVEL2_TICKS)
    fl, _ = rounders(tick)  # ticks, rounded down: every row built with it is implied by the exact values

    md = LinearModel(name="multi_pipeline")
    cap = {}
    for t in used_t:
        cap[t.index] = min([Rmax] + [ctx.islands[i].num_gpus // g for i, g in t.gpus.items()])
    n, v = {}, {}
    for t, m, _ in pairs:
        n[t.index, m] = md.add_var(f"n[{t.index},{m}]", 0, cap[t.index], integer=True)
        v[t.index, m] = md.add_binary(f"v[{t.index},{m}]")
        md.add(n[t.index, m] <= cap[t.index] * v[t.index, m], f"nv[{t.index},{m}]")
        md.add(n[t.index, m] >= v[t.index, m], f"vn[{t.index},{m}]")
    md.add(lsum(t.b * m * n[t.index, m] for t, m, _ in pairs) == B, "batch")
    gpus_cap = _replica_capacities(ctx, used_t)
    for isl in ctx.islands:
        terms = [t.gpus[isl.index] * n[t.index, m] for t, m, _ in pairs if t.gpus.get(isl.index)]
        if terms:
            md.add(lsum(terms) <= gpus_cap[isl.index], f"gpus[{isl.index}]")
    y = {R: md.add_binary(f"y[{R}]") for R in range(2, Rmax + 1)}
    md.add(lsum(y.values()) == 1, "one_R")
    md.add(lsum(n.values()) == lsum(R * yv for R, yv in y.items()), "R")
    cf_max = max(fl(cf) for _, _, cf in pairs)
    tp = md.add_var("Tpipe", min(fl(fluid_s), cf_max), cf_max, integer=True)
    opt_max = max(fl(t.optimizer_s) for t in used_t)
    # every plan here has R >= 2 pipelines, so some template runs: Opt >= min_t OPT_t and
    # Rho >= min_t ratio_t hold whatever the (fractional) w[t] (formulations/multi_pipeline.md)
    o = md.add_var("Opt", min(fl(t.optimizer_s) for t in used_t) if strengthen else 0, opt_max, integer=True)
    # GPU-time per island: replicas are disjoint and each is busy CF' <= Tpipe, so
    # sum g CF' n <= N Tpipe (valid; it prices fill, drain and tails into the LP relaxation)
    for isl in ctx.islands:
        terms = [t.gpus[isl.index] * fl(cf) * n[t.index, m] for t, m, cf in pairs if t.gpus.get(isl.index)]
        if terms:
            md.add(lsum(terms) <= gpus_cap[isl.index] * tp, f"gpu_time[{isl.index}]")
    for t, m, cf in pairs:
        md.add(tp >= fl(cf) * v[t.index, m], f"pipe[{t.index},{m}]")
    # w[t]: template t has a replica (per-template rows keep the model small for LP-based presolve)
    w = {t.index: md.add_binary(f"w[{t.index}]") for t in used_t}
    for t in used_t:
        ms = [var for (ti, _), var in v.items() if ti == t.index]
        md.add(lsum(ms) <= len(ms) * w[t.index], f"used[{t.index}]")
        if fl(t.optimizer_s) > 0:
            md.add(o >= fl(t.optimizer_s) * w[t.index], f"opt[{t.index}]")
    # sync: ring factor 2(R-1)/R times the most loaded resource, plus latency (lower bounds)
    zs = _ZoneBounds(ctx, pricer, used_t, fl)
    rho_ub = max([fl(t.ratio_s) for t in used_t] + [zs.sigma] + list(zs.kappa.values()))
    rho = md.add_var("Rho", min(fl(t.ratio_s) for t in used_t) if strengthen else 0, rho_ub, integer=True)
    for t in used_t:
        if fl(t.ratio_s) > 0:
            md.add(rho >= fl(t.ratio_s) * w[t.index], f"rho[{t.index}]")
    span = zs.build(md, w, rho)
    lat = {R: fl(latency_steps(R) * lat_min) for R in y}
    zlat = {R: fl(latency_steps(R) * zs.zone_latency_s) for R in y}
    x_ub = 2 * rho_ub + max(lat.values()) + max(zlat.values()) + 1
    x = md.add_var("X", 0, x_ub, integer=True)

    def zl(R: int) -> Any:
        """Zone-link latency of every all-reduce group when single-zone pipelines span zones."""
        return zlat[R] * span if span is not None else 0

    md.add(x >= rho + lat[2] + zl(2), "sync_R2")  # 2(R-1)/R >= 1 and latencies grow with R
    if strengthen:
        _gpu_weighted_rows(md, ctx, pairs, n, ((rho, lambda t: fl(t.ratio_s)), (o, lambda t: fl(t.optimizer_s))),
                           gpus_cap)
        _average_rows(md, y, lsum(n.values()), (
            ("rho", rho, rho_ub, [(fl(t.ratio_s), n[t.index, m]) for t, m, _ in pairs]),
            ("pipe", tp, cf_max, [(fl(cf), n[t.index, m]) for t, m, cf in pairs])))
    for R, yv in y.items():
        big = 2 * (R - 1) * rho_ub + R * (lat[R] + zlat[R])
        md.add(R * x >= 2 * (R - 1) * rho + R * lat[R] + R * zl(R) - big * (1 - yv), f"sync[{R}]")
    md.minimize(tp + x + o)
    # the LP relaxation (HiGHS) bounds the MIP optimum; as a row it also helps CP-SAT prune
    lp = lp_relaxation_bound(md, max(2.0, min(10.0, 0.3 * time_limit_s)))
    if lp is not None and math.isinf(lp) and lp > 0:
        return _nothing_better(warm, cutoff_s, len(pairs), len(templates), time.perf_counter() - t0, {})
    lp_ticks = math.ceil(lp - 1e-6 * max(1.0, abs(lp))) if lp is not None and math.isfinite(lp) else None
    branched = None

    def beyond_cutoff(close_ok: bool = False) -> Level2Result | None:
        """Every plan of the model is at least (LP - 1 tick) exactly: when that is no better than the
        cutoff, the MIP (and more LPs) could only prove what the LP already has (on "384 V100+A10G,
        MoE" of the communication-bound family the MIP ran out its 10 s to say so). Likewise when
        the warm start lies within the optimality resolution of it, once the LPs are done
        (``close_ok``; issue 27's "128 A100, 2 zones 5 ms": the branched LP meets the warm start to
        4e-7, and the MIP ran 6 s to find nothing)."""
        if lp_ticks is None:
            return None
        lp_s = (lp_ticks - 1) * tick
        close = close_ok and warm is not None and relative_gap(warm[0], lp_s) <= max(rel_gap, OPTIMAL_RESOLUTION)
        if lp_s < cut and not close:
            return None
        info = {"root_lp_bound_s": lp * tick if lp is not None else None,
                "branched_lp_bound_s": None if branched is None else branched * tick,
                "lp_bound_s": lp_ticks * tick, "tick_s": tick, "solver_status": "not run (LP bound at the cutoff)"}
        if lp_s < cut:
            assert warm is not None
            info["solver_status"] = "not run (LP bound within the resolution of the warm start)"
            info["warm_start_s"] = warm[0]
            return Level2Result(status="optimal", pipes=warm[1], objective_s=warm[0], bound_s=lp_s, pairs=len(pairs),
                                templates=len(templates), solve_time_s=time.perf_counter() - t0, info=info)
        return _nothing_better(warm, cutoff_s, len(pairs), len(templates), time.perf_counter() - t0, info)

    if (done := beyond_cutoff()) is not None:
        return done
    if lp_ticks is not None and strengthen:
        # branch on the zone binaries (or, with one zone, on R): the minimum over the patterns of
        # their LPs bounds the MIP as well, and prices the zone link / the ring factor exactly
        patterns = _patterns(zs, y)
        # most of what is left: the pattern LPs make the bound, while the MIP after them mostly
        # searches plans the warm start (uniform replicas included) has usually found already
        budget = max(2.0, BRANCHED_LP_SHARE * (time_limit_s - (time.perf_counter() - t0)))
        branched = _branched_lp(md, patterns, budget)
        if branched is not None and math.isfinite(branched):
            lp_ticks = max(lp_ticks, math.ceil(branched - 1e-6 * max(1.0, abs(branched))))
        elif branched is not None:  # every pattern is LP-infeasible: so is the MIP
            return _nothing_better(warm, cutoff_s, len(pairs), len(templates), time.perf_counter() - t0, {})
    if (done := beyond_cutoff(close_ok=True)) is not None:
        return done
    if lp_ticks is not None:
        md.add(tp + x + o >= lp_ticks, "lp_bound")
    hinted = False
    if warm is not None:
        hint = _level2_hint(warm[1], n, v, w, y, tp, x, o, rho, fl, lat, zlat, pricer, zs)
        if hint is not None:
            md.set_hint(hint)
            hinted = True
    st = md.stats()
    left = max(0.5, time_limit_s - (time.perf_counter() - t0))  # building, the greedy and the LP took their share
    lp_s = None if lp_ticks is None else (lp_ticks - 1) * tick  # what the LP bounds every plan by
    if floor_s is not None and lp_s is not None and floor_s <= lp_s and floor_s < cut:
        # its bound cannot raise the certificate's: the MIP is for a better plan only
        left = min(left, max(PRIMAL_ONLY_MIN_S, left * max(0.0, cut - lp_s) / (cut - floor_s)))
    # the cutoff as the solver's, so it prunes at it: a plan of exact objective E has a MIP
    # objective of at most E / tick + 1 (the rounding below), so every plan better than the
    # cutoff stays; "infeasible" then proves none is (on "256 A100+V100, 2 sites 5 ms, dense" of
    # the communication-bound family: 1.1 s, against 8.8 s to the optimum without it)
    mip_options = SolveOptions(time_limit_s=left, threads=threads, seed=seed, rel_gap=rel_gap,
                               cutoff=cut / tick + 1 if math.isfinite(cut) else None)
    if st.nonzeros > DEADLINE_NONZEROS:
        res = solve_by_deadline(md, backend, mip_options, hard_s=left + DEADLINE_GRACE_S)
    else:
        res = solve_model(md, backend, mip_options)
    info = {"rows": st.rows, "columns": st.columns, "integers": st.integer_columns, "tick_s": tick,
            "fluid_lower_bound_s": fluid_s, "root_lp_bound_s": None if lp is None or not math.isfinite(lp) else lp * tick,
            "branched_lp_bound_s": None if branched is None else branched * tick,
            "lp_bound_s": None if lp_ticks is None else lp_ticks * tick,
            "solver_status": res.status.value,
            "warm_start_s": warm[0] if warm is not None else None, "hinted": hinted}
    elapsed = time.perf_counter() - t0
    if res.status == SolveStatus.INFEASIBLE:
        return _nothing_better(warm, cutoff_s, len(pairs), len(templates), elapsed, info)
    # every plan below the cutoff has Tpipe >= the fluid bound; the MIP optimum exceeds the exact
    # optimum by at most one tick (the integer X rounds c_R * Rho up), so one tick comes off its bound
    bound = fluid_s
    if lp_ticks is not None:
        bound = max(bound, (lp_ticks - 1) * tick)
    if res.bound is not None and math.isfinite(res.bound):
        bound = max(bound, (res.bound - 1) * tick)
    bound = min(bound, cut)
    best: tuple[float, list[tuple[Template, int]]] | None = warm
    if res.values is None:
        if best is not None:
            return Level2Result(status="feasible", pipes=best[1], objective_s=best[0], bound_s=bound,
                                pairs=len(pairs), templates=len(templates), solve_time_s=elapsed, info=info)
        return Level2Result(status="no solution", pipes=None, objective_s=None, bound_s=bound,
                            pairs=len(pairs), templates=len(templates), solve_time_s=elapsed, info=info)
    by_index = {t.index: t for t in used_t}
    for vals in [res.values] + [vv for _, vv in sorted(res.pool, key=lambda q: q[0])[:25]]:
        pipes: list[tuple[Template, int]] = []
        for (ti, m), var in n.items():
            pipes += [(by_index[ti], m)] * int(round(vals[var.index]))
        pipes.sort(key=lambda q: (sorted(q[0].gpus), -q[0].total_gpus, q[0].index, -q[1]))
        obj = pricer.objective(pipes)
        if best is None or obj < best[0]:
            best = (obj, pipes)
    assert best is not None
    bound = min(bound, best[0])
    # the MIP prices latency and zone terms by lower bounds: "optimal" only if the exact value agrees
    status = "optimal" if relative_gap(best[0], bound) <= max(rel_gap, OPTIMAL_RESOLUTION) else "feasible"
    return Level2Result(status=status, pipes=best[1], objective_s=best[0], bound_s=bound, pairs=len(pairs),
                        templates=len(templates), solve_time_s=elapsed, info=info)


class _ZoneBounds:
    """Lower bounds of the zone-link part of the sync (clusters with several zones).

    - single-zone templates in two zones both run (``span``): every piece's ring crosses a zone link:
      ``Rho >= sigma`` with ``sigma`` = all piece bytes over the fastest zone link (divided by the
      number of link directions when there are more than two zones); every all-reduce group then
      pays a zone latency too;
    - a template spanning zones runs with any single-zone template (``single``): the pieces it holds
      outside that template's zone cross, at least ``kappa_t`` bytes (the fewest outside one zone).
    """

    def __init__(self, ctx: PlanningContext, pricer: TemplatePricer, templates: Sequence[Template], fl: Any):
        self.templates = templates
        self.zones = sorted(ctx.cluster.zones)
        self.sigma, self.kappa, self.zone_latency_s = 0, {}, 0.0
        links = pricer.zone_links
        if not links or len(self.zones) < 2:
            return
        # a crossing piece loads at least one zone-link direction (one key per link with two zones,
        # up to Z (Z - 1) ordered pairs with more), so the busiest one carries >= 1/K of the bytes
        K = 1 if len(self.zones) == 2 else len(self.zones) * (len(self.zones) - 1)
        bw = K * max(b for b, _ in links.values())
        self.zone_latency_s = min(lat for _, lat in links.values())
        pieces = pricer.piece_bytes()
        self.sigma = fl(sum(pieces.values()) / bw)
        for t in templates:
            if len(t.zones) > 1:
                held: dict[str, float] = {}
                for st in pricer.sync_stages([(t, 1)])[0]:
                    held[st.zone] = held.get(st.zone, 0.0) + sum(pieces[x] for x in st.pieces)
                total = sum(held.values())
                self.kappa[t.index] = fl(min(total - held.get(z, 0.0) for z in self.zones) / bw)

    def build(self, md: LinearModel, w: dict[int, Any], rho: Any) -> Any:
        """Add the rows; returns the ``span`` binary (None for one zone)."""
        if self.sigma <= 0:
            return None
        self.zu = {z: md.add_binary(f"zone[{z}]") for z in self.zones}
        self.single = md.add_binary("single_zone_used")
        for t in self.templates:
            if len(t.zones) == 1:
                md.add(self.zu[next(iter(t.zones))] >= w[t.index], f"zu[{t.index}]")
                md.add(self.single >= w[t.index], f"single[{t.index}]")
        self.span = md.add_binary("span")
        for a in self.zones:
            for b in self.zones:
                if a < b:
                    md.add(self.span >= self.zu[a] + self.zu[b] - 1, f"span[{a},{b}]")
        md.add(rho >= self.sigma * self.span, "rho_zone")
        for t in self.templates:
            if self.kappa.get(t.index, 0) > 0:
                md.add(rho >= self.kappa[t.index] * (w[t.index] + self.single - 1), f"rho_cross[{t.index}]")
        return self.span

    def hint(self, pipes: Sequence[tuple[Template, int]]) -> tuple[dict[Any, float], int, int]:
        """Values of the zone binaries, the span and the zone part of Rho for ``pipes``."""
        if self.sigma <= 0:
            return {}, 0, 0
        zones = {z for t, _ in pipes if len(t.zones) == 1 for z in t.zones}
        single = 1 if zones else 0
        span = 1 if len(zones) > 1 else 0
        vals: dict[Any, float] = {var: int(z in zones) for z, var in self.zu.items()}
        vals[self.single], vals[self.span] = single, span
        r = max([self.sigma * span] + [self.kappa.get(t.index, 0) * single for t, _ in pipes])
        return vals, span, r


#: zone binaries enumerated by the branched bound (2^Z patterns)
MAX_BRANCH_ZONES = 3


def _average_rows(md: LinearModel, y: dict[int, Any], replicas: Any,
                  maxima: Sequence[tuple[str, Var, float, list[tuple[float, Var]]]]) -> None:
    """A maximum over the R pipelines is at least their average (issue 27): ``R M >= sum_p a_p``
    for ``M`` = ``Rho`` (``a`` = the ratio of each replica's template) and ``M`` = ``Tpipe``
    (``a`` = its CF'). The product ``R M`` is linear once R is known: one row per R, switched off by
    a big-M when ``y[R] = 0`` and exact in the R patterns of the branched LP; and McCormick's
    over-estimator on ``R in [2, R_max]``, ``M >= lb``, ``R M <= R_max M - lb (R_max - R)``, for the
    root LP and the zone patterns (formulations/multi_pipeline.md). The fractional "template used"
    binaries let the LP price ``Rho`` at the smallest ratio of any template otherwise."""
    rmax = max(y)
    for name, var, ub, terms in maxima:
        total = lsum(a * v for a, v in terms if a > 0)
        for R, yv in y.items():
            md.add(R * var - total >= -rmax * ub * (1 - yv), f"{name}_avg[{R}]")
        md.add(rmax * var + var.lb * replicas - total >= rmax * var.lb, f"{name}_avg")


def _gpu_weighted_rows(md: LinearModel, ctx: PlanningContext, pairs: Sequence[tuple[Template, int, float]],
                       n: dict[tuple[int, int], Var], maxima: Sequence[tuple[Var, Any]], cap: dict[int, int]) -> None:
    """A maximum over the pipelines is at least their average weighted by each one's GPUs on an
    island (issue 27, seventh round): ``N_i M >= sum_{t,m} g_{t,i} a_t n[t,m]`` for ``M`` = ``Rho``
    (``a`` = the template's ratio) and ``M`` = ``Opt`` (its optimizer step), as ``gpu_time`` does
    for ``Tpipe``. Every used template has ``a_t <= M`` and the replicas hold at most ``N_i`` GPUs
    of island ``i`` (its capacity ``cap``: ``_replica_capacities``). The rows need no ``y[R]``: where
    the plain average lets light replicas that hold few GPUs dilute it, these weigh each by its
    GPUs, and large templates, which carry the largest gradient shards per GPU over slow NICs,
    cannot hide behind small ones."""
    for isl in ctx.islands:
        for var, value in maxima:
            terms = [(t.gpus[isl.index] * a, n[t.index, m]) for t, m, _ in pairs
                     if t.gpus.get(isl.index) and (a := value(t)) > 0]
            if terms:
                md.add(lsum(c * v for c, v in terms) <= cap[isl.index] * var, f"{var.name.lower()}_gpus[{isl.index}]")


def _patterns(zs: _ZoneBounds, y: dict[int, Any]) -> list[dict[Any, int]]:
    """Fixings that cover every integer point of the level-2 model: the zone binaries' values
    (clusters with zone-link bounds and at most :data:`MAX_BRANCH_ZONES` zones), else y[R] = 1 for each R."""
    if zs.sigma > 0 and len(zs.zones) <= MAX_BRANCH_ZONES:
        zvars = [zs.zu[z] for z in zs.zones]
        return [dict(zip(zvars, bits)) for bits in itertools.product((0, 1), repeat=len(zvars))]
    if len(y) > 1:
        # y[R] = 1 through the others at 0 (row one_R): HiGHS (presolve off) has answered "Optimal"
        # without a primal solution to the LP with y[R] fixed at 1 on a tiny instance
        return [{o: 0 for o in y.values() if o is not var} for var in y.values()]
    return []


def _branched_lp(md: LinearModel, patterns: Sequence[dict[Any, int]], budget_s: float) -> float | None:
    """Minimum over ``patterns`` of the LP relaxation with those variables fixed (+inf if every one is
    LP-infeasible); None if there are no patterns or one LP was not solved within ``budget_s`` in all
    (then nothing is claimed). ``md`` is left as it was."""
    if not patterns:
        return None
    from dataclasses import replace

    t0 = time.perf_counter()
    best = math.inf
    for fix in patterns:
        left = budget_s - (time.perf_counter() - t0)
        if left <= 0.05:
            return None
        saved = {var.index: md.vars[var.index] for var in fix}
        for var, val in fix.items():
            md.vars[var.index] = replace(md.vars[var.index], lb=float(val), ub=float(val))
        try:
            val = lp_relaxation_bound(md, left, presolve=True)
        finally:
            for i, old in saved.items():
                md.vars[i] = old
        if val is None:
            return None
        best = min(best, val)
    return best


def _not_built(ctx: PlanningContext, templates: Sequence[Template], warm: tuple[float, list[tuple[Template, int]]] | None,
               cutoff_s: float, why: str, t0: float, pairs: int = 0, templates_count: int | None = None
               ) -> Level2Result:
    """The level-2 model is too large to build in the time left: the plan is the warm start's and
    the bound the fluid bound over ``templates`` (every plan of the template space below the
    cutoff has ``Tpipe`` at least that, formulations/multi_pipeline.md), capped at the cutoff."""
    thr = fluid_throughput(ctx, templates)
    fluid_s = ctx.training.global_batch_size / thr if thr > 0 else 0.0
    if warm is not None and warm[0] >= cutoff_s:
        warm = None
    info = {"fluid_lower_bound_s": fluid_s, "warm_start_s": warm[0] if warm is not None else None,
            "solver_status": f"not run ({why}: about {BUILD_S_PER_PAIR:g} s each to build, more than the time left)"}
    status = "model not built (too large for the time left)" + ("; greedy plan" if warm is not None else "")
    return Level2Result(status=status, pipes=warm[1] if warm is not None else None,
                        objective_s=warm[0] if warm is not None else None,
                        bound_s=min(fluid_s, cutoff_s if warm is None else warm[0]), pairs=pairs,
                        templates=len(templates) if templates_count is None else templates_count,
                        solve_time_s=time.perf_counter() - t0, info=info)


def _nothing_better(warm: tuple[float, list[tuple[Template, int]]] | None, cutoff_s: float, pairs: int,
                    templates: int, elapsed: float, info: dict[str, Any]) -> Level2Result:
    """The MIP proved that no plan beats its cutoff: the warm start is optimal, or nothing beats ``cutoff_s``."""
    if warm is not None:
        return Level2Result(status="optimal", pipes=warm[1], objective_s=warm[0], bound_s=warm[0], pairs=pairs,
                            templates=templates, solve_time_s=elapsed, info=info)
    return Level2Result(status="nothing better than the cutoff", pipes=None, objective_s=None, bound_s=cutoff_s,
                        pairs=pairs, templates=templates, solve_time_s=elapsed, info=info)


def _level2_hint(pipes: Sequence[tuple[Template, int]], n: dict, v: dict, w: dict, y: dict, tp: Any, x: Any,
                 o: Any, rho: Any, fl: Any, lat: dict[int, int], zlat: dict[int, int], pricer: TemplatePricer,
                 zs: _ZoneBounds) -> dict | None:
    """A complete assignment of the level-2 model for ``pipes`` (None if a pair was left out)."""
    count: dict[tuple[int, int], int] = {}
    for t, m in pipes:
        count[t.index, m] = count.get((t.index, m), 0) + 1
    R = len(pipes)
    if any(k not in n for k in count) or R not in y:
        return None
    used = {t.index for t, _ in pipes}
    vals: dict[Any, float] = {}
    for k, var in n.items():
        vals[var] = count.get(k, 0)
        vals[v[k]] = 1 if count.get(k, 0) else 0
    for ti, var in w.items():
        vals[var] = 1 if ti in used else 0
    for r, var in y.items():
        vals[var] = 1 if r == R else 0
    zone_vals, span, zone_rho = zs.hint(pipes)
    vals.update(zone_vals)
    vals[tp] = max(max(fl(pricer.cf(t, m)) for t, m in pipes), tp.lb)
    vals[o] = max(fl(t.optimizer_s) for t, _ in pipes)
    r_val = max([fl(t.ratio_s) for t, _ in pipes] + [zone_rho])
    vals[rho] = r_val
    vals[x] = max(r_val + lat[2] + zlat[2] * span,
                  -(-(2 * (R - 1) * r_val + R * lat[R] + R * zlat[R] * span) // R))
    if vals[x] > x.ub or vals[tp] > tp.ub:
        return None
    return vals


__all__ = ["GREEDY_CHOICES", "Level2Result", "OPTIMAL_RESOLUTION", "fluid_throughput", "greedy_level2",
           "solve_level2", "split_micro_batches", "uniform_replicas"]
