"""torchtitan configuration per part: command-line overrides for torchtitan 0.3 and TOML for 0.2.

torchtitan 0.3 (the current release) builds its configuration from a Python function named on the
command line (``--module llama3 --config llama3_8b``, ``torchtitan/config/manager.py``
``ConfigManager._load_config``) and takes overrides as ``--<section>.<key> value``; activation
checkpointing is a subcommand (``activation-checkpoint:selective|full|none``,
``torchtitan/distributed/activation_checkpoint.py``). It no longer reads ``--job.config_file`` TOML.
torchtitan 0.2 reads a TOML job file (``[training]``, ``[parallelism]``, ``[activation_checkpoint]``
with ``mode`` / ``selective_ac_option``; ``torchtitan/config/job_config.py``). docs/exports.md cites
both.

Mapping: dp with ZeRO-0 -> ``data_parallel_replicate_degree`` (0.3: HSDP with shard degree 1; 0.2:
DDP, which refuses tp/pp); dp with ZeRO-1/2/3 -> ``data_parallel_shard_degree`` (FSDP2), with
``fsdp_reshard_after_forward = "never"`` for ZeRO-1/2 (parameters stay gathered from forward to
backward; FSDP2 always shards gradients, so ZeRO-1 maps to its closest, ZeRO-2) and ``"always"`` for
ZeRO-3. Stages -> ``module_fqns_per_model_part`` with torchtitan's decoder names (``tok_embeddings``,
``layers.<i>``, ``norm``, and ``lm_head`` in 0.3 / ``output`` in 0.2). With pipeline parallelism
``local_batch_size`` is the per-DP-rank batch per step, split into micro-batches of
``pipeline_parallel_microbatch_size``; without it, ``local_batch_size`` is the micro-batch and
``global_batch_size`` implies the gradient-accumulation steps.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any

from tangram_opt.export.launch import TORCHTITAN_RECIPES, part_refusals
from tangram_opt.export.parts import Part, heterogeneity_notes, homogeneous_parts, replica_notes, single_job
from tangram_opt.export.ranks import node_launches
from tangram_opt.planner.plan import Plan
from tangram_opt.specs.cluster import Cluster
from tangram_opt.specs.model import ModelSpec

SOURCE = "pytorch/torchtitan torchtitan/config/configs.py + manager.py (0.3), torchtitan/config/job_config.py (0.2)"
_SCHEDULES = {"1f1b": "1F1B", "gpipe": "GPipe"}
_PRECISION = {"bf16": "bfloat16", "fp16": "float32", "fp32": "float32", "fp8": "bfloat16"}
#: the name of the output projection: ``lm_head`` from 0.3 on (models/common/decoder.py), ``output`` in 0.2
_HEAD = {"0.3": "lm_head", "0.2": "output"}


@dataclass(frozen=True, slots=True, kw_only=True)
class TorchtitanPart:
    """One part's torchtitan settings (``config``: section -> key -> value), for release line ``version``."""

    name: str
    part: Part
    config: dict[str, dict[str, Any]]
    notes: tuple[str, ...]
    version: str = "0.3"
    #: why torchtitan's own checks reject this part; then nothing is written for it
    refusals: tuple[str, ...] = ()

    def toml(self) -> str:
        """torchtitan 0.2 job-file TOML (no refusals), else a comment saying why none is written."""
        lines = [f"# {self.part.label} (global ranks {self.part.rank_text}): {self.part.config_text}"]
        if self.refusals:
            return "\n".join(lines + [f"# NOT WRITTEN: {r}" for r in self.refusals]) + "\n"
        lines += [f"# note: {n}" for n in self.notes]
        for table, values in self.config.items():
            lines.append("")
            lines.append(f"[{table}]")
            lines += [f"{k} = {_toml_value(v)}" for k, v in values.items()]
        return "\n".join(lines) + "\n"

    def args(self) -> list[str]:
        """torchtitan 0.3 command-line overrides (after ``--module`` / ``--config``); ``[]`` when refused."""
        if self.refusals:
            return []
        out: list[str] = []
        for table, values in self.config.items():
            if table == "activation_checkpoint":
                continue
            for k, v in values.items():
                out += _cli(f"--{table}.{k}", v)
        mode = self.config["activation_checkpoint"]["mode"]
        out.append(f"activation-checkpoint:{mode}")
        return out


