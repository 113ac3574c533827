"""Plan files and framework exports (tangram_opt.export), on hand-made plans (no solver needed).

The flag and key allow-lists below are the names verified against each framework's source
(docs/exports.md, "Sources"); an export that emits anything else fails here.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tomllib

import pytest

import tangram_opt as to
from tangram_opt.errors import FormatError, SpecError
from tangram_opt.export import (PLAN_FILE_SCHEMA, PlanFile, assign_ranks, deepspeed_config, deepspeed_json,
                                deepspeed_parts, homogeneous_parts, megatron_args, megatron_export, megatron_script,
                                node_launches, plan_envelope, plan_file_from_dict, read_plan_file, save_plan_file,
                                single_job, torchtitan_parts, torchtitan_toml, write_exports)
from tangram_opt.export.megatron import layout
from tangram_opt.export.torchtitan import split_documents
from tangram_opt.planner.plan import Certificate, PipelinePlan, Plan, StagePlan
from tangram_opt import units as u

# --- hand-made plans ------------------------------------------------------------------------------------

_GPU_MEM = {"a100": 35.3 * u.GiB, "v100": 13.2 * u.GiB, "h100": 72.0 * u.GiB}
_GPU_NAME = {"a100": "A100-40", "v100": "V100-16"}


def stage(island: str, gpus: int, layers: tuple[int, int], *, tp: int = 1, cp: int = 1, ep: int = 1, zero: int = 1,
          recompute: str = "selective", mb: int = 1, emb: bool = False, head: bool = False,
          moe_layers: int = 0) -> StagePlan:
    first, n = layers
    dp = gpus // (tp * cp)
    assert dp * tp * cp == gpus
    return StagePlan(island=island, gpu=_GPU_NAME.get(island, island), gpus=gpus, tp=tp, cp=cp, dp=dp, ep=ep,
                     zero=zero, recompute=recompute, micro_batch_size=mb, first_layer=first,
                     num_dense_layers=n - moe_layers, num_moe_layers=moe_layers, has_embedding=emb, has_head=head,
                     fwd_time_s=0.01 * n, bwd_time_s=0.02 * n, tail_time_s=0.05, p2p_time_s=0.001,
                     memory_bytes=0.5 * _GPU_MEM.get(island, 40 * u.GiB),
                     capacity_bytes=_GPU_MEM.get(island, 40 * u.GiB), inflight=2)


def make_plan(pipes: list[tuple[list[StagePlan], int, int]], *, model: str = "llama-3-8b", batch: int = 64,
              seq: int = 2048, precision: str = "fp16", cluster: str = "tiny-mixed",
              bound_s: float | None = 0.95) -> Plan:
    """``pipes``: (stages, pipeline micro-batch, number of micro-batches) per pipeline."""
    pp = []
    for stages, b, m in pipes:
        t = max(s.time_s for s in stages)
        pp.append(PipelinePlan(stages=tuple(stages), pipeline_micro_batch=b, num_micro_batches=m, schedule="1f1b",
                               makespan_s=t * (m + len(stages) - 1), step_time_s=t * (m + len(stages) - 1) + 0.05,
                               bottleneck_s=t))
    step = max(p.step_time_s for p in pp)
    cert = Certificate(status="feasible", backend="cp-sat", objective_s=step, bound_s=bound_s,
                       gap=None if bound_s is None else (step - bound_s) / step, solve_time_s=1.0,
                       plan_space="test space", subproblems=({"pipeline_micro_batch": 8, "bound_s": float("inf")},),
                       trajectory=((0.1, step, bound_s),))
    return Plan(cluster=cluster, model=model, method="mip", global_batch_size=batch, seq_len=seq, precision=precision,
                pipelines=tuple(pp), step_time_s=step, model_flops_per_step=3e15, used_peak_flops_per_s=2e15,
                cluster_peak_flops_per_s=2.5e15, island_gpus={"a100": 8, "v100": 16}, certificate=cert)


def single_job_plan(precision: str = "fp16") -> Plan:
    """tiny-mixed, llama-3-8b (32 layers): one part (tp1 cp1 dp8, ZeRO-1), uneven layers 16/8/8."""
    return make_plan([([stage("a100", 8, (0, 16), emb=True), stage("v100", 8, (16, 8)),
                        stage("v100", 8, (24, 8), head=True)], 8, 8)], precision=precision)


def hetero_plan() -> Plan:
    """tiny-mixed, llama-3-8b: stage configs differ (tp2 on a100 vs tp1 cp8 on v100), uneven layers."""
    return make_plan([([stage("a100", 4, (0, 9), tp=2, cp=2, zero=2, emb=True),
                        stage("v100", 8, (9, 8), cp=8, zero=2), stage("v100", 8, (17, 8), cp=8, zero=2),
                        stage("a100", 4, (25, 7), cp=4, zero=2, head=True)], 1, 64)])


def two_pipeline_plan() -> Plan:
    """Two pipelines with uneven batch shares (40 + 24 sequences)."""
    return make_plan([([stage("a100", 8, (0, 32), emb=True, head=True, zero=3)], 8, 5),
                      ([stage("v100", 8, (0, 16), emb=True), stage("v100", 8, (16, 16), head=True)], 8, 3)])


@pytest.fixture(scope="module")
def cluster():
    return to.load_cluster("tiny-mixed")


@pytest.fixture(scope="module")
def model():
    return to.load_model("llama-3-8b")


def plan_file(plan: Plan, cluster, model) -> PlanFile:
    return PlanFile(plan=plan, cluster=cluster, model=model,
                    training=to.TrainingSpec(global_batch_size=plan.global_batch_size, seq_len=plan.seq_len,
                                             precision=plan.precision))


# --- the plan file ---------------------------------------------------------------------------------------

def test_envelope_round_trips_plan_cluster_model_and_training(tmp_path, cluster, model):
    plan = hetero_plan()
    training = to.TrainingSpec(global_batch_size=64, seq_len=2048, precision="fp16")
    path = save_plan_file(tmp_path / "sub" / "plan.json", plan, cluster=cluster, model=model, training=training)
    raw = json.loads(path.read_text())
    assert raw["schema"] == PLAN_FILE_SCHEMA
    assert set(raw) >= {"schema", "tangram_opt_version", "plan", "cluster", "model", "training", "summary"}
    pf = read_plan_file(path)
    assert pf.cluster == cluster and pf.model == model and pf.training == training
    assert pf.plan.pipelines == plan.pipelines and pf.plan.step_time_s == plan.step_time_s
    assert pf.plan.certificate.gap == pytest.approx(plan.certificate.gap)


def test_envelope_writes_non_finite_numbers_as_null(tmp_path):
    path = save_plan_file(tmp_path / "p.json", hetero_plan())
    text = path.read_text()
    assert "Infinity" not in text and "NaN" not in text
    assert json.loads(text)["plan"]["certificate"]["subproblems"][0]["bound_s"] is None


def test_bare_plan_save_is_accepted_without_specs(tmp_path):
    plan = single_job_plan()
    plan.save(tmp_path / "bare.json")
    pf = read_plan_file(tmp_path / "bare.json")
    assert pf.plan == plan and pf.cluster is None and pf.model is None
    assert pf.training_or_default.global_batch_size == plan.global_batch_size


@pytest.mark.parametrize("doc, match", [
    ({"schema": "tangram_opt.plan/2", "plan": {}}, "reads 'tangram_opt.plan/1'"),
    ({"schema": "other/1", "plan": {}}, "not a tangram_opt plan file schema"),
    ({"hello": 1}, "schema"),
    ([1, 2], "JSON object"),
    ({"schema": PLAN_FILE_SCHEMA}, "plan"),
])
def test_bad_plan_files_raise_format_errors(doc, match):
    with pytest.raises(FormatError, match=match):
        plan_file_from_dict(doc)


def test_missing_and_malformed_plan_files(tmp_path):
    with pytest.raises(FormatError, match="file not found"):
        read_plan_file(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(FormatError, match="not valid JSON"):
        read_plan_file(bad)


def test_envelope_summary_matches_plan():
    plan = hetero_plan()
    s = plan_envelope(plan)["summary"]
    assert s["step_time_s"] == plan.step_time_s and s["gpus_used"] == plan.gpus_used and s["stages"] == [4]


# --- ranks and parts -------------------------------------------------------------------------------------

def test_ranks_are_contiguous_and_gpus_are_not_shared(cluster):
    plan = hetero_plan()
    ranks = assign_ranks(plan, cluster)
    assert [r.first_rank for r in ranks] == [0, 4, 12, 20]
    used = [(s.island, s.node, g) for r in ranks for s in r.slices for g in s.local_gpus]
    assert len(used) == len(set(used)) == plan.gpus_used
    # stage 0 and stage 3 share the single a100 node: not node-contiguous
    assert node_launches(ranks) is None


def test_node_launches_for_whole_node_stages(cluster):
    nl = node_launches(assign_ranks(single_job_plan(), cluster))
    assert [(n.host, n.first_rank, n.nproc) for n in nl] == [("a100[0]", 0, 8), ("v100[0]", 8, 8), ("v100[1]", 16, 8)]


def test_plan_for_another_cluster_is_a_spec_error():
    with pytest.raises(SpecError, match="not an island"):
        assign_ranks(hetero_plan(), to.load_cluster("h100-64"))


def test_parts_group_consecutive_equal_configs():
    assert [p.stage_indices for p in homogeneous_parts(hetero_plan())] == [(0,), (1, 2), (3,)]
    assert single_job(homogeneous_parts(single_job_plan()))
    parts = homogeneous_parts(two_pipeline_plan())
    assert [(p.pipeline, p.sequences_per_step) for p in parts] == [(0, 40), (1, 24)]
    assert not single_job(parts)


# --- Megatron-LM ----------------------------------------------------------------------------------------

#: Flags verified in NVIDIA/Megatron-LM megatron/training/arguments.py (docs/exports.md, "Sources").
MEGATRON_FLAGS = {
    "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size",
    "--expert-model-parallel-size", "--sequence-parallel", "--use-distributed-optimizer", "--use-megatron-fsdp",
    "--data-parallel-sharding-strategy", "--ckpt-format", "--recompute-granularity", "--recompute-method",
    "--recompute-num-layers", "--micro-batch-size", "--global-batch-size", "--num-layers", "--seq-length", "--bf16",
    "--fp16", "--fp8-format", "--fp8-recipe", "--overlap-grad-reduce", "--overlap-param-gather",
    "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
    "--pipeline-model-parallel-layout", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads",
    "--group-query-attention", "--num-query-groups", "--kv-channels", "--max-position-embeddings",
    "--position-embedding-type", "--normalization", "--swiglu", "--untie-embeddings-and-output-weights",
    "--disable-bias-linear", "--add-qkv-bias", "--qk-layernorm", "--multi-latent-attention", "--kv-lora-rank",
    "--q-lora-rank", "--qk-head-dim", "--qk-pos-emb-head-dim", "--v-head-dim", "--num-experts", "--moe-router-topk",
    "--moe-ffn-hidden-size", "--moe-shared-expert-intermediate-size", "--moe-layer-freq",
    "--moe-token-dispatcher-type", "--moe-router-score-function", "--moe-router-enable-expert-bias",
    "--moe-router-num-groups", "--moe-router-group-topk", "--moe-router-topk-scaling-factor",
    "--moe-router-pre-softmax", "--moe-shared-expert-gate", "--rotary-base", "--rope-type",
    "--rotary-scaling-factor", "--mscale", "--mscale-all-dim", "--use-rope-scaling", "--rope-scaling-factor",
}


def _flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def _parse_layout(text: str) -> list[list[str]]:
    """Megatron-LM's PipelineParallelLayerLayout.parse_str_to_list, re-implemented for the test."""
    text = text.replace(",", "")
    for pattern in (r"\(([^)]+)\)\*(\d+)", r"(.)\*(\d+)"):
        text = re.sub(pattern, lambda m: m.group(1) * int(m.group(2)), text)
    return [list(stage_text) for stage_text in text.split("|")]


