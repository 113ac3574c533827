"""Memory per GPU: model states under ZeRO, and activations under recomputation, TP/SP and CP.

Model states (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion
Parameter Models", Sec. 3.1 and 5): with ``psi`` parameters on a GPU and ``N_d`` data-parallel
ranks, mixed-precision Adam keeps ``2 psi`` bytes of 16-bit weights, ``2 psi`` of 16-bit gradients
and ``K psi`` of optimizer state (K = 12: fp32 master weights, momentum, variance). ZeRO-1 divides
the optimizer state by ``N_d``, ZeRO-2 also the gradients, ZeRO-3 also the weights. The byte
counts per parameter come from :class:`~tangram_opt.specs.TrainingSpec`. Dense parameters are
sharded over the ``dp x cp`` ranks that hold replicas of them; routed-expert parameters over the
``dp x cp / ep`` ranks that hold the same experts (Megatron-core's expert-data-parallel group).

Activations (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
Models", Sec. 4, Table 2), per layer, 16-bit, with dropout, MHA and a 4h MLP:

- no parallelism:               ``s b h (34 + 5 a s / h)`` bytes
- tensor parallel (no SP):      ``s b h (10 + 24 / t + 5 a s / (h t))``
- tensor + sequence parallel:   ``s b h / t (34 + 5 a s / h)``
- + selective recomputation:    the ``5 a s / h`` term disappears (``34 s b h / t`` with SP)
- full recomputation:           ``2 s b h`` (only the layer input is kept; ``/ t`` with SP).

:func:`activation_bytes` rebuilds these numbers tensor by tensor (Korthikanti Sec. 4.1 lists
them), so the same code covers GQA, MLA, SwiGLU, any FFN width, MoE, fp32, flash attention (no
score matrix stored: the same as selective recomputation, Dao et al. 2022) and no dropout, and
reproduces the published formulas exactly where they apply (tested). Context parallelism divides
every per-token term by ``cp`` (each rank keeps its own ``s / cp`` tokens).
"""

from __future__ import annotations

from dataclasses import dataclass

from tangram_opt.cost.flops import LayerParams
from tangram_opt.specs.model import ModelSpec
from tangram_opt.specs.training import TrainingSpec

MASK_BYTES = 1.0  # dropout masks are stored as one byte per element


@dataclass(frozen=True, slots=True)
class StaticBytes:
    weight_bytes: float
    grad_bytes: float
    optimizer_bytes: float


def model_state_bytes(params: LayerParams, training: TrainingSpec, *, tp: int, ep: int, dense_dp: int,
                      expert_dp: int, zero: int) -> StaticBytes:
    """Weights, gradients and optimizer state per GPU for one layer (ZeRO, Rajbhandari et al. 2020)."""
    dense, expert = params.per_gpu(tp, ep)

    def shard(sharded: bool) -> float:
        return dense / dense_dp + expert / expert_dp if sharded else dense + expert

    return StaticBytes(weight_bytes=shard(zero >= 3) * training.weight_bytes,
                       grad_bytes=shard(zero >= 2) * training.grad_bytes,
                       optimizer_bytes=shard(zero >= 1) * training.optimizer_bytes)


@dataclass(frozen=True, slots=True)
class ActivationShape:
    """Per-GPU sizes for the activation count of one layer."""

    seq: float  # tokens per sequence on this GPU (seq_len / cp)
    seq_kv: float  # keys per query (seq_len)
    batch: float  # sequences (micro-batch size)
    tp: int
    sp: bool
    elt_bytes: float
    flash: bool  # fused attention kernel: no score matrix is kept
    attention_dropout: bool  # dropout on the attention probabilities (a mask per score)
    hidden_dropout: bool  # dropout on the attention and MLP outputs (a mask per residual-path element)


