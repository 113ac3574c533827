"""Every written export loaded by the frameworks' own configuration code (CPU, no GPU).

Needs the ``frameworks`` extra (``pip install -e ".[test,frameworks]"``: CPU torch, megatron-core,
deepspeed, torchtitan); each framework's tests are skipped when it is not installed.

- Megatron-LM: megatron-core's ``TransformerConfig`` / ``MLATransformerConfig`` built from the
  exported arguments (the flag -> field map below is Megatron-LM's ``core_transformer_config_from_args``:
  each flag names the field it sets), its ``get_num_layers_to_build`` for the split per stage and its
  ``ConstantNumMicroBatchesCalculator`` for the micro-batch count. With ``MEGATRON_LM`` pointing at a
  Megatron-LM checkout matching the installed megatron-core, ``parse_args`` + ``validate_args`` run too.
- DeepSpeed: ``DeepSpeedConfig`` with an mpu reporting the part's data-parallel size.
- torchtitan: 0.3's ``ConfigManager.parse_args`` on the exported command line, and ``ParallelDims``.

The plans: hand-made launchable plans (dense, MoE, one to three GPU types, identical pipelines), and
every saved benchmark plan (``benchmarks/results/plans``) with its model; every part that an export
writes must be accepted, and refused parts must carry a reason with the nearest accepted plan.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import tangram_opt as to
from tangram_opt.export import (deepspeed_parts, homogeneous_parts, launchable, megatron_export,
                                torchtitan_parts)
from tangram_opt.planner.plan import Plan
from tests.test_export import make_plan, stage

torch = pytest.importorskip("torch", reason="needs the frameworks extra: pip install -e '.[test,frameworks]'")

PLANS_DIR = Path(__file__).resolve().parent.parent / "benchmarks" / "results" / "plans"


# --- plans -----------------------------------------------------------------------------------------------

def _launchable_plans() -> list[tuple[str, Plan, str]]:
    """(id, plan, model preset): one stock job each for every framework (bf16, ZeRO <= 1 with pp > 1)."""
    out = []
    out.append(("dense-2-types-uneven", make_plan(
        [([stage("a100", 8, (0, 16), emb=True), stage("v100", 8, (16, 8)), stage("v100", 8, (24, 8), head=True)],
          8, 8)], precision="bf16"), "llama-3-8b"))
    out.append(("dense-tp2-cp2-zero3-full", make_plan(
        [([stage("h100", 8, (0, 80), tp=2, cp=2, zero=3, recompute="full", emb=True, head=True)], 2, 16)],
        precision="bf16", cluster="h100-64", batch=32, seq=4096), "llama-3-70b"))
    out.append(("dense-3-types-pp3-zero0", make_plan(
        [([stage("h100", 8, (0, 30), tp=2, zero=0, recompute="none", emb=True),
           stage("a100", 8, (30, 26), tp=2, zero=0, recompute="none"),
           stage("l4", 8, (56, 24), tp=2, zero=0, recompute="none", head=True)], 4, 8)],
        precision="bf16", cluster="h100-a100-l4", batch=32), "llama-3-70b"))
    out.append(("moe-mixtral-ep4", make_plan(
        [([stage("h100", 16, (0, 16), tp=2, ep=4, zero=1, emb=True, moe_layers=16),
           stage("h100", 16, (16, 16), tp=2, ep=4, zero=1, head=True, moe_layers=16)], 8, 8)],
        precision="bf16", cluster="h100-64"), "mixtral-8x7b"))
    # two identical pipelines of DeepSeek-V2-Lite (tp2 cp2 dp2 ep2, layers 7/7/7/6): one job with dp 4
    ds = [stage("h100", 8, (0, 7), tp=2, cp=2, ep=2, zero=1, emb=True, moe_layers=6),
          stage("h100", 8, (7, 7), tp=2, cp=2, ep=2, zero=1, moe_layers=7),
          stage("h100", 8, (14, 7), tp=2, cp=2, ep=2, zero=1, moe_layers=7),
          stage("h100", 8, (21, 6), tp=2, cp=2, ep=2, zero=1, head=True, moe_layers=6)]
    out.append(("moe-deepseek-two-identical-pipelines", make_plan([(ds, 2, 8), (ds, 2, 8)], precision="bf16",
                                                                  cluster="h100-64", batch=32, seq=4096),
                "deepseek-v2-lite"))
    return out


LAUNCHABLE = _launchable_plans()


def _benchmark_plans() -> list[tuple[str, Plan, str]]:
    out = []
    for f in sorted(PLANS_DIR.glob("*.json")):
        plan = Plan.load(f)
        out.append((f.stem, plan, plan.model))
    return out


BENCHMARK = _benchmark_plans()


# --- Megatron-LM ----------------------------------------------------------------------------------------

#: exported flag -> TransformerConfig field (Megatron-LM core_transformer_config_from_args copies each
#: argument into the dataclass field of the same name; the exceptions are spelled out)
_MEGATRON_FIELDS = {
    "--num-layers": "num_layers", "--hidden-size": "hidden_size", "--ffn-hidden-size": "ffn_hidden_size",
    "--num-attention-heads": "num_attention_heads", "--num-query-groups": "num_query_groups",
    "--kv-channels": "kv_channels", "--tensor-model-parallel-size": "tensor_model_parallel_size",
    "--pipeline-model-parallel-size": "pipeline_model_parallel_size",
    "--context-parallel-size": "context_parallel_size", "--expert-model-parallel-size": "expert_model_parallel_size",
    "--sequence-parallel": "sequence_parallel",
    "--decoder-first-pipeline-num-layers": "num_layers_in_first_pipeline_stage",
    "--decoder-last-pipeline-num-layers": "num_layers_in_last_pipeline_stage",
    "--pipeline-model-parallel-layout": "pipeline_model_parallel_layout",
    "--recompute-granularity": "recompute_granularity", "--recompute-method": "recompute_method",
    "--recompute-num-layers": "recompute_num_layers", "--num-experts": "num_moe_experts",
    "--moe-router-topk": "moe_router_topk", "--moe-ffn-hidden-size": "moe_ffn_hidden_size",
    "--moe-shared-expert-intermediate-size": "moe_shared_expert_intermediate_size",
    "--moe-layer-freq": "moe_layer_freq", "--moe-token-dispatcher-type": "moe_token_dispatcher_type",
    "--moe-router-score-function": "moe_router_score_function",
    "--moe-router-enable-expert-bias": "moe_router_enable_expert_bias",
    "--moe-router-num-groups": "moe_router_num_groups", "--moe-router-group-topk": "moe_router_group_topk",
    "--moe-router-topk-scaling-factor": "moe_router_topk_scaling_factor",
    "--moe-router-pre-softmax": "moe_router_pre_softmax", "--moe-shared-expert-gate": "moe_shared_expert_gate",
    "--normalization": "normalization", "--qk-layernorm": "qk_layernorm", "--add-qkv-bias": "add_qkv_bias",
    "--multi-latent-attention": "multi_latent_attention", "--q-lora-rank": "q_lora_rank",
    "--kv-lora-rank": "kv_lora_rank", "--qk-head-dim": "qk_head_dim", "--qk-pos-emb-head-dim": "qk_pos_emb_head_dim",
    "--v-head-dim": "v_head_dim", "--rope-type": "rope_type", "--rotary-scaling-factor": "rotary_scaling_factor",
    "--mscale": "mscale", "--mscale-all-dim": "mscale_all_dim", "--bf16": "bf16", "--fp16": "fp16",
    "--fp8-format": "fp8", "--fp8-recipe": "fp8_recipe",
}
#: flags that are not TransformerConfig fields (model-builder, training-loop or data arguments)
_MEGATRON_OTHER = {"--micro-batch-size", "--global-batch-size", "--seq-length", "--max-position-embeddings",
                   "--position-embedding-type", "--untie-embeddings-and-output-weights", "--use-distributed-optimizer",
                   "--use-megatron-fsdp", "--data-parallel-sharding-strategy", "--ckpt-format", "--rotary-base",
                   "--use-rope-scaling", "--rope-scaling-factor", "--group-query-attention", "--swiglu",
                   "--disable-bias-linear", "--overlap-grad-reduce", "--overlap-param-gather"}


def _argv_dict(argv: list[str]) -> dict[str, object]:
    out: dict[str, object] = {}
    i = 0
    while i < len(argv):
        flag = argv[i]
        assert flag.startswith("--"), argv[i:]
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            out[flag] = argv[i + 1]
            i += 2
        else:
            out[flag] = True
            i += 1
    return out


def _value(flag: str, v: object) -> object:
    if v is True or not isinstance(v, str):
        return v
    if flag == "--moe-layer-freq":
        return _eval_freq(v)
    for cast in (int, float):
        try:
            return cast(v)
        except ValueError:
            pass
    return v


def _eval_freq(text: str) -> list[int]:
    """Megatron-LM's moe_freq_type evaluates the Python list expression; only lists, ints, + and *."""
    tree = ast.parse(text, mode="eval")
    for node in ast.walk(tree):
        assert isinstance(node, (ast.Expression, ast.BinOp, ast.List, ast.Constant, ast.Add, ast.Mult, ast.Load)), text
    return eval(compile(tree, "<moe-layer-freq>", "eval"))  # noqa: S307 - checked above