def test_megatron_single_job_flags_match_the_plan(cluster, model):
    plan = single_job_plan()
    (argv,) = megatron_args(plan, model=model, cluster=cluster)
    assert {a for a in argv if a.startswith("--")} <= MEGATRON_FLAGS
    s0 = plan.stages[0]
    assert _flag(argv, "--tensor-model-parallel-size") == str(s0.tp)
    assert _flag(argv, "--pipeline-model-parallel-size") == "3"
    assert _flag(argv, "--context-parallel-size") == str(s0.cp)
    assert _flag(argv, "--micro-batch-size") == str(s0.micro_batch_size)
    assert _flag(argv, "--global-batch-size") == str(plan.global_batch_size)
    assert _flag(argv, "--num-layers") == str(model.num_layers)
    assert _flag(argv, "--seq-length") == str(plan.seq_len)
    assert "--fp16" in argv and "--bf16" not in argv
    assert "--use-distributed-optimizer" in argv  # ZeRO-1 over dp 8
    assert "--sequence-parallel" not in argv  # tp 1
    assert _flag(argv, "--recompute-granularity") == "selective"
    assert _flag(argv, "--decoder-first-pipeline-num-layers") == "16"
    assert _flag(argv, "--decoder-last-pipeline-num-layers") == "8"
    # Megatron derives the micro-batch count: global / (micro x dp) must be the plan's
    micro_batches = int(_flag(argv, "--global-batch-size")) // (s0.micro_batch_size * s0.dp)
    assert micro_batches == plan.pipelines[0].num_micro_batches


