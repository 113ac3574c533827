"""Reading Hugging Face config.json files (tests/fixtures/hf_configs/<model_type>.json, shaped like the hub files)."""

import json
from pathlib import Path

import pytest

from tangram_opt.errors import FormatError, SpecError
from tangram_opt.specs import SUPPORTED_ARCHITECTURES, model_from_hf_config
from tangram_opt.specs.hf_config import architecture_of

FIXTURES = Path(__file__).parent / "fixtures" / "hf_configs"


def fixture(arch: str) -> dict:
    return json.loads((FIXTURES / f"{arch}.json").read_text())


#: Exact totals of the fixture models. Sources: Hugging Face model pages (safetensors parameter
#: count) for Llama-3.2-1B, Mistral-Nemo-Base-2407, Mixtral-8x7B, Qwen2-0.5B, OPT-125M and
#: GPT-Neo-125M; the Pythia paper (Biderman et al. 2023, Table 1) for Pythia-160M; the rounded figures
#: of the model cards for the rest (checked at 1% in test_presets.py).
EXACT_TOTALS = {
    "llama": 1_235_814_400,
    "mistral": 12_247_782_400,
    "mixtral": 46_702_792_704,
    "qwen2": 494_032_768,
    "opt": 125_239_296,
    "gpt_neox": 162_322_944,
    "gpt_neo": 125_198_592,
}

ROUNDED_TOTALS_B = {  # published (billions), tolerance (billions)
    "qwen2_moe": (14.3, 0.05),  # Qwen1.5-MoE-A2.7B card: 14.3B total
    "qwen3": (0.6, 0.05),  # Qwen3-0.6B card: 0.6B
    "qwen3_moe": (30.5, 0.05),  # Qwen3-30B-A3B card: 30.5B
    "deepseek_v2": (15.7, 0.05),  # DeepSeek-V2-Lite: 15.7B
    "deepseek_v3": (671, 1.0),  # DeepSeek-V3: 671B without the MTP module
}


def test_every_supported_architecture_has_a_fixture():
    assert sorted(p.stem for p in FIXTURES.glob("*.json")) == sorted(SUPPORTED_ARCHITECTURES)


@pytest.mark.parametrize("arch", sorted(SUPPORTED_ARCHITECTURES))
def test_each_architecture_loads_with_hub_extras_ignored(arch):
    data = fixture(arch)
    assert "transformers_version" in data and "architectures" in data  # real-shaped: hub extras present
    m = model_from_hf_config(data)
    assert m.architecture == arch
    assert m.total_params > 0 and m.active_params <= m.total_params
    assert m.name == data["_name_or_path"].split("/")[-1]


@pytest.mark.parametrize("arch", sorted(EXACT_TOTALS))
def test_exact_parameter_counts(arch):
    assert model_from_hf_config(fixture(arch)).total_params == EXACT_TOTALS[arch]


@pytest.mark.parametrize("arch", sorted(ROUNDED_TOTALS_B))
def test_rounded_parameter_counts(arch):
    published, tol = ROUNDED_TOTALS_B[arch]
    assert abs(model_from_hf_config(fixture(arch)).total_params / 1e9 - published) <= tol


def test_reads_path_to_file_and_to_directory(tmp_path):
    m_file = model_from_hf_config(FIXTURES / "llama.json")
    (tmp_path / "Llama-3.2-1B").mkdir()
    cfg = fixture("llama")
    del cfg["_name_or_path"]
    (tmp_path / "Llama-3.2-1B" / "config.json").write_text(json.dumps(cfg))
    m_dir = model_from_hf_config(str(tmp_path / "Llama-3.2-1B"))
    assert m_dir.name == "Llama-3.2-1B"  # named after the directory when _name_or_path is absent
    assert m_dir.total_params == m_file.total_params
    assert model_from_hf_config(FIXTURES / "llama.json", name="mine").name == "mine"


