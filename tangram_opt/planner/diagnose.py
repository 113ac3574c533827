"""Explain infeasibility: a restriction of the search space that leaves no stage layout at all
(a tp that divides no node, a micro-batch larger than the batch, ...), else what came closest to
fitting in memory, and by how much it misses."""

from __future__ import annotations

import math
from dataclasses import fields, replace
from typing import Any

from tangram_opt import units as u
from tangram_opt.cost import StageConfig
from tangram_opt.errors import InfeasibleError
from tangram_opt.planner.candidates import AnalyticalCandidates
from tangram_opt.planner.candidates.analytical import _divisors
from tangram_opt.planner.context import PlanningContext
from tangram_opt.planner.space import SearchSpace

#: the fields of the space that restrict stage layouts, in the order a diagnosis names them
RESTRICTIONS = ("tp", "cp", "ep", "micro_batch_sizes", "pipeline_micro_batches", "zero", "recompute")


def _has_layouts(ctx: PlanningContext, space: SearchSpace) -> bool:
    """Whether ``space`` holds one stage layout that the model and some island allow, memory aside
    (the enumeration of :class:`AnalyticalCandidates`, checked by ``CostModel.check_config``)."""
    B = ctx.training.global_batch_size
    provider = AnalyticalCandidates(ctx.model, ctx.cost, space)
    return any(not ctx.cost.check_config(isl.node, cfg) for isl in ctx.islands
               for b in (space.pipeline_micro_batches or _divisors(B)) if B % b == 0
               for cfg in provider.configs(isl, b))


def _why(ctx: PlanningContext, name: str) -> str:
    """Why ``space.<name>`` alone leaves no stage layout (lifting it would leave some)."""
    sp, m, t = ctx.space, ctx.model, ctx.training
    value = getattr(sp, name)
    reasons: list[str] = []
    if name == "tp":
        node_sizes = tuple(dict.fromkeys(isl.gpus_per_node for isl in ctx.islands))
        fit = [x for x in value if any(n % x == 0 for n in node_sizes)]
        if not fit:
            return f"space.tp {value} divides no island's node size ({', '.join(map(str, node_sizes))})"
        reasons = [p for x in fit for isl in ctx.islands if isl.gpus_per_node % x == 0
                   for p in ctx.cost.check_config(isl.node, StageConfig(tp=x))]
    elif name == "cp":
        sizes = sorted({s for isl in ctx.islands for s in isl.valid_stage_sizes()})
        for c in value:
            if not any(s % c == 0 for s in sizes):
                reasons.append(f"cp({c}) divides no stage size the islands allow {tuple(sizes)}")
            if c > 1 and t.seq_len % (2 * c):
                reasons.append(f"seq_len ({t.seq_len}) is not divisible by 2 x cp({c}) (load-balanced causal CP)")
    elif name == "ep" and m.moe is not None:
        reasons = [f"ep({e}) does not divide the number of experts ({m.moe.num_experts})"
                   for e in value if m.moe.num_experts % e]
    elif name == "micro_batch_sizes":
        B = t.global_batch_size
        bs = sp.pipeline_micro_batches or tuple(_divisors(B))
        if min(value) > B:
            return f"space.micro_batch_sizes {value} exceeds the global batch ({B})"
        if not any(b % mb == 0 for b in bs for mb in value):
            return (f"space.micro_batch_sizes {value} divides no pipeline micro-batch {bs}"
                    + (f" (the divisors of the global batch {B})" if sp.pipeline_micro_batches is None else ""))
    elif name == "pipeline_micro_batches":
        if not any(b % mb == 0 for b in value for mb in sp.micro_batch_sizes):
            return (f"space.pipeline_micro_batches {value} holds no multiple of a per-rank micro-batch of "
                    f"space.micro_batch_sizes {sp.micro_batch_sizes}")
    reasons = list(dict.fromkeys(reasons))
    return (f"space.{name} {value}: {'; '.join(reasons)}" if reasons
            else f"space.{name} {value} leaves no stage layout with the rest of the space")


