"""Turn decoded stage choices into :class:`~tangram_opt.planner.plan.Plan` objects."""

from __future__ import annotations

from collections.abc import Sequence

from tangram_opt.planner.context import PlanningContext
from tangram_opt.planner.formulations.pipeline_model import exact_step_time
from tangram_opt.planner.formulations.problem import PipelineProblem, StageChoice, choices_timing
from tangram_opt.planner.plan import Certificate, PipelinePlan, Plan, StagePlan


def pipeline_plan(ctx: PlanningContext, problem: PipelineProblem, choices: Sequence[StageChoice]) -> PipelinePlan:
    timing = choices_timing(problem, choices)
    cands = problem.candidates
    stages = []
    layer = 0
    n = len(choices)
    for k, (ch, t) in enumerate(zip(choices, timing.stages)):
        c = cands[ch.candidate]
        isl = ctx.islands[c.island]
        cfg = c.config
        dense = ch.layers.get("dense", 0)
        moe = ch.layers.get("moe", 0)
        stages.append(StagePlan(island=isl.name, gpu=isl.gpu_name, gpus=cfg.gpus, tp=cfg.tp, cp=cfg.cp, dp=cfg.dp,
                                ep=cfg.ep, zero=cfg.zero, recompute=cfg.recompute,
                                micro_batch_size=cfg.micro_batch_size, first_layer=layer, num_dense_layers=dense,
                                num_moe_layers=moe, has_embedding=k == 0, has_head=k == n - 1,
                                fwd_time_s=t.fwd_s, bwd_time_s=t.bwd_s, tail_time_s=t.tail_s, p2p_time_s=t.p2p_s,
                                memory_bytes=t.memory_bytes, capacity_bytes=t.capacity_bytes, inflight=t.inflight))
        layer += dense + moe
    exact = exact_step_time(timing, problem.num_micro_batches, problem.schedule)
    return PipelinePlan(stages=tuple(stages), pipeline_micro_batch=problem.pipeline_micro_batch,
                        num_micro_batches=problem.num_micro_batches, schedule=problem.schedule,
                        makespan_s=timing.makespan_s, step_time_s=exact, model_step_time_s=timing.step_time_s,
                        bottleneck_s=timing.bottleneck_s)


def make_plan(ctx: PlanningContext, pipelines: Sequence[PipelinePlan], *, method: str,
              certificate: Certificate | None = None, step_time_s: float | None = None) -> Plan:
    t = ctx.training
    gpu_peak = {i.name: i.node.gpu.peak_flops_per_s(t.precision) for i in ctx.islands}
    used_peak = sum(s.gpus * gpu_peak[s.island] for p in pipelines for s in p.stages)
    return Plan(cluster=ctx.cluster.name, model=ctx.model.name, method=method, global_batch_size=t.global_batch_size,
                seq_len=t.seq_len, precision=t.precision, pipelines=tuple(pipelines),
                step_time_s=step_time_s if step_time_s is not None else max(p.step_time_s for p in pipelines),
                model_flops_per_step=ctx.cost.model_flops_per_step(),
                used_peak_flops_per_s=used_peak, cluster_peak_flops_per_s=ctx.cluster.peak_flops_per_s(t.precision),
                island_gpus={i.name: i.num_gpus for i in ctx.islands}, certificate=certificate)
