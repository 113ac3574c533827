"""Is a plan one stock framework job, and would each exported part be accepted by the framework?

Two questions, answered from the plan alone (pure functions, no framework import):

- :func:`part_refusals`: the reasons the framework's own code rejects one part's configuration, as
  a standalone job. An export does not write a part that has any; it prints the reasons instead.
- :func:`launchable`: the reasons the whole plan is not ONE job of the framework: several parts,
  several pipelines of different shapes, and every part refusal. An empty list means the exported
  configuration, launched as it is, runs the plan.

Each check names the framework code that enforces it (docs/exports.md, "Sources"), and each
reason ends with the nearest plan the framework accepts.
"""

from __future__ import annotations

from tangram_opt.export.parts import Part, heterogeneity_notes, homogeneous_parts
from tangram_opt.planner.plan import Plan
from tangram_opt.specs.frameworks import FRAMEWORKS, TORCHTITAN_RECIPES
from tangram_opt.specs.model import ModelSpec

#: torchtitan release lines the export writes: "0.3" (current, command-line overrides) and "0.2" (TOML)
TORCHTITAN_VERSIONS = ("0.3", "0.2")


def _fix(framework: str) -> str:
    return f"plan with --launch {framework}"


def _check_framework(framework: str) -> None:
    if framework not in FRAMEWORKS:
        from tangram_opt.errors import SpecError

        raise SpecError("framework", framework, "is not a framework tangram_opt exports to",
                        f"use one of {', '.join(FRAMEWORKS)}")


def _deepseek(model: ModelSpec | None) -> bool:
    return model is not None and model.architecture in ("deepseek_v2", "deepseek_v3")


def part_refusals(part: Part, framework: str, *, seq_len: int, precision: str, model: ModelSpec | None = None,
                  torchtitan_version: str = "0.3") -> list[str]:
    """Why the framework's own code rejects this part as a standalone job (empty: it accepts it)."""
    _check_framework(framework)
    out: list[str] = []
    where = part.label
    if framework == "megatron":
        # megatron/training/arguments.py validate_args: seq-length a multiple of 2 x context-parallel-size
        if part.cp > 1 and seq_len % (2 * part.cp):
            out.append(f"{where}: Megatron-LM needs the sequence length ({seq_len}) to be a multiple of "
                       f"2 x cp = {2 * part.cp}; plan with another --seq or --cp")
    elif framework == "deepspeed":
        # deepspeed/runtime/config.py: the JSON config has bf16 / fp16 sections and no FP8 training
        if precision == "fp8":
            out.append(f"{where}: DeepSpeed's config has no FP8 training (only bf16 / fp16); FP8 linear layers "
                       "come from the model code (Transformer Engine), which the export cannot set; plan with "
                       "--precision bf16, or launch with Megatron-LM")
        # deepspeed/runtime/pipe/engine.py PipelineEngine.__init__: zero stage < 2 with pipelines
        if part.pp > 1 and part.zero >= 2:
            out.append(f"{where}: DeepSpeed pipelines need ZeRO <= 1 (the pipeline engine asserts 'ZeRO-2 and "
                       f"ZeRO-3 are incompatible with pipeline parallelism'), this part has ZeRO-{part.zero} over "
                       f"{part.pp} stages; {_fix('deepspeed')} (or --zero 0 / --zero 1)")
    else:
        if torchtitan_version not in TORCHTITAN_VERSIONS:
            from tangram_opt.errors import SpecError

            raise SpecError("torchtitan_version", torchtitan_version, "is not a torchtitan release line the export "
                            "writes", f"use one of {', '.join(TORCHTITAN_VERSIONS)}")
        if not part.whole_pipeline:
            # torchtitan builds the whole model and splits it over pipeline_parallel_degree ranks; a part
            # holding some stages of a pipeline has no module names of its own
            out.append(f"{where}: holds {part.pp} of the pipeline's {part.pipeline_stages} stages; torchtitan "
                       "builds and splits the whole model, so a part of a pipeline is not a torchtitan job; "
                       f"{_fix('torchtitan')}")
        if precision == "fp16":
            out.append(f"{where}: torchtitan trains in bfloat16 or float32 (training.mixed_precision_param), not "
                       "fp16 as planned; plan with --precision bf16")
        if precision == "fp8":
            # 0.3: models/*/config_registry.py set Float8LinearConverter in the Python config's model_spec;
            # no command-line override turns it on
            out.append(f"{where}: torchtitan turns FP8 on in a Python config (a config_registry entry whose "
                       "model_spec has Float8LinearConverter, torchao), not by the overrides the export writes; "
                       "write such a config, plan with --precision bf16, or launch with Megatron-LM")
        # 0.3 trainer.py Trainer.__init__: seq_len divisible by tp (sequence parallel) x 2 cp when cp > 1;
        # 0.2 models/*/infra/parallelize.py: by ParallelDims.seq_len_divisor = tp x 2 cp, always
        div = part.tp * (2 * part.cp if (part.cp > 1 or torchtitan_version == "0.2") else 1)
        if seq_len % div:
            out.append(f"{where}: torchtitan needs the sequence length ({seq_len}) divisible by {div} "
                       f"(tp {part.tp} x 2 x cp {part.cp}); plan with another --seq, --tp or --cp")
        if torchtitan_version == "0.2":
            # models/*/infra/parallelize.py: dp_shard 1 and dp_replicate > 1 is DDP, which refuses other dims
            if part.zero == 0 and part.dp > 1 and part.dp != part.world_size:
                out.append(f"{where}: ZeRO-0 is DDP in torchtitan 0.2, which refuses tp/cp/pp > 1 ('DDP has not "
                           f"supported > 1D parallelism'; this part has tp{part.tp} cp{part.cp} pp{part.pp}); use "
                           "torchtitan 0.3 (the export's default) or plan with --zero 1")
            # distributed/utils.py maybe_enable_amp: without FSDP (dp_shard and cp 1), tp or pp turn
            # mixed precision off
            elif (precision == "bf16" and (part.zero == 0 or part.dp == 1) and part.cp == 1
                  and (part.tp > 1 or part.pp > 1)):
                out.append(f"{where}: torchtitan 0.2 turns bf16 mixed precision off with tp or pp > 1 unless FSDP "
                           f"shards over > 1 rank (this part: dp {part.dp} ZeRO-{part.zero}); use torchtitan 0.3 "
                           "(the export's default)")
            # models/deepseek_v3/infra/parallelize.py: CP needs SDPA, the DeepSeek flavors use flex attention
            if part.cp > 1 and _deepseek(model):
                out.append(f"{where}: torchtitan 0.2's DeepSeek models use flex attention and its context "
                           "parallelism supports SDPA only ('Context Parallel only supports SDPA attention'); "
                           "use torchtitan 0.3 or plan with --cp 1")
    return out


