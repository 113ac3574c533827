"""Per-layer time of the cost model: FLOP counts, rooflines, communication terms and validity checks."""

from __future__ import annotations

import math
import time

import pytest

from tangram_opt import units as u
from tangram_opt.cost import Calibration, CostModel, LayerCost, StageConfig, model_flops_per_token, pipeline_link
from tangram_opt.cost.flops import LayerShape, block_ops, layer_params
from tangram_opt.errors import SpecError
from tangram_opt.specs import MLASpec, ModelSpec, MoESpec, NodeSpec, TrainingSpec, ZoneLink, get_gpu_type


def gpt(h: int, heads: int, layers: int, vocab: int = 51200) -> ModelSpec:
    return ModelSpec(name="gpt", num_layers=layers, hidden_size=h, ffn_hidden_size=4 * h, num_attention_heads=heads,
                     vocab_size=vocab, mlp_type="gelu", norm_type="layernorm", attention_bias="all", mlp_bias=True,
                     position_embedding="learned", max_position_embeddings=2048, tied_embeddings=True)


LLAMA8 = ModelSpec(name="llama-3-8b", num_layers=32, hidden_size=4096, ffn_hidden_size=14336, num_attention_heads=32,
                   num_kv_heads=8, vocab_size=128256)
MIXTRAL = ModelSpec(name="mixtral-8x7b", num_layers=32, hidden_size=4096, ffn_hidden_size=14336,
                    num_attention_heads=32, num_kv_heads=8, vocab_size=32000,
                    moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=14336))
DSV2_LITE = ModelSpec(name="deepseek-v2-lite", num_layers=27, hidden_size=2048, ffn_hidden_size=10944,
                      num_attention_heads=16, vocab_size=102400,
                      mla=MLASpec(kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128),
                      moe=MoESpec(num_experts=64, top_k=6, expert_ffn_hidden_size=1408, num_shared_experts=2,
                                  first_dense_layers=1))


def node(gpu: str = "H100-SXM", per_node: int = 8, link_gbs: float = 450, nic_gbps: float = 3200) -> NodeSpec:
    return NodeSpec(gpu=get_gpu_type(gpu), gpus_per_node=per_node, intra_node_link="nvlink4",
                    intra_node_bw_bytes_per_s=link_gbs * u.GB_PER_S, intra_node_latency_s=3 * u.US,
                    nic_bw_bytes_per_s=nic_gbps * u.GBIT_PER_S)


# --- FLOPs and MFU ---------------------------------------------------------------------------------
@pytest.mark.parametrize("h,heads,layers", [(12288, 96, 96), (6144, 64, 48), (25600, 160, 128)])
def test_model_flops_per_step_is_narayanan_eq3(h, heads, layers):
    """72 B s l h^2 (1 + s/6h + V/12lh) (Narayanan et al. 2021, without recomputation)."""
    s, v, batch = 2048, 51200, 64
    cm = CostModel(gpt(h, heads, layers, v), TrainingSpec(global_batch_size=batch, seq_len=s))
    expected = 72 * batch * s * layers * h * h * (1 + s / (6 * h) + v / (12 * layers * h))
    assert cm.model_flops_per_step() == pytest.approx(expected, rel=1e-12)


def test_model_flops_per_token_is_6n_plus_attention_for_llama():
    """PaLM App. B: 6 N + 12 L H Q T per token, N = non-embedding matmul parameters + LM head."""
    m, s = LLAMA8, 8192
    mats = m.num_layers * (m.attention_params + m.dense_mlp_params) + m.vocab_size * m.hidden_size
    assert model_flops_per_token(m, s) == pytest.approx(6 * mats + 12 * m.num_layers * m.hidden_size * s)


def test_per_gpu_model_flops_add_up_to_the_step():
    m = LLAMA8
    t = TrainingSpec(global_batch_size=64, seq_len=4096)
    cm = CostModel(m, t)
    n = node()
    cfg = StageConfig(tp=2, cp=2, dp=2, micro_batch_size=2)
    per_mb = cfg.gpus * (m.num_layers * cm.layer(n, cfg, "dense").model_flops + cm.head(n, cfg).model_flops)
    micro_batches = t.global_batch_size / cfg.pipeline_micro_batch
    assert per_mb * micro_batches == pytest.approx(cm.model_flops_per_step(), rel=1e-12)