def megatron_config(argv: list[str]):
    """megatron-core's TransformerConfig (MLATransformerConfig with MLA) from exported arguments."""
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

    args = _argv_dict(argv)
    unknown = set(args) - set(_MEGATRON_FIELDS) - _MEGATRON_OTHER
    assert not unknown, f"flags without a known destination: {unknown}"
    kw = {_MEGATRON_FIELDS[f]: _value(f, v) for f, v in args.items() if f in _MEGATRON_FIELDS}
    if "--swiglu" in args:  # Megatron-LM: --swiglu sets gated_linear_unit and activation_func=silu
        kw["gated_linear_unit"] = True
        kw["activation_func"] = torch.nn.functional.silu
    kw["add_bias_linear"] = "--disable-bias-linear" not in args
    if "--group-query-attention" not in args:
        kw.pop("num_query_groups", None)
    kw["params_dtype"] = torch.bfloat16 if args.get("--bf16") else torch.float16 if args.get("--fp16") else torch.float32
    kw["pipeline_dtype"] = kw["params_dtype"]
    kw["variable_seq_lengths"] = False
    cls = MLATransformerConfig if kw.get("multi_latent_attention") else TransformerConfig
    if cls is MLATransformerConfig:  # Megatron-LM's argparse defaults, which differ from the dataclass's
        kw.setdefault("q_lora_rank", None)
        kw.setdefault("rope_type", "rope")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return cls(**kw), args


