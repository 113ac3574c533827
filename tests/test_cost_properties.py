"""Properties the planner relies on (hypothesis): positive and finite; memory non-increasing in ZeRO
stage, tp and recomputation; time non-increasing in bandwidth."""

from __future__ import annotations

import math
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tangram_opt import units as u
from tangram_opt.cost import RECOMPUTE_MODES, CostModel, LayerCost, StageConfig, pipeline_link
from tangram_opt.specs import MLASpec, ModelSpec, MoESpec, NodeSpec, TrainingSpec, get_gpu_type

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
GPUS = ("A100-80", "H100-SXM", "V100-16", "L4", "RTX-3090", "MI300X")


@st.composite
def models(draw) -> ModelSpec:
    heads = draw(st.sampled_from([8, 16, 32]))
    head_dim = draw(st.sampled_from([32, 64, 128]))
    h = heads * head_dim
    kv = draw(st.sampled_from([k for k in (1, 2, 4, 8, heads) if heads % k == 0]))
    moe = None
    if draw(st.booleans()):
        experts = draw(st.sampled_from([4, 8, 16]))
        moe = MoESpec(num_experts=experts, top_k=draw(st.integers(1, 2)),
                      expert_ffn_hidden_size=draw(st.sampled_from([256, 512, 1024])),
                      num_shared_experts=draw(st.integers(0, 1)), first_dense_layers=1)
    mla = None
    if draw(st.booleans()):
        mla = MLASpec(kv_lora_rank=128, qk_nope_head_dim=64, qk_rope_head_dim=32, v_head_dim=64,
                      q_lora_rank=draw(st.sampled_from([None, 256])))
    return ModelSpec(name="m", num_layers=4, hidden_size=h, ffn_hidden_size=draw(st.sampled_from([2 * h, 4 * h])),
                     num_attention_heads=heads, num_kv_heads=None if mla else kv, vocab_size=draw(
                         st.sampled_from([1000, 32000])), mlp_type=draw(st.sampled_from(["swiglu", "gelu"])),
                     moe=moe, mla=mla)


@st.composite
def setups(draw):
    m = draw(models())
    precision = draw(st.sampled_from(["bf16", "fp16", "fp32"]))
    gpu = get_gpu_type(draw(st.sampled_from(GPUS)))
    if precision == "bf16" and not gpu.supports("bf16"):
        precision = "fp16"
    t = TrainingSpec(global_batch_size=64, seq_len=draw(st.sampled_from([512, 1024, 2048])), precision=precision)
    node = NodeSpec(gpu=gpu, gpus_per_node=8, intra_node_link="nvlink3",
                    intra_node_bw_bytes_per_s=draw(st.sampled_from([16, 64, 300])) * u.GB_PER_S,
                    intra_node_latency_s=3 * u.US, nic_bw_bytes_per_s=draw(st.sampled_from([25, 200, 3200]))
                    * u.GBIT_PER_S)
    tp = draw(st.sampled_from([t_ for t_ in (1, 2, 4) if m.num_attention_heads % (2 * t_) == 0]))
    cp = draw(st.sampled_from([1, 2]))
    dp = draw(st.sampled_from([1, 2, 4, 8]))
    ep = 1
    if m.moe is not None:
        ep = draw(st.sampled_from([e for e in (1, 2, 4) if (dp * cp) % e == 0 and m.moe.num_experts % e == 0]))
    cfg = StageConfig(tp=tp, cp=cp, dp=dp, ep=ep, zero=draw(st.integers(0, 3)),
                      recompute=draw(st.sampled_from(RECOMPUTE_MODES)), micro_batch_size=draw(st.integers(1, 4)),
                      sequence_parallel=draw(st.booleans()))
    cm = CostModel(m, t, moe_load_imbalance=draw(st.sampled_from([1.0, 1.7])), dropout=draw(st.booleans()))
    return cm, node, cfg


def costs(cm: CostModel, node: NodeSpec, cfg: StageConfig) -> list[LayerCost]:
    out = [cm.embedding(node, cfg), cm.head(node, cfg), cm.layer(node, cfg, "dense")]
    if cm.model.moe is not None:
        out.append(cm.layer(node, cfg, "moe"))
    return out