def _cli(flag: str, v: Any) -> list[str]:
    if isinstance(v, bool):  # tyro: --section.key sets True, --section.no-key sets False
        section, key = flag[2:].split(".", 1)
        return [flag] if v else [f"--{section}.no-{key}"]
    if isinstance(v, list) and v and isinstance(v[0], list):
        return [flag] + [",".join(x) for x in v]
    return [flag, str(v)]


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


def module_fqns(part: Part, version: str = "0.3") -> list[list[str]]:
    """torchtitan module names per stage of the part (decoder names of the release line)."""
    out = []
    for s in part.stages:
        names = ["tok_embeddings"] if s.has_embedding else []
        names += [f"layers.{i}" for i in s.layer_range]
        if s.has_head:
            names += ["norm", _HEAD[version]]
        out.append(names)
    return out


def _config(part: Part, plan: Plan, version: str) -> tuple[dict[str, dict[str, Any]], list[str]]:
    notes: list[str] = []
    mbs, m = part.micro_batch_size, part.num_micro_batches
    training: dict[str, Any] = {"local_batch_size": mbs * m if part.pp > 1 else mbs,
                                "global_batch_size": part.sequences_per_step, "seq_len": plan.seq_len,
                                "mixed_precision_param": _PRECISION[plan.precision]}
    if version == "0.3" and (part.pp > 1 or part.ep > 1):
        # trainer.py Trainer.Config._validate_cuda_graphs: CUDA graphs refuse pipelines and blocking EP
        training["disable_cuda_graphs"] = True
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
        par["module_fqns_per_model_part"] = module_fqns(part, version)
    if part.replicas > 1:
        notes.append(f"{part.replicas} identical pipelines of the plan run as this one job (data-parallel "
                     f"size {part.dp})")
    ac: dict[str, Any] = {"mode": part.recompute}
    if part.recompute == "selective":
        if version == "0.2":
            ac["selective_ac_option"] = "op"
        notes.append("selective recomputation -> torchtitan per-op selective AC, its closest mode (the plan "
                     "recomputes the attention core only)")
    return {"training": training, "parallelism": par, "activation_checkpoint": ac}, notes


def torchtitan_parts(plan: Plan, cluster: Cluster | None = None, *, version: str = "0.3",
                     model: ModelSpec | None = None) -> tuple[TorchtitanPart, ...]:
    """One torchtitan configuration per part, for release line ``version`` ("0.3" or "0.2")."""
    out = []
    for i, part in enumerate(homogeneous_parts(plan, cluster)):
        refusals = tuple(part_refusals(part, "torchtitan", seq_len=plan.seq_len, precision=plan.precision,
                                       model=model, torchtitan_version=version))
        cfg, notes = _config(part, plan, version)
        out.append(TorchtitanPart(name=f"part{i}", part=part, config=cfg, notes=tuple(notes), version=version,
                                  refusals=refusals))
    return tuple(out)


def _header(plan: Plan, parts: tuple[TorchtitanPart, ...], cluster: Cluster | None, version: str) -> list[str]:
    head = [f"# torchtitan {version}.x settings for a tangram_opt plan ({plan.model} on {plan.cluster}); keys: {SOURCE}"]
    refusals = [r for p in parts for r in p.refusals]
    if not single_job(tuple(p.part for p in parts)):
        head.append("# This plan is NOT one torchtitan job (nearest plan torchtitan runs: plan with --launch "
                    "torchtitan):")
        head += [f"#  - {r}" for r in heterogeneity_notes(tuple(p.part for p in parts))]
        head += [f"#  - {r}" for r in replica_notes(plan, cluster)]
    if refusals:
        head.append("# torchtitan's own checks reject these parts, so nothing is written for them:")
        head += [f"#  - {r}" for r in refusals]
    return head


