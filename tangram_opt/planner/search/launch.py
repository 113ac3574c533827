"""The plan space of a launch target: plans a stock framework runs as one job (issue 29).

Megatron-LM, DeepSpeed and torchtitan run one parallel layout on every pipeline stage: the same
tensor, context, expert and data parallelism, ZeRO stage, recomputation and per-rank micro-batch,
hence the same number of GPUs per stage; the GPU type may differ per stage (each stage's ranks sit
on one island), and the layers may be split unevenly (each export writes the split: Megatron-LM's
first/last-stage counts or layout, torchtitan's module names per stage, DeepSpeed's partition).
A launch target's plan space is therefore the union, over the uniform configurations
``K = (tp, cp, ep, ZeRO, recompute, mb)`` the framework supports, of single-pipeline plans whose
every stage runs ``K``, with ``dp = b / mb`` for pipeline micro-batch ``b``.

Each ``(K, b)`` is one sub-problem with at most one candidate per island. All of them go to one
branch and bound (:class:`BranchAndBound` with ``subproblems``): one incumbent, nodes taken by best
bound across every ``K``, and a global bound that is the minimum over all of them, so the
certificate covers the whole launch space. Before the search, a sub-problem is dropped when
another of the same ``b`` has, on every island, a candidate no worse in every coefficient the
formulation reads (and allows at least as many stages): any plan of the dropped one is a plan of
the other, no slower and no larger (exact, as the candidates' Pareto pruning).

What each framework accepts, and how it runs (the export side is in tangram_opt/export/launch.py
and docs/exports.md, which cite the frameworks' code):

- **megatron**: ZeRO 0, 1 (``--use-distributed-optimizer``) or 3 (Megatron-FSDP). Not 2: the
  distributed optimizer reduce-scatters gradients but keeps the whole 16-bit gradient buffer, so
  ZeRO-2's memory saving is not realized. Gradient reduction overlaps the backward
  (``--overlap-grad-reduce``). ``seq_len`` a multiple of ``2 cp``.
- **deepspeed**: ZeRO 0-3, but ZeRO-2/3 only on one stage (the pipeline engine asserts ZeRO <= 1);
  tp = ep = 1 (tensor and expert parallelism live in model code, Megatron-DeepSpeed or
  ``deepspeed.moe``, not in the job's ``ds_config.json``); no context parallelism (its engine has
  no ring attention); fp16 or bf16, not fp8.
  Gradients are reduced after the pipeline flush (the pipeline engine's ``_exec_reduce_grads``,
  and ZeRO's ``overlap_comm`` is off by default): priced as exposed.
- **torchtitan**: ZeRO 0 (replicate), 2 (FSDP2 ``reshard_after_forward = never``) or 3; not 1
  (FSDP2 always shards gradients); bf16 only (no fp16 mixed precision, fp8 is set in Python
  configs); ``seq_len`` divisible by ``tp`` (and by ``2 tp cp`` with context parallelism); a model
  torchtitan defines (its config registry). FSDP2 overlaps the reduce-scatter with the backward.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from tangram_opt.cost import Calibration
from tangram_opt.errors import InfeasibleError, SpecError
from tangram_opt.planner.candidates.analytical import coefficient_matrix
from tangram_opt.planner.context import PlanningContext
from tangram_opt.planner.formulations.problem import PipelineProblem
from tangram_opt.planner.plan import CertificateStatus, Plan
from tangram_opt.planner.search.branch_and_bound import BranchAndBound
from tangram_opt.planner.search.nodes import SearchEvent
from tangram_opt.planner.space import SearchSpace
from tangram_opt.specs.frameworks import FRAMEWORKS, TORCHTITAN_RECIPES
from tangram_opt.specs.model import ModelSpec

LAUNCH_TARGETS = FRAMEWORKS
#: share of ``time_limit_s`` that building the launch sub-problems may take; configurations not
#: reached by then are not searched, and the certificate says so. (DeepSeek-V3 on 1,024 GPUs has
#: 5,184 uniform Megatron-LM configurations: building them all took 23-27 s, and a 15 s solve 45-52 s.)
LAUNCH_BUILD_SHARE = 0.5


@dataclass(frozen=True, slots=True)
class LaunchRules:
    """What one framework runs as one job, and how it runs it (see the module docstring)."""

    target: str
    zero: tuple[int, ...]
    recompute: tuple[str, ...]
    #: tensor-, context- and expert-parallel sizes it runs as one job (None: the search space's)
    tp: tuple[int, ...] | None
    cp: tuple[int, ...] | None
    ep: tuple[int, ...] | None
    #: ZeRO stages allowed only on a one-stage pipeline
    one_stage_zero: tuple[int, ...]
    #: precision -> why the framework cannot train in it
    refused_precisions: dict[str, str]
    overlap_grad_reduce: bool
    runtime: str

    def seq_ok(self, seq_len: int, tp: int, cp: int) -> bool:
        if self.target == "torchtitan":
            return seq_len % (tp * (2 * cp if cp > 1 else 1)) == 0
        if self.target == "megatron":
            return cp == 1 or seq_len % (2 * cp) == 0
        return True


RULES: dict[str, LaunchRules] = {
    "megatron": LaunchRules(
        target="megatron", zero=(0, 1, 3), recompute=("none", "selective", "full"), tp=None, cp=None, ep=None,
        one_stage_zero=(),
        refused_precisions={}, overlap_grad_reduce=True,
        runtime="Megatron-LM: gradient reduction overlapped with the backward (--overlap-grad-reduce)"),
    "deepspeed": LaunchRules(
        target="deepspeed", zero=(0, 1, 2, 3), recompute=("none", "selective", "full"), tp=(1,), cp=(1,), ep=(1,),
        one_stage_zero=(2, 3),
        refused_precisions={"fp8": "DeepSpeed's config has no FP8 training (FP8 layers come from model code)"},
        overlap_grad_reduce=False,
        runtime="DeepSpeed: gradients reduced after the pipeline flush (pipeline engine; ZeRO overlap_comm off by "
                "default), priced as exposed"),
    "torchtitan": LaunchRules(
        target="torchtitan", zero=(0, 2, 3), recompute=("none", "selective", "full"), tp=None, cp=None, ep=None,
        one_stage_zero=(),
        refused_precisions={"fp16": "torchtitan trains in bfloat16 or float32, not fp16",
                            "fp8": "torchtitan turns FP8 on in a Python config, not in the job the export writes"},
        overlap_grad_reduce=True,
        runtime="torchtitan: FSDP2 reduce-scatter (or DDP all-reduce) overlapped with the backward"),
}


@dataclass(frozen=True, slots=True)
class UniformConfig:
    """One parallel layout for every stage of a launchable pipeline."""

    tp: int
    cp: int
    ep: int
    zero: int
    recompute: str
    micro_batch_size: int

    def label(self, b: int) -> str:
        dp = b // self.micro_batch_size
        return (f"tp{self.tp} cp{self.cp} dp{dp}" + (f" ep{self.ep}" if self.ep > 1 else "")
                + f" z{self.zero} {self.recompute} mb{self.micro_batch_size}")


def launch_rules(target: str) -> LaunchRules:
    if target not in RULES:
        raise SpecError("launch", target, "is not a launch target", f"use one of {', '.join(LAUNCH_TARGETS)}")
    return RULES[target]


def check_launch(target: str, precision: str, model: ModelSpec) -> LaunchRules:
    """The target's rules; refuses a precision the framework cannot train in, or a model it has no
    definition of (naming the fix)."""
    rules = launch_rules(target)
    if target == "torchtitan" and model.name not in TORCHTITAN_RECIPES:
        raise SpecError("launch", target, f"has no model definition and config for {model.name} "
                        f"(torchtitan 0.3 defines {', '.join(sorted(TORCHTITAN_RECIPES))})",
                        "launch with megatron, or write a torchtitan config_registry function for the model")
    if precision in rules.refused_precisions:
        fix = "plan with precision bf16" if precision != "fp16" else "plan with precision bf16 (every GPU of the " \
            "cluster must have BF16 tensor cores)"
        raise SpecError("launch", target, f"cannot train in {precision}: {rules.refused_precisions[precision]}",
                        f"{fix}, or launch with megatron")
    return rules


def launch_calibration(rules: LaunchRules, calibration: Calibration | None) -> Calibration:
    """``calibration`` with the framework's runtime behaviour (gradient-reduction overlap)."""
    base = calibration if calibration is not None else Calibration()
    return replace(base, overlap_grad_reduce=rules.overlap_grad_reduce)