def diagnose_space(ctx: PlanningContext) -> InfeasibleError | None:
    """The restrictions of the search space that leave no stage layout before memory counts (each
    named, with why), or None when the space holds layouts (or the model and cluster allow none at all:
    :func:`diagnose_infeasible` lists every island's reasons then)."""
    sp = ctx.space
    if _has_layouts(ctx, sp):
        return None
    default = {f.name: f.default for f in fields(SearchSpace)}
    narrowed = [n for n in RESTRICTIONS if getattr(sp, n) != default[n]]
    culprits = [n for n in narrowed if _has_layouts(ctx, replace(sp, **{n: default[n]}))]
    if culprits:
        why = "; ".join(_why(ctx, n) for n in culprits)
    elif narrowed and _has_layouts(ctx, replace(sp, **{n: default[n] for n in narrowed})):
        culprits = narrowed
        why = "together, " + ", ".join(f"space.{n} {getattr(sp, n)}" for n in narrowed) + " leave no stage layout"
    else:
        return None
    widen = ", ".join(f"space.{n} (e.g. " + ("None: every valid value)" if default[n] is None else f"{default[n]})")
                      for n in culprits)
    return InfeasibleError(f"{_head(ctx)} The search space leaves no stage layout the model and the islands allow, "
                           f"before memory is counted: {why}. Widen {widen}.",
                           closest={"restriction": [f"space.{n}" for n in culprits]})


def _one_layer_bytes(ctx: PlanningContext, node: Any, cfg: StageConfig) -> tuple[float, float]:
    """Peak bytes per GPU of a middle stage of one layer (its largest kind) with one micro-batch in
    flight, and of the larger of a first or last stage of one layer, as the candidate tables count
    them (weights, one micro-batch's activations, and the largest scratch of the pieces)."""
    cost = ctx.cost
    layers = [cost.layer(node, cfg, k) for k in ctx.kinds]
    layer = max(c.static_bytes + c.activation_bytes for c in layers)
    scratch = max(c.transient_bytes for c in layers)
    ends = max(layer + e.static_bytes + e.activation_bytes + max(scratch, e.transient_bytes)
               for e in (cost.embedding(node, cfg), cost.head(node, cfg)))
    return layer + scratch, ends


def _tokens(ctx: PlanningContext) -> str:
    """Tokens of one micro-batch of the smallest per-rank size the space allows, readable."""
    return f"{min(ctx.space.micro_batch_sizes) * ctx.training.seq_len:,}"


def _head(ctx: PlanningContext) -> str:
    return (f"No plan fits {ctx.model.name} on {ctx.cluster.name} with global batch "
            f"{ctx.training.global_batch_size} x {ctx.training.seq_len} tokens.")