def _megatron_check_part(argv: list[str], part) -> None:
    from megatron.core.num_microbatches_calculator import ConstantNumMicroBatchesCalculator
    from megatron.core.transformer.transformer_block import get_num_layers_to_build

    cfg, args = megatron_config(argv)
    tp, cp, pp = cfg.tensor_model_parallel_size, cfg.context_parallel_size, cfg.pipeline_model_parallel_size
    assert part.world_size % (tp * cp * pp) == 0
    dp = part.world_size // (tp * cp * pp)
    assert dp == part.dp
    calc = ConstantNumMicroBatchesCalculator(int(args["--global-batch-size"]), int(args["--micro-batch-size"]), dp,
                                             False, 0)
    assert calc.get() == part.num_micro_batches
    lay = cfg.pipeline_model_parallel_layout
    if lay is not None:  # the parsed layout: per pipeline rank, per virtual stage, the layer types
        from megatron.core.transformer.enums import LayerType

        built = [sum(stage.count(LayerType.decoder) for stage in lay.layout[r]) for r in range(pp)]
    else:
        built = [get_num_layers_to_build(cfg, pp_rank=r) for r in range(pp)]
    assert built == list(part.layer_counts)


def _megatron_check_plan(plan: Plan, model) -> None:
    ex = megatron_export(plan, model=model)
    for b in ex.blocks:
        if b.refusals:
            assert all("; " in r for r in b.refusals)
            continue
        _megatron_check_part(list(ex.model_args) + b.argv(), b.part)
        if b.part.zero >= 3 and b.part.dp * b.part.cp > 1:
            assert b.env == ("-u", "CUDA_DEVICE_MAX_CONNECTIONS")
        elif b.part.tp > 1 or b.part.cp > 1:
            assert b.env == ("CUDA_DEVICE_MAX_CONNECTIONS=1",)