@SETTINGS
@given(setups())
def test_everything_is_positive_and_finite(setup):
    cm, node, cfg = setup
    for c in costs(cm, node, cfg):
        for name in ("fwd_time_s", "bwd_time_s", "weight_bytes", "grad_bytes", "optimizer_bytes", "activation_bytes",
                     "transient_bytes", "optimizer_time_s"):
            v = getattr(c, name)
            assert math.isfinite(v) and v > 0, (name, v)
        assert math.isfinite(c.grad_sync_time_s) and c.grad_sync_time_s >= 0
        assert math.isfinite(c.model_flops) and c.model_flops >= 0
    link = pipeline_link(node, node, None, intra_node=False)
    assert cm.p2p_time_s((node, cfg), (node, cfg), link) > 0
    assert cm.model_flops_per_step() > 0


@SETTINGS
@given(setups())
def test_memory_never_increases_with_zero_stage(setup):
    cm, node, cfg = setup
    prev = None
    for z in (0, 1, 2, 3):
        cur = costs(cm, node, replace(cfg, zero=z))
        if prev is not None:
            for a, b in zip(prev, cur):
                assert b.static_bytes <= a.static_bytes * (1 + 1e-12)
                assert b.activation_bytes == a.activation_bytes
                # a stage of two or more layers: ZeRO-3's gathered layer is paid back by the sharded weights
                assert 2 * b.static_bytes + b.transient_bytes <= (2 * a.static_bytes + a.transient_bytes) * (1 + 1e-12)
        prev = cur


@SETTINGS
@given(setups())
def test_memory_never_increases_with_tp(setup):
    cm, node, cfg = setup
    lo = replace(cfg, tp=1)
    for tp in (2, 4):
        if cm.model.num_attention_heads % tp:
            break
        hi = replace(cfg, tp=tp)
        for a, b in zip(costs(cm, node, lo), costs(cm, node, hi)):
            assert b.static_bytes <= a.static_bytes * (1 + 1e-12)
            assert b.activation_bytes <= a.activation_bytes * (1 + 1e-12)
            assert b.transient_bytes <= a.transient_bytes * (1 + 1e-12)
        lo = hi


@SETTINGS
@given(setups())
def test_memory_never_increases_with_recomputation(setup):
    cm, node, cfg = setup
    prev = None
    for r in RECOMPUTE_MODES:
        cur = costs(cm, node, replace(cfg, recompute=r))
        if prev is not None:
            for a, b in zip(prev, cur):
                assert b.static_bytes == a.static_bytes
                assert b.activation_bytes <= a.activation_bytes * (1 + 1e-12)
                assert b.transient_bytes <= a.transient_bytes * (1 + 1e-12)
                assert b.time_s >= a.time_s * (1 - 1e-12)  # and it costs time
        prev = cur


@SETTINGS
@given(setups(), st.sampled_from([0.5, 0.1, 0.01]), st.booleans())
def test_time_never_decreases_when_bandwidth_drops(setup, factor, which):
    cm, node, cfg = setup
    slow = replace(node, intra_node_bw_bytes_per_s=node.intra_node_bw_bytes_per_s * (factor if which else 1.0),
                   nic_bw_bytes_per_s=node.nic_bw_bytes_per_s * (1.0 if which else factor))
    for a, b in zip(costs(cm, node, cfg), costs(cm, slow, cfg)):
        assert b.fwd_time_s >= a.fwd_time_s * (1 - 1e-12)
        assert b.bwd_time_s >= a.bwd_time_s * (1 - 1e-12)
        assert b.grad_sync_time_s >= a.grad_sync_time_s * (1 - 1e-12) - 1e-15
    for intra in (False, True):
        fast_link, slow_link = (pipeline_link(x, x, None, intra_node=intra) for x in (node, slow))
        assert cm.p2p_time_s((slow, cfg), (slow, cfg), slow_link) >= cm.p2p_time_s((node, cfg), (node, cfg), fast_link)
