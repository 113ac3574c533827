"""Level 1 of the multi-pipeline search: which pipelines (templates) the level-2 MIP may replicate.

Templates come from every candidate that holds the whole model on one stage (one_stage_templates,
templates.py), from the single-pipeline optimum, and from the single-pipeline search run on
scaled-down sub-clusters (every island's node count divided by k) and on each island alone. The
sub-cluster searches reuse the full cluster's candidate table (:class:`SubProvider`); the search
itself is passed in (``solver``), so this package never imports the search that calls it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from tangram_opt.errors import TangramError
from tangram_opt.planner.candidates import Candidate
from tangram_opt.planner.context import PlanningContext
from tangram_opt.planner.formulations.problem import StageChoice
from tangram_opt.planner.islands import Island, find_islands
from tangram_opt.planner.multi_pipeline.options import MultiPipelineOptions
from tangram_opt.planner.multi_pipeline.templates import Template, TemplatePricer, one_stage_templates
from tangram_opt.planner.plan import PipelinePlan, Plan
from tangram_opt.specs.cluster import Cluster

#: the single-pipeline search, called as ``solver(cluster, model, training, time_limit_s=..., backend=...,
#: threads=..., seed=..., rel_gap=..., space=..., provider=..., calibration=..., profiles=...,
#: moe_load_imbalance=...)``: ``tangram_opt.planner.search.solve_single_pipeline``
SinglePipelineSolver = Callable[..., Plan]


class SubProvider:
    """Candidates of a sub-cluster: the full cluster's table, renumbered and cut to the sub-island
    size. One provider may serve every sub-cluster of a cluster: the tables it made are kept by
    (island shape, sub-island index, stage sizes, pipeline micro-batch)."""

    def __init__(self, ctx: PlanningContext):
        self.ctx = ctx
        self.by_shape = {(i.node, i.zone): i for i in ctx.islands}
        self._tables: dict[tuple, list[Candidate]] = {}

    def candidates(self, island: Island, pipeline_micro_batch: int) -> list[Candidate]:
        main = self.by_shape[(island.node, island.zone)]
        sizes = frozenset(island.valid_stage_sizes())
        key = (main.index, island.index, sizes, pipeline_micro_batch)
        if key not in self._tables:
            self._tables[key] = [c.on_island(island.index) for c in self.ctx.provider.candidates(main, pipeline_micro_batch)
                                 if c.gpus in sizes]
        return list(self._tables[key])


def sub_cluster(cluster: Cluster, islands: Sequence[Island], nodes: dict[int, int]) -> Cluster | None:
    """The cluster keeping ``nodes[i]`` nodes of island i (taken from its node groups in order)."""
    groups_by_name = {g.name: g for g in cluster.node_groups}
    groups = []
    for isl in islands:
        want = nodes.get(isl.index, 0)
        for gname in isl.node_groups:
            g = groups_by_name[gname]
            take = min(want, g.num_nodes)
            if take > 0:
                groups.append(replace(g, num_nodes=take))
                want -= take
    if not groups:
        return None
    zones = {g.zone for g in groups}
    links = tuple(z for z in cluster.zone_links if z.zone_a in zones and z.zone_b in zones)
    return Cluster(name=f"{cluster.name}-sub", node_groups=tuple(groups), zone_links=links)


def _nearest_divisor(n: int, target: float) -> int:
    divs = [d for d in range(1, n + 1) if n % d == 0]
    return min(divs, key=lambda d: (abs(math.log(d / max(target, 1e-9))), d))


def choices_of(ctx: PlanningContext, pipe: PipelinePlan, cluster: Cluster | None = None) -> list[StageChoice] | None:
    """Stage choices (indices into ``ctx.candidates(b)``) of a pipeline planned on ``cluster`` (default: the
    context's; a sub-cluster's islands are matched by node shape and zone) via each stage's configuration."""
    b = pipe.pipeline_micro_batch
    cands = ctx.candidates(b)
    index = {(c.island, c.config): i for i, c in enumerate(cands)}
    shape = {(i.node, i.zone): i.index for i in ctx.islands}
    named = {i.name: i for i in (find_islands(cluster) if cluster is not None else ctx.islands)}
    out = []
    for st in pipe.stages:
        isl = named.get(st.island)
        if isl is None or (isl.node, isl.zone) not in shape:
            return None
        key = (shape[(isl.node, isl.zone)], st.config)
        if key not in index:
            return None
        layers = {k: (st.num_dense_layers if k == "dense" else st.num_moe_layers) for k in ctx.kinds}
        out.append(StageChoice(candidate=index[key], layers=layers))
    return out