def diagnose_infeasible(ctx: PlanningContext) -> InfeasibleError:
    """A restriction of the search space that leaves no layout (:func:`diagnose_space`), else the
    smallest per-GPU footprint of a single layer on each island, with the most memory-saving
    configuration the search space allows (max tp within a node, ZeRO-3 over the whole island,
    full recomputation, the smallest micro-batch, the largest cp), compared with usable memory; when a
    middle stage of one layer fits but no first or last stage does, the embedding or LM head is named."""
    by_space = diagnose_space(ctx)
    if by_space is not None:
        return by_space
    cost = ctx.cost
    sp = ctx.space
    lines: list[str] = []
    closest: dict[str, Any] = {}
    best_ratio = float("inf")
    ends_vs_usable: list[tuple[float, float, dict[str, Any]]] = []  # first / last stage of one layer
    for isl in ctx.islands:
        tps = [t for t in (sp.tp or range(1, isl.gpus_per_node + 1))
               if isl.gpus_per_node % t == 0 and not cost.check_config(isl.node, StageConfig(tp=t))]
        if not tps:
            lines.append(f"  {isl.name} ({isl.gpu_name}): no tp " + (f"of space.tp {sp.tp} " if sp.tp else "")
                         + f"that the model allows divides its {isl.gpus_per_node} GPUs per node")
            continue
        tp = max(tps)
        # context parallelism splits every activation by the sequence: the largest cp the space,
        # the island and the sequence allow (load-balanced causal CP needs 2 cp | seq_len)
        cps = [c for c in sp.cp if isl.num_gpus % (tp * c) == 0 and (c == 1 or ctx.training.seq_len % (2 * c) == 0)
               and not cost.check_config(isl.node, StageConfig(tp=tp, cp=c))]
        cp = max(cps, default=1)
        dp = max(1, isl.num_gpus // (tp * cp))
        cfg = StageConfig(tp=tp, cp=cp, dp=dp, zero=max(sp.zero), micro_batch_size=min(sp.micro_batch_sizes),
                          recompute=sp.recompute[-1] if "full" not in sp.recompute else "full")
        problems = cost.check_config(isl.node, cfg)
        cap = cost.usable_memory_bytes(isl.node)
        if problems:
            need = ends = float("nan")
        else:
            need, ends = _one_layer_bytes(ctx, isl.node, cfg)
        ends_vs_usable.append((ends, cap, {"island": isl.name, "gpu": isl.gpu_name, "config": cfg.label}))
        ratio = need / cap if cap > 0 else float("inf")
        lines.append(f"  {isl.name} ({isl.gpu_name}): one layer needs {need / u.GiB:.2f} GiB per GPU with "
                     f"{cfg.label} over {cfg.gpus} GPUs"
                     + (f", a first or last stage with one layer {ends / u.GiB:.2f} GiB" if ends > need else "")
                     + f"; {cap / u.GiB:.2f} GiB usable" + (f" ({'; '.join(problems)})" if problems else ""))
        if ratio < best_ratio:
            best_ratio = ratio
            closest = {"island": isl.name, "gpu": isl.gpu_name, "need_bytes": need, "usable_bytes": cap,
                       "config": cfg.label}
    head = _head(ctx)
    if closest:
        miss = closest["need_bytes"] - closest["usable_bytes"]
        if miss > 0:
            head += (f" Closest: {closest['island']} ({closest['gpu']}) misses by {miss / u.GiB:.2f} GiB per GPU "
                     f"for a single layer even with {closest['config']}; use GPUs with more memory, more GPUs "
                     f"per ZeRO-3 group, or a shorter sequence / smaller micro-batch.")
        else:
            # one layer fits somewhere: compare the whole model's static memory with the cluster's
            m, t = ctx.model, ctx.training
            bytes_per_param = t.weight_bytes + t.grad_bytes + t.optimizer_bytes
            need = m.total_params * bytes_per_param
            usable = sum(i.num_gpus * cost.usable_memory_bytes(i.node) for i in ctx.islands)
            head += (f" A single layer fits, but not the whole model in at most {ctx.max_stages} stages: its "
                     f"weights, gradients and optimizer states alone take {need / u.GiB:.1f} GiB "
                     f"({m.total_params / 1e9:.2f}B parameters x {bytes_per_param:g} bytes) and the cluster has "
                     f"{usable / u.GiB:.1f} GiB usable")
            if need > usable:
                head += f": it misses by {(need - usable) / u.GiB:.1f} GiB before activations; add GPUs."
            elif all(not ends <= cap for ends, cap, _ in ends_vs_usable):
                # a middle stage of one layer fits, but no first or last stage does: the vocabulary's
                # pieces (the head's logits grow with the tokens of a micro-batch) are what is too large
                ends, cap, at = min(ends_vs_usable, key=lambda e: e[0] / e[1] if e[1] > 0 else math.inf)
                head += (f". No first or last stage of one layer fits: with {at['config']} on {at['island']} "
                         f"({at['gpu']}), one layer with the embedding or the LM head (its logits: {_tokens(ctx)} "
                         f"tokens x {ctx.model.vocab_size:,} vocabulary entries per micro-batch) takes "
                         f"{ends / u.GiB:.2f} GiB per GPU, {(ends - cap) / u.GiB:.2f} GiB more than usable; use a "
                         f"shorter sequence or GPUs with more memory.")
            else:
                head += ("; activations and per-stage copies of the embedding/head do not fit: allow more stages "
                         "(space.max_stages), ZeRO-3 or full recomputation.")
    elif all(cost.usable_memory_bytes(isl.node) <= 0 for isl in ctx.islands):
        c = cost.calibration
        head += (f" No GPU has usable memory: the calibration's memory reserve ({c.memory_reserve_bytes / u.GiB:g} "
                 f"GiB + {c.memory_reserve_fraction:.0%} of HBM) takes all of it; lower the calibration's "
                 "memory_reserve_gib or memory_reserve_fraction.")
    return InfeasibleError(head + "\n" + "\n".join(lines), closest=closest)
