"""Megatron-LM launch arguments for a plan.

Flag names were checked against NVIDIA/Megatron-LM ``megatron/training/arguments.py`` and
``megatron/core/transformer/pipeline_parallel_layer_layout.py`` (docs/exports.md cites them).

Megatron-LM runs one (tp, cp, dp, ep) layout, ZeRO mode, recomputation mode and micro-batch size
per job. Each homogeneous part of a plan (:mod:`tangram_opt.export.parts`) gets one argument block.
A plan that is one pipeline of one part is one Megatron-LM job, and the script ends with its
launch lines; otherwise the blocks describe what each part runs, and the header says what a
stock Megatron-LM cannot express (docs/exports.md, "What a heterogeneous plan needs").

Mapping (tangram_opt -> Megatron-LM):

- ``tp``/``cp``/``ep`` -> ``--tensor-model-parallel-size``/``--context-parallel-size``/
  ``--expert-model-parallel-size``; stages of a part -> ``--pipeline-model-parallel-size``;
  dp is implied (world size / (tp x cp x pp)); ``--sequence-parallel`` when tp > 1 (the cost
  model's default, Korthikanti et al. 2022).
- ZeRO-1 and ZeRO-2 -> ``--use-distributed-optimizer`` (shards the optimizer state and fp32 main
  weights over data-parallel ranks and reduce-scatters gradients; Megatron keeps the 16-bit
  gradient buffer whole, so ZeRO-2's gradient saving is not realized). ZeRO-3 ->
  ``--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params`` (which requires
  ``--ckpt-format fsdp_dtensor``). Nothing when the data-parallel group has one rank.
- recompute ``selective`` -> ``--recompute-granularity selective`` (Megatron's default module is
  the attention core, what the cost model recomputes); ``full`` -> ``--recompute-granularity full
  --recompute-method uniform --recompute-num-layers 1``.
- per-rank micro-batch -> ``--micro-batch-size``; the pipeline's sequences per step ->
  ``--global-batch-size`` (Megatron derives the micro-batch count, which equals the plan's).
- uneven layers: ``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers``
  when only the first and last stage differ from an even middle, else
  ``--pipeline-model-parallel-layout`` (e.g. ``"Et*9|t*8|t*8|t*7L"``).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from tangram_opt.export.launch import part_refusals
from tangram_opt.export.parts import Part, heterogeneity_notes, homogeneous_parts, replica_notes, single_job
from tangram_opt.export.ranks import NodeLaunch, node_launches
from tangram_opt.planner.plan import Plan, StagePlan
from tangram_opt.specs.cluster import Cluster
from tangram_opt.specs.model import ModelSpec

SOURCE = "NVIDIA/Megatron-LM megatron/training/arguments.py"
ENTRY_POINT = "pretrain_gpt.py"


@dataclass(frozen=True, slots=True, kw_only=True)
class MegatronBlock:
    """The arguments of one homogeneous part, and comments explaining them."""

    name: str
    part: Part
    args: tuple[str, ...]
    comments: tuple[str, ...] = ()
    #: ``env`` arguments the part's processes need (``("CUDA_DEVICE_MAX_CONNECTIONS=1",)``, ``("-u", ...)``)
    env: tuple[str, ...] = ()
    #: why Megatron-LM's own checks reject this part; then ``args`` is empty and nothing is written for it
    refusals: tuple[str, ...] = ()

    def argv(self) -> list[str]:
        return list(self.args)

    def env_shell(self) -> str:
        """The shell statement applying :attr:`env` (``export X=1`` / ``unset X``), or ``""``."""
        if self.env[:1] == ("-u",):
            return f"unset {self.env[1]}"
        return "; ".join(f"export {e}" for e in self.env)


@dataclass(frozen=True, slots=True, kw_only=True)
class MegatronExport:
    """Everything ``megatron_script`` prints."""

    plan: Plan
    model_args: tuple[str, ...]
    model_comments: tuple[str, ...]
    blocks: tuple[MegatronBlock, ...]
    single_job: bool
    reasons: tuple[str, ...]
    launches: tuple[NodeLaunch, ...] | None

    @property
    def refusals(self) -> tuple[str, ...]:
        """Every part's refusal (parts whose arguments are not written)."""
        return tuple(r for b in self.blocks for r in b.refusals)

    def launch_lines(self, entry_point: str = ENTRY_POINT) -> list[str]:
        """One ``torchrun`` command per node (single-job plans on a known cluster), else ``[]``."""
        if not self.single_job or self.launches is None or self.refusals:
            return []
        b = self.blocks[0]
        n = len(self.launches)
        env = b.env_shell() + "; " if b.env else ""
        return [f"{env}export CUDA_VISIBLE_DEVICES={','.join(map(str, nl.local_gpus))}; exec torchrun --nnodes {n} "
                f"--node-rank {nl.node_rank} --nproc-per-node {nl.nproc} --master-addr \"$MASTER_ADDR\" --master-port "
                f"\"${{MASTER_PORT:-6000}}\" \"${{MEGATRON_LM:-.}}/{entry_point}\" \"${{MODEL_ARGS[@]}}\" "
                f"\"${{{b.name}[@]}}\" \"${{DATA_AND_OPTIMIZER_ARGS[@]}}\"" for nl in self.launches]


