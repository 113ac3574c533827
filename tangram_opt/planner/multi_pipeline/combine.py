"""The multi-pipeline level from end to end, and the plan and certificate it returns.

:func:`run_multi_pipeline` generates the templates (generation.py), solves level 2 (level2.py),
builds the plan of the best choice (:func:`assemble`) and merges the two levels' certificates: the
plan space is the union of the single-pipeline space and the template space, and the bound is the
smaller of the two levels' bounds (docs/multi_pipeline.md).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

from tangram_opt.errors import SpecError
from tangram_opt.planner.assemble import make_plan
from tangram_opt.planner.context import PlanningContext
from tangram_opt.planner.multi_pipeline.generation import SinglePipelineSolver, generate_templates
from tangram_opt.planner.multi_pipeline.level2 import OPTIMAL_RESOLUTION, Level2Result, solve_level2
from tangram_opt.planner.multi_pipeline.options import MultiPipelineOptions
from tangram_opt.planner.multi_pipeline.templates import Template, TemplatePricer
from tangram_opt.planner.plan import Certificate, CertificateStatus, PipelinePlan, Plan, StagePlan
from tangram_opt.solvers import relative_gap


def assemble(ctx: PlanningContext, pricer: TemplatePricer, pipes: Sequence[tuple[Template, int]], *, method: str = "mip",
             certificate: Certificate | None = None) -> Plan:
    """The :class:`Plan` of ``pipes`` (template, micro-batches): exact step = max pipeline + sync + optimizer."""
    out = []
    for t, m in pipes:
        tm, exact = pricer.exact(t, m)
        cands = ctx.candidates(t.b)
        stages, layer, P = [], 0, t.num_stages
        for k, (ch, st, p) in enumerate(zip(t.choices, tm.stages, t.parts)):
            c = cands[ch.candidate]
            isl = ctx.islands[c.island]
            cfg = c.config
            dense, moe = ch.layers.get("dense", 0), ch.layers.get("moe", 0)
            stages.append(StagePlan(island=isl.name, gpu=isl.gpu_name, gpus=cfg.gpus, tp=cfg.tp, cp=cfg.cp, dp=cfg.dp,
                                    ep=cfg.ep, zero=cfg.zero, recompute=cfg.recompute,
                                    micro_batch_size=cfg.micro_batch_size, first_layer=layer, num_dense_layers=dense,
                                    num_moe_layers=moe, has_embedding=k == 0, has_head=k == P - 1,
                                    fwd_time_s=st.fwd_s, bwd_time_s=st.bwd_s, tail_time_s=p.grad_sync_s,
                                    p2p_time_s=st.p2p_s, memory_bytes=st.memory_bytes,
                                    capacity_bytes=st.capacity_bytes, inflight=st.inflight,
                                    post_sync_time_s=p.optimizer_s))
            layer += dense + moe
        out.append(PipelinePlan(stages=tuple(stages), pipeline_micro_batch=t.b, num_micro_batches=m,
                                schedule=ctx.space.schedule, makespan_s=tm.makespan_s, step_time_s=exact,
                                model_step_time_s=pricer.cf(t, m), bottleneck_s=tm.bottleneck_s))
    sync = pricer.sync(pipes)
    step = max(p.step_time_s for p in out) + sync.total_s + max(t.optimizer_s for t, _ in pipes)
    plan = make_plan(ctx, out, method=method, certificate=certificate, step_time_s=step)
    return replace(plan, cross_sync_s=sync.total_s)


# --- the entry point used by solve() -----------------------------------------------------------
@dataclass(slots=True)
class MultiPipelineRun:
    """Everything the multi-pipeline level produced (for tests, brute force and the benchmark)."""

    templates: list[Template]
    level2: Level2Result
    pricer: TemplatePricer
    log: list[str]


def with_multi_pipeline(ctx: PlanningContext, single: Plan, *, solver: SinglePipelineSolver, backend: str,
                        time_limit_s: float, t0: float, threads: int = 1, seed: int = 0, rel_gap: float = 1e-4,
                        options: MultiPipelineOptions | None = None) -> Plan:
    """Run the template and level-2 stages after the single-pipeline search; return the better plan.

    The returned plan's certificate covers the union of the single-pipeline space and the template
    space; its bound is the smaller of the two levels' bounds.
    """
    plan, _ = run_multi_pipeline(ctx, single, solver=solver, backend=backend, time_limit_s=time_limit_s, t0=t0,
                                 threads=threads, seed=seed, rel_gap=rel_gap, options=options)
    return plan


def run_multi_pipeline(ctx: PlanningContext, single: Plan, *, solver: SinglePipelineSolver | None, backend: str,
                       time_limit_s: float, t0: float, threads: int = 1, seed: int = 0, rel_gap: float = 1e-4,
                       options: MultiPipelineOptions | None = None,
                       templates: list[Template] | None = None) -> tuple[Plan, MultiPipelineRun]:
    """:func:`with_multi_pipeline` returning also the templates and the level-2 result (``solver`` may be
    None when ``templates`` are given: nothing is planned on sub-clusters then)."""
    opts = options or MultiPipelineOptions()
    cert = single.certificate
    assert cert is not None
    pricer = TemplatePricer(ctx)
    log: list[str] = []
    now = time.perf_counter()
    left = max(0.0, time_limit_s - (now - t0))
    if templates is None:
        if solver is None:
            raise SpecError("solver", None, "is needed to generate templates",
                            "pass solver=tangram_opt.planner.search.solve_single_pipeline, or the templates")
        deadline = now + opts.template_share * left
        templates = generate_templates(ctx, single, opts, solver=solver, backend=backend, deadline=deadline,
                                       threads=threads, seed=seed, rel_gap=rel_gap, log=log, pricer=pricer)
    # keep a little of the budget for assembling and evaluating the plans
    remaining = max(0.5, 0.97 * time_limit_s - (time.perf_counter() - t0))
    level2 = solve_level2(ctx, templates, pricer, cutoff_s=cert.objective_s, max_pipelines=opts.max_pipelines,
                          backend=backend, time_limit_s=remaining, threads=threads, seed=seed, rel_gap=rel_gap,
                          floor_s=cert.bound_s)
    run = MultiPipelineRun(templates=templates, level2=level2, pricer=pricer, log=log)
    return combine_levels(ctx, single, run, opts, t0=t0, backend=backend, rel_gap=rel_gap), run


def describe_template_space(ctx: PlanningContext, templates: Sequence[Template], opts: MultiPipelineOptions) -> str:
    ones = [t for t in templates if t.num_stages == 1]
    multi = [t for t in templates if t.num_stages > 1]
    bs = sorted({t.b for t in ones})
    text = (f"2 to {opts.max_pipelines} data-parallel pipelines on disjoint GPUs, each a copy of one of "
            f"{len(templates)} templates with a free whole number of micro-batches (shares summing to the global "
            f"batch): {len(ones)} one-stage templates (every candidate holding the whole model, pipeline "
            f"micro-batch in {bs}, exact-Pareto pruned) and {len(multi)} multi-stage templates")
    if multi:
        text += " (" + "; ".join(t.describe(ctx) for t in multi) + ")"
    return text + ("; step = slowest pipeline (gradient-sync-only tails) + cross-pipeline all-reduce + optimizer "
                   "(docs/multi_pipeline.md)")


def combine_levels(ctx: PlanningContext, single: Plan, run: MultiPipelineRun, opts: MultiPipelineOptions, *,
                   t0: float, backend: str, rel_gap: float) -> Plan:
    """The better of the single-pipeline plan and the level-2 plan, with the union's certificate
    (also after the single-pipeline search went on with a better plan or bound: the level-2 bound
    holds for the template space whatever cutoff it was computed with, since it is capped by it)."""
    cert = single.certificate
    assert cert is not None
    lv = run.level2
    single_bound = cert.bound_s if cert.bound_s is not None else 0.0
    bound = min(single_bound, lv.bound_s)
    space = f"union of (A) {cert.plan_space} and (B) {describe_template_space(ctx, run.templates, opts)}"
    row = {"level": "multi-pipeline (templates + level-2 MIP)", "status": lv.status, "templates": lv.templates,
           "pairs": lv.pairs, "objective_s": lv.objective_s, "bound_s": lv.bound_s, "solve_time_s": lv.solve_time_s,
           **lv.info}
    notes = cert.notes + (
        f"single-pipeline level: {cert.status}, objective {cert.objective_s:.6f} s, bound {single_bound:.6f} s"
        + (f", gap {100 * cert.gap:.3f}%" if cert.gap is not None else ""),
        f"multi-pipeline level (R = 2..{opts.max_pipelines}): {lv.status}"
        + (f", objective {lv.objective_s:.6f} s" if lv.objective_s is not None else "")
        + f", bound {lv.bound_s:.6f} s over {lv.templates} templates, {lv.pairs} (template, micro-batch count) pairs",
    ) + tuple(run.log)
    multi = None
    if lv.pipes is not None and lv.objective_s is not None:
        multi = assemble(ctx, run.pricer, lv.pipes, method="mip")
    # the better plan is the one with the shorter exact step (what plans report and the simulator
    # replays); the closed form breaks ties. Its certificate states its own model objective.
    use_multi = multi is not None and (multi.step_time_s, lv.objective_s) < (single.step_time_s, cert.objective_s)
    objective = lv.objective_s if use_multi else cert.objective_s
    assert objective is not None
    gap = relative_gap(objective, bound)
    status = CertificateStatus.OPTIMAL if gap <= max(rel_gap, OPTIMAL_RESOLUTION) else CertificateStatus.FEASIBLE
    elapsed = time.perf_counter() - t0
    new_cert = replace(cert, status=status, objective_s=objective, bound_s=bound, gap=gap, solve_time_s=elapsed,
                       plan_space=space, subproblems=cert.subproblems + (row,), notes=notes)
    if use_multi:
        assert multi is not None
        return replace(multi, certificate=new_cert)
    return replace(single, certificate=new_cert)


__all__ = ["MultiPipelineRun", "assemble", "combine_levels", "describe_template_space", "run_multi_pipeline",
           "with_multi_pipeline"]