def test_megatron_layout_string_reproduces_the_stage_split():
    plan = make_plan([([stage("a100", 8, (0, 10), emb=True), stage("v100", 8, (10, 7)), stage("v100", 8, (17, 9)),
                        stage("v100", 8, (26, 6), head=True)], 8, 8)])
    argv = megatron_export(plan).blocks[0].args
    text = argv[argv.index("--pipeline-model-parallel-layout") + 1]
    stages = _parse_layout(text)
    assert [st.count("t") for st in stages] == [s.num_layers for s in plan.stages]
    assert stages[0][0] == "E" and stages[-1][-1] == "L"
    assert sum(st.count("E") for st in stages) == 1 and sum(st.count("L") for st in stages) == 1
    assert layout(plan.stages) == text


def test_megatron_script_is_valid_bash_with_launch_lines(cluster, model):
    text = megatron_script(single_job_plan(), model=model, cluster=cluster)
    assert "ONE Megatron-LM job" in text
    assert text.count("torchrun --nnodes 3") == 3 and "--node-rank 2" in text
    assert "CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7" in text
    if shutil.which("bash"):
        subprocess.run(["bash", "-n"], input=text, text=True, check=True)


def test_megatron_script_runs_torchrun_for_the_node_rank(tmp_path, cluster, model):
    """Run the script with a fake ``torchrun`` that prints its environment and arguments."""
    if not shutil.which("bash"):
        pytest.skip("no bash")
    script = tmp_path / "megatron_args.sh"
    script.write_text(megatron_script(single_job_plan(), model=model, cluster=cluster))
    fake = tmp_path / "bin" / "torchrun"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho CVD=$CUDA_VISIBLE_DEVICES\nfor a in \"$@\"; do echo \"ARG $a\"; done\n")
    fake.chmod(0o755)
    env = {"PATH": f"{fake.parent}:/usr/bin:/bin", "NODE_RANK": "1", "MASTER_ADDR": "node0", "MEGATRON_LM": "/m"}
    res = subprocess.run(["bash", str(script), "--data-path", "/data/x"], capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stderr
    args = [ln[4:] for ln in res.stdout.splitlines() if ln.startswith("ARG ")]
    assert "CVD=0,1,2,3,4,5,6,7" in res.stdout
    assert args[args.index("--node-rank") + 1] == "1" and args[args.index("--master-addr") + 1] == "node0"
    assert "/m/pretrain_gpt.py" in args and args[-2:] == ["--data-path", "/data/x"]
    assert args[args.index("--pipeline-model-parallel-size") + 1] == "3"
    env["NODE_RANK"] = "9"
    bad = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env)
    assert bad.returncode == 2 and "set NODE_RANK" in bad.stderr


