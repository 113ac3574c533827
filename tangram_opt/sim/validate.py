"""Structural validation of a :class:`~tangram_opt.planner.plan.Plan` against the cluster and model.

Every rule is checked and every violation is returned at once (a user fixing a hand-written plan
should see the whole list, not the first problem). Each :class:`Violation` names the pipeline,
the stage and the field. The rules restate the plan space from first principles; none of them
calls the planner's candidate enumeration, formulation or closed form. Memory is recomputed from
the cost model (:mod:`tangram_opt.sim._stages`), with the in-flight micro-batches of the schedule.

Rules (see docs/simulator.md):

- plan: training batch, sequence length and precision match ``training``; at least one pipeline;
  the pipelines' ``pipeline_micro_batch x num_micro_batches`` sum to the global batch;
- pipeline: known schedule, ``num_micro_batches >= 1``, at least one stage; layers ``0 .. L-1``
  each exactly once, contiguous and in order (stage k starts where stage k-1 ends); the
  model's dense layers first (dense-first MoE models); the embedding on the first stage only and
  the head on the last only;
- stage: known island and matching GPU type; ``tp x cp x dp == gpus``; ``gpus`` divides the
  island's node size or is a multiple of it; ``tp`` within one node; attention heads, KV heads
  (non-MLA), the model's FFN widths divisible by ``tp``; experts divisible by ``ep`` and ``ep`` dividing
  ``dp x cp``; ``ep == 1`` on dense models; ``seq_len`` divisible by ``2 cp`` when ``cp > 1``;
  ZeRO stage in 0..3; recomputation in none/selective/full; ``micro_batch_size x dp ==
  pipeline_micro_batch``; the GPU type supports the precision; peak memory within usable memory;
- island: the GPUs all pipelines take from an island fit in it, with every stage on whole nodes or
  packed inside nodes without straddling one.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tangram_opt import units as u
from tangram_opt.cost import RECOMPUTE_MODES, ZERO_STAGES, CostModel
from tangram_opt.cost.calibration import Calibration
from tangram_opt.errors import SpecError
from tangram_opt.planner.islands import Island
from tangram_opt.planner.plan import Plan, StagePlan
from tangram_opt.sim._stages import (SCHEDULES, inflight_at_peak, island_by_name, peak_memory_bytes, stage_config,
                                     stage_work)
from tangram_opt.specs.cluster import Cluster
from tangram_opt.specs.model import ModelSpec
from tangram_opt.specs.training import TrainingSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class Violation:
    """One broken rule. ``pipeline`` / ``stage`` are ``None`` for plan- or island-level rules."""

    pipeline: int | None
    stage: int | None
    field: str
    message: str

    @property
    def where(self) -> str:
        if self.pipeline is None:
            return "plan"
        if self.stage is None:
            return f"pipeline {self.pipeline}"
        return f"pipeline {self.pipeline} stage {self.stage}"

    def __str__(self) -> str:
        return f"{self.where}: {self.field}: {self.message}"


class PlanValidationError(SpecError):
    """A plan broke one or more structural rules; ``violations`` lists all of them."""

    def __init__(self, violations: list[Violation]):
        self.violations = list(violations)
        listing = "\n".join(f"  - {v}" for v in self.violations)
        super().__init__("plan", f"{len(self.violations)} violation(s)", f"breaks the plan rules:\n{listing}",
                         "fix every listed field, or re-plan with tangram_opt.solve")


def validate(plan: Plan, cluster: Cluster, model: ModelSpec, training: TrainingSpec, *,
             cost: CostModel | None = None, calibration: Calibration | None = None,
             moe_load_imbalance: float = 1.0, profiles: Any = None) -> list[Violation]:
    """Every rule ``plan`` breaks (empty when it is valid). See the module docstring for the rules."""
    cost = cost or CostModel(model, training, calibration=calibration, moe_load_imbalance=moe_load_imbalance,
                             profiles=profiles)
    out: list[Violation] = []

    def bad(pi: int | None, k: int | None, field: str, message: str) -> None:
        out.append(Violation(pipeline=pi, stage=k, field=field, message=message))

    # --- plan level ---------------------------------------------------------------------------
    for name, have, want in (("global_batch_size", plan.global_batch_size, training.global_batch_size),
                             ("seq_len", plan.seq_len, training.seq_len),
                             ("precision", plan.precision, training.precision)):
        if have != want:
            bad(None, None, name, f"plan has {have!r} but the training spec has {want!r}")
    if not plan.pipelines:
        bad(None, None, "pipelines", "the plan has no pipeline")
    seqs = [p.pipeline_micro_batch * p.num_micro_batches for p in plan.pipelines]
    if plan.pipelines and sum(seqs) != training.global_batch_size:
        terms = " + ".join(f"{p.pipeline_micro_batch} x {p.num_micro_batches}" for p in plan.pipelines)
        bad(None, None, "pipelines.num_micro_batches",
            f"pipeline_micro_batch x num_micro_batches summed over pipelines = {terms} = {sum(seqs)} sequences, "
            f"but the global batch is {training.global_batch_size}")

    islands = island_by_name(cluster)
    kinds = model.layer_kinds
    L, D = model.num_layers, model.num_dense_layers
    used: dict[str, list[int]] = defaultdict(list)  # island -> stage sizes

    for pi, pipe in enumerate(plan.pipelines):
        P, m = len(pipe.stages), pipe.num_micro_batches
        if pipe.schedule not in SCHEDULES:
            bad(pi, None, "schedule", f"{pipe.schedule!r} is not a schedule; use one of {', '.join(SCHEDULES)}")
        if m < 1:
            bad(pi, None, "num_micro_batches", f"{m} must be >= 1")
        if pipe.pipeline_micro_batch < 1:
            bad(pi, None, "pipeline_micro_batch", f"{pipe.pipeline_micro_batch} must be >= 1")
        if P == 0:
            bad(pi, None, "stages", "the pipeline has no stage")
            continue
        # --- layer assignment: 0..L-1 exactly once, contiguous, in order --------------------
        expect = 0
        for k, st in enumerate(pipe.stages):
            n = st.num_layers
            if st.num_dense_layers < 0 or st.num_moe_layers < 0:
                bad(pi, k, "num_layers", f"negative layer count (dense {st.num_dense_layers}, "
                                         f"moe {st.num_moe_layers})")
                continue
            if n < 1:
                bad(pi, k, "num_layers", "the stage holds no transformer layer")
            if st.first_layer != expect:
                what = ("overlaps the previous stage" if st.first_layer < expect
                        else "leaves a gap after the previous stage")
                bad(pi, k, "first_layer", f"is {st.first_layer} but the previous stage ends at layer {expect - 1} "
                                          f"(expected {expect}): {what}")
            lo, hi = st.first_layer, st.first_layer + n
            if lo < 0 or hi > L:
                bad(pi, k, "first_layer", f"layers {lo}..{hi - 1} fall outside the model's 0..{L - 1}")
            else:
                want_dense = sum(1 for i in range(lo, hi) if kinds[i] == "dense")
                if want_dense != st.num_dense_layers or n - want_dense != st.num_moe_layers:
                    bad(pi, k, "num_dense_layers",
                        f"layers {lo}..{hi - 1} are {want_dense} dense + {n - want_dense} MoE (the model's "
                        f"{D} dense layers come first), but the stage says {st.num_dense_layers} dense + "
                        f"{st.num_moe_layers} MoE")
            expect = max(expect, hi)
        if expect != L:
            bad(pi, None, "stages", f"the stages cover layers 0..{expect - 1} but the model has {L} layers "
                                    f"(0..{L - 1})")
        # --- embedding / head placement -------------------------------------------------------
        for k, st in enumerate(pipe.stages):
            if st.has_embedding != (k == 0):
                bad(pi, k, "has_embedding", "the embedding must be on the first stage only"
                    if k else "the first stage must hold the embedding")
            if st.has_head != (k == P - 1):
                bad(pi, k, "has_head", "the LM head must be on the last stage only"
                    if k != P - 1 else "the last stage must hold the LM head")
        # --- per-stage configuration ----------------------------------------------------------
        for k, st in enumerate(pipe.stages):
            isl = islands.get(st.island)
            if isl is None:
                bad(pi, k, "island", f"{st.island!r} is not an island of cluster {cluster.name!r} "
                                     f"(islands: {', '.join(islands)})")
            config_ok = _check_stage(bad, pi, k, st, isl, model, training, pipe.pipeline_micro_batch)
            if isl is None:
                continue
            used[st.island].append(st.gpus)
            if not config_ok:
                continue
            # anything the cost model rejects that the rules above did not name
            extra = cost.check_config(isl.node, stage_config(st))
            for msg in extra:
                bad(pi, k, "config", msg)
            if extra:
                continue
            work = stage_work(cost, isl, st)
            inflight = inflight_at_peak(k, P, max(1, m), pipe.schedule if pipe.schedule in SCHEDULES else "1f1b")
            peak = peak_memory_bytes(work, inflight)
            if peak > work.capacity_bytes:
                bad(pi, k, "memory_bytes",
                    f"peak {u.fmt_bytes(peak)} per GPU (static {u.fmt_bytes(work.static_bytes)} + {inflight} in-flight "
                    f"x {u.fmt_bytes(work.activation_bytes)} activations + {u.fmt_bytes(work.transient_bytes)} "
                    f"scratch) exceeds the usable {u.fmt_bytes(work.capacity_bytes)} of a {isl.gpu_name}")

    # --- island budgets and node packing ------------------------------------------------------
    for name, sizes in used.items():
        isl = islands[name]
        if sum(sizes) > isl.num_gpus:
            bad(None, None, f"island[{name}].gpus",
                f"the plan's stages use {' + '.join(map(str, sizes))} = {sum(sizes)} GPUs but island {name!r} has "
                f"{isl.num_gpus} ({isl.num_nodes} node(s) x {isl.gpus_per_node})")
        elif all(_shape_ok(g, isl) for g in sizes) and not _packs(sizes, isl):
            bad(None, None, f"island[{name}].gpus",
                f"stages of {', '.join(map(str, sorted(sizes, reverse=True)))} GPUs cannot be placed on "
                f"{isl.num_nodes} node(s) of {isl.gpus_per_node} without splitting a sub-node stage across nodes")
    # plan-level first, then by pipeline and stage; rule order within a stage
    out.sort(key=lambda v: (-1 if v.pipeline is None else v.pipeline, -1 if v.stage is None else v.stage))
    return out


def validate_or_raise(plan: Plan, cluster: Cluster, model: ModelSpec, training: TrainingSpec, **kwargs) -> None:
    """Raise :class:`PlanValidationError` listing every violation, if any."""
    v = validate(plan, cluster, model, training, **kwargs)
    if v:
        raise PlanValidationError(v)


def _shape_ok(gpus: int, isl: Island) -> bool:
    n = isl.gpus_per_node
    return gpus >= 1 and ((gpus <= n and n % gpus == 0) or gpus % n == 0)


def _packs(sizes: list[int], isl: Island) -> bool:
    """Whether stages of ``sizes`` GPUs fit on the island's nodes: stages of whole nodes take whole
    nodes, smaller stages (divisors of the node size) are bin-packed into the remaining nodes."""
    n = isl.gpus_per_node
    whole = sum(g // n for g in sizes if g >= n)
    free_nodes = isl.num_nodes - whole
    small = sorted((g for g in sizes if g < n), reverse=True)
    if free_nodes < 0:
        return False
    if not small:
        return True
    bins = [n] * free_nodes
    budget = [200_000]  # search nodes; sizes dividing n pack easily, this is a safety net

    def place(i: int) -> bool:
        if i == len(small):
            return True
        budget[0] -= 1
        if budget[0] < 0:
            return True  # give up: do not report a violation we could not prove
        seen = set()
        for b in range(len(bins)):
            if bins[b] >= small[i] and bins[b] not in seen:
                seen.add(bins[b])
                bins[b] -= small[i]
                if place(i + 1):
                    return True
                bins[b] += small[i]
        return False

    return place(0)


_Report = Callable[[int | None, int | None, str, str], None]


def _check_stage(bad: _Report, pi: int, k: int, st: StagePlan, isl: Island | None, model: ModelSpec,
                 training: TrainingSpec, pipe_mb: int) -> bool:
    """Configuration rules of one stage; returns whether a StageConfig can be built and priced."""
    ok = True
    for name in ("tp", "cp", "dp", "ep", "micro_batch_size", "gpus"):
        v = getattr(st, name)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            bad(pi, k, name, f"{v!r} must be an integer >= 1")
            ok = False
    if st.zero not in ZERO_STAGES:
        bad(pi, k, "zero", f"{st.zero!r} is not a ZeRO stage (use 0, 1, 2 or 3)")
        ok = False
    if st.recompute not in RECOMPUTE_MODES:
        bad(pi, k, "recompute", f"{st.recompute!r} is not a recomputation mode (use {', '.join(RECOMPUTE_MODES)})")
        ok = False
    if not ok:
        return False
    tp, cp, dp, ep = st.tp, st.cp, st.dp, st.ep
    if tp * cp * dp != st.gpus:
        bad(pi, k, "gpus", f"tp({tp}) x cp({cp}) x dp({dp}) = {tp * cp * dp} GPUs, but the stage has {st.gpus}"
            + (f" on island {st.island!r}" if isl is not None else ""))
        ok = False
    if isl is not None:
        if st.gpu != isl.gpu_name:
            bad(pi, k, "gpu", f"{st.gpu!r} but island {isl.name!r} has {isl.gpu_name} GPUs")
        n = isl.gpus_per_node
        if not _shape_ok(st.gpus, isl):
            bad(pi, k, "gpus", f"{st.gpus} GPUs is neither a divisor nor a multiple of the {n} GPUs per node of "
                               f"island {isl.name!r}")
            ok = False
        if st.gpus > isl.num_gpus:
            bad(pi, k, "gpus", f"{st.gpus} GPUs but island {isl.name!r} has only {isl.num_gpus}")
            ok = False
        if tp > n:
            bad(pi, k, "tp", f"tp({tp}) exceeds the {n} GPUs per node of island {isl.name!r} (TP stays in a node)")
            ok = False
        if not isl.node.gpu.supports(training.precision):
            bad(pi, k, "island", f"{isl.gpu_name} does not support {training.precision}")
            ok = False
    if model.num_attention_heads % tp:
        bad(pi, k, "tp", f"tp({tp}) does not divide the {model.num_attention_heads} attention heads")
        ok = False
    if model.mla is None and model.kv_heads % tp:
        bad(pi, k, "tp", f"tp({tp}) does not divide the {model.kv_heads} KV heads")
        ok = False
    # FFN widths are checked for the whole model, as the cost model does (it prices configurations per model)
    if model.num_dense_layers and model.ffn_hidden_size % tp:
        bad(pi, k, "tp", f"tp({tp}) does not divide ffn_hidden_size ({model.ffn_hidden_size})")
        ok = False
    if model.moe is not None and model.moe.expert_ffn_hidden_size % tp:
        bad(pi, k, "tp", f"tp({tp}) does not divide expert_ffn_hidden_size ({model.moe.expert_ffn_hidden_size})")
        ok = False
    if model.moe is None and ep > 1:
        bad(pi, k, "ep", f"ep({ep}) > 1 but {model.name!r} has no experts")
        ok = False
    if model.moe is not None and model.moe.num_experts % ep:
        bad(pi, k, "ep", f"ep({ep}) does not divide the {model.moe.num_experts} experts")
        ok = False
    if (dp * cp) % ep:
        bad(pi, k, "ep", f"ep({ep}) does not divide dp({dp}) x cp({cp}) = {dp * cp} (expert groups are carved "
                         "from the data- and context-parallel ranks)")
        ok = False
    if cp > 1 and training.seq_len % (2 * cp):
        bad(pi, k, "cp", f"seq_len ({training.seq_len}) is not divisible by 2 x cp({cp}) = {2 * cp} "
                         "(load-balanced causal context parallelism)")
        ok = False
    if st.micro_batch_size * dp != pipe_mb:
        bad(pi, k, "micro_batch_size", f"micro_batch_size({st.micro_batch_size}) x dp({dp}) = "
                                       f"{st.micro_batch_size * dp} sequences, but the pipeline micro-batch is "
                                       f"{pipe_mb}")
    return ok


__all__ = ["Violation", "PlanValidationError", "validate", "validate_or_raise"]
