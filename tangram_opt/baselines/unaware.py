"""The heterogeneity-unaware baseline (see docs/baselines.md).

What a Megatron-style planner does when it is handed a mixed cluster and told nothing about it:

1. **Virtual cluster.** Every GPU is treated as the slowest type present (lowest dense peak in the
   training precision; ties broken by smaller memory), with the *smallest* memory of any type
   present, so a plan made for it fits on every real GPU. Every node takes the shape of a node of
   the slowest type (GPUs per node, scale-up link, NIC); the virtual cluster is one island of
   ``floor(total GPUs / GPUs per node)`` such nodes in one zone.
2. **Uniform plan.** On that virtual cluster, pick by the cost model the best Megatron-style plan:
   one pipeline micro-batch ``b``, one stage configuration (tp, cp, dp, ep, ZeRO, recomputation,
   micro-batch) shared by every stage, ``P`` stages of ``g`` GPUs, and a uniform layer split
   (layer counts differ by at most one; the extra layers go to the stages after the first, which
   hold the embedding and the most in-flight micro-batches). This is an exact enumeration.
   The planner knows the node structure (how many GPUs each island has), so a stage never
   straddles two islands: only (g, P) that pack into the real islands are considered.
3. **Real evaluation.** Stages are placed on the real islands in cluster order (the order of the
   node groups in the cluster file, as a rank assignment from a host list would), and re-priced with
   the real GPUs, links and p2p (:func:`~tangram_opt.baselines.homogeneous.reprice`). Faster GPUs
   finish their equal share early and wait: the step is set by the slowest stage.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tangram_opt.baselines.homogeneous import StageLayout, layout_fits, reprice
from tangram_opt.cost import StageConfig
from tangram_opt.errors import InfeasibleError
from tangram_opt.planner.assemble import make_plan, pipeline_plan
from tangram_opt.planner.candidates import Candidate, boundary_time_s
from tangram_opt.planner.context import PlanningContext
from tangram_opt.planner.formulations.inflight import inflight_micro_batches
from tangram_opt.planner.formulations.pipeline_model import pipeline_timing
from tangram_opt.planner.formulations.problem import StageChoice
from tangram_opt.planner.islands import Island
from tangram_opt.planner.plan import Plan
from tangram_opt.specs.cluster import Cluster, NodeGroup
from tangram_opt.specs.hardware import GPUType


@dataclass(frozen=True, slots=True, kw_only=True)
class UnawareResult:
    """The unaware plan evaluated on the real cluster (``plan``) and as its planner saw it
    (``virtual_plan``, on ``virtual_cluster`` where every GPU is ``virtual_gpu``)."""

    plan: Plan
    virtual_plan: Plan
    virtual_cluster: Cluster
    virtual_gpu: GPUType


def virtual_gpu(cluster: Cluster, precision: str) -> GPUType:
    """The slowest GPU type of ``cluster`` (dense peak in ``precision``), with the smallest memory present."""
    types = cluster.gpu_types
    slow = min(types, key=lambda g: (g.peak_flops_per_s(precision), g.hbm_bytes))
    mem = min(g.hbm_bytes for g in types)
    if mem == slow.hbm_bytes:
        return slow
    # keep the name: the calibration (achievable efficiency) is looked up by GPU name
    return replace(slow, hbm_bytes=mem, notes=f"{slow.name} with the smallest memory of {cluster.name}")


def virtual_cluster(cluster: Cluster, precision: str) -> Cluster:
    """Every GPU of ``cluster`` seen as :func:`virtual_gpu`, in nodes shaped like the slowest type's."""
    gpu = virtual_gpu(cluster, precision)
    group = next(g for g in cluster.node_groups if g.gpu.name == gpu.name)
    node = replace(group.node, gpu=gpu)
    nodes = cluster.num_gpus // node.gpus_per_node
    if len(cluster.node_groups) == 1 and gpu == group.gpu:
        return cluster  # already homogeneous: nothing to hide
    return Cluster(name=f"{cluster.name} as {nodes * node.gpus_per_node} x {gpu.name}",
                   node_groups=(NodeGroup(name="virtual", node=node, num_nodes=nodes),),
                   description=f"{cluster.name} with every GPU treated as {gpu.name} "
                               f"({gpu.hbm_bytes / 2**30:.0f} GiB)")


def uniform_split(total: int, parts: int) -> list[int]:
    """``total`` layers over ``parts`` stages, counts differing by at most one; the extra layers go to
    stages 1, 2, ... (then stage 0 last), sparing the first stage, which holds the embedding."""
    base, extra = divmod(total, parts)
    counts = [base] * parts
    order = list(range(1, parts)) + [0]
    for k in order[:extra]:
        counts[k] += 1
    return counts


