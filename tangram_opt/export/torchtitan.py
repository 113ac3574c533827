"""torchtitan job-config TOML (``[training]``, ``[parallelism]``, ``[activation_checkpoint]``) per part.

Key names were checked against pytorch/torchtitan ``torchtitan/config/job_config.py`` (classes
``Training``, ``Parallelism``, ``ActivationCheckpoint``; docs/exports.md cites them).

Mapping: dp with ZeRO-0 -> ``data_parallel_replicate_degree`` (DDP); dp with ZeRO-1/2/3 ->
``data_parallel_shard_degree`` (FSDP2), with ``fsdp_reshard_after_forward = "never"`` for ZeRO-1/2
(parameters stay gathered from forward to backward; FSDP2 always shards gradients, so ZeRO-1 maps
to its closest, ZeRO-2) and ``"always"`` for ZeRO-3. Uneven stages -> ``module_fqns_per_model_part``
with torchtitan's Llama module names (``tok_embeddings``, ``layers.<i>``, ``norm``, ``output``).
With pipeline parallelism ``local_batch_size`` is the per-DP-rank batch per step, split into
micro-batches of ``pipeline_parallel_microbatch_size``; without it, ``local_batch_size`` is the
micro-batch and ``global_batch_size`` implies the gradient-accumulation steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tangram_opt.export.parts import Part, heterogeneity_notes, homogeneous_parts, replica_notes, single_job
from tangram_opt.planner.plan import Plan
from tangram_opt.specs.cluster import Cluster

SOURCE = "pytorch/torchtitan torchtitan/config/job_config.py"
_SCHEDULES = {"1f1b": "1F1B", "gpipe": "GPipe"}
_PRECISION = {"bf16": "bfloat16", "fp16": "float32", "fp32": "float32"}


@dataclass(frozen=True, slots=True, kw_only=True)
class TorchtitanPart:
    name: str
    part: Part
    config: dict[str, dict[str, Any]]
    notes: tuple[str, ...]

    def toml(self) -> str:
        lines = [f"# {self.part.label} (global ranks {self.part.rank_text}): {self.part.config_text}"]
        lines += [f"# note: {n}" for n in self.notes]
        for table, values in self.config.items():
            lines.append("")
            lines.append(f"[{table}]")
            lines += [f"{k} = {_toml_value(v)}" for k, v in values.items()]
        return "\n".join(lines) + "\n"


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"no TOML form for {type(v).__name__}")


def module_fqns(part: Part) -> list[list[str]]:
    """torchtitan module names per stage of the part (Llama-family names)."""
    out = []
    for s in part.stages:
        names = ["tok_embeddings"] if s.has_embedding else []
        names += [f"layers.{i}" for i in s.layer_range]
        if s.has_head:
            names += ["norm", "output"]
        out.append(names)
    return out


def _config(part: Part, plan: Plan) -> tuple[dict[str, dict[str, Any]], list[str]]:
    notes: list[str] = []
    mbs, m = part.micro_batch_size, part.num_micro_batches
    training: dict[str, Any] = {"local_batch_size": mbs * m if part.pp > 1 else mbs,
                                "global_batch_size": part.sequences_per_step, "seq_len": plan.seq_len,
                                "mixed_precision_param": _PRECISION[plan.precision]}
    if plan.precision == "fp16":
        notes.append("torchtitan's mixed_precision_param is bfloat16 or float32 only; fp16 training is not offered")
    par: dict[str, Any] = {}
    if part.zero == 0:
        par["data_parallel_replicate_degree"] = part.dp
        par["data_parallel_shard_degree"] = 1
    else:
        par["data_parallel_replicate_degree"] = 1
        par["data_parallel_shard_degree"] = part.dp
        par["fsdp_reshard_after_forward"] = "always" if part.zero >= 3 else "never"
        if part.zero == 1:
            notes.append("ZeRO-1 planned: FSDP2 also shards gradients (ZeRO-2), which only saves memory")
    par["tensor_parallel_degree"] = part.tp
    par["context_parallel_degree"] = part.cp
    par["expert_parallel_degree"] = part.ep
    par["pipeline_parallel_degree"] = part.pp
    if part.pp > 1:
        par["pipeline_parallel_schedule"] = _SCHEDULES.get(part.schedule, part.schedule)
        par["pipeline_parallel_microbatch_size"] = mbs
        if part.whole_pipeline:
            par["module_fqns_per_model_part"] = module_fqns(part)
        else:
            notes.append("layers of this part's stages: " + "; ".join(
                f"stage {k}: layers {s.first_layer}-{s.first_layer + s.num_layers - 1}"
                for k, s in zip(part.stage_indices, part.stages)))
    ac: dict[str, Any] = {"mode": part.recompute}
    if part.recompute == "selective":
        ac["selective_ac_option"] = "op"
        notes.append("selective recomputation -> torchtitan per-op selective AC, its closest mode (the plan "
                     "recomputes the attention core only)")
    return {"training": training, "parallelism": par, "activation_checkpoint": ac}, notes


def torchtitan_parts(plan: Plan, cluster: Cluster | None = None) -> tuple[TorchtitanPart, ...]:
    out = []
    for i, part in enumerate(homogeneous_parts(plan, cluster)):
        cfg, notes = _config(part, plan)
        out.append(TorchtitanPart(name=f"part{i}", part=part, config=cfg, notes=tuple(notes)))
    return tuple(out)


def torchtitan_toml(plan: Plan, cluster: Cluster | None = None) -> str:
    """TOML text: one document for a single-job plan; otherwise one document per part, each
    starting with a ``# === part<i> ===`` line (save each as its own file)."""
    parts = torchtitan_parts(plan, cluster)
    head = [f"# torchtitan job config sections for a tangram_opt plan ({plan.model} on {plan.cluster}); "
            f"keys: {SOURCE}"]
    if single_job(tuple(p.part for p in parts)):
        return "\n".join(head) + "\n" + parts[0].toml()
    head.append("# This plan is NOT one torchtitan job:")
    head += [f"#  - {r}" for r in heterogeneity_notes(tuple(p.part for p in parts))]
    head += [f"#  - {r}" for r in replica_notes(plan, cluster)]
    docs = ["\n".join(head) + "\n"]
    for p in parts:
        docs.append(f"# === {p.name} ===\n" + p.toml())
    return "\n".join(docs)


def split_documents(text: str) -> list[str]:
    """Split :func:`torchtitan_toml` output into its per-part documents."""
    chunks = text.split("# === ")
    if len(chunks) == 1:
        return [text]
    return [c.split("\n", 1)[1] for c in chunks[1:]]


__all__ = ["TorchtitanPart", "module_fqns", "split_documents", "torchtitan_parts", "torchtitan_toml", "SOURCE"]