def _hf_config(model: ModelSpec) -> dict:
    """The Hugging Face config.json of ``model`` when it is a built-in preset (same shape), else ``{}``.

    The ModelSpec keeps what the planner prices; routing details (score function, groups, scaling)
    and RoPE scaling change neither, so they are read from the preset's config.json."""
    import json

    from tangram_opt.specs.presets import list_presets, load_preset, preset_path

    if model.name not in list_presets():
        return {}
    try:
        if load_preset(model.name) != model:
            return {}
        return json.loads(preset_path(model.name).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _rope_args(model: ModelSpec, hf: dict) -> tuple[list[str], list[str]]:
    if model.position_embedding != "rope":
        return [], []
    a: list[str] = []
    notes: list[str] = []
    theta = hf.get("rope_theta")
    if theta is not None:
        a += ["--rotary-base", str(int(theta))]
    elif model.mla is None:
        notes.append("RoPE base (rope_theta) unknown for a non-preset model: add --rotary-base from its config.json")
    scaling = hf.get("rope_scaling") or {}
    kind = scaling.get("type") or scaling.get("rope_type")
    if model.mla is not None:
        # MLATransformerConfig defaults: rope_type yarn, original_max_position_embeddings 4096, beta_fast 32,
        # beta_slow 1 (DeepSeek's values); factor and mscale differ per model
        if kind == "yarn":
            if (scaling.get("original_max_position_embeddings", 4096), scaling.get("beta_fast", 32),
                    scaling.get("beta_slow", 1)) != (4096, 32, 1):
                notes.append("YaRN original length / beta differ from Megatron-LM's MLA defaults (4096, 32, 1), "
                             "which have no flag here")
            a += ["--rope-type", "yarn", "--rotary-scaling-factor", repr(float(scaling.get("factor", 40))),
                  "--mscale", repr(float(scaling.get("mscale", 1.0))),
                  "--mscale-all-dim", repr(float(scaling.get("mscale_all_dim", 0.0)))]
        elif hf:
            a += ["--rope-type", "rope"]
        else:
            notes.append("RoPE scaling unknown for a non-preset MLA model: Megatron-LM's MLA default is YaRN "
                         "(factor 40); set --rope-type / --rotary-scaling-factor from its config.json")
    elif kind == "llama3":
        a += ["--use-rope-scaling", "--rope-scaling-factor", repr(float(scaling.get("factor", 8.0)))]
    elif kind:
        notes.append(f"RoPE scaling {kind!r} has no Megatron-LM flag here")
    return a, notes


def _routing_args(model: ModelSpec, hf: dict) -> tuple[list[str], list[str]]:
    """Router arguments reproducing the Hugging Face routing of each MoE family (Megatron-LM's default is
    softmax over the top-k logits, i.e. softmax, top-k and renormalize)."""
    moe = model.moe
    assert moe is not None
    a: list[str] = []
    notes: list[str] = []
    arch = model.architecture
    if arch == "deepseek_v3" or hf.get("scoring_func") == "sigmoid":
        # sigmoid scores, top-k picked on score + e_score_correction_bias, weights renormalized (Megatron
        # normalizes sigmoid top-k weights when top_k > 1, as norm_topk_prob does)
        a += ["--moe-router-score-function", "sigmoid"]
        if moe.router_bias:
            a.append("--moe-router-enable-expert-bias")
    elif arch in ("deepseek_v2", "qwen2_moe") or hf.get("norm_topk_prob") is False:
        # softmax over all experts, top-k weights used as they are (norm_topk_prob false)
        a.append("--moe-router-pre-softmax")
    if arch in ("deepseek_v2", "deepseek_v3"):
        if not hf:
            notes.append("group-limited routing and the routed scaling factor of a non-preset DeepSeek model are "
                         "not in its ModelSpec: add --moe-router-num-groups, --moe-router-group-topk and "
                         "--moe-router-topk-scaling-factor from its config.json (n_group, topk_group, "
                         "routed_scaling_factor)")
        else:
            groups, topk_group = int(hf.get("n_group", 1)), int(hf.get("topk_group", 1))
            if hf.get("topk_method") in ("group_limited_greedy", "noaux_tc") and groups > 1:
                a += ["--moe-router-num-groups", str(groups), "--moe-router-group-topk", str(topk_group)]
            scale = float(hf.get("routed_scaling_factor", 1.0))
            if scale != 1.0:
                a += ["--moe-router-topk-scaling-factor", repr(scale)]
    if moe.shared_expert_gate:
        a.append("--moe-shared-expert-gate")
    mtp = int(hf.get("num_nextn_predict_layers", 0) or 0)
    if mtp:
        notes.append(f"multi-token prediction ({mtp} MTP layer(s) in config.json) is not in the planned model "
                     "(the plan's time and memory exclude it); add --mtp-num-layers "
                     f"{mtp} to train it, on a last stage with headroom")
    return a, notes


def megatron_model_args(model: ModelSpec, seq_len: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Model-shape arguments and comments on what has no exact flag."""
    hf = _hf_config(model)
    a: list[str] = ["--hidden-size", str(model.hidden_size), "--ffn-hidden-size", str(model.ffn_hidden_size),
                    "--num-attention-heads", str(model.num_attention_heads)]
    notes: list[str] = []
    if model.kv_heads != model.num_attention_heads and model.mla is None:
        a += ["--group-query-attention", "--num-query-groups", str(model.kv_heads)]
    if model.head_dim is not None and model.head_dim * model.num_attention_heads != model.hidden_size \
            and model.mla is None:
        a += ["--kv-channels", str(model.head_dim)]
    a += ["--max-position-embeddings", str(max(model.max_position_embeddings, seq_len))]
    a += ["--position-embedding-type", "rope" if model.position_embedding == "rope" else "learned_absolute"]
    ra, rnotes = _rope_args(model, hf)
    a += ra
    notes += rnotes
    a += ["--normalization", "RMSNorm" if model.norm_type == "rmsnorm" else "LayerNorm"]
    if model.mlp_type == "swiglu":
        a.append("--swiglu")
    elif model.mlp_type == "relu":
        notes.append("ReLU MLP: Megatron-LM has no plain-ReLU flag (its default is GeLU; --squared-relu differs)")
    if not model.tied_embeddings:
        a.append("--untie-embeddings-and-output-weights")
    if not model.mlp_bias and model.attention_bias in ("none", "qkv"):
        a.append("--disable-bias-linear")
        if model.attention_bias == "qkv":
            a.append("--add-qkv-bias")
    elif not (model.mlp_bias and model.attention_bias == "all"):
        notes.append(f"bias pattern (attention: {model.attention_bias}, MLP bias: {model.mlp_bias}) has no exact "
                     "Megatron-LM flag; Megatron's default biases every linear layer")
    if model.qk_norm:
        a.append("--qk-layernorm")
    if model.mla is not None:
        m = model.mla
        a += ["--multi-latent-attention", "--kv-lora-rank", str(m.kv_lora_rank), "--qk-head-dim",
              str(m.qk_nope_head_dim), "--qk-pos-emb-head-dim", str(m.qk_rope_head_dim), "--v-head-dim",
              str(m.v_head_dim)]
        if m.q_lora_rank is not None:
            a += ["--q-lora-rank", str(m.q_lora_rank)]
        else:
            notes.append("queries are not compressed (q_lora_rank none): Megatron-LM's MLA then uses a full "
                         "query projection, as Hugging Face does")
    if model.moe is not None:
        moe = model.moe
        a += ["--num-experts", str(moe.num_experts), "--moe-router-topk", str(moe.top_k),
              "--moe-ffn-hidden-size", str(moe.expert_ffn_hidden_size)]
        if moe.num_shared_experts:
            a += ["--moe-shared-expert-intermediate-size", str(moe.num_shared_experts * moe.shared_ffn_hidden_size)]
        if moe.first_dense_layers:
            k, n = moe.first_dense_layers, model.num_layers
            a += ["--moe-layer-freq", f"[0]*{k}+[1]*{n - k}"]
        ma, mnotes = _routing_args(model, hf)
        a += ma
        notes += mnotes
    notes.append(f"vocabulary: {model.vocab_size} tokens (Megatron-LM takes it from your tokenizer)")
    return tuple(a), tuple(notes)


def _layer_args(part: Part) -> tuple[list[str], list[str]]:
    """Pipeline split arguments for the part's stages, and comments.

    Megatron-LM states a split by ``--decoder-first/last-pipeline-num-layers`` (the middle stages even,
    every count > 0) or by ``--pipeline-model-parallel-layout``; without either it splits evenly and
    refuses counts that do not divide. A part that is not a whole pipeline is written as the standalone
    job it is: Megatron puts the embedding on its first stage and the loss on its last.
    """
    counts = part.layer_counts
    if part.pp == 1 or len(set(counts)) == 1:
        return [], []
    first, last, middle = counts[0], counts[-1], counts[1:-1]
    note = [] if part.whole_pipeline else [
        "as a standalone Megatron-LM job this part's first stage holds the embedding and its last stage the "
        "loss; in the plan they sit on other parts"]
    if len(set(middle)) <= 1 and first > 0 and last > 0:
        alt = [f"or, on Megatron-LM versions with it: --pipeline-model-parallel-layout \"{_part_layout(part)}\""]
        return (["--decoder-first-pipeline-num-layers", str(first), "--decoder-last-pipeline-num-layers", str(last)],
                alt + note)
    return ["--pipeline-model-parallel-layout", _part_layout(part)], note


def _part_layout(part: Part) -> str:
    if part.whole_pipeline:
        return layout(part.stages)
    n = len(part.stages)
    return "|".join(("E" if k == 0 else "") + ("" if s.num_layers == 0 else "t" if s.num_layers == 1
                                                else f"t*{s.num_layers}") + ("L" if k == n - 1 else "")
                    for k, s in enumerate(part.stages))


def layout(stages: tuple[StagePlan, ...] | list[StagePlan]) -> str:
    """Megatron-LM ``--pipeline-model-parallel-layout`` string: ``E`` embedding, ``t`` decoder layer,
    ``L`` loss (head), stages split by ``|``, ``t*n`` for n layers."""
    out = []
    for s in stages:
        n = s.num_layers
        body = "" if n == 0 else ("t" if n == 1 else f"t*{n}")
        out.append(("E" if s.has_embedding else "") + body + ("L" if s.has_head else ""))
    return "|".join(out)


def _zero_args(part: Part) -> tuple[list[str], list[str]]:
    # the cost model overlaps the gradient reduction with the backward and, with a sharded optimizer,
    # the parameter all-gather with the next forward (docs/cost_model.md §3.2): Megatron-LM does so with
    # --overlap-grad-reduce / --overlap-param-gather (validate_args: the latter needs the former and the
    # distributed optimizer); Megatron-FSDP's optim_grads_params turns both on by itself
    if part.dp * part.cp == 1:
        return [], ([f"ZeRO-{part.zero} over a data-parallel group of 1 rank shards nothing: no flag needed"]
                    if part.zero else [])
    if part.zero == 0:
        return ["--overlap-grad-reduce"], []
    if part.zero in (1, 2):
        notes = ["ZeRO-2 planned: Megatron's distributed optimizer shards optimizer state and fp32 main weights; "
                 "its 16-bit gradient buffer stays whole (the plan's memory assumed gradient sharding)"] \
            if part.zero == 2 else []
        return ["--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather"], notes
    return (["--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads_params",
             "--ckpt-format", "fsdp_dtensor"], ["ZeRO-3 -> Megatron-FSDP (optim_grads_params)"])


def _recompute_args(recompute: str) -> list[str]:
    if recompute == "selective":
        return ["--recompute-granularity", "selective"]
    if recompute == "full":
        return ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    return []


#: Megatron-LM validate_args: with tp or cp > 1 before Blackwell, CUDA_DEVICE_MAX_CONNECTIONS must be 1;
#: with Megatron-FSDP it must not be 1 (unset, or > 1). One script can hold parts of both kinds.
CONNECTIONS = "CUDA_DEVICE_MAX_CONNECTIONS"


def _env(part: Part) -> tuple[str, ...]:
    """``env`` arguments for the part: set or unset CUDA_DEVICE_MAX_CONNECTIONS as validate_args wants."""
    if part.zero >= 3 and part.dp * part.cp > 1:
        return ("-u", CONNECTIONS)
    if part.tp > 1 or part.cp > 1:
        return (f"{CONNECTIONS}=1",)
    return ()


def _block(part: Part, idx: int, plan: Plan, moe: bool) -> MegatronBlock:
    a: list[str] = ["--tensor-model-parallel-size", str(part.tp), "--pipeline-model-parallel-size", str(part.pp),
                    "--context-parallel-size", str(part.cp)]
    if moe or part.ep > 1:
        a += ["--expert-model-parallel-size", str(part.ep)]
        # the cost model prices expert parallelism as an all-to-all dispatch; Megatron's default is allgather
        a += ["--moe-token-dispatcher-type", "alltoall"]
    if part.tp > 1:
        a.append("--sequence-parallel")
    za, notes = _zero_args(part)
    a += za
    a += _recompute_args(part.recompute)
    a += ["--micro-batch-size", str(part.micro_batch_size), "--global-batch-size", str(part.sequences_per_step)]
    a += ["--num-layers", str(part.num_layers), "--seq-length", str(plan.seq_len)]
    # fp8: Transformer Engine's FP8 linear layers in a bf16 model, E4M3 forward / E5M2 gradients with
    # per-tensor current scaling (megatron-core TransformerConfig.fp8 / fp8_recipe, Fp8Recipe.tensorwise),
    # the recipe the cost model prices (docs/cost_model.md §1.2)
    prec = {"bf16": ["--bf16"], "fp16": ["--fp16"],
            "fp8": ["--bf16", "--fp8-format", "hybrid", "--fp8-recipe", "tensorwise"]}.get(plan.precision, [])
    a += prec
    la, lnotes = _layer_args(part)
    a += la
    notes += lnotes
    first, last = part.stages[0], part.stages[-1]
    if part.replicas > 1:
        notes.append(f"{part.replicas} identical pipelines of the plan run as this one job: data-parallel size "
                     f"{part.dp} = {part.dp // part.replicas} x {part.replicas}")
    if not part.whole_pipeline:
        notes.append(f"part of a {part.pipeline_stages}-stage pipeline: holds "
                     + ("the embedding, " if first.has_embedding else "")
                     + f"layers {first.first_layer}-{last.first_layer + last.num_layers - 1}"
                     + (", the LM head" if last.has_head else "")
                     + f"; exchanges activations and gradients of {part.pipeline_micro_batch} sequence(s) per "
                       "micro-batch with the neighbouring parts")
    name = f"PART{idx}_ARGS"
    head = [f"{part.label} (global ranks {part.rank_text}, {part.world_size} GPUs): {part.config_text}"]
    for r, s in zip(part.ranks, part.stages):
        where = f" on {r.hosts_text}" if r.hosts_text else ""
        extras = (("embedding + " if s.has_embedding else "")
                  + f"layers {s.first_layer}-{s.first_layer + s.num_layers - 1}"
                  + (" + LM head" if s.has_head else ""))
        head.append(f"  stage {r.stage}: ranks {r.rank_text}, {s.gpus} x {s.gpu} (island {s.island}){where}: {extras}")
    refusals = tuple(part_refusals(part, "megatron", seq_len=plan.seq_len, precision=plan.precision))
    return MegatronBlock(name=name, part=part, args=() if refusals else tuple(a), comments=tuple(head + notes),
                         env=_env(part), refusals=refusals)


def megatron_export(plan: Plan, *, model: ModelSpec | None = None, cluster: Cluster | None = None) -> MegatronExport:
    """The Megatron-LM view of ``plan`` (model-shape arguments only when ``model`` is given;
    node placement and launch lines only when ``cluster`` is given)."""
    parts = homogeneous_parts(plan, cluster)
    moe = bool(model is not None and model.moe is not None) or any(s.ep > 1 for s in plan.stages)
    blocks = tuple(_block(p, i, plan, moe) for i, p in enumerate(parts))
    if model is not None:
        margs, mnotes = megatron_model_args(model, plan.seq_len)
    else:
        margs, mnotes = (), ("model shape unknown: add --hidden-size, --num-attention-heads, ... for your model",)
    ranks = tuple(r for p in parts for r in p.ranks)
    return MegatronExport(plan=plan, model_args=margs, model_comments=mnotes, blocks=blocks,
                          single_job=single_job(parts), reasons=tuple(heterogeneity_notes(parts)),
                          launches=node_launches(ranks) if cluster is not None else None)


def megatron_args(plan: Plan, *, model: ModelSpec | None = None, cluster: Cluster | None = None) -> list[list[str]]:
    """One argv list per homogeneous part that Megatron-LM accepts: model-shape arguments followed by the
    part's arguments (refused parts, see :attr:`MegatronExport.refusals`, are left out)."""
    ex = megatron_export(plan, model=model, cluster=cluster)
    return [list(ex.model_args) + b.argv() for b in ex.blocks if not b.refusals]


def _bash_array(name: str, args: tuple[str, ...]) -> list[str]:
    lines = [f"{name}=("]
    i = 0
    while i < len(args):
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            lines.append(f"  {args[i]} {shlex.quote(args[i + 1])}")
            i += 2
        else:
            lines.append(f"  {args[i]}")
            i += 1
    lines.append(")")
    return lines


def megatron_script(plan: Plan, *, model: ModelSpec | None = None, cluster: Cluster | None = None) -> str:
    """A bash script: argument arrays per part and, for a single-job plan, the launch lines."""
    from tangram_opt import __version__

    ex = megatron_export(plan, model=model, cluster=cluster)
    out = ["#!/usr/bin/env bash",
           f"# Megatron-LM arguments for a tangram_opt plan (tangram_opt {__version__}).",
           f"# plan: {plan.model} on {plan.cluster}, {plan.gpus_used} GPUs, {len(plan.pipelines)} pipeline(s), "
           f"predicted step {plan.step_time_s:.4g} s, global batch {plan.global_batch_size} x {plan.seq_len} tokens",
           f"# flag names: {SOURCE} (see docs/exports.md)", "#"]
    if ex.single_job and not ex.refusals:
        out.append("# This plan is ONE Megatron-LM job: MODEL_ARGS + PART0_ARGS + your data, tokenizer and "
                   "optimizer arguments.")
    elif ex.single_job:
        out.append("# This plan is NOT a Megatron-LM job as it stands (see below); plan with --launch megatron.")
    else:
        out.append("# This plan is NOT one stock Megatron-LM job:")
        out += [f"#  - {r}" for r in ex.reasons]
        replicas = replica_notes(plan, cluster)
        if replicas:
            out.append("# Several pipelines (docs/multi_pipeline.md, 'What a launcher needs'):")
            out += [f"#  - {r}" for r in replicas]
        out.append("# Each block below is what one homogeneous part runs; joining them needs the launcher support "
                   "listed in docs/exports.md, 'What a heterogeneous plan needs'. The nearest plan that Megatron-LM "
                   "runs as one job: plan with --launch megatron.")
    if ex.refusals:
        out.append("# Megatron-LM's own checks reject these parts, so their arguments are not written:")
        out += [f"#  - {r}" for r in ex.refusals]
    out.append("set -euo pipefail")
    out.append("")
    out += [f"# {c}" for c in ex.model_comments]
    out += _bash_array("MODEL_ARGS", ex.model_args)
    for b in ex.blocks:
        out.append("")
        out += [f"# {c}" for c in b.comments]
        if b.refusals:
            out += [f"# NOT WRITTEN: {r}" for r in b.refusals]
            continue
        env_name = b.name.replace("_ARGS", "_ENV")
        why = ("Megatron-FSDP (ZeRO-3) requires CUDA_DEVICE_MAX_CONNECTIONS unset or > 1" if b.env[:1] == ("-u",)
               else "tp or cp > 1: Megatron-LM requires CUDA_DEVICE_MAX_CONNECTIONS=1 before Blackwell GPUs"
               if b.env else "no environment requirement")
        out.append(f"# environment of this part's processes (run them under: env \"${{{env_name}[@]}}\" ...): {why}")
        out.append(f"{env_name}=({' '.join(shlex.quote(e) for e in b.env)})")
        out += _bash_array(b.name, b.args)
    out.append("")
    out.append("DATA_AND_OPTIMIZER_ARGS=(\"$@\")  # your --data-path, --tokenizer-*, --lr, --train-iters, ...")
    lines = ex.launch_lines()
    if lines:
        assert ex.launches is not None
        hosts = ", ".join(f"{nl.node_rank}={nl.host}" for nl in ex.launches)
        out += ["",
                "# Launch: on every node run  NODE_RANK=<n> MASTER_ADDR=<node-rank-0 host> MEGATRON_LM=<checkout> \\",
                "#   bash megatron_args.sh --data-path ... --tokenizer-type ... --lr ... --train-iters ...",
                f"# node ranks: {hosts}",
                'case "${NODE_RANK:-}" in']
        for nl, line in zip(ex.launches, lines):
            out.append(f"  {nl.node_rank})  # {nl.host}: global ranks {nl.first_rank}-{nl.first_rank + nl.nproc - 1}")
            out.append(f"    {line} ;;")
        out.append(f'  *) echo "set NODE_RANK to one of {hosts}" >&2; exit 2 ;;')
        out.append("esac")
    elif ex.single_job and not ex.refusals and cluster is not None:
        out.append("")
        out.append("# Launch: some node holds two separate rank ranges, so start each process yourself with RANK, "
                   "LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set per the rank table above.")
    elif ex.single_job and not ex.refusals:
        out.append("")
        out.append("# Launch: pass the cluster (a plan file holding it, or --cluster) to get per-node launch lines.")
    return "\n".join(out) + "\n"


__all__ = ["MegatronBlock", "MegatronExport", "megatron_args", "megatron_export", "megatron_model_args",
           "megatron_script", "layout", "SOURCE"]
