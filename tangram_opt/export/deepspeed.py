"""DeepSpeed configuration (``ds_config.json``) for each homogeneous part of a plan.

Keys were checked against deepspeedai/DeepSpeed ``deepspeed/runtime/constants.py`` (batch sizes,
``bf16``/``fp16``), ``deepspeed/runtime/zero/config.py`` (``zero_optimization.stage``) and
``deepspeed/runtime/activation_checkpointing/config.py`` (docs/exports.md cites them).

DeepSpeed's JSON holds the batch, ZeRO, precision and activation-checkpointing settings; tensor,
pipeline, context and expert parallelism are set in code (``PipelineModule(num_stages=...)``,
Megatron-DeepSpeed arguments, ``deepspeed.moe.layer.MoE(ep_size=...)``). Each part's ``notes`` say
which of those the plan needs. DeepSpeed relates the batch keys as ``train_batch_size =
train_micro_batch_size_per_gpu x gradient_accumulation_steps x data-parallel size``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from tangram_opt.export.launch import part_refusals
from tangram_opt.export.parts import Part, heterogeneity_notes, homogeneous_parts, replica_notes, single_job
from tangram_opt.planner.plan import Plan
from tangram_opt.specs.cluster import Cluster

SOURCE = "deepspeedai/DeepSpeed deepspeed/runtime/constants.py, zero/config.py, activation_checkpointing/config.py"


@dataclass(frozen=True, slots=True, kw_only=True)
class DeepSpeedPart:
    """One ``ds_config.json`` and what the launch needs beyond it."""

    name: str
    part: Part
    config: dict[str, Any]
    notes: tuple[str, ...]
    #: why DeepSpeed's own checks reject this part; then no ds_config is written for it
    refusals: tuple[str, ...] = ()


def _config(part: Part, precision: str) -> tuple[dict[str, Any], list[str]]:
    mbs, gas = part.micro_batch_size, part.num_micro_batches
    cfg: dict[str, Any] = {
        "train_batch_size": mbs * gas * part.dp,
        "train_micro_batch_size_per_gpu": mbs,
        "gradient_accumulation_steps": gas,
        "zero_optimization": {"stage": part.zero},
        "bf16": {"enabled": precision == "bf16"},
        "fp16": {"enabled": precision == "fp16"},
    }
    notes: list[str] = []
    if part.recompute == "full":
        cfg["activation_checkpointing"] = {"partition_activations": False, "cpu_checkpointing": False,
                                           "contiguous_memory_optimization": False,
                                           "synchronize_checkpoint_boundary": False}
        notes.append("full recomputation: wrap every transformer layer in deepspeed.checkpointing.checkpoint "
                     "(or PipelineModule(activation_checkpoint_interval=1))")
    elif part.recompute == "selective":
        notes.append("selective recomputation (attention core) has no DeepSpeed switch: the model code must do it "
                     "(e.g. Megatron-DeepSpeed --recompute-granularity selective)")
    if part.pp > 1:
        counts = ", ".join(map(str, part.layer_counts))
        notes.append(f"pipeline: PipelineModule(num_stages={part.pp}) with {counts} transformer layers per stage"
                     + ("" if len(set(part.layer_counts)) == 1 else
                        "; DeepSpeed's partition_method ('parameters', 'uniform', 'type:<regex>') cannot state "
                        "explicit per-stage counts"))
    if part.world_size != part.dp:
        notes.append(f"data-parallel size {part.dp} of {part.world_size} ranks: DeepSpeed checks train_batch_size = "
                     f"micro-batch x accumulation x data-parallel size with the size its mpu reports, so initialize "
                     f"with a PipelineModule (num_stages={part.pp}) or an mpu whose data-parallel world size is "
                     f"{part.dp}; launched without one, DeepSpeed takes all {part.world_size} ranks as data-parallel "
                     "and rejects the batch sizes")
    if part.tp > 1:
        notes.append(f"tensor parallelism {part.tp}: set in the model code (e.g. Megatron-DeepSpeed "
                     f"--tensor-model-parallel-size {part.tp})")
    if part.cp > 1:
        notes.append(f"context parallelism {part.cp}: DeepSpeed's own sequence parallelism (Ulysses, all-to-all "
                     "over heads) is a different scheme from the ring attention the plan was costed with")
    if part.ep > 1:
        notes.append(f"expert parallelism {part.ep}: deepspeed.moe.layer.MoE(ep_size={part.ep})")
    return cfg, notes


def deepspeed_parts(plan: Plan, cluster: Cluster | None = None) -> tuple[DeepSpeedPart, ...]:
    """One DeepSpeed config per homogeneous part."""
    out = []
    for i, part in enumerate(homogeneous_parts(plan, cluster)):
        cfg, notes = _config(part, plan.precision)
        refusals = tuple(part_refusals(part, "deepspeed", seq_len=plan.seq_len, precision=plan.precision))
        out.append(DeepSpeedPart(name=f"part{i}", part=part, config={} if refusals else cfg, notes=tuple(notes),
                                 refusals=refusals))
    return tuple(out)


def deepspeed_config(plan: Plan) -> dict[str, Any]:
    """The config of a single-job plan (one pipeline, one part); for other plans see
    :func:`deepspeed_parts`. Raises ``ValueError`` if the plan has several parts."""
    parts = deepspeed_parts(plan)
    if len(parts) != 1:
        raise ValueError(f"the plan has {len(parts)} homogeneous parts; use deepspeed_parts()")
    if parts[0].refusals:
        from tangram_opt.errors import SpecError

        raise SpecError("plan", plan.model, "; ".join(parts[0].refusals), "plan with --launch deepspeed")
    return parts[0].config


def deepspeed_json(plan: Plan, cluster: Cluster | None = None) -> str:
    """JSON text: the bare ``ds_config`` of a single-job plan (its notes: :func:`deepspeed_notes`);
    otherwise ``{"single_job", "why_not_one_job", "parts": [{"part", "label", "ranks", "config", "notes"}]}``
    where each ``config`` is one ds_config.json."""
    parts = deepspeed_parts(plan, cluster)
    one = single_job(tuple(p.part for p in parts))
    if one and not parts[0].refusals:
        return json.dumps(parts[0].config, indent=2) + "\n"
    doc = {"tangram_opt_export": "deepspeed", "single_job": False,
           "why_not_one_job": heterogeneity_notes(tuple(p.part for p in parts)) + [r for p in parts for r in p.refusals],
           "nearest_fix": "plan with --launch deepspeed",
           "parts": [{"part": p.name, "label": p.part.label, "ranks": p.part.rank_text,
                      **({"refused": list(p.refusals)} if p.refusals else {"config": p.config}),
                      "notes": list(p.notes)} for p in parts]}
    if len(plan.pipelines) > 1:
        doc["pipelines"] = replica_notes(plan, cluster)
    return json.dumps(doc, indent=2) + "\n"


def deepspeed_notes(plan: Plan) -> list[str]:
    """What a single-job plan needs beyond its ds_config.json (empty for multi-part plans, whose
    notes are inside :func:`deepspeed_json`)."""
    parts = deepspeed_parts(plan)
    refused = [f"not written: {r}" for p in parts for r in p.refusals]
    return (list(parts[0].notes) if single_job(tuple(p.part for p in parts)) else []) + refused


__all__ = ["DeepSpeedPart", "deepspeed_config", "deepspeed_json", "deepspeed_notes", "deepspeed_parts", "SOURCE"]