def test_gemm_flops_of_a_block_are_24_b_s_h2_forward():
    h, s, b = 4096, 2048, 2
    m = gpt(h, 32, 2)
    sh = LayerShape(tokens=b * s, seq_kv=s, batch=b, tp=1, sp=False, elt_bytes=2)
    fwd, bwd = block_ops(m, "dense", sh, kernel="fused-softmax", attention_dropout=True, hidden_dropout=True)
    gemm = sum(op.flops for op in fwd if op.unit == "gemm" and not op.name.startswith("attn"))
    attn = sum(op.flops for op in fwd if op.unit == "gemm" and op.name.startswith("attn"))
    assert gemm == pytest.approx(24 * b * s * h * h)
    assert attn == pytest.approx(4 * b * s * s * h)
    assert sum(op.flops for op in bwd if op.unit == "gemm") == pytest.approx(2 * (gemm + attn))


def test_flash_attention_skips_the_masked_half_and_recomputes_in_backward():
    h, s = 4096, 8192
    m = gpt(h, 32, 2)
    sh = LayerShape(tokens=s, seq_kv=s, batch=1, tp=1, sp=False, elt_bytes=2)
    fwd, bwd = block_ops(m, "dense", sh, kernel="flash", attention_dropout=False, hidden_dropout=False)
    f = next(op for op in fwd if op.name == "attn.flash")
    b = next(op for op in bwd if op.name == "attn.flash.bwd")
    assert f.flops == pytest.approx(0.5 * 4 * s * s * h)
    assert b.flops == pytest.approx(2.5 * f.flops)


def test_large_gemm_layer_runs_near_the_calibrated_matmul_efficiency():
    """A GEMM-dominated layer (h = 16384, flash) is within a few % of FLOPs / (peak x efficiency)."""
    m = ModelSpec(name="wide", num_layers=2, hidden_size=16384, ffn_hidden_size=65536, num_attention_heads=128,
                  vocab_size=32000)
    t = TrainingSpec(global_batch_size=8, seq_len=2048)
    cm = CostModel(m, t, dropout=False)
    n = node()
    c = cm.layer(n, StageConfig(micro_batch_size=2), "dense")
    cal = cm.calibration
    ideal = c.model_flops / (n.gpu.bf16_flops_per_s * cal.matmul("H100-SXM") * cal.step("H100-SXM"))
    assert 1.0 < c.time_s / ideal < 1.15


def test_efficiency_calibration_is_per_gpu_and_overridable():
    t = TrainingSpec(global_batch_size=8, seq_len=4096)
    slow = Calibration().with_gpu("H100-SXM", matmul_efficiency=0.4)
    fast, cal = CostModel(LLAMA8, t), CostModel(LLAMA8, t, calibration=slow)
    n, cfg = node(), StageConfig(micro_batch_size=1)
    assert cal.layer(n, cfg, "dense").time_s > 1.3 * fast.layer(n, cfg, "dense").time_s
    a100 = node("A100-80")
    assert cal.layer(a100, cfg, "dense").time_s == pytest.approx(fast.layer(a100, cfg, "dense").time_s)
    with pytest.raises(SpecError):
        Calibration(matmul_efficiency={"A100-80": 0.5})  # no "*" default


def test_fp32_uses_cuda_cores_unless_tf32():
    m = gpt(2560, 20, 4)
    t = TrainingSpec(global_batch_size=8, seq_len=2048, precision="fp32")
    n, cfg = node("A100-80"), StageConfig(micro_batch_size=1)
    ieee = CostModel(m, t).layer(n, cfg, "dense")
    tf32 = CostModel(m, t, fp32_matmul="tf32").layer(n, cfg, "dense")
    assert ieee.time_s > 2.5 * tf32.time_s
    v100 = node("V100-16")  # no TF32 on Volta: both modes run on CUDA cores
    assert CostModel(m, t, fp32_matmul="tf32").layer(v100, cfg, "dense").time_s == pytest.approx(
        CostModel(m, t).layer(v100, cfg, "dense").time_s)