@pytest.fixture(scope="module")
def mcore():
    return pytest.importorskip("megatron.core", reason="needs the frameworks extra (megatron-core)")


@pytest.mark.parametrize("name, plan, preset", LAUNCHABLE, ids=[x[0] for x in LAUNCHABLE])
def test_megatron_accepts_every_launchable_plan(mcore, name, plan, preset):
    model = to.load_model(preset)
    assert launchable(plan, "megatron", model=model) == []
    _megatron_check_plan(plan, model)


def test_megatron_accepts_every_written_part_of_the_benchmark_plans(mcore):
    for name, plan, preset in BENCHMARK:
        try:
            _megatron_check_plan(plan, to.load_model(preset))
        except Exception as e:  # name the plan
            raise AssertionError(f"{name}: {e}") from e


def test_fp8_plan_is_a_megatron_job_with_fp8_layers_and_refused_where_the_config_cannot_say_fp8(mcore):
    plan = make_plan([([stage("h100", 8, (0, 32), tp=1, zero=1, emb=True, head=True)], 8, 8)], precision="fp8",
                     cluster="h100-64", batch=64, seq=4096)
    model = to.load_model("llama-3-8b")
    assert launchable(plan, "megatron", model=model) == []
    _megatron_check_plan(plan, model)
    from tangram_opt.export.megatron import megatron_args

    (argv,) = megatron_args(plan, model=model)
    cfg, _ = megatron_config(argv)
    assert cfg.fp8 == "hybrid" and cfg.fp8_recipe == "tensorwise" and cfg.bf16
    for fw in ("deepspeed", "torchtitan"):
        reasons = launchable(plan, fw, model=model)
        assert reasons and "fp8" in " ".join(reasons).lower(), fw


def test_identical_pipelines_are_one_megatron_job(mcore):
    name, plan, preset = LAUNCHABLE[-1]
    (part,) = homogeneous_parts(plan)
    assert part.dp == 4 and part.replicas == 2 and part.world_size == 64 and part.layer_counts == (7, 7, 7, 6)
    ex = megatron_export(plan, model=to.load_model(preset))
    assert ex.single_job and not ex.reasons


# --- model arguments round trip ------------------------------------------------------------------------

def _megatron_params(cfg, model, args) -> int:
    """Parameters of the GPT model megatron-core builds from ``cfg`` (its module layout: fused QKV or MLA
    projections, gated MLP, routed + shared experts with router, norms), plus embedding and output."""
    h, L = cfg.hidden_size, cfg.num_layers
    norm = h * (2 if cfg.normalization == "LayerNorm" else 1)
    bias = cfg.add_bias_linear
    if cfg.multi_latent_attention:
        nh = cfg.num_attention_heads
        qd = cfg.qk_head_dim + cfg.qk_pos_emb_head_dim
        q = (h * cfg.q_lora_rank + cfg.q_lora_rank + cfg.q_lora_rank * nh * qd) if cfg.q_lora_rank else h * nh * qd
        kv = h * (cfg.kv_lora_rank + cfg.qk_pos_emb_head_dim) + cfg.kv_lora_rank \
            + cfg.kv_lora_rank * nh * (cfg.qk_head_dim + cfg.v_head_dim)
        attn = q + kv + nh * cfg.v_head_dim * h
    else:
        kvc, g = cfg.kv_channels, cfg.num_query_groups
        qkv_out = cfg.num_attention_heads * kvc + 2 * g * kvc
        attn = h * qkv_out + (qkv_out if (bias or cfg.add_qkv_bias) else 0) + cfg.num_attention_heads * kvc * h \
            + (h if bias else 0)
        if cfg.qk_layernorm:
            attn += 2 * kvc
    up = 2 if cfg.gated_linear_unit else 1

    def mlp(ffn: int) -> int:
        return h * ffn * up + ffn * h + ((ffn * up + h) if bias else 0)

    freq = cfg.moe_layer_freq if cfg.num_moe_experts else [0] * L
    if isinstance(freq, int):
        freq = [1 if i % freq == 0 else 0 for i in range(L)]
    total = 0
    for is_moe in freq:
        total += attn + 2 * norm
        if is_moe:
            total += cfg.num_moe_experts * mlp(cfg.moe_ffn_hidden_size) + cfg.num_moe_experts * h
            if cfg.moe_router_enable_expert_bias:  # a buffer in Megatron, a tensor of the checkpoint
                total += cfg.num_moe_experts
            if cfg.moe_shared_expert_intermediate_size:
                total += mlp(cfg.moe_shared_expert_intermediate_size) + (h if cfg.moe_shared_expert_gate else 0)
        else:
            total += mlp(cfg.ffn_hidden_size)
    total += norm  # final norm
    v = model.vocab_size
    total += v * h * (2 if "--untie-embeddings-and-output-weights" in args else 1)
    if args.get("--position-embedding-type") == "learned_absolute":
        total += int(args["--max-position-embeddings"]) * h
    return total