def test_architecture_from_architectures_when_model_type_missing():
    cfg = fixture("qwen2")
    del cfg["model_type"]
    assert architecture_of(cfg) == "qwen2"
    assert model_from_hf_config(cfg).total_params == EXACT_TOTALS["qwen2"]


def test_llama_defaults_and_tied_embeddings():
    m = model_from_hf_config(fixture("llama"))  # Llama-3.2-1B: GQA 32/8, head_dim 64, tied
    assert (m.num_attention_heads, m.kv_heads, m.head_size) == (32, 8, 64)
    assert m.tied_embeddings and m.head_params == m.hidden_size  # only the final norm
    cfg = fixture("llama")
    for key in ("num_key_value_heads", "head_dim", "tie_word_embeddings", "attention_bias", "mlp_bias"):
        cfg.pop(key, None)
    m2 = model_from_hf_config(cfg)
    assert m2.kv_heads == 32 and not m2.tied_embeddings  # transformers defaults: MHA, untied


def test_llama_attention_and_mlp_bias():
    base = model_from_hf_config(fixture("llama"))
    biased = model_from_hf_config(dict(fixture("llama"), attention_bias=True, mlp_bias=True))
    h, q, kv, ffn = 2048, 2048, 512, 8192
    assert biased.attention_params - base.attention_params == q + 2 * kv + h  # q, k, v and o biases
    assert biased.dense_mlp_params - base.dense_mlp_params == 2 * ffn + h  # gate, up and down biases


def test_mistral_explicit_head_dim():
    m = model_from_hf_config(fixture("mistral"))  # Mistral NeMo: 32 heads x 128 != hidden 5120
    assert m.head_size == 128 and m.hidden_size // m.num_attention_heads == 160
    assert m.attention_params == 5120 * 4096 * 2 + 2 * 5120 * 1024


def test_qwen2_has_qkv_bias_only():
    m = model_from_hf_config(fixture("qwen2"))
    assert m.attention_bias == "qkv"
    # Qwen2-0.5B: hidden 896, 14 heads x 64, 2 KV heads
    assert m.attention_params == 896 * 896 * 2 + 2 * 896 * 128 + 896 + 2 * 128


def test_qwen2_moe_shared_expert_and_gate():
    m = model_from_hf_config(fixture("qwen2_moe"))  # Qwen1.5-MoE-A2.7B
    assert m.moe.num_experts == 60 and m.moe.top_k == 4 and m.moe.expert_ffn_hidden_size == 1408
    assert m.moe.num_shared_experts == 1 and m.moe.shared_ffn_hidden_size == 5632 and m.moe.shared_expert_gate
    assert m.shared_expert_params == 3 * 2048 * 5632 + 2048  # shared MLP + Linear(hidden, 1) gate
    assert m.num_dense_layers == 0
    prefix = model_from_hf_config(dict(fixture("qwen2_moe"), mlp_only_layers=[0, 1]))
    assert prefix.num_dense_layers == 2 and prefix.ffn_hidden_size == 5632  # dense layers use intermediate_size


def test_qwen3_qk_norm_and_default_head_dim():
    m = model_from_hf_config(fixture("qwen3"))  # Qwen3-0.6B: hidden 1024, 16 heads x 128
    assert m.qk_norm and m.head_size == 128
    cfg = fixture("qwen3")
    del cfg["head_dim"]
    assert model_from_hf_config(cfg).head_size == 128  # Qwen3Config's own default


def test_qwen3_moe_has_no_shared_expert():
    m = model_from_hf_config(fixture("qwen3_moe"))
    assert m.moe.num_shared_experts == 0 and m.shared_expert_params == 0
    assert (m.moe.num_experts, m.moe.top_k, m.moe.expert_ffn_hidden_size) == (128, 8, 768)


def test_deepseek_v2_lite_mla_without_query_compression():
    m = model_from_hf_config(fixture("deepseek_v2"))
    assert m.mla.q_lora_rank is None and m.mla.kv_lora_rank == 512 and m.mla.qk_head_dim == 192
    assert m.num_dense_layers == 1 and m.num_moe_layers == 26
    assert m.moe.num_shared_experts == 2 and not m.moe.router_bias  # greedy top-k: no correction bias