# --- communication terms ---------------------------------------------------------------------------
def test_tensor_parallel_comm_is_exposed_and_grows_with_slower_links():
    t = TrainingSpec(global_batch_size=8, seq_len=4096)
    cm = CostModel(LLAMA8, t)
    cfg = StageConfig(tp=8, micro_batch_size=1)
    fast = cm.layer(node(link_gbs=450), cfg, "dense")
    slow = cm.layer(node(link_gbs=32), cfg, "dense")
    assert fast.breakdown["tp_comm"] > 0
    assert slow.time_s - fast.time_s == pytest.approx(slow.breakdown["tp_comm"] - fast.breakdown["tp_comm"])
    # SP: 2 all-gathers + 2 reduce-scatters per pass, the bytes of 2 all-reduces
    msg = 4096 * 4096 * 2
    expected = 2 * 2 * (2 * 7 / 8 * msg / (32 * u.GB_PER_S * 0.8) + 2 * 7 * 3 * u.US)  # (fwd+bwd) x 2 pairs
    assert slow.breakdown["tp_comm"] == pytest.approx(expected, rel=1e-9)


def test_moe_layer_pays_all_to_all_and_load_imbalance():
    t = TrainingSpec(global_batch_size=64, seq_len=4096)
    n = node()
    cfg = StageConfig(dp=8, ep=8, micro_batch_size=1)
    even = CostModel(MIXTRAL, t).layer(n, cfg, "moe")
    skew = CostModel(MIXTRAL, t, moe_load_imbalance=1.5).layer(n, cfg, "moe")
    assert even.breakdown["ep_comm"] > 0
    assert skew.time_s > even.time_s
    assert skew.model_flops == even.model_flops
    cross = node(per_node=4)  # EP 8 now crosses nodes: the all-to-all goes over the NIC
    assert CostModel(MIXTRAL, t).layer(cross, StageConfig(dp=8, ep=8), "moe").breakdown["ep_comm"] > \
        even.breakdown["ep_comm"]


def test_mla_model_costs_are_positive():
    t = TrainingSpec(global_batch_size=16, seq_len=4096)
    cm = CostModel(DSV2_LITE, t)
    n = node()
    for kind in ("dense", "moe"):
        c = cm.layer(n, StageConfig(tp=2, dp=4, ep=4, zero=1, micro_batch_size=1), kind)
        assert c.time_s > 0 and c.static_bytes > 0 and c.activation_bytes > 0
    assert layer_params(DSV2_LITE, "moe").total == DSV2_LITE.layer_params("moe")
    assert layer_params(DSV2_LITE, "dense").total == DSV2_LITE.layer_params("dense")


def test_zero3_gathers_and_data_parallel_sync_are_overlapped():
    t = TrainingSpec(global_batch_size=64, seq_len=4096)
    cm = CostModel(LLAMA8, t)
    n = node(nic_gbps=100)
    z3 = cm.layer(n, StageConfig(dp=16, zero=3, micro_batch_size=1), "dense")
    z1 = cm.layer(n, StageConfig(dp=16, zero=1, micro_batch_size=1), "dense")
    assert z3.weight_bytes < z1.weight_bytes
    assert z3.time_s >= z1.time_s
    assert z1.breakdown["grad_sync_total"] > 0
    no_overlap = CostModel(LLAMA8, t, calibration=Calibration(overlap_grad_reduce=False))
    z1_exposed = no_overlap.layer(n, StageConfig(dp=16, zero=1, micro_batch_size=1), "dense")
    assert z1_exposed.grad_sync_time_s == pytest.approx(z1.breakdown["grad_sync_total"])
    assert z1.grad_sync_time_s <= z1_exposed.grad_sync_time_s


def test_context_parallel_splits_attention_work():
    t = TrainingSpec(global_batch_size=8, seq_len=32768)
    cm = CostModel(LLAMA8, t, dropout=False)
    n = node()
    one = cm.layer(n, StageConfig(tp=1, cp=1, dp=8), "dense")
    cp4 = cm.layer(n, StageConfig(tp=1, cp=4, dp=2), "dense")
    assert cp4.activation_bytes == pytest.approx(one.activation_bytes / 4)
    assert cp4.breakdown["compute_fwd"] < 0.3 * one.breakdown["compute_fwd"]