def _values(given: tuple[int, ...] | None, upto: int) -> tuple[int, ...]:
    if given is not None:
        return tuple(sorted(set(given)))
    out, v = [], 1
    while v <= upto:
        out.append(v)
        v *= 2
    return tuple(out)


def uniform_configs(ctx: PlanningContext, rules: LaunchRules) -> list[tuple[UniformConfig, SearchSpace]]:
    """Every uniform configuration of the search space that the target runs, with its space."""
    space, model, training = ctx.space, ctx.model, ctx.training
    node_max = max(i.node.gpus_per_node for i in ctx.islands)
    tps = tuple(t for t in _values(space.tp, node_max) if rules.tp is None or t in rules.tp)
    cps = tuple(c for c in space.cp if rules.cp is None or c in rules.cp)
    eps = tuple(e for e in (_values(space.ep, model.moe.num_experts) if model.moe is not None else (1,))
                if rules.ep is None or e in rules.ep)
    out = []
    for tp, cp, ep, zero, rec, mb in itertools.product(
            tps, cps, eps, [z for z in space.zero if z in rules.zero],
            [r for r in space.recompute if r in rules.recompute], space.micro_batch_sizes):
        if not rules.seq_ok(training.seq_len, tp, cp):
            continue
        k = UniformConfig(tp=tp, cp=cp, ep=ep, zero=zero, recompute=rec, micro_batch_size=mb)
        k_space = replace(space, tp=(tp,), cp=(cp,), ep=(ep,) if model.moe is not None else space.ep,
                          zero=(zero,), recompute=(rec,), micro_batch_sizes=(mb,),
                          max_stages=1 if zero in rules.one_stage_zero else space.max_stages)
        out.append((k, k_space))
    return out


