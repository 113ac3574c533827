"""ModelSpec arithmetic: exact per-part parameter counts, layer kinds, the tangram file form."""

import pytest

from tangram_opt.errors import SpecError
from tangram_opt.specs import LAYER_KINDS, MLASpec, ModelSpec, MoESpec, load_model, model_from_dict


def tiny(**kw) -> ModelSpec:
    base = dict(name="tiny", num_layers=4, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4, vocab_size=100)
    return ModelSpec(**{**base, **kw})


def test_dense_llama_counts_by_hand():
    m = tiny(num_kv_heads=2)
    attn = 64 * 64 + 2 * 64 * 32 + 64 * 64  # q, k, v (2 KV heads x 16), o
    mlp = 3 * 64 * 128
    assert m.attention_params == attn and m.dense_mlp_params == mlp
    assert m.layer_params("dense") == attn + mlp + 2 * 64
    assert m.total_params == 4 * (attn + mlp + 128) + 100 * 64 + 64 + 100 * 64
    assert m.active_params == m.total_params and m.active_compute_params == m.total_params - 100 * 64


def test_opt_350m_layer_matches_sailor_profile():
    # Sailor's llm_info.json (OPT-350, tp 1) lists 12,596,224 parameters per transformer block.
    assert load_model("opt-350m").layer_params("dense") == 12_596_224


def test_gpt_neo_bias_layout():
    # GPT-Neo-2.7B block: q/k/v without bias, out_proj with bias, biased MLP, two LayerNorms.
    m = load_model("gpt-neo-2.7b")
    h = 2560
    assert m.layer_params("dense") == 4 * h * h + h + 2 * h * 4 * h + 4 * h + h + 4 * h


def test_moe_layer_counts_and_kinds():
    moe = MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=32, num_shared_experts=1,
                  shared_expert_ffn_hidden_size=64, shared_expert_gate=True, first_dense_layers=1, router_bias=True)
    m = tiny(moe=moe)
    assert m.layer_kinds == ("dense", "moe", "moe", "moe")
    assert (m.num_dense_layers, m.num_moe_layers) == (1, 3)
    assert m.expert_params == 3 * 64 * 32
    assert m.shared_expert_params == 3 * 64 * 64 + 64
    assert m.router_params == 64 * 8 + 8
    routed_total, routed_active = 8 * m.expert_params, 2 * m.expert_params
    assert m.layer_params("moe") - m.layer_active_params("moe") == routed_total - routed_active
    assert m.total_params - m.active_params == 3 * (routed_total - routed_active)
    assert sum(m.layers_of_kind(k) for k in LAYER_KINDS) == 4


def test_mla_attention_counts():
    mla = MLASpec(kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8, q_lora_rank=24)
    m = tiny(mla=mla)
    q = 64 * 24 + 24 + 24 * 4 * 12
    kv = 64 * (16 + 4) + 16 + 16 * 4 * (8 + 8)
    o = 4 * 8 * 64
    assert m.attention_params == q + kv + o
    no_q_lora = tiny(mla=MLASpec(kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8))
    assert no_q_lora.attention_params == 64 * 4 * 12 + kv + o


def test_embedding_projection_and_final_norm():
    m = tiny(embedding_dim=32, tied_embeddings=True, final_norm=False, norm_type="layernorm",
             position_embedding="learned", max_position_embeddings=10)
    assert m.embed_dim == 32
    assert m.embedding_params == 100 * 32 + 10 * 64 + 32 * 64
    assert m.head_params == 64 * 32  # project_out only: tied, no final norm
    assert m.lm_head_matmul_params == 100 * 32


def test_spellings_are_canonicalized_and_ints_normalized():
    m = tiny(mlp_type="SwiGLU", norm_type="RMSNorm", hidden_size=64.0)
    assert m.mlp_type == "swiglu" and m.norm_type == "rmsnorm"
    assert type(m.hidden_size) is int


def test_to_dict_round_trip_for_every_kind():
    for name in ("llama-3-8b", "qwen2-57b-a14b", "deepseek-v3", "opt-350m", "gpt-neo-2.7b"):
        m = load_model(name)
        assert model_from_dict(m.to_dict()) == m


def test_with_layers_keeps_a_moe_layer():
    v3 = load_model("deepseek-v3")
    small = v3.with_layers(2)
    assert small.num_layers == 2 and small.num_dense_layers == 1 and small.num_moe_layers == 1
    assert small.name == "deepseek-v3-2L"


def test_describe():
    text = load_model("mixtral-8x7b").describe()
    assert "46.70B parameters" in text and "12.88B active" in text and "8 experts top-2" in text


@pytest.mark.parametrize("kwargs, field", [
    (dict(num_kv_heads=3), "num_kv_heads"),
    (dict(num_layers=0), "num_layers"),
    (dict(mlp_type="geglu"), "mlp_type"),
    (dict(attention_bias="q"), "attention_bias"),
    (dict(tied_embeddings="no"), "tied_embeddings"),
    (dict(position_embedding="learned"), "max_position_embeddings"),
    (dict(name=""), "name"),
    (dict(moe=MoESpec(num_experts=4, top_k=1, expert_ffn_hidden_size=8, first_dense_layers=4)),
     "moe.first_dense_layers"),
    (dict(moe={"num_experts": 4}), "moe"),
    (dict(mla=MLASpec(kv_lora_rank=4, qk_nope_head_dim=4, qk_rope_head_dim=4, v_head_dim=4), attention_bias="all"),
     "attention_bias"),
])
def test_invalid_model_specs(kwargs, field):
    with pytest.raises(SpecError) as e:
        tiny(**kwargs)
    assert e.value.field == field
