"""The "best homogeneous" baseline: the best plan that uses a single island (see docs/baselines.md).

This is what a heterogeneity-unaware planner does when it simply ignores the GPUs that are not of
its favourite type: for every island alone (a sub-cluster made of just that island's node groups)
it runs the planner it is given (``solver``: :func:`tangram_opt.solve`, the same MIP, cost model
and plan space, restricted to that island) and keeps the island whose plan has the shortest step.

The per-island plans are carried over to the full cluster (:func:`on_full_cluster`) so their island
names and cluster-level metrics are directly comparable with the MIP's; on the same island every
cost, p2p term and cross-pipeline sync is identical, so no time changes, only the labels do.
The per-island plans are also what "heterogeneity efficiency" divides by (benchmarks/run.py).

This module also holds the two helpers the other baselines use to evaluate a layout of stages on
a cluster without going through the candidate table: :func:`stage_candidate` prices one stage
configuration on one island with the context's cost model, :func:`reprice` turns a list of
(island, configuration, layers) into a :class:`Plan`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from tangram_opt.cost import StageConfig
from tangram_opt.errors import InfeasibleError, NoSolutionError, SpecError
from tangram_opt.planner.assemble import make_plan, pipeline_plan
from tangram_opt.planner.candidates import Candidate, price_candidate
from tangram_opt.planner.context import PlanningContext
from tangram_opt.planner.formulations.inflight import inflight_micro_batches
from tangram_opt.planner.formulations.problem import PipelineProblem, StageChoice
from tangram_opt.planner.islands import Island
from tangram_opt.planner.plan import Certificate, Plan
from tangram_opt.solvers import DEFAULT_BACKEND
from tangram_opt.specs.cluster import Cluster


@dataclass(frozen=True, slots=True, kw_only=True)
class StageLayout:
    """One stage to evaluate: a configuration on an island holding ``layers`` (kind -> count)."""

    island: Island
    config: StageConfig
    layers: dict[str, int]


def stage_candidate(ctx: PlanningContext, island: Island, config: StageConfig,
                    pipeline_micro_batch: int) -> Candidate:
    """Price ``config`` on ``island`` with ``ctx``'s cost model, exactly as the candidate table does.

    Raises :class:`SpecError` naming every problem when the configuration is not valid on that
    island (e.g. tp not dividing the heads, more GPUs than the island has).
    """
    cost = ctx.cost
    problems = list(cost.check_config(island.node, config))
    if config.gpus not in island.valid_stage_sizes():
        problems.append(f"tp({config.tp}) x cp({config.cp}) x dp({config.dp}) = {config.gpus} GPUs is not a "
                        f"valid stage size on island {island.name!r} ({island.num_nodes} nodes x "
                        f"{island.gpus_per_node} GPUs)")
    if config.dp * config.micro_batch_size != pipeline_micro_batch:
        problems.append(f"dp({config.dp}) x micro_batch_size({config.micro_batch_size}) != pipeline micro-batch "
                        f"({pipeline_micro_batch})")
    if problems:
        raise SpecError("stage", config.label, f"is not valid on island {island.name!r}: " + "; ".join(problems),
                        "choose a configuration from the island's candidate table")
    return price_candidate(cost, island, config, ctx.kinds)


def layout_problem(ctx: PlanningContext, layout: Sequence[StageLayout],
                   pipeline_micro_batch: int) -> tuple[PipelineProblem, list[StageChoice]]:
    """A pipeline problem whose candidate table is exactly the stages of ``layout``, and the choices."""
    b = pipeline_micro_batch
    cands = [stage_candidate(ctx, s.island, s.config, b) for s in layout]
    problem = PipelineProblem(candidates=cands, kinds=ctx.kinds, layers=ctx.layers,
                              island_gpus={i.index: i.num_gpus for i in ctx.islands}, links=ctx.links(b),
                              num_micro_batches=ctx.training.global_batch_size // b, pipeline_micro_batch=b,
                              max_stages=max(ctx.max_stages, len(layout)), schedule=ctx.space.schedule)
    choices = [StageChoice(candidate=k, layers={kd: s.layers.get(kd, 0) for kd in ctx.kinds})
               for k, s in enumerate(layout)]
    return problem, choices


def layout_fits(ctx: PlanningContext, layout: Sequence[StageLayout], pipeline_micro_batch: int) -> list[str]:
    """Why ``layout`` does not fit (memory per stage, GPUs per island); empty when it fits."""
    problem, choices = layout_problem(ctx, layout, pipeline_micro_batch)
    out = []
    n, m = len(layout), problem.num_micro_batches
    for k, (s, ch) in enumerate(zip(layout, choices)):
        c = problem.candidates[ch.candidate]
        q = inflight_micro_batches(k, n, m, problem.schedule)
        need = c.memory_bytes(ch.layers, q, first=k == 0, last=k == n - 1)
        if need > c.capacity_bytes:
            out.append(f"stage {k} on {s.island.name} ({s.config.label}, {sum(ch.layers.values())} layers, "
                       f"{q} in flight) needs {need / 2**30:.2f} GiB of {c.capacity_bytes / 2**30:.2f} GiB")
    used: dict[int, int] = {}
    for s in layout:
        used[s.island.index] = used.get(s.island.index, 0) + s.config.gpus
    for isl in ctx.islands:
        if used.get(isl.index, 0) > isl.num_gpus:
            out.append(f"island {isl.name!r} has {isl.num_gpus} GPUs but the stages use {used[isl.index]}")
    return out


def reprice(ctx: PlanningContext, layout: Sequence[StageLayout], pipeline_micro_batch: int, *, method: str,
            certificate: Certificate | None = None) -> Plan:
    """Evaluate ``layout`` (pipeline order) on ``ctx``'s cluster with its cost model: a :class:`Plan`.

    The islands of ``layout`` must be islands of ``ctx`` (same index). Raises
    :class:`InfeasibleError` when a stage does not fit in memory or an island is over-subscribed.
    """
    problems = layout_fits(ctx, layout, pipeline_micro_batch)
    if problems:
        raise InfeasibleError(f"{method} plan does not fit on {ctx.cluster.name}: " + "; ".join(problems))
    problem, choices = layout_problem(ctx, layout, pipeline_micro_batch)
    return make_plan(ctx, [pipeline_plan(ctx, problem, choices)], method=method, certificate=certificate)


def plan_layout(ctx: PlanningContext, plan: Plan) -> tuple[list[StageLayout], int]:
    """The stages of ``plan``'s (single) pipeline as a layout on ``ctx``'s islands, matched by name."""
    if len(plan.pipelines) != 1:
        raise SpecError("plan.pipelines", len(plan.pipelines), "baselines handle single-pipeline plans",
                        "pass a plan with one pipeline")
    by_name = {i.name: i for i in ctx.islands}
    pipe = plan.pipelines[0]
    layout = []
    for k, s in enumerate(pipe.stages):
        if s.island not in by_name:
            raise SpecError(f"stages[{k}].island", s.island, f"is not an island of cluster {ctx.cluster.name!r}",
                            f"use one of {', '.join(by_name)}")
        layers = {"dense": s.num_dense_layers, "moe": s.num_moe_layers}
        layout.append(StageLayout(island=by_name[s.island], config=s.config,
                                  layers={k2: v for k2, v in layers.items() if k2 in ctx.kinds}))
    return layout, pipe.pipeline_micro_batch


def on_full_cluster(ctx: PlanningContext, plan: Plan, *, method: str, certificate: Certificate | None) -> Plan:
    """``plan``, made on one island alone, as a plan of ``ctx``'s cluster.

    Island names are the same in the sub-cluster and in the full cluster (same node groups), and on
    the same island every stage cost, p2p link and cross-pipeline sync is identical, so only the
    cluster-level fields change: the cluster name, its islands and its dense peak.
    """
    names = {i.name for i in ctx.islands}
    unknown = sorted({s.island for s in plan.stages} - names)
    if unknown:
        raise SpecError("plan.stages.island", unknown, f"are not islands of cluster {ctx.cluster.name!r}",
                        f"use one of {', '.join(sorted(names))}")
    return replace(plan, cluster=ctx.cluster.name, method=method, certificate=certificate,
                   island_gpus={i.name: i.num_gpus for i in ctx.islands},
                   cluster_peak_flops_per_s=ctx.cluster.peak_flops_per_s(ctx.training.precision))


def island_cluster(cluster: Cluster, island: Island) -> Cluster:
    """A cluster made of just ``island``'s node groups (one zone, so no zone links)."""
    groups = tuple(g for g in cluster.node_groups if g.name in island.node_groups)
    return Cluster(name=f"{cluster.name}[{island.name}]", node_groups=groups,
                   description=f"island {island.name!r} of {cluster.name} alone")


