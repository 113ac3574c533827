"""Memory per GPU: ZeRO model states match the closed-form counts, activations match Korthikanti et al."""

from __future__ import annotations

import pytest

from tangram_opt import units as u
from tangram_opt.cost import CostModel, StageConfig
from tangram_opt.cost.flops import LayerParams, layer_params
from tangram_opt.cost.memory import ActivationShape, activation_bytes, korthikanti_bytes, model_state_bytes
from tangram_opt.specs import ModelSpec, MoESpec, NodeSpec, TrainingSpec, get_gpu_type, load_model


def gpt(h: int = 1024, heads: int = 16, layers: int = 4, vocab: int = 51200) -> ModelSpec:
    """A Megatron GPT block: 12 h^2 + 13 h parameters (biases everywhere, LayerNorm, 4h GeLU MLP)."""
    return ModelSpec(name="gpt", num_layers=layers, hidden_size=h, ffn_hidden_size=4 * h, num_attention_heads=heads,
                     vocab_size=vocab, mlp_type="gelu", norm_type="layernorm", attention_bias="all", mlp_bias=True,
                     position_embedding="learned", max_position_embeddings=2048)


def node8(gpu: str = "A100-80") -> NodeSpec:
    return NodeSpec(gpu=get_gpu_type(gpu), gpus_per_node=8, intra_node_link="nvlink3",
                    intra_node_bw_bytes_per_s=300 * u.GB_PER_S, intra_node_latency_s=3 * u.US,
                    nic_bw_bytes_per_s=8 * 200 * u.GBIT_PER_S)


def test_megatron_layer_params_split_is_exact():
    h = 1024
    p = layer_params(gpt(h), "dense")
    assert p.total == 12 * h * h + 13 * h == gpt(h).layer_params("dense")
    # sharded: QKV weight+bias, output weight, fc1 weight+bias, fc2 weight; replicated: 2 biases, 2 LayerNorms
    assert p.sharded == 12 * h * h + 7 * h
    assert p.replicated == 6 * h


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
@pytest.mark.parametrize("dp", [1, 4])
@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_zero_model_states_match_closed_form(tp, dp, zero):
    """Rajbhandari et al. 2020: 2 psi weights, 2 psi grads, 12 psi optimizer, divided by N_d per stage."""
    h = 1024
    m = gpt(h)
    t = TrainingSpec(global_batch_size=64, seq_len=2048, precision="bf16")
    cm = CostModel(m, t)
    c = cm.layer(node8(), StageConfig(tp=tp, dp=dp, zero=zero), "dense")
    psi = (12 * h * h + 7 * h) / tp + 6 * h  # per-GPU parameters under Megatron tensor parallelism
    nd = dp
    assert c.weight_bytes == pytest.approx(2 * psi / (nd if zero >= 3 else 1), rel=1e-12)
    assert c.grad_bytes == pytest.approx(2 * psi / (nd if zero >= 2 else 1), rel=1e-12)
    assert c.optimizer_bytes == pytest.approx(12 * psi / (nd if zero >= 1 else 1), rel=1e-12)
    assert c.static_bytes == pytest.approx(
        psi * (2 / (nd if zero >= 3 else 1) + 2 / (nd if zero >= 2 else 1) + 12 / (nd if zero >= 1 else 1)), rel=1e-12)


def test_zero_paper_example_7_5b():
    """ZeRO paper Fig. 1: 7.5B parameters, N_d = 64 -> 120 GB, 31.4 GB, 16.6 GB, 1.9 GB per GPU (rounded)."""
    params = LayerParams(sharded=7.5e9, replicated=0.0)
    t = TrainingSpec(global_batch_size=64, seq_len=2048, precision="fp16")
    expected = {0: 120e9, 1: 31.4e9, 2: 16.6e9, 3: 1.9e9}
    for zero, total in expected.items():
        s = model_state_bytes(params, t, tp=1, ep=1, dense_dp=64, expert_dp=1, zero=zero)
        assert s.weight_bytes + s.grad_bytes + s.optimizer_bytes == pytest.approx(total, rel=0.02)