#: one preset per model family the planner knows (specs/hf_config.py SUPPORTED_ARCHITECTURES)
FAMILIES = ["llama-3-8b", "mistral-7b", "mixtral-8x7b", "qwen2-7b", "qwen2-57b-a14b", "qwen3-8b", "qwen3-30b-a3b",
            "deepseek-v2-lite", "deepseek-v2", "deepseek-v3", "opt-350m", "gpt-neo-2.7b", "gpt-neox-20b"]


@pytest.mark.parametrize("preset", FAMILIES)
def test_megatron_model_arguments_round_trip(mcore, preset):
    from tangram_opt.export.megatron import megatron_model_args

    model = to.load_model(preset)
    margs, notes = megatron_model_args(model, 4096)
    argv = list(margs) + ["--num-layers", str(model.num_layers)]
    cfg, args = megatron_config(argv)
    assert cfg.num_layers == model.num_layers and cfg.hidden_size == model.hidden_size
    assert cfg.num_attention_heads == model.num_attention_heads
    if model.mla is None:
        assert cfg.num_query_groups == model.kv_heads
        assert cfg.kv_channels == (model.head_dim or model.hidden_size // model.num_attention_heads)
    if model.moe is not None:
        moe = model.moe
        assert (cfg.num_moe_experts, cfg.moe_router_topk, cfg.moe_ffn_hidden_size) == \
            (moe.num_experts, moe.top_k, moe.expert_ffn_hidden_size)
        freq = cfg.moe_layer_freq if isinstance(cfg.moe_layer_freq, list) else [1] * model.num_layers
        assert freq.count(0) == moe.first_dense_layers
        assert cfg.moe_token_dispatcher_type == "allgather"  # the dispatcher is a part argument (alltoall)
        if model.architecture == "deepseek_v3":
            assert cfg.moe_router_score_function == "sigmoid" and cfg.moe_router_enable_expert_bias
            assert (cfg.moe_router_num_groups, cfg.moe_router_group_topk) == (8, 4)
            assert cfg.moe_router_topk_scaling_factor == 2.5
            assert cfg.rope_type == "yarn" and cfg.rotary_scaling_factor == 40
            assert any("multi-token prediction" in n for n in notes)
        elif model.architecture == "deepseek_v2":
            assert cfg.moe_router_score_function == "softmax" and cfg.moe_router_pre_softmax
            assert cfg.rope_type == "yarn"
        elif model.architecture == "qwen2_moe":
            assert cfg.moe_router_pre_softmax and cfg.moe_shared_expert_gate
        else:  # softmax, top-k, renormalize: Megatron's default
            assert cfg.moe_router_score_function == "softmax" and not cfg.moe_router_pre_softmax
    exact = not any("no exact" in n or "no plain-ReLU" in n for n in notes)
    if exact and model.embedding_dim is None and model.final_norm:
        assert _megatron_params(cfg, model, args) == model.total_params
    else:  # the difference is stated in the export
        assert any("Megatron" in n for n in notes)


def test_megatron_moe_parts_use_the_alltoall_dispatcher(mcore):
    name, plan, preset = LAUNCHABLE[3]
    ex = megatron_export(plan, model=to.load_model(preset))
    cfg, _ = megatron_config(list(ex.model_args) + ex.blocks[0].argv())
    assert cfg.moe_token_dispatcher_type == "alltoall" and cfg.expert_model_parallel_size == 4


@pytest.mark.skipif(not os.environ.get("MEGATRON_LM"), reason="set MEGATRON_LM to a Megatron-LM checkout matching "
                    "the installed megatron-core to run its parse_args + validate_args")
@pytest.mark.parametrize("name, plan, preset", LAUNCHABLE, ids=[x[0] for x in LAUNCHABLE])
def test_megatron_lm_validate_args_accepts_launchable_plans(mcore, name, plan, preset):
    ex = megatron_export(plan, model=to.load_model(preset))
    b = ex.blocks[0]
    code = ("import sys, warnings; warnings.filterwarnings('ignore'); sys.path.insert(0, sys.argv[1]); "
            "import megatron.training.arguments as A; A.get_device_arch_version = lambda: 9; "  # no GPU: Hopper
            "from megatron.training.arguments import parse_args, validate_args, core_transformer_config_from_args; "
            "sys.argv = sys.argv[1:]; a = parse_args(); validate_args(a); c = core_transformer_config_from_args(a); "
            "print('DP', a.data_parallel_size)")
    env = {k: v for k, v in os.environ.items() if k != "CUDA_DEVICE_MAX_CONNECTIONS"}
    env.update(WORLD_SIZE=str(b.part.world_size), RANK="0")
    if b.env[:1] != ("-u",):
        env.update(dict(e.split("=", 1) for e in b.env))
    argv = list(ex.model_args) + b.argv() + ["--tokenizer-type", "NullTokenizer", "--vocab-size", "32000",
                                               "--mock-data", "--no-rope-fusion", "--transformer-impl", "local"]
    res = subprocess.run([sys.executable, "-c", code, os.environ["MEGATRON_LM"], *argv], capture_output=True, text=True,
                         env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"DP {b.part.dp}" in res.stdout


# --- DeepSpeed ------------------------------------------------------------------------------------------

class _Mpu:
    """The mpu interface DeepSpeedConfig asks for the data-parallel size (deepspeed/runtime/config.py)."""

    def __init__(self, dp: int):
        self.dp = dp

    def get_data_parallel_world_size(self) -> int:
        return self.dp

    def get_data_parallel_rank(self) -> int:
        return 0


def _deepspeed_check_plan(plan: Plan) -> None:
    from deepspeed.runtime.config import DeepSpeedConfig

    for p in deepspeed_parts(plan):
        if p.refusals:
            assert all("--launch deepspeed" in r for r in p.refusals)
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cfg = DeepSpeedConfig(dict(p.config), mpu=_Mpu(p.part.dp))
        assert cfg.train_batch_size == p.part.sequences_per_step
        assert cfg.gradient_accumulation_steps == p.part.num_micro_batches
        assert cfg.zero_optimization_stage == p.part.zero
        if p.part.pp > 1:
            assert cfg.zero_optimization_stage <= 1  # the pipeline engine's assertion


def _free_port() -> str:
    """A TCP port nobody listens on now (two test runs on one machine must not share the rendezvous)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return str(sock.getsockname()[1])


@pytest.fixture(scope="module")
def deepspeed():
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    ds = pytest.importorskip("deepspeed", reason="needs the frameworks extra (deepspeed)")
    import deepspeed.comm as dist

    if not dist.is_initialized():  # DeepSpeedConfig asks the mpu only inside an initialized process group
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("TANGRAM_TEST_PORT", _free_port()),
                          RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ds.init_distributed(dist_backend="gloo", verbose=False)
    return ds


@pytest.mark.parametrize("name, plan, preset", LAUNCHABLE, ids=[x[0] for x in LAUNCHABLE])
def test_deepspeed_config_accepts_every_launchable_plan(deepspeed, name, plan, preset):
    _deepspeed_check_plan(plan)


def test_deepspeed_accepts_every_written_part_of_the_benchmark_plans(deepspeed):
    for name, plan, preset in BENCHMARK:
        try:
            _deepspeed_check_plan(plan)
        except Exception as e:
            raise AssertionError(f"{name}: {e}") from e


# --- torchtitan -----------------------------------------------------------------------------------------

def _torchtitan_check_part(p, module: str, config: str) -> None:
    from torchtitan.config import ConfigManager
    from torchtitan.distributed.parallel_dims import ParallelDims

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            cfg = ConfigManager().parse_args(["--module", module, "--config", config, *p.args()])
        except ImportError as e:  # e.g. llama3_405b's float8 needs torchao: check the overrides on the debug model
            assert "torchao" in str(e), e
            cfg = ConfigManager().parse_args(["--module", module, "--config", f"{module}_debugmodel", *p.args()])
    par, tr = cfg.parallelism, cfg.training
    dims = ParallelDims(dp_replicate=par.data_parallel_replicate_degree, dp_shard=par.data_parallel_shard_degree,
                        cp=par.context_parallel_degree, tp=par.tensor_parallel_degree,
                        pp=par.pipeline_parallel_degree, ep=par.expert_parallel_degree, world_size=p.part.world_size)
    assert dims.dp_replicate * dims.dp_shard == p.part.dp
    assert tr.global_batch_size == p.part.sequences_per_step and tr.seq_len > 0
    if p.part.pp > 1:
        assert tr.local_batch_size // par.pipeline_parallel_microbatch_size == p.part.num_micro_batches
        fq = par.module_fqns_per_model_part
        assert [sum(n.startswith("layers.") for n in s) for s in fq] == list(p.part.layer_counts)
    kind = type(cfg.activation_checkpoint).__qualname__ if cfg.activation_checkpoint is not None else "none"
    assert kind.split(".")[0].lower().startswith({"selective": "selective", "full": "full",
                                                  "none": "none"}[p.part.recompute])


def _torchtitan_check_plan(plan: Plan, model) -> None:
    from tangram_opt.export.launch import TORCHTITAN_RECIPES

    module, config = TORCHTITAN_RECIPES.get(model.name, ("llama3", "llama3_debugmodel"))
    for p in torchtitan_parts(plan, model=model):
        if p.refusals:
            assert all("; " in r for r in p.refusals)
            continue
        _torchtitan_check_part(p, module, config)


@pytest.fixture(scope="module")
def torchtitan():
    tt = pytest.importorskip("torchtitan", reason="needs the frameworks extra (torchtitan)")
    pytest.importorskip("torchtitan.config.manager")
    return tt


@pytest.mark.parametrize("name, plan, preset", LAUNCHABLE, ids=[x[0] for x in LAUNCHABLE])
def test_torchtitan_accepts_every_launchable_plan(torchtitan, name, plan, preset):
    model = to.load_model(preset)
    reasons = launchable(plan, "torchtitan", model=model)
    assert reasons == [] or all("no model definition" in r for r in reasons)
    _torchtitan_check_plan(plan, model)


def test_torchtitan_accepts_every_written_part_of_the_benchmark_plans(torchtitan):
    for name, plan, preset in BENCHMARK:
        try:
            _torchtitan_check_plan(plan, to.load_model(preset))
        except Exception as e:
            raise AssertionError(f"{name}: {e}") from e


# --- the launch-target plans of the benchmark suite (benchmarks/launch_price.py) -------------------------

LAUNCH_PLANS_DIR = PLANS_DIR.parent / "launch_plans"


def _launch_target_plans() -> list[tuple[str, str, Plan]]:
    out = []
    for f in sorted(LAUNCH_PLANS_DIR.glob("*.json")):
        target = f.stem.rsplit("-", 1)[1]
        out.append((f.stem, target, Plan.load(f)))
    return out


LAUNCH_TARGET_PLANS = _launch_target_plans()


def test_the_suite_has_launch_target_plans_of_every_framework():
    assert {t for _, t, _ in LAUNCH_TARGET_PLANS} == {"megatron", "deepspeed", "torchtitan"}


@pytest.mark.parametrize("name, target, plan", LAUNCH_TARGET_PLANS, ids=[x[0] for x in LAUNCH_TARGET_PLANS])
def test_every_launch_target_plan_is_one_job_its_framework_accepts(mcore, deepspeed, torchtitan, name, target, plan):
    model = to.load_model(plan.model)
    assert launchable(plan, target, model=model) == [], name
    check = {"megatron": lambda: _megatron_check_plan(plan, model), "deepspeed": lambda: _deepspeed_check_plan(plan),
             "torchtitan": lambda: _torchtitan_check_plan(plan, model)}[target]
    check()