def _sub_contexts(ctx: PlanningContext, opts: MultiPipelineOptions) -> list[tuple[str, Cluster, int]]:
    """(origin, sub-cluster, its global batch) in the order they are solved: the whole cluster
    scaled down (smallest divisor first), whose plans replicate over the cluster, then each island
    alone. The searches share the template budget in turn, so the last ones get the least."""
    isl, B = ctx.islands, ctx.training.global_batch_size
    peak = {i.index: i.num_gpus * i.node.gpu.peak_flops_per_s(ctx.training.precision) for i in isl}
    total = sum(peak.values())
    out: list[tuple[str, Cluster, int]] = []
    seen: set[tuple] = set()

    def add(origin: str, nodes: dict[int, int], batch: int) -> None:
        key = tuple(sorted((i, n) for i, n in nodes.items() if n > 0))
        if not key or key in seen or batch < 1:
            return
        if key == tuple(sorted((i.index, i.num_nodes) for i in isl)):
            return  # the whole cluster: that is the single-pipeline search itself
        sub = sub_cluster(ctx.cluster, isl, nodes)
        if sub is not None:
            seen.add(key)
            out.append((origin, sub, batch))

    for k in sorted(opts.cluster_scales):
        if B % k == 0:
            add(f"cluster / {k}", {i.index: i.num_nodes // k for i in isl}, B // k)
    for k in sorted(opts.island_scales):
        if len(isl) > 1:
            for i in isl:
                if i.num_nodes // k >= 1:
                    add(f"island {i.name} / {k}", {i.index: i.num_nodes // k},
                        _nearest_divisor(B, B * peak[i.index] / total / k))
    return out


def generate_templates(ctx: PlanningContext, single: Plan | None, opts: MultiPipelineOptions, *,
                       solver: SinglePipelineSolver, backend: str, deadline: float, threads: int = 1, seed: int = 0,
                       rel_gap: float = 1e-4, log: list[str] | None = None,
                       pricer: TemplatePricer | None = None) -> list[Template]:
    """Level 1: the template set (one-stage, single-pipeline optimum, sub-cluster optima).

    ``solver`` plans the sub-clusters: the single-pipeline search (what ``solve`` passes here).
    """
    pricer = pricer or TemplatePricer(ctx)
    log = log if log is not None else []
    multi: list[Template] = []
    seen: set[tuple] = set()

    def add(origin: str, pipe: PipelinePlan, cluster: Cluster | None = None) -> None:
        ch = choices_of(ctx, pipe, cluster)
        if ch is None:
            log.append(f"{origin}: plan does not map onto the candidate table; skipped")
            return
        key = (pipe.pipeline_micro_batch, tuple((c.candidate, tuple(sorted(c.layers.items()))) for c in ch))
        if key in seen:
            return
        t = pricer.template(0, origin, pipe.pipeline_micro_batch, ch)
        if t is not None and t.num_stages > 1:
            seen.add(key)
            multi.append(t)

    if single is not None:
        add("single-pipeline optimum", single.pipelines[0])
    subs = _sub_contexts(ctx, opts)
    provider = SubProvider(ctx)  # one for all: the sub-clusters share island shapes
    for n, (origin, sub, batch) in enumerate(subs):
        left = deadline - time.perf_counter()
        if left <= 0.2:
            log.append(f"{origin}: skipped (template time budget spent)")
            continue
        limit = max(0.2, left / (len(subs) - n))
        space = ctx.space
        if space.pipeline_micro_batches is not None:
            keep = tuple(b for b in space.pipeline_micro_batches if batch % b == 0)
            if not keep:
                continue
            space = replace(space, pipeline_micro_batches=keep)
        training = replace(ctx.training, global_batch_size=batch)
        try:
            plan = solver(sub, ctx.model, training, time_limit_s=limit, backend=backend, threads=threads, seed=seed,
                          rel_gap=max(rel_gap, 1e-3), space=space, provider=provider,
                          calibration=ctx.calibration, profiles=ctx.profiles,
                          moe_load_imbalance=ctx.moe_load_imbalance)
        except TangramError as e:
            log.append(f"{origin}: no plan ({type(e).__name__})")
            continue
        add(origin, plan.pipelines[0], sub)
    ones = one_stage_templates(ctx, pricer) if opts.one_stage else []
    out = ones + multi
    for i, t in enumerate(out):
        t.index = i
    return out


__all__ = ["SinglePipelineSolver", "SubProvider", "choices_of", "generate_templates", "sub_cluster"]