def test_megatron_heterogeneous_plan_gets_one_block_per_part(cluster, model):
    plan = hetero_plan()
    ex = megatron_export(plan, model=model, cluster=cluster)
    assert not ex.single_job and len(ex.blocks) == 3 and ex.reasons
    assert [b.args[b.args.index("--tensor-model-parallel-size") + 1] for b in ex.blocks] == ["2", "1", "1"]
    assert [b.args[b.args.index("--context-parallel-size") + 1] for b in ex.blocks] == ["2", "8", "4"]
    assert "--sequence-parallel" in ex.blocks[0].args and "--sequence-parallel" not in ex.blocks[1].args
    text = megatron_script(plan, model=model, cluster=cluster)
    assert "NOT one stock Megatron-LM job" in text and "torchrun" not in text
    assert "ranks 0-3" in text and "ranks 20-23" in text and "a100[0] GPUs 4-7" in text
    for args in megatron_args(plan, model=model):
        assert {a for a in args if a.startswith("--")} <= MEGATRON_FLAGS
    if shutil.which("bash"):
        subprocess.run(["bash", "-n"], input=text, text=True, check=True)


def test_megatron_zero3_uses_megatron_fsdp_and_dp1_needs_no_flag():
    argv = megatron_export(two_pipeline_plan()).blocks[0].args
    assert _flag(list(argv), "--data-parallel-sharding-strategy") == "optim_grads_params"
    one = make_plan([([stage("a100", 1, (0, 32), emb=True, head=True, zero=2)], 1, 64)])
    assert "--use-distributed-optimizer" not in megatron_export(one).blocks[0].args