def test_recomputation_adds_forward_work_to_backward():
    t = TrainingSpec(global_batch_size=8, seq_len=2048, precision="fp16")
    cm = CostModel(gpt(4096, 32, 4), t, attention_kernel="fused-softmax")
    n = node("A100-80")
    none, sel, full = (cm.layer(n, StageConfig(tp=2, recompute=r), "dense") for r in ("none", "selective", "full"))
    assert none.fwd_time_s == sel.fwd_time_s == full.fwd_time_s
    assert none.bwd_time_s < sel.bwd_time_s < full.bwd_time_s
    assert full.bwd_time_s == pytest.approx(none.bwd_time_s + none.fwd_time_s)


def test_pipeline_link_kinds():
    a, b = node(), node("A100-80", nic_gbps=800)
    lk = pipeline_link(a, b, None, intra_node=False)
    assert not lk.intra_node and lk.latency_s == a.nic_latency_s and math.isinf(lk.shared_bw_bytes_per_s)
    zl = ZoneLink(zone_a="x", zone_b="y", bw_bytes_per_s=10 * u.GBIT_PER_S, latency_s=2 * u.MS)
    lz = pipeline_link(a, b, zl, intra_node=False)
    assert lz.shared_bw_bytes_per_s == 10 * u.GBIT_PER_S and lz.latency_s == pytest.approx(lk.latency_s + 2 * u.MS)
    li = pipeline_link(a, a, None, intra_node=True)
    assert li.intra_node and li.latency_s == a.intra_node_latency_s