def test_whole_model_static_bytes_sum_to_16_bytes_per_parameter():
    m = gpt(512, 8, layers=6, vocab=1000)
    t = TrainingSpec(global_batch_size=8, seq_len=512, precision="fp16")
    cm = CostModel(m, t)
    node, cfg = node8(), StageConfig()
    total = m.num_layers * cm.layer(node, cfg, "dense").static_bytes
    total += cm.embedding(node, cfg).static_bytes + cm.head(node, cfg).static_bytes
    assert total == pytest.approx(16 * m.total_params, rel=1e-12)


def test_expert_states_are_divided_by_ep_and_sharded_over_expert_dp():
    m = ModelSpec(name="moe", num_layers=2, hidden_size=512, ffn_hidden_size=2048, num_attention_heads=8,
                  vocab_size=1000, moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=1024))
    t = TrainingSpec(global_batch_size=8, seq_len=512)
    cm = CostModel(m, t, dropout=False)
    p = layer_params(m, "moe")
    assert p.total == m.layer_params("moe")
    node = node8()
    for ep in (1, 2, 4, 8):
        c = cm.layer(node, StageConfig(dp=8, ep=ep, zero=1), "moe")
        dense = p.sharded + p.replicated
        experts = p.experts / ep
        assert c.weight_bytes == pytest.approx(2 * (dense + experts))
        assert c.optimizer_bytes == pytest.approx(12 * (dense / 8 + experts / (8 // ep)))


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_activations_match_korthikanti_table2(tp, sp, recompute):
    """s b h (10 + 24/t + 5as/(ht)), s b h/t (34 + 5as/h), 34 s b h / t, 2 s b h (Korthikanti et al. 2022)."""
    s, b, h, a = 2048, 2, 6144, 64
    m = gpt(h, a)
    sh = ActivationShape(seq=s, seq_kv=s, batch=b, tp=tp, sp=sp, elt_bytes=2,
                         flash=False, attention_dropout=True, hidden_dropout=True)
    got = activation_bytes(m, "dense", sh, recompute)
    assert got == pytest.approx(korthikanti_bytes(s, b, h, a, tp, sp=sp, recompute=recompute), rel=1e-12)


def test_cost_model_activation_bytes_use_the_formulas():
    s, h, a = 2048, 12288, 96
    m = gpt(h, a)
    t = TrainingSpec(global_batch_size=64, seq_len=s, precision="fp16")
    cm = CostModel(m, t, attention_kernel="fused-softmax", dropout=True)
    for rc in ("none", "selective", "full"):
        c = cm.layer(node8(), StageConfig(tp=8, micro_batch_size=1, recompute=rc, sequence_parallel=True), "dense")
        assert c.activation_bytes == pytest.approx(korthikanti_bytes(s, 1, h, a, 8, sp=True, recompute=rc))


def test_flash_attention_keeps_no_score_matrix():
    s, b, h, a = 4096, 1, 4096, 32
    m = gpt(h, a)
    flash = ActivationShape(seq=s, seq_kv=s, batch=b, tp=1, sp=False, elt_bytes=2,
                            flash=True, attention_dropout=True, hidden_dropout=True)
    eager = ActivationShape(seq=s, seq_kv=s, batch=b, tp=1, sp=False, elt_bytes=2,
                            flash=False, attention_dropout=True, hidden_dropout=True)
    sel = activation_bytes(m, "dense", eager, "selective")
    assert activation_bytes(m, "dense", flash, "none") == pytest.approx(sel + 4.0 * b * a * s)  # + fp32 log-sum-exp
    assert activation_bytes(m, "dense", eager, "none") - sel == pytest.approx(5 * a * s * s * b)


def test_context_parallel_divides_activations():
    m = gpt(4096, 32)
    base = ActivationShape(seq=8192, seq_kv=8192, batch=1, tp=2, sp=True, elt_bytes=2,
                           flash=True, attention_dropout=False, hidden_dropout=False)
    cp4 = ActivationShape(seq=8192 / 4, seq_kv=8192, batch=1, tp=2, sp=True, elt_bytes=2,
                          flash=True, attention_dropout=False, hidden_dropout=False)
    for rc in ("none", "selective", "full"):
        assert activation_bytes(m, "dense", cp4, rc) == pytest.approx(activation_bytes(m, "dense", base, rc) / 4)


def test_fp32_activations_double_16_bit_without_masks():
    m = gpt(1024, 16)
    a16 = ActivationShape(seq=2048, seq_kv=2048, batch=1, tp=1, sp=False, elt_bytes=2,
                          flash=False, attention_dropout=False, hidden_dropout=False)
    a32 = ActivationShape(seq=2048, seq_kv=2048, batch=1, tp=1, sp=False, elt_bytes=4,
                          flash=False, attention_dropout=False, hidden_dropout=False)
    assert activation_bytes(m, "dense", a32, "none") == pytest.approx(2 * activation_bytes(m, "dense", a16, "none"))


def test_head_logits_are_transient_and_usable_memory_keeps_a_reserve():
    m = gpt(1024, 16, vocab=50304)
    t = TrainingSpec(global_batch_size=8, seq_len=2048)
    cm = CostModel(m, t)
    node = node8()
    head = cm.head(node, StageConfig(tp=2, micro_batch_size=2))
    assert head.transient_bytes == pytest.approx(2 * 2048 * 50304 / 2 * (2 + 4))  # logits + one fp32 buffer
    assert 0 < cm.usable_memory_bytes(node) < node.gpu.hbm_bytes


def test_dropout_memory_follows_the_model_opt_350m_on_v100():
    """OPT-350M trains with dropout 0.1 on the residual path and none on the attention probabilities
    (its config.json: attention_dropout 0.0): no score-sized mask or copy. V100 tp4, micro-batch 4,
    fp32, eager attention: Sailor's llm_info.json (shared/reference/profiles/sailor) records 104.5 MiB
    of activations per layer at tp 4 and micro-batch 1, 418 MiB at 4; with both kinds of dropout the
    layer would hold 708 MiB."""
    m = load_model("opt-350m")
    assert (m.attention_dropout, m.hidden_dropout) == (0.0, 0.1)
    t = TrainingSpec(global_batch_size=1024, seq_len=2048, precision="fp32")
    v100 = NodeSpec(gpu=get_gpu_type("V100-16"), gpus_per_node=4, intra_node_link="nvlink2",
                    intra_node_bw_bytes_per_s=150 * u.GB_PER_S, intra_node_latency_s=3 * u.US,
                    nic_bw_bytes_per_s=32 * u.GBIT_PER_S)
    cfg = StageConfig(tp=4, dp=16, micro_batch_size=4)
    own = CostModel(m, t).layer(v100, cfg, "dense").activation_bytes
    both = CostModel(m, t, dropout=True).layer(v100, cfg, "dense").activation_bytes
    none = CostModel(m, t, dropout=False).layer(v100, cfg, "dense").activation_bytes
    assert both / u.MiB == pytest.approx(708, abs=1)
    assert none < own < both
    assert own / u.MiB == pytest.approx(418, rel=0.10)
    # the residual masks are one byte per element of the (sequence-parallel) hidden state, two per layer
    assert own - none == pytest.approx(2 * 4 * 2048 * 1024 / 4)


def test_no_dropout_llama_keeps_no_masks():
    m = load_model("llama-3-8b")
    assert (m.attention_dropout, m.hidden_dropout) == (0.0, 0.0)
    t = TrainingSpec(global_batch_size=8, seq_len=4096)
    cfg = StageConfig(tp=2, dp=1, micro_batch_size=1)
    n = NodeSpec(gpu=get_gpu_type("H100-SXM"), gpus_per_node=8, intra_node_link="nvlink4",
                 intra_node_bw_bytes_per_s=450 * u.GB_PER_S, intra_node_latency_s=3 * u.US,
                 nic_bw_bytes_per_s=3200 * u.GBIT_PER_S)
    assert CostModel(m, t).layer(n, cfg, "dense") == CostModel(m, t, dropout=False).layer(n, cfg, "dense")
    assert CostModel(m, t, dropout=True).layer(n, cfg, "dense").activation_bytes > \
        CostModel(m, t).layer(n, cfg, "dense").activation_bytes
