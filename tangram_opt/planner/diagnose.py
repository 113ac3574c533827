"""Explain infeasibility: what came closest to fitting, and by how much it misses."""

from __future__ import annotations

from tangram_opt import units as u
from tangram_opt.cost import StageConfig
from tangram_opt.errors import InfeasibleError
from tangram_opt.planner.context import PlanningContext


def diagnose_infeasible(ctx: PlanningContext) -> InfeasibleError:
    """The smallest per-GPU footprint of a single layer on each island, with the most memory-saving
    configuration the search space allows (max tp within a node, ZeRO-3 over the whole island,
    full recomputation, the smallest micro-batch), compared with usable memory."""
    cost = ctx.cost
    sp = ctx.space
    lines, closest = [], {}
    best_ratio = float("inf")
    kinds = ctx.kinds
    for isl in ctx.islands:
        tp = max(t for t in (sp.tp or range(1, isl.gpus_per_node + 1))
                 if isl.gpus_per_node % t == 0 and not cost.check_config(isl.node, StageConfig(tp=t)))
        dp = max(1, isl.num_gpus // tp)
        cfg = StageConfig(tp=tp, dp=dp, zero=max(sp.zero), recompute=sp.recompute[-1] if "full" not in sp.recompute
                          else "full", micro_batch_size=min(sp.micro_batch_sizes))
        problems = cost.check_config(isl.node, cfg)
        cap = cost.usable_memory_bytes(isl.node)
        need = max(cost.layer(isl.node, cfg, k).static_bytes + cost.layer(isl.node, cfg, k).activation_bytes
                   for k in kinds) if not problems else float("nan")
        ratio = need / cap if cap > 0 else float("inf")
        lines.append(f"  {isl.name} ({isl.gpu_name}): one layer needs {need / u.GiB:.2f} GiB per GPU with "
                     f"{cfg.label} over {cfg.gpus} GPUs; {cap / u.GiB:.2f} GiB usable"
                     + (f" ({'; '.join(problems)})" if problems else ""))
        if ratio < best_ratio:
            best_ratio = ratio
            closest = {"island": isl.name, "gpu": isl.gpu_name, "need_bytes": need, "usable_bytes": cap,
                       "config": cfg.label}
    head = (f"No plan fits {ctx.model.name} on {ctx.cluster.name} with global batch "
            f"{ctx.training.global_batch_size} x {ctx.training.seq_len} tokens.")
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
            head += (f": it misses by {(need - usable) / u.GiB:.1f} GiB before activations; add GPUs." if need > usable
                     else "; activations and per-stage copies of the embedding/head do not fit: allow more stages "
                          "(space.max_stages), ZeRO-3 or full recomputation.")
    return InfeasibleError(head + "\n" + "\n".join(lines), closest=closest)