def test_deepseek_v3_dense_prefix_and_router_bias():
    m = model_from_hf_config(fixture("deepseek_v3"))
    assert m.num_dense_layers == 3 and m.num_moe_layers == 58  # first_k_dense_replace = 3
    assert m.moe.router_bias  # topk_method noaux_tc: e_score_correction_bias
    assert m.router_params == 256 * 7168 + 256
    assert m.layer_kinds[:4] == ("dense", "dense", "dense", "moe")
    no_bias = model_from_hf_config(dict(fixture("deepseek_v3"), topk_method="greedy"))
    assert m.total_params - no_bias.total_params == 58 * 256


def test_deepseek_without_routed_experts_is_dense():
    m = model_from_hf_config(dict(fixture("deepseek_v2"), n_routed_experts=None))
    assert m.moe is None and m.num_dense_layers == 27


def test_opt_350m_projection_positions_and_post_ln():
    m = model_from_hf_config(fixture("opt"))
    assert m.max_position_embeddings == 2048 + 2  # OPTLearnedPositionalEmbedding offset
    assert m.attention_bias == "all" and m.mlp_bias and m.mlp_type == "relu" and m.final_norm
    opt350 = dict(fixture("opt"), hidden_size=1024, ffn_dim=4096, num_attention_heads=16, num_hidden_layers=24,
                  word_embed_proj_dim=512, do_layer_norm_before=False)
    m350 = model_from_hf_config(opt350)
    assert m350.embed_dim == 512 and not m350.final_norm  # post-LN OPT has no final layer norm
    assert m350.embedding_params == 50272 * 512 + 2050 * 1024 + 512 * 1024  # + project_in
    assert m350.head_params == 1024 * 512  # project_out; lm_head tied, no final norm
    assert m350.total_params == 331_196_416


def test_opt_without_bias():
    m = model_from_hf_config(dict(fixture("opt"), enable_bias=False))
    assert m.attention_bias == "none" and not m.mlp_bias
    assert m.attention_params == 4 * 768 * 768


def test_gpt_neox_fused_qkv_bias_and_untied_head():
    m = model_from_hf_config(fixture("gpt_neox"))
    assert m.attention_bias == "all" and m.mlp_bias and not m.tied_embeddings and m.norm_type == "layernorm"
    parallel_off = model_from_hf_config(dict(fixture("gpt_neox"), use_parallel_residual=False, rotary_pct=1.0))
    assert parallel_off.total_params == m.total_params  # dataflow options, same weights


def test_gpt_neo_output_bias_only_and_learned_positions():
    m = model_from_hf_config(fixture("gpt_neo"))
    assert m.attention_bias == "out" and m.attention_params == 4 * 768 * 768 + 768
    assert m.position_embedding == "learned" and m.max_position_embeddings == 2048
    assert m.ffn_hidden_size == 4 * 768  # intermediate_size null
    assert m.tied_embeddings


def test_unsupported_interleaving_names_the_field():
    with pytest.raises(SpecError, match="interleaves dense and MoE") as e:
        model_from_hf_config(dict(fixture("qwen3_moe"), decoder_sparse_step=2))
    assert e.value.field == "decoder_sparse_step" and "dense layer comes before" in str(e.value)
    with pytest.raises(SpecError, match=r"MoE at layers 0-2, 4-23, dense at 3") as e:
        model_from_hf_config(dict(fixture("qwen2_moe"), mlp_only_layers=[3]))
    assert e.value.field == "mlp_only_layers"
    with pytest.raises(SpecError, match="interleaves") as e:
        model_from_hf_config(dict(fixture("deepseek_v3"), moe_layer_freq=2))
    assert e.value.field == "moe_layer_freq"