def launch_subproblems(ctx: PlanningContext, rules: LaunchRules, deadline: float | None = None
                       ) -> tuple[dict[int, tuple[PipelineProblem, str]], dict[str, int]]:
    """The sub-problems of the launch space (key -> (problem, label)) and how many were built,
    empty, and dropped as dominated. Configurations not reached by ``deadline`` (a
    ``time.perf_counter()`` time) are not built, once some sub-problem fits: ``counts["not_built"]``
    says how many."""
    subs: list[tuple[UniformConfig, int, PipelineProblem]] = []
    counts = {"configurations": 0, "sub_problems": 0, "empty": 0, "dominated": 0, "not_built": 0}
    for k, k_space in uniform_configs(ctx, rules):
        counts["configurations"] += 1
        if deadline is not None and subs and time.perf_counter() > deadline:
            counts["not_built"] += 1
            continue
        k_ctx = PlanningContext(ctx.cluster, ctx.model, ctx.training, space=k_space, cost=ctx.cost)
        for b in k_ctx.pipeline_micro_batches():
            if b % k.micro_batch_size:
                continue
            prob = k_ctx.problem(b)
            counts["sub_problems"] += 1
            if not prob.candidates:
                counts["empty"] += 1
                continue
            subs.append((k, b, prob))
    keep = _undominated(subs, ctx.kinds, ctx.space.schedule)
    counts["dominated"] = len(subs) - len(keep)
    return {i: (prob, k.label(b)) for i, (k, b, prob) in enumerate(keep)}, counts