@pytest.mark.parametrize("preset", ["mixtral-8x7b", "deepseek-v3", "qwen2-7b", "opt-350m"])
def test_megatron_model_args_use_known_flags(preset):
    from tangram_opt.export.megatron import megatron_model_args

    m = to.load_model(preset)
    args, _ = megatron_model_args(m, 4096)
    assert {a for a in args if a.startswith("--")} <= MEGATRON_FLAGS
    assert int(_flag(list(args), "--max-position-embeddings")) >= 4096
    if m.moe is not None:
        assert _flag(list(args), "--num-experts") == str(m.moe.num_experts)
        freq = _flag(list(args), "--moe-layer-freq")
        if freq is not None:  # Megatron evaluates this Python list expression
            assert re.fullmatch(r"[\d\[\]\(\)\+\*,]+", freq)
            pattern = eval(freq)  # digits, brackets, + and * only (checked above)
            assert len(pattern) == m.num_layers and pattern.count(0) == m.moe.first_dense_layers


# --- DeepSpeed ------------------------------------------------------------------------------------------

DEEPSPEED_KEYS = {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                  "zero_optimization", "bf16", "fp16", "activation_checkpointing"}


def test_deepspeed_single_job_config_is_consistent():
    plan = single_job_plan()
    cfg = deepspeed_config(plan)
    assert set(cfg) <= DEEPSPEED_KEYS
    s0 = plan.stages[0]
    assert cfg["train_micro_batch_size_per_gpu"] == s0.micro_batch_size
    assert cfg["gradient_accumulation_steps"] == plan.pipelines[0].num_micro_batches
    assert cfg["train_batch_size"] == cfg["train_micro_batch_size_per_gpu"] * cfg["gradient_accumulation_steps"] * s0.dp
    assert cfg["train_batch_size"] == plan.global_batch_size
    assert cfg["zero_optimization"] == {"stage": 1}
    assert cfg["fp16"] == {"enabled": True} and cfg["bf16"] == {"enabled": False}
    assert json.loads(deepspeed_json(plan)) == cfg
    from tangram_opt.export import deepspeed_notes

    assert any("selective" in n for n in deepspeed_notes(plan))