class IslandCandidates:
    """A :class:`CandidateProvider` for ``island``'s own sub-cluster that reuses ``ctx``'s provider.

    The candidates of an island depend only on its node shape and size (and the search space), so the
    island-alone planner can take them from the full cluster's table (cached) instead of enumerating
    and pricing them again; only the island index is renumbered for the sub-cluster.
    """

    def __init__(self, ctx: PlanningContext, island: Island):
        self.ctx = ctx
        self.island = island

    def candidates(self, island: Island, pipeline_micro_batch: int) -> list[Candidate]:
        if island.node != self.island.node or island.num_nodes != self.island.num_nodes:
            raise SpecError("island", island.name, f"is not island {self.island.name!r} of {self.ctx.cluster.name}",
                            "use this provider only for the island it was made for")
        rows = self.ctx.provider.candidates(self.island, pipeline_micro_batch)
        return [replace(c, island=island.index) for c in rows]


@dataclass(frozen=True, slots=True, kw_only=True)
class HomogeneousResult:
    """The best single-island plan (``plan``, on ``island``) and every island's own best plan.

    ``per_island[name]`` is ``None`` when nothing fits on that island alone (the reason is in
    ``notes[name]``). Every plan is priced on the full cluster.
    """

    plan: Plan
    island: str
    per_island: dict[str, Plan | None] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)
    solve_time_s: float = 0.0