def test_p2p_is_priced_at_the_busiest_nic_of_either_side():
    """Each data-parallel replica sends its own share between its own nodes: a stage boundary
    spanning 1, 2 or 16 nodes per side moves the micro-batch through that many NICs at once."""
    t = TrainingSpec(global_batch_size=64, seq_len=4096)
    cm = CostModel(LLAMA8, t)
    assert cm.p2p_bytes(4) == 4 * 4096 * 4096 * 2
    n = node(per_node=8, nic_gbps=400)
    lk = pipeline_link(n, n, None, intra_node=False)
    eff = cm.calibration.network_efficiency
    total = cm.p2p_bytes(16)
    for nodes in (1, 2, 16):
        cfg = StageConfig(tp=8, dp=nodes, micro_batch_size=16 // nodes)  # whole nodes, 8 GPUs each
        got = cm.p2p_time_s((n, cfg), (n, cfg), lk)
        # each node holds 1/nodes of the micro-batch and pushes it through its own NIC
        assert got == pytest.approx(lk.latency_s + total / nodes / (n.nic_bw_bytes_per_s * eff))
    # the slower side sets the time: 1 node sending to 16
    one, wide = StageConfig(tp=8, dp=1, micro_batch_size=16), StageConfig(tp=8, dp=16, micro_batch_size=1)
    assert cm.p2p_time_s((n, one), (n, wide), lk) == pytest.approx(cm.p2p_time_s((n, one), (n, one), lk))
    # a stage smaller than a node gets its GPUs' share of the node's NIC
    half = StageConfig(tp=4, dp=1, micro_batch_size=16)
    assert cm.p2p_side_time_s(n, half, intra_node=False) == pytest.approx(
        total / (4 * n.nic_bw_bytes_per_s / 8 * eff))
    # without sequence parallelism every TP rank sends the whole replica's slice (tp times the bytes)
    no_sp = StageConfig(tp=8, dp=2, micro_batch_size=8, sequence_parallel=False)
    sp = StageConfig(tp=8, dp=2, micro_batch_size=8)
    assert cm.p2p_shard_bytes(no_sp) == pytest.approx(8 * cm.p2p_shard_bytes(sp))
    # context parallelism splits the tokens too
    assert cm.p2p_shard_bytes(StageConfig(tp=2, cp=4, dp=2, micro_batch_size=8)) == pytest.approx(total / 16)


def test_p2p_across_zones_is_capped_by_the_zone_link():
    t = TrainingSpec(global_batch_size=64, seq_len=4096)
    cm = CostModel(LLAMA8, t)
    n = node(per_node=8, nic_gbps=400)
    cfg = StageConfig(tp=8, dp=16, micro_batch_size=1)
    zl = ZoneLink(zone_a="x", zone_b="y", bw_bytes_per_s=100 * u.GBIT_PER_S, latency_s=5 * u.MS)
    inside = cm.p2p_time_s((n, cfg), (n, cfg), pipeline_link(n, n, None, intra_node=False))
    across = cm.p2p_time_s((n, cfg), (n, cfg), pipeline_link(n, n, zl, intra_node=False))
    eff = cm.calibration.network_efficiency
    assert across == pytest.approx(n.nic_latency_s + 5 * u.MS + cm.p2p_bytes(16) / (zl.bw_bytes_per_s * eff))
    assert across > 10 * inside
    # a fast zone link does not make the NICs faster
    fast = ZoneLink(zone_a="x", zone_b="y", bw_bytes_per_s=1e6 * u.GBIT_PER_S, latency_s=0.0)
    assert cm.p2p_time_s((n, cfg), (n, cfg), pipeline_link(n, n, fast, intra_node=False)) == pytest.approx(inside)
    # mixed micro-batches on the two sides are not a pipeline
    with pytest.raises(SpecError, match="micro_batch"):
        cm.p2p_time_s((n, cfg), (n, StageConfig(tp=8, dp=8, micro_batch_size=1)),
                      pipeline_link(n, n, None, intra_node=False))


def test_p2p_of_the_issue_example_is_about_thirteen_milliseconds():
    """32 A100-40 (nodes of 4, 50 Gb/s) after 96 V100-16 (nodes of 4, 32 Gb/s), OPT-350M in fp32,
    per-rank micro-batch 4: V100 tp4 dp16 sends to A100 tp2 dp16. The busiest NIC is an A100
    node receiving two replicas' shares, 67 MB at 50 Gb/s: ~11 ms at line rate, ~13 ms at 80%."""
    opt = ModelSpec(name="opt-350m", num_layers=24, hidden_size=1024, ffn_hidden_size=4096, num_attention_heads=16,
                    vocab_size=50272, mlp_type="relu", norm_type="layernorm", attention_bias="all", mlp_bias=True,
                    position_embedding="learned", max_position_embeddings=2050, embedding_dim=512,
                    final_norm=False)
    t = TrainingSpec(global_batch_size=1024, seq_len=2048, precision="fp32")
    cm = CostModel(opt, t)
    v100 = node("V100-16", per_node=4, link_gbs=150, nic_gbps=32)
    a100 = node("A100-40", per_node=4, link_gbs=300, nic_gbps=50)
    got = cm.p2p_time_s((v100, StageConfig(tp=4, dp=16, micro_batch_size=4)),
                        (a100, StageConfig(tp=2, dp=16, micro_batch_size=4)),
                        pipeline_link(v100, a100, None, intra_node=False))
    assert cm.p2p_bytes(64) == pytest.approx(537e6, rel=1e-3)
    line_rate = 2 * cm.p2p_bytes(64) / 16 / (50 * u.GBIT_PER_S)
    assert line_rate == pytest.approx(10.7e-3, rel=0.01)
    assert got == pytest.approx(line_rate / cm.calibration.network_efficiency, rel=0.01)
    assert 12e-3 <= got <= 14.5e-3  # within 10% of the ~13 ms estimate


# --- validity and contract -------------------------------------------------------------------------
def test_check_config_names_every_problem():
    t = TrainingSpec(global_batch_size=8, seq_len=4100)
    cm = CostModel(LLAMA8, t)
    problems = cm.check_config(node(per_node=4), StageConfig(tp=16, cp=4, dp=1))
    text = " | ".join(problems)
    assert "tp(16) does not divide KV heads (8)" in text
    assert "exceeds GPUs per node (4)" in text
    assert "seq_len (4100)" in text
    assert cm.check_config(node(), StageConfig(tp=8, dp=2)) == []
    dense_ep = cm.check_config(node(), StageConfig(dp=2, ep=2))
    assert any("dense model" in p for p in dense_ep)
    v100 = node("V100-16")
    assert any("bf16" in p for p in cm.check_config(v100, StageConfig()))
    assert any("neither a multiple nor a divisor" in p for p in cm.check_config(node(), StageConfig(dp=3)))


def test_layer_is_cached_deterministic_and_fast():
    t = TrainingSpec(global_batch_size=512, seq_len=4096)
    cm = CostModel(MIXTRAL, t)
    n = node()
    cfgs = [StageConfig(tp=tp, dp=dp, ep=ep, zero=z, recompute=r, micro_batch_size=b)
            for tp in (1, 2, 4, 8) for dp in (1, 2, 4, 8) for ep in (1, 2, 4, 8) if (dp % ep == 0)
            for z in (0, 1, 3) for r in ("none", "full") for b in (1, 2)]
    t0 = time.perf_counter()
    costs = [cm.layer(n, c, "moe") for c in cfgs]
    assert time.perf_counter() - t0 < 2.0
    assert all(isinstance(c, LayerCost) for c in costs)
    again = CostModel(MIXTRAL, t)
    assert [again.layer(n, c, "moe") for c in cfgs[:20]] == costs[:20]
    assert cm.layer(n, cfgs[0], "moe") is costs[0]


def test_embedding_and_head_cache_keys_only_what_they_read():
    """The vocabulary costs are shared across EP degrees (and, but for a fully recomputed head,
    recomputation modes); each shared value equals a fresh computation for that configuration."""
    t = TrainingSpec(global_batch_size=512, seq_len=4096)
    cm = CostModel(MIXTRAL, t)
    n = node()
    cfgs = [StageConfig(tp=tp, dp=dp, ep=ep, zero=z, recompute=r, micro_batch_size=b)
            for tp in (1, 4) for dp in (2, 8) for ep in (1, 2) for z in (0, 3)
            for r in ("none", "selective", "full") for b in (1, 2)]
    for c in cfgs:
        fresh = CostModel(MIXTRAL, t)
        assert cm.embedding(n, c) == fresh.embedding(n, c)
        assert cm.head(n, c) == fresh.head(n, c)
    base = StageConfig(tp=4, dp=8, ep=1, zero=1, recompute="none")
    assert cm.embedding(n, base) is cm.embedding(n, StageConfig(tp=4, dp=8, ep=2, zero=1, recompute="full"))
    assert cm.head(n, base) is cm.head(n, StageConfig(tp=4, dp=8, ep=2, zero=1, recompute="selective"))
    assert cm.head(n, base) != cm.head(n, StageConfig(tp=4, dp=8, zero=1, recompute="full"))


def test_moe_kind_on_dense_model_is_an_error():
    cm = CostModel(LLAMA8, TrainingSpec(global_batch_size=8, seq_len=4096))
    with pytest.raises(SpecError):
        cm.layer(node(), StageConfig(), "moe")
    with pytest.raises(SpecError):
        CostModel(LLAMA8, TrainingSpec(global_batch_size=8, seq_len=4096), moe_load_imbalance=0.5)
    assert math.isfinite(cm.head(node(), StageConfig()).time_s)


def test_model_flops_of_embedding_layers_and_head_add_up_with_projections():
    import dataclasses

    fields = {f.name for f in dataclasses.fields(ModelSpec)}
    extra = {"embedding_dim": 512} if "embedding_dim" in fields else {}
    m = ModelSpec(name="opt-like", num_layers=4, hidden_size=1024, ffn_hidden_size=4096, num_attention_heads=16,
                  vocab_size=50272, mlp_type="gelu", norm_type="layernorm", attention_bias="all", mlp_bias=True,
                  position_embedding="learned", max_position_embeddings=2050, **extra)
    t = TrainingSpec(global_batch_size=16, seq_len=2048)
    cm = CostModel(m, t)
    n, cfg = node(), StageConfig(tp=2, dp=2, micro_batch_size=2)
    per_mb = cfg.gpus * (m.num_layers * cm.layer(n, cfg, "dense").model_flops + cm.embedding(n, cfg).model_flops
                         + cm.head(n, cfg).model_flops)
    assert per_mb * t.global_batch_size / cfg.pipeline_micro_batch == pytest.approx(cm.model_flops_per_step())


# --- calibration files -------------------------------------------------------------------------------
def test_calibration_file_round_trip_and_errors_name_the_field(tmp_path):
    from tangram_opt.cost.calibration import calibration_from_dict, load_calibration, save_calibration

    cal = Calibration(kernel_overhead_s=6 * u.US).with_gpu("H100-SXM", matmul_efficiency=0.7)
    path = save_calibration(cal, tmp_path / "cal.yaml", gpus=["H100-SXM"], header="fitted here")
    back = load_calibration(path)
    assert back.matmul("H100-SXM") == 0.7 and back.kernel_overhead_s == pytest.approx(6 * u.US)
    assert back.matmul("A100-80") == cal.matmul("A100-80")
    assert path.read_text().startswith("# fitted here")
    # a file overrides only what it names; aliases resolve to catalog names
    part = calibration_from_dict({"gpus": {"h100": {"attention_efficiency": 0.5}}})
    assert part.attention("H100-SXM") == 0.5 and part.matmul("H100-SXM") == Calibration().matmul("H100-SXM")
    bad = [({"gpus": {"H100-SXM": {"matmul_efficiency": -1}}}, "calibration.gpus.H100-SXM.matmul_efficiency"),
           ({"gpus": {"X900": {"matmul_efficiency": 0.5}}}, "calibration.gpus.X900"),
           ({"kernel_overhead_us": 5000}, "calibration.kernel_overhead_us"),
           ({"gpus": {"H100-SXM": {"matmul": 0.5}}}, "matmul"),
           ({"network_efficiency": "fast"}, "calibration.network_efficiency"),
           ({"format": "other"}, "calibration.format")]
    for data, field in bad:
        with pytest.raises(SpecError, match=field.replace(".", r"\.")):
            calibration_from_dict(data)


def test_fp8_runs_the_linear_layers_at_the_fp8_peak_and_keeps_their_fp8_weights():
    from tangram_opt.specs import check_precision, load_cluster, load_model, make_cluster

    model = load_model("llama-3-8b")
    node = make_cluster("h", [dict(gpu="H100", nodes=1, gpus_per_node=8, nic_gbps=3200)]).node_groups[0].node
    cfg = StageConfig(tp=1, dp=8, zero=1, micro_batch_size=1)
    bf16 = CostModel(model, TrainingSpec(global_batch_size=64, seq_len=4096, precision="bf16"))
    fp8 = CostModel(model, TrainingSpec(global_batch_size=64, seq_len=4096, precision="fp8"))
    a, b = bf16.layer(node, cfg, "dense"), fp8.layer(node, cfg, "dense")
    # GEMMs at twice the rate, attention and memory-bound work (plus the FP8 casts) unchanged: a
    # block speeds up, but by less than 2x
    assert 1.2 < a.fwd_time_s / b.fwd_time_s < 2.0 and 1.2 < a.bwd_time_s / b.bwd_time_s < 2.0
    assert b.breakdown["attention_core_fwd"] == a.breakdown["attention_core_fwd"]
    # the LM head stays 16-bit (Megatron-LM's output layer is not a Transformer Engine layer)
    assert fp8.head(node, cfg).fwd_time_s == bf16.head(node, cfg).fwd_time_s
    # FP8 copies of the weights: 2 bytes per parameter on top of the bf16 weights
    params = model.layer_params("dense")
    assert b.weight_bytes - a.weight_bytes == pytest.approx(2 * params, rel=0.01)
    assert b.model_flops == a.model_flops
    with pytest.raises(SpecError) as exc:
        check_precision(TrainingSpec(global_batch_size=8, seq_len=1024, precision="fp8"), load_cluster("a100-v100"))
    assert "FP8" in str(exc.value) or "BF16" in str(exc.value)


def test_tp_comm_overlap_hides_tp_collectives_under_the_gemms_but_one_chunk():
    from tangram_opt.specs import load_model, make_cluster

    model = load_model("llama-2-13b")
    node = make_cluster("h", [dict(gpu="H100", nodes=1, gpus_per_node=8, nic_gbps=3200)]).node_groups[0].node
    t = TrainingSpec(global_batch_size=64, seq_len=4096)
    cfg = StageConfig(tp=8, dp=1, micro_batch_size=1)
    off = CostModel(model, t).layer(node, cfg, "dense")
    on = CostModel(model, t, calibration=Calibration(overlap_tp_comm=True)).layer(node, cfg, "dense")
    assert on.breakdown["compute_fwd"] == off.breakdown["compute_fwd"]
    # the GEMMs take longer than the collectives here: only one of tp chunks stays exposed
    assert on.breakdown["tp_comm"] == pytest.approx(off.breakdown["tp_comm"] / 8)
    assert on.fwd_time_s + on.bwd_time_s < off.fwd_time_s + off.bwd_time_s
    # without sequence parallelism (all-reduces) nothing is overlapped
    nosp = StageConfig(tp=8, dp=1, micro_batch_size=1, sequence_parallel=False)
    assert CostModel(model, t, calibration=Calibration(overlap_tp_comm=True)).layer(node, nosp, "dense") \
        .breakdown["tp_comm"] == CostModel(model, t).layer(node, nosp, "dense").breakdown["tp_comm"]