def activation_bytes(m: ModelSpec, kind: str, sh: ActivationShape, recompute: str, *,
                     expert_tokens: float = 0.0) -> float:
    """Bytes kept from forward to backward for one layer and one micro-batch on one GPU.

    Tensor by tensor as in Korthikanti et al. 2022, Sec. 4.1 (``e`` bytes per element, ``T = s b``):
    attention: norm input, QKV input, Q and K (score matmul inputs), V, softmax output, dropout mask
    and output (materialized attention only), output-projection input, dropout mask;
    MLP: norm input, fc1 input, activation input, fc2 input, dropout mask. Tensors that are sharded
    over TP are divided by ``t``; the ones replicated on every TP rank (norm and residual-path
    tensors) only with sequence parallelism. ``expert_tokens`` is the token-expert assignments
    processed by this GPU's experts (MoE layers).
    """
    e, t, tokens = sh.elt_bytes, sh.tp, sh.seq * sh.batch
    rep = 1.0 / t if sh.sp else 1.0  # replicated (residual-path) tensors
    h = m.hidden_size
    if recompute == "full":
        # only the layer input is checkpointed (Korthikanti Table 2: 2 s b h in 16-bit)
        return e * tokens * h * rep
    mask = MASK_BYTES if sh.hidden_dropout else 0.0
    nh = m.num_attention_heads
    if m.mla is not None:
        a = m.mla
        q_in = (a.q_lora_rank or 0) + (a.kv_lora_rank + a.qk_rope_head_dim)  # latents (replicated)
        qk = 2.0 * nh * a.qk_head_dim / t  # expanded Q and K
        v = nh * a.v_head_dim / t
        o = nh * a.v_head_dim / t
        attn_per_token = e * (h * rep + h * rep + q_in + qk + v + o) + mask * h * rep
    else:
        d, nkv = m.head_size, m.kv_heads
        # norm input, QKV input, Q and K, V, output-projection input, output dropout mask
        attn_per_token = e * (h * rep + h * rep + (nh + nkv) * d / t + nkv * d / t + nh * d / t) + mask * h * rep
    total = attn_per_token * tokens
    if recompute == "none" and not sh.flash:
        # softmax output, dropout mask, dropout output: (2e + 1) a s^2 b / t per layer (5 a s^2 b in 16-bit)
        scores = sh.batch * nh * sh.seq * sh.seq_kv / t
        total += scores * (e + (e + MASK_BYTES if sh.attention_dropout else 0.0))
    elif sh.flash and recompute == "none":
        # FlashAttention keeps the output (counted as the projection input) and one fp32 log-sum-exp per row
        total += 4.0 * sh.batch * nh * sh.seq / t
    # MLP / MoE
    if kind == "dense":
        total += tokens * _mlp_act_per_token(m, m.ffn_hidden_size / t, e, rep, mask)
    else:
        moe = m.moe
        assert moe is not None
        total += tokens * (e * h * rep + mask * h * rep + e * h * rep)  # norm input, dropout mask, router input
        if moe.num_shared_experts:
            ffn = moe.num_shared_experts * moe.shared_ffn_hidden_size / t
            total += tokens * _mlp_act_per_token(m, ffn, e, 0.0, 0.0)
        f = moe.expert_ffn_hidden_size / t
        gated = m.mlp_type == "swiglu"
        # per routed token copy: fc1 input (full hidden), activation input, fc2 input
        total += expert_tokens * e * (h + (2 * f if gated else f) + f)
    return total


def _mlp_act_per_token(m: ModelSpec, f_local: float, e: float, rep: float, mask: float) -> float:
    """Norm input, fc1 input, activation input, fc2 input, dropout mask (per token)."""
    h = m.hidden_size
    gated = m.mlp_type == "swiglu"
    act_in = 2 * f_local if gated else f_local
    return e * (h * rep + h * rep + act_in + f_local) + mask * h * rep


def korthikanti_bytes(s: int, b: int, h: int, a: int, t: int, *, sp: bool, recompute: str) -> float:
    """The published per-layer formulas (Korthikanti et al. 2022, Table 2), 16-bit with dropout."""
    if recompute == "full":
        return 2.0 * s * b * h / (t if sp else 1)
    attn = 0.0 if recompute == "selective" else 5.0 * a * s / h
    if sp:
        return s * b * h / t * (34.0 + attn)
    return s * b * h * (10.0 + 24.0 / t + attn / t)