def _undominated(subs: Sequence[tuple[UniformConfig, int, PipelineProblem]], kinds: Sequence[str],
                 schedule: str) -> list[tuple[UniformConfig, int, PipelineProblem]]:
    """Drop each sub-problem another of the same ``b`` dominates: on every island a candidate
    no worse in every coefficient (a missing candidate is worst), and at least as many stages."""
    by_b: dict[int, list[int]] = {}
    for i, (_, b, _) in enumerate(subs):
        by_b.setdefault(b, []).append(i)
    alive = [True] * len(subs)
    for members in by_b.values():
        islands = sorted({c.island for i in members for c in subs[i][2].candidates})
        vecs: list[np.ndarray | None] = []
        width = None
        for i in members:
            rows = {c.island: c for c in subs[i][2].candidates}
            if len(rows) != len(subs[i][2].candidates):  # several candidates on an island: not compared
                vecs.append(None)
                continue
            parts = {isl: coefficient_matrix([c], kinds, schedule=schedule)[0] for isl, c in rows.items()}
            width = width or len(next(iter(parts.values())))
            vecs.append(np.concatenate([parts.get(isl, np.full(width, np.inf)) for isl in islands]))
        comparable = [x for x, v in enumerate(vecs) if v is not None]
        if len(comparable) < 2:
            continue
        M = np.vstack([vecs[x] for x in comparable])  # one row per comparable member, in member order
        tol = 1e-12 * np.abs(M)
        stages = np.array([subs[members[x]][2].max_stages for x in comparable])
        live = np.ones(len(comparable), dtype=bool)
        for r, x in enumerate(comparable):
            i, d = members[x], M[r]
            # rows no worse than d everywhere, with at least as many stages, still alive, not d itself
            dom = np.all(M <= d + 1e-12 * np.abs(d), axis=1) & (stages >= stages[r]) & live
            dom[r] = False
            # an identical row dominates only if it comes first (identical: keep the first)
            same = np.all(d <= M + tol, axis=1)
            dom &= ~(same & (np.arange(len(comparable)) > r))
            if dom.any():
                alive[i] = live[r] = False
    return [s for i, s in enumerate(subs) if alive[i]]


def solve_launch(ctx: PlanningContext, rules: LaunchRules, *, backend: str, time_limit_s: float, threads: int,
                 seed: int, rel_gap: float, knobs: Any, on_progress: Callable[[SearchEvent], None] | None,
                 t0: float) -> Plan:
    """The best plan of the launch space of ``rules`` (``ctx`` must price with the target's
    runtime calibration, :func:`launch_calibration`), with a certificate over that space."""
    subs, counts = launch_subproblems(ctx, rules, deadline=t0 + LAUNCH_BUILD_SHARE * time_limit_s)
    cut = counts["not_built"]
    built = counts["configurations"] - cut
    space_text = (f"launch target {rules.target}: one {ctx.space.schedule} pipeline, every stage the same "
                  f"(tp, cp, ep, dp, ZeRO, recompute, micro-batch) among "
                  + (f"the first {built} of {counts['configurations']} uniform configurations the framework runs "
                     f"(the time limit stopped building the others: they are not searched and the bound does "
                     f"not cover them; raise time_limit_s to search them all) " if cut else
                     f"{counts['configurations']} uniform configurations the framework runs ")
                  + f"({len(subs)} of {counts['sub_problems']} (configuration, "
                  f"pipeline micro-batch) sub-problems searched: {counts['empty']} fit nowhere, "
                  f"{counts['dominated']} dominated); " + ctx.space.describe())
    if not subs:
        raise InfeasibleError(f"no plan {rules.target} launches as one job fits {ctx.model.name} on "
                              f"{ctx.cluster.name} with global batch {ctx.training.global_batch_size} x "
                              f"{ctx.training.seq_len} tokens: no uniform configuration of the search space fits any "
                              "island (plan without --launch to see what fits, or widen the search space)")
    search = BranchAndBound(ctx, backend=backend, time_limit_s=time_limit_s, threads=threads, seed=seed,
                            rel_gap=rel_gap, formulation=knobs.formulation, windows=bool(knobs.windows),
                            fluid_cuts=knobs.fluid_cuts, knapsack=bool(knobs.knapsack),
                            sequence=bool(knobs.sequence_leaves), warm_start=knobs.warm_start,
                            on_progress=on_progress, t0=t0, subproblems=subs, plan_space=space_text)
    plan = search.run()
    cert = plan.certificate
    assert cert is not None
    notes = cert.notes + (f"runtime: {rules.runtime}",)
    if cut:
        # the bound is over the configurations built: not a proof over the launch space
        notes += (f"time limit: {cut} of {counts['configurations']} uniform configurations were not built or "
                  "searched; the gap covers the configurations searched only",)
        return replace(plan, certificate=replace(cert, notes=notes, status=CertificateStatus.FEASIBLE))
    return replace(plan, certificate=replace(cert, notes=notes))


__all__ = ["LAUNCH_TARGETS", "RULES", "LaunchRules", "UniformConfig", "check_launch", "launch_calibration",
           "launch_rules", "launch_subproblems", "solve_launch", "uniform_configs"]