def _kinds_of(start: int, count: int, ctx: PlanningContext) -> dict[str, int]:
    """Layers ``start .. start + count - 1`` by kind (dense-first models: dense layers come first)."""
    dense = ctx.layers.get("dense", 0) if "dense" in ctx.kinds else 0
    n_dense = max(0, min(start + count, dense) - start)
    out = {k: 0 for k in ctx.kinds}
    if n_dense:
        out["dense"] = n_dense
    if count - n_dense:
        out[ctx.kinds[-1]] += count - n_dense
    return out


def _pack(islands: tuple[Island, ...], g: int, num_stages: int) -> list[Island] | None:
    """Islands of ``num_stages`` stages of ``g`` GPUs, filled in cluster order (None if they do not fit)."""
    out: list[Island] = []
    for isl in islands:
        if g not in isl.valid_stage_sizes():
            continue
        out += [isl] * min(isl.num_gpus // g, num_stages - len(out))
        if len(out) == num_stages:
            return out
    return None


def _capacity(islands: tuple[Island, ...], g: int) -> int:
    return sum(isl.num_gpus // g for isl in islands if g in isl.valid_stage_sizes())


def heterogeneity_unaware(ctx: PlanningContext) -> UnawareResult:
    """The heterogeneity-unaware plan of ``ctx`` (see the module docstring).

    Raises :class:`InfeasibleError` when no uniform plan for the virtual cluster fits (the virtual
    GPU has the smallest memory present, so this happens before the MIP runs out of room).
    """
    prec = ctx.training.precision
    vcl = virtual_cluster(ctx.cluster, prec)
    vctx = PlanningContext(vcl, ctx.model, ctx.training, space=ctx.space, cost=ctx.cost,
                           calibration=ctx.calibration, moe_load_imbalance=ctx.moe_load_imbalance)
    assert len(vctx.islands) == 1 or vcl is ctx.cluster
    L = ctx.model.num_layers
    max_stages = min(ctx.max_stages, vctx.max_stages, L)
    best: tuple[float, int, Candidate, int, list[dict[str, int]]] | None = None
    for b in vctx.pipeline_micro_batches():
        m = ctx.training.global_batch_size // b
        links = vctx.links(b)
        for c in vctx.candidates(b):
            visl = vctx.islands[c.island]
            g = c.gpus
            p_max = min(max_stages, _capacity(ctx.islands, g), visl.num_gpus // g)
            lt_min = min(c.layer[k].time_s for k in ctx.kinds)
            for P in range(1, p_max + 1):
                # a lower bound on the step: (m + P - 1) stage-slots of at least floor(L/P) layers each
                if best is not None and (m + P - 1) * (L // P) * lt_min >= best[0]:
                    continue
                counts = uniform_split(L, P)
                layers, start = [], 0
                for n in counts:
                    layers.append(_kinds_of(start, n, ctx))
                    start += n
                if any(c.memory_bytes(layers[k], inflight_micro_batches(k, P, m, ctx.space.schedule),
                                      first=k == 0, last=k == P - 1) > c.capacity_bytes for k in range(P)):
                    continue
                link = boundary_time_s(links[c.island, c.island], c, c)
                t = pipeline_timing([(c, lay) for lay in layers], [link] * (P - 1), m, ctx.space.schedule).step_time_s
                if best is not None and t >= best[0]:
                    continue
                real = _real_layout(ctx, c.config, g, P, layers, b)
                if real is None:
                    continue
                best = (t, b, c, P, layers)
    if best is None:
        raise InfeasibleError(f"no uniform plan of {ctx.model.name} fits on {vcl.name} (every GPU as "
                              f"{virtual_gpu(ctx.cluster, prec).name} with the smallest memory present)")
    _, b, c, P, layers = best
    vprob = vctx.problem(b)
    ci = next(i for i, x in enumerate(vprob.candidates) if x is c)
    vchoices = [StageChoice(candidate=ci, layers=lay) for lay in layers]
    vplan = make_plan(vctx, [pipeline_plan(vctx, vprob, vchoices)], method="unaware (virtual cluster)")
    real = _real_layout(ctx, c.config, c.gpus, P, layers, b)
    assert real is not None
    plan = reprice(ctx, real, b, method="unaware")
    return UnawareResult(plan=plan, virtual_plan=vplan, virtual_cluster=vcl, virtual_gpu=vctx.islands[0].node.gpu)


def _real_layout(ctx: PlanningContext, cfg: StageConfig, g: int, P: int, layers: list[dict[str, int]],
                 b: int) -> list[StageLayout] | None:
    """The uniform plan placed on the real islands in cluster order, if it is valid and fits there."""
    isls = _pack(ctx.islands, g, P)
    if isls is None:
        return None
    if any(ctx.cost.check_config(isl.node, cfg) for isl in set(isls)):
        return None
    layout = [StageLayout(island=isl, config=cfg, layers=lay) for isl, lay in zip(isls, layers)]
    return None if layout_fits(ctx, layout, b) else layout


__all__ = ["UnawareResult", "heterogeneity_unaware", "uniform_split", "virtual_cluster", "virtual_gpu"]