def torchtitan_toml(plan: Plan, cluster: Cluster | None = None, *, model: ModelSpec | None = None) -> str:
    """torchtitan 0.2 TOML: one document for a single-job plan; otherwise one document per part, each
    starting with a ``# === part<i> ===`` line (save each as its own file)."""
    parts = torchtitan_parts(plan, cluster, version="0.2", model=model)
    head = _header(plan, parts, cluster, "0.2")
    if single_job(tuple(p.part for p in parts)) and not parts[0].refusals:
        return "\n".join(head) + "\n" + parts[0].toml()
    docs = ["\n".join(head) + "\n"]
    for p in parts:
        docs.append(f"# === {p.name} ===\n" + p.toml())
    return "\n".join(docs)


def torchtitan_script(plan: Plan, cluster: Cluster | None = None, *, model: ModelSpec | None = None) -> str:
    """torchtitan 0.3 launch script: per part an override array and, for a single-job plan on a known
    cluster, one ``torchrun -m torchtitan.train`` line per node."""
    parts = torchtitan_parts(plan, cluster, version="0.3", model=model)
    out = ["#!/usr/bin/env bash"] + _header(plan, parts, cluster, "0.3")
    recipe = TORCHTITAN_RECIPES.get(model.name) if model is not None else None
    if recipe is None:
        what = f"for {model.name}" if model is not None else "(model unknown)"
        out.append(f"# torchtitan defines no config {what}: set TORCHTITAN_MODULE and TORCHTITAN_CONFIG to a "
                   "config_registry function with this model's shape")
        module, config = "${TORCHTITAN_MODULE:?set TORCHTITAN_MODULE}", "${TORCHTITAN_CONFIG:?set TORCHTITAN_CONFIG}"
    else:
        module, config = recipe
    out += ["set -euo pipefail", f'MODULE_ARGS=(--module "{module}" --config "{config}")']
    for p in parts:
        out.append("")
        out.append(f"# {p.part.label} (global ranks {p.part.rank_text}): {p.part.config_text}")
        if p.refusals:
            out += [f"# NOT WRITTEN: {r}" for r in p.refusals]
            continue
        out += [f"# note: {n}" for n in p.notes]
        out.append(f"{p.name.upper()}_ARGS=(" + " ".join(shlex.quote(a) for a in p.args()) + ")")
    out.append('EXTRA_ARGS=("$@")  # your --hf_assets_path, --dataloader.*, --optimizer.*, --training.steps, ...')
    one = single_job(tuple(p.part for p in parts)) and not parts[0].refusals
    launches = node_launches(parts[0].part.ranks) if (one and cluster is not None) else None
    if launches:
        hosts = ", ".join(f"{nl.node_rank}={nl.host}" for nl in launches)
        out += ["", "# Launch: on every node run  NODE_RANK=<n> MASTER_ADDR=<node-rank-0 host> bash torchtitan.sh ...",
                f"# node ranks: {hosts}", 'case "${NODE_RANK:-}" in']
        for nl in launches:
            out.append(f"  {nl.node_rank})  # {nl.host}: global ranks {nl.first_rank}-{nl.first_rank + nl.nproc - 1}")
            out.append(f"    export CUDA_VISIBLE_DEVICES={','.join(map(str, nl.local_gpus))}; exec torchrun "
                       f"--nnodes {len(launches)} --node-rank {nl.node_rank} --nproc-per-node {nl.nproc} "
                       '--master-addr "$MASTER_ADDR" --master-port "${MASTER_PORT:-29500}" -m torchtitan.train '
                       '"${MODULE_ARGS[@]}" "${PART0_ARGS[@]}" "${EXTRA_ARGS[@]}" ;;')
        out.append(f'  *) echo "set NODE_RANK to one of {hosts}" >&2; exit 2 ;;')
        out.append("esac")
    elif one:
        out += ["", "# Launch: torchrun ... -m torchtitan.train \"${MODULE_ARGS[@]}\" \"${PART0_ARGS[@]}\" ... "
                "(pass the cluster for per-node lines)"]
    return "\n".join(out) + "\n"


def split_documents(text: str) -> list[str]:
    """Split :func:`torchtitan_toml` output into its per-part documents."""
    chunks = text.split("# === ")
    if len(chunks) == 1:
        return [text]
    return [c.split("\n", 1)[1] for c in chunks[1:]]


__all__ = ["TorchtitanPart", "module_fqns", "split_documents", "torchtitan_parts", "torchtitan_script",
           "torchtitan_toml", "SOURCE"]