def test_deepspeed_full_recompute_and_pipeline_zero2_is_refused():
    def plan_with(zero: int) -> Plan:
        return make_plan([([stage("v100", 8, (0, 16), emb=True, zero=zero, recompute="full"),
                            stage("v100", 8, (16, 16), head=True, zero=zero, recompute="full")], 8, 8)])

    (p,) = deepspeed_parts(plan_with(1))
    assert not p.refusals
    assert set(p.config["activation_checkpointing"]) == {"partition_activations", "cpu_checkpointing",
                                                         "contiguous_memory_optimization",
                                                         "synchronize_checkpoint_boundary"}
    assert any("mpu" in n and "data-parallel world size is 8" in n for n in p.notes)
    (p,) = deepspeed_parts(plan_with(2))
    assert p.config == {} and len(p.refusals) == 1
    assert "ZeRO <= 1" in p.refusals[0] and "--launch deepspeed" in p.refusals[0]
    with pytest.raises(SpecError, match="ZeRO <= 1"):
        deepspeed_config(plan_with(2))


def test_deepspeed_multi_part_listing_parses():
    doc = json.loads(deepspeed_json(hetero_plan()))
    assert doc["single_job"] is False and len(doc["parts"]) == 3
    assert doc["nearest_fix"] == "plan with --launch deepspeed"
    for part in doc["parts"]:
        assert ("config" in part) != ("refused" in part)
        if "config" in part:
            assert set(part["config"]) <= DEEPSPEED_KEYS
    # stages 1-2 are a 2-stage pipeline with ZeRO-2: the pipeline engine refuses it
    assert "refused" in doc["parts"][1] and "config" in doc["parts"][0]


# --- torchtitan -----------------------------------------------------------------------------------------

TORCHTITAN_KEYS = {
    "training": {"local_batch_size", "global_batch_size", "seq_len", "mixed_precision_param"},
    "parallelism": {"data_parallel_replicate_degree", "data_parallel_shard_degree", "fsdp_reshard_after_forward",
                    "tensor_parallel_degree", "context_parallel_degree", "expert_parallel_degree",
                    "pipeline_parallel_degree", "pipeline_parallel_schedule", "pipeline_parallel_microbatch_size",
                    "module_fqns_per_model_part"},
    "activation_checkpoint": {"mode", "selective_ac_option"},
}


def _check_torchtitan_doc(doc: dict, world: int) -> None:
    assert set(doc) == set(TORCHTITAN_KEYS)
    for table, keys in TORCHTITAN_KEYS.items():
        assert set(doc[table]) <= keys
    par = doc["parallelism"]
    degrees = (par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"] * par["tensor_parallel_degree"]
               * par["context_parallel_degree"] * par["pipeline_parallel_degree"])
    assert degrees == world


def test_torchtitan_single_job_toml_parses_and_is_consistent():
    plan = single_job_plan(precision="bf16")
    doc = tomllib.loads(torchtitan_toml(plan))
    _check_torchtitan_doc(doc, plan.gpus_used)
    par, tr = doc["parallelism"], doc["training"]
    assert par["pipeline_parallel_schedule"] == "1F1B" and par["pipeline_parallel_degree"] == 3
    fqns = par["module_fqns_per_model_part"]
    layers = [n for part in fqns for n in part if n.startswith("layers.")]
    assert layers == [f"layers.{i}" for i in range(32)]
    assert fqns[0][0] == "tok_embeddings" and fqns[-1][-2:] == ["norm", "output"]  # 0.2 names the head output
    assert [sum(n.startswith("layers.") for n in part) for part in fqns] == [16, 8, 8]
    dp = par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"]
    assert tr["global_batch_size"] == plan.global_batch_size == tr["local_batch_size"] * dp
    assert tr["local_batch_size"] // par["pipeline_parallel_microbatch_size"] == plan.pipelines[0].num_micro_batches
    assert doc["activation_checkpoint"]["mode"] == "selective"