def test_missing_and_mistyped_fields_name_the_field():
    cfg = fixture("mixtral")
    del cfg["num_local_experts"]
    with pytest.raises(SpecError, match=r"num_local_experts = None: is required in a mixtral config\.json") as e:
        model_from_hf_config(cfg)
    assert "Fix:" in str(e.value)
    with pytest.raises(SpecError, match=r"num_hidden_layers = '24': must be a JSON number.*without quotes"):
        model_from_hf_config(dict(fixture("qwen2"), num_hidden_layers="24"))
    with pytest.raises(SpecError, match=r"rotary_pct = 1\.5: must be a fraction"):
        model_from_hf_config(dict(fixture("gpt_neox"), rotary_pct=1.5))
    with pytest.raises(SpecError, match=r"attention_types = .*expands to 10 layers but num_layers is 12"):
        model_from_hf_config(dict(fixture("gpt_neo"), attention_types=[[["global", "local"], 5]]))


def test_unknown_architecture_suggests_and_lists():
    with pytest.raises(SpecError, match=r"model_type = 'qwen3-mo'.*did you mean 'qwen3_moe'") as e:
        model_from_hf_config(dict(fixture("qwen2"), model_type="qwen3-mo"))
    assert e.value.field == "model_type"
    assert model_from_hf_config(dict(fixture("qwen2_moe"), model_type="Qwen2-MoE")).architecture == "qwen2_moe"
    with pytest.raises(SpecError, match=r"model_type = 'gemma2': is not a supported architecture.*supported: llama"):
        model_from_hf_config(dict(fixture("llama"), model_type="gemma2"))


def test_file_errors(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text('{"model_type": "llama",\n "hidden_size": 4096,\n}')
    with pytest.raises(FormatError, match=r"not valid JSON \(line 3, column 1"):
        model_from_hf_config(bad)
    with pytest.raises(FormatError, match="directory without a config.json"):
        model_from_hf_config(tmp_path / ".." / tmp_path.name / "..")
    with pytest.raises(FormatError, match="file not found"):
        model_from_hf_config(tmp_path / "nope.json")
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(FormatError, match="holds a JSON list, not an object"):
        model_from_hf_config(tmp_path / "list.json")


# --- dropout ---------------------------------------------------------------------------------

def test_dropout_probabilities_follow_each_architectures_field_names():
    opt = model_from_hf_config(fixture("opt"))  # OPT-125M: dropout 0.1, attention_dropout 0.0
    assert (opt.attention_dropout, opt.hidden_dropout) == (0.0, 0.1)
    llama = model_from_hf_config(fixture("llama"))  # attention_dropout 0.0, no hidden dropout at all
    assert (llama.attention_dropout, llama.hidden_dropout) == (0.0, 0.0)
    neox = fixture("gpt_neox")
    for k in ("attention_dropout", "hidden_dropout", "attention_probs_dropout_prob", "hidden_dropout_prob"):
        neox.pop(k, None)
    old = model_from_hf_config({**neox, "attention_probs_dropout_prob": 0.1, "hidden_dropout_prob": 0.2})
    new = model_from_hf_config({**neox, "attention_dropout": 0.1, "hidden_dropout": 0.2})
    assert (old.attention_dropout, old.hidden_dropout) == (new.attention_dropout, new.hidden_dropout) == (0.1, 0.2)
    neo = model_from_hf_config({**fixture("gpt_neo"), "resid_dropout": 0.1, "embed_dropout": 0.1,
                                "attention_dropout": 0.05})
    assert (neo.attention_dropout, neo.hidden_dropout) == (0.05, 0.1)


def test_dropout_that_is_not_modelled_or_out_of_range_is_refused():
    with pytest.raises(SpecError, match="activation_dropout"):
        model_from_hf_config({**fixture("opt"), "activation_dropout": 0.1})
    with pytest.raises(SpecError, match="embed_dropout"):
        model_from_hf_config({**fixture("gpt_neo"), "resid_dropout": 0.0, "embed_dropout": 0.1})
    with pytest.raises(SpecError, match=r"attention_dropout.*\[0, 1\)"):
        model_from_hf_config({**fixture("llama"), "attention_dropout": 1.5})