def best_homogeneous(ctx: PlanningContext, *, solver: Callable[..., Plan], time_limit_s: float = 30.0,
                     backend: str = DEFAULT_BACKEND, threads: int = 1, seed: int = 0) -> HomogeneousResult:
    """Plan every island alone with ``solver`` (``time_limit_s`` per island) and keep the best.

    ``solver`` is the planner to run on each island: ``tangram_opt.solve`` (or a ``functools.partial``
    of it with ``options=SearchOptions(...)``), called as ``solver(cluster, model, training,
    time_limit_s=..., backend=..., threads=..., seed=..., space=..., calibration=..., profiles=...,
    moe_load_imbalance=..., provider=...)``. The island sub-problems use ``ctx``'s search space,
    calibration, profiles, MoE load imbalance and candidate table (:class:`IslandCandidates`), so the
    plan space is exactly the MIP's restricted to one island and the time limit is spent solving,
    not re-pricing candidates; each per-island plan keeps its own certificate (bound and gap for
    that island alone). Raises :class:`InfeasibleError` when no island can hold the model on its own.
    """
    per_island: dict[str, Plan | None] = {}
    notes: dict[str, str] = {}
    total_s = 0.0
    for isl in ctx.islands:
        sub = island_cluster(ctx.cluster, isl)
        try:
            p = solver(sub, ctx.model, ctx.training, time_limit_s=time_limit_s, backend=backend, threads=threads,
                       seed=seed, space=ctx.space, calibration=ctx.calibration, profiles=ctx.profiles,
                       moe_load_imbalance=ctx.moe_load_imbalance, provider=IslandCandidates(ctx, isl))
        except (InfeasibleError, NoSolutionError) as e:
            per_island[isl.name] = None
            notes[isl.name] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
            continue
        cert = p.certificate
        if cert is not None:
            total_s += cert.solve_time_s
            cert = replace(cert, plan_space=f"island {isl.name!r} alone: {cert.plan_space}")
        per_island[isl.name] = on_full_cluster(ctx, p, method=f"homogeneous:{isl.name}", certificate=cert)
    fitting = {n: p for n, p in per_island.items() if p is not None}
    if not fitting:
        raise InfeasibleError(f"no island of {ctx.cluster.name} can hold {ctx.model.name} on its own: "
                              + "; ".join(f"{n}: {t}" for n, t in notes.items()))
    name, best = min(fitting.items(), key=lambda kv: kv[1].step_time_s)
    plan = replace(best, method="homogeneous")
    assert math.isfinite(plan.step_time_s)
    return HomogeneousResult(plan=plan, island=name, per_island=per_island, notes=notes, solve_time_s=total_s)


__all__ = ["HomogeneousResult", "IslandCandidates", "StageLayout", "best_homogeneous", "island_cluster", "layout_fits",
           "layout_problem", "on_full_cluster", "plan_layout", "reprice", "stage_candidate"]