def test_torchtitan_current_release_gets_command_line_overrides(cluster, model):
    plan = single_job_plan(precision="bf16")
    (p,) = torchtitan_parts(plan, cluster, model=model)
    args = p.args()
    assert args[-1] == "activation-checkpoint:selective" and "--training.disable_cuda_graphs" in args
    fq = args[args.index("--parallelism.module_fqns_per_model_part") + 1:][:3]
    assert fq[0].startswith("tok_embeddings,layers.0") and fq[2].endswith("norm,lm_head")  # 0.3 names it lm_head
    from tangram_opt.export import torchtitan_script

    text = torchtitan_script(plan, cluster, model=model)
    assert '--module "llama3" --config "llama3_8b"' in text and text.count("-m torchtitan.train") == 3
    if shutil.which("bash"):
        subprocess.run(["bash", "-n"], input=text, text=True, check=True)


def test_torchtitan_refuses_fp16_and_parts_of_pipelines():
    (p,) = torchtitan_parts(single_job_plan())
    assert p.args() == [] and "fp16" in p.refusals[0] and "--precision bf16" in p.refusals[0]
    plan = make_plan([([stage("a100", 4, (0, 9), tp=2, cp=2, zero=1, emb=True),
                        stage("v100", 8, (9, 8), cp=8, zero=1), stage("v100", 8, (17, 8), cp=8, zero=1),
                        stage("a100", 4, (25, 7), cp=4, zero=1, head=True)], 1, 64)], precision="bf16")
    text = torchtitan_toml(plan)
    assert "NOT one torchtitan job" in text and "--launch torchtitan" in text
    for d, p in zip(split_documents(text), torchtitan_parts(plan)):
        assert p.refusals and "NOT WRITTEN" in d and tomllib.loads(d) == {}


def test_torchtitan_0_2_refuses_ddp_with_other_dimensions():
    plan = make_plan([([stage("a100", 8, (0, 32), tp=2, zero=0, emb=True, head=True)], 4, 16)], precision="bf16")
    (p2,) = torchtitan_parts(plan, version="0.2")
    assert any("DDP has not supported > 1D parallelism" in r for r in p2.refusals)
    (p3,) = torchtitan_parts(plan, version="0.3")
    assert not p3.refusals and p3.config["parallelism"]["data_parallel_replicate_degree"] == 4


# --- writing files --------------------------------------------------------------------------------------

def test_write_exports_single_job(tmp_path, cluster, model):
    formats = ("megatron", "deepspeed", "torchtitan", "torchtitan-0.2")
    files = write_exports(plan_file(single_job_plan(precision="bf16"), cluster, model), formats, tmp_path)
    assert sorted(f.name for f in files) == ["deepspeed.json", "megatron_args.sh", "torchtitan.sh", "torchtitan.toml"]
    tomllib.loads((tmp_path / "torchtitan.toml").read_text())
    json.loads((tmp_path / "deepspeed.json").read_text())


def test_write_exports_leaves_out_refused_parts_and_says_why(tmp_path, cluster, model):
    from tangram_opt.export import export_notes

    pf = plan_file(hetero_plan(), cluster, model)
    files = {f.name for f in write_exports(pf, ("deepspeed", "torchtitan", "torchtitan-0.2"), tmp_path)}
    # part 1 (ZeRO-2 over 2 stages) is refused by DeepSpeed; torchtitan refuses every part of a pipeline
    assert files == {"deepspeed.json", "deepspeed_part0.json", "deepspeed_part2.json"}
    for name in files:
        json.loads((tmp_path / name).read_text())
    notes = export_notes("torchtitan", pf)
    assert len(notes) >= 3 and all(n.startswith("not written: ") for n in notes)
    assert any("ZeRO <= 1" in n for n in export_notes("deepspeed", pf))


def test_written_plan_files_match_the_documented_json_schema(tmp_path, cluster, model):
    jsonschema = pytest.importorskip("jsonschema")
    from tangram_opt.export import plan_file_json_schema

    schema = plan_file_json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    for plan in (single_job_plan(), hetero_plan(), two_pipeline_plan()):
        path = save_plan_file(tmp_path / "p.json", plan, cluster=cluster, model=model)
        jsonschema.validate(json.loads(path.read_text()), schema)
    bare = {"schema": PLAN_FILE_SCHEMA, "plan": {"schema_version": 1}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bare, schema)