def _job_reasons(plan: Plan, parts: tuple[Part, ...], framework: str, model: ModelSpec | None) -> list[str]:
    """Framework-wide reasons beyond the per-part refusals (the configuration is accepted, the plan is not
    what the framework runs)."""
    out: list[str] = []
    if framework == "deepspeed":
        for p in parts:
            if p.cp > 1:
                out.append(f"{p.label}: context parallelism {p.cp} was priced as ring attention; DeepSpeed's "
                           f"sequence parallelism (Ulysses) is a different scheme; {_fix('deepspeed')} (or --cp 1)")
            if p.tp > 1 or p.ep > 1:
                out.append(f"{p.label}: tp {p.tp} / ep {p.ep} live in the model code (Megatron-DeepSpeed, "
                           "deepspeed.moe.layer.MoE), not in ds_config.json")
    if framework == "torchtitan" and model is not None and _torchtitan_recipe(model) is None:
        out.append(f"torchtitan has no model definition and config for {model.name} ({model.architecture}): write a "
                   "config_registry function for it, or use Megatron-LM")
    return out


def _torchtitan_recipe(model: ModelSpec) -> tuple[str, str] | None:
    return TORCHTITAN_RECIPES.get(model.name)


def launchable(plan: Plan, framework: str, *, model: ModelSpec | None = None, torchtitan_version: str = "0.3") -> list[str]:
    """Why ``plan`` is not ONE stock job of ``framework`` (``megatron``, ``deepspeed`` or ``torchtitan``);
    an empty list means it is: the export, launched as it is, runs the plan. Identical pipelines count
    as one job (dp x pipelines)."""
    _check_framework(framework)
    parts = homogeneous_parts(plan)
    out = [f"{r}; {_fix(framework)}" for r in heterogeneity_notes(parts)]
    for p in parts:
        out += part_refusals(p, framework, seq_len=plan.seq_len, precision=plan.precision, model=model,
                             torchtitan_version=torchtitan_version)
    out += _job_reasons(plan, parts, framework, model)
    return out


__all__ = ["FRAMEWORKS", "TORCHTITAN_VERSIONS", "TORCHTITAN_RECIPES", "launchable", "part_refusals"]
