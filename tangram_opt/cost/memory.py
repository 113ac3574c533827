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

What "selective" keeps depends on the framework (``CostModel(framework=...)``). Megatron-LM's
selective recomputation is Korthikanti's (above). torchtitan's ``selective_ac_option = "op"``
(``_apply_ac_to_transformer_block`` in torchtitan/parallelisms/parallelize_llama.py at 9dec370) is
PyTorch's selective activation checkpointing with a policy that saves the outputs of the ops in its
``_save_list`` (``aten.mm``, the SDPA flash / efficient kernels, ``reduce_scatter_tensor``), except
every second ``mm`` counted from the block's start, and recomputes everything else from the block's
input (:func:`sac_op_activation_bytes`, :func:`sac_op_recompute_shares`). Its loss is PyTorch's
eager ``cross_entropy`` on fp32-upcast logits (:func:`cross_entropy_bytes`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tangram_opt.cost.config import LayerCost
from tangram_opt.cost.flops import LayerParams
from tangram_opt.specs.model import ModelSpec
from tangram_opt.specs.training import TrainingSpec

MASK_BYTES = 1.0  # dropout masks are stored as one byte per element
#: How "selective" recomputation, the loss and ZeRO-3 gathers behave: "megatron" (Megatron-LM:
#: Korthikanti's selective recomputation, fused vocab-parallel cross-entropy) or "torchtitan"
#: (per-op selective activation checkpointing, eager cross-entropy, FSDP2's root unit kept gathered).
FRAMEWORKS = ("megatron", "torchtitan")


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


# --------------------------------------------------------------------------------------------------
# torchtitan: per-op selective activation checkpointing, eager cross-entropy
# --------------------------------------------------------------------------------------------------
def block_matmuls(m: ModelSpec, tp: int) -> list[tuple[str, float]]:
    """The ``aten.mm`` calls of one dense block in forward order, with output width per token on one
    GPU: torchtitan's Llama runs ``wq, wk, wv`` (separate linears), ``wo``, then the MLP ``w2(silu(w1(x))
    * w3(x))`` evaluates ``w1``, ``w3``, ``w2`` (a GeLU MLP: ``w1``, ``w2``). Column-parallel outputs are
    sharded by ``tp``; the row-parallel ``wo`` and ``w2`` write full-width partial sums before their
    reduce-scatter."""
    d, nh, nkv, h = m.head_size, m.num_attention_heads, m.kv_heads, m.hidden_size
    f = m.ffn_hidden_size / tp
    mms = [("wq", nh * d / tp), ("wk", nkv * d / tp), ("wv", nkv * d / tp), ("wo", float(h))]
    mms += [("w1", f), ("w3", f), ("w2", float(h))] if m.mlp_type == "swiglu" else [("w1", f), ("w2", float(h))]
    return mms


def sac_op_saved(m: ModelSpec, tp: int) -> list[str]:
    """The matmuls whose outputs torchtitan's "op" policy saves: the odd-numbered ``mm`` calls of the
    block (its policy counts them from 1 in a counter created per checkpointed call and skips every
    second one; Llama: ``wq, wv, w1, w2``)."""
    return [name for i, (name, _) in enumerate(block_matmuls(m, tp), start=1) if i % 2]


def sac_op_supported(m: ModelSpec, kind: str) -> bool:
    """Per-op SAC is modelled for dense blocks with MHA/GQA attention (torchtitan's Llama); MoE
    (grouped GEMMs) and MLA blocks keep Megatron's selective accounting."""
    return kind == "dense" and m.mla is None


def sac_op_activation_bytes(m: ModelSpec, sh: ActivationShape) -> float:
    """Bytes one dense block keeps from forward to backward under torchtitan's per-op SAC, one micro-batch.

    The checkpoint keeps the block's input (``e T h``, ``/ t`` with sequence parallelism), the outputs
    of the saved matmuls (:func:`sac_op_saved`), the attention kernel's output and its fp32
    log-sum-exp per row (``_scaled_dot_product_flash_attention`` is in the save list) and, with
    tensor + sequence parallelism, the two reduce-scatter outputs (``e T h / t`` each). Norms, RoPE,
    the activation function, residual adds and the unsaved matmuls are recomputed in the backward.
    Llama 3 8B at 2 x 8,192 tokens, bf16, ``t = 1``: 128 + 128 + 32 + 448 + 128 + 128 + 2 MiB = 994 MiB
    (Megatron's selective recomputation keeps 2,176 MiB).
    """
    e, t, tokens = sh.elt_bytes, sh.tp, sh.seq * sh.batch
    h = m.hidden_size
    rep = 1.0 / t if sh.sp else 1.0
    widths = dict(block_matmuls(m, t))
    total = e * tokens * h * rep  # checkpoint input
    total += e * tokens * sum(widths[n] for n in sac_op_saved(m, t))
    total += e * tokens * m.num_attention_heads * m.head_size / t  # attention output
    total += 4.0 * sh.batch * m.num_attention_heads * sh.seq / t  # log-sum-exp (fp32, per query row and head)
    if sh.sp and t > 1:
        total += 2.0 * e * tokens * h / t  # reduce_scatter_tensor outputs after wo and w2
    return total


def sac_op_recompute_shares(m: ModelSpec, tp: int) -> dict[str, float]:
    """Share of each forward GEMM of :func:`tangram_opt.cost.flops.block_ops` ("qkv", "out",
    "mlp.fc1", "mlp.fc2") that the backward recomputes under per-op SAC, by FLOPs: an unsaved matmul
    is recomputed unless it is the block's last (its output only feeds the residual add, which
    saves nothing; ``torch.utils.checkpoint`` stops recomputing once every needed tensor exists).
    Llama: ``wk``, ``wo`` and ``w3`` are recomputed, 36.5 % of the block's linear FLOPs."""
    mms = block_matmuls(m, tp)
    saved = set(sac_op_saved(m, tp))
    redo = {name for name, _ in mms[:-1] if name not in saved}
    widths = dict(mms)
    groups = {"qkv": ("wq", "wk", "wv"), "out": ("wo",), "mlp.fc1": ("w1", "w3") if "w3" in widths else ("w1",),
              "mlp.fc2": ("w2",)}
    return {op: sum(widths[n] for n in names if n in redo) / sum(widths[n] for n in names)
            for op, names in groups.items()}


def cross_entropy_bytes(tokens: float, vocab_local: float, e: float, framework: str) -> tuple[float, float]:
    """(peak allocated, peak reserved) bytes of the logits and the loss for ``tokens`` tokens.

    - megatron: the logits in the training dtype and one fp32 buffer, ``(e + 4) T V / t``: Megatron's
      vocab-parallel cross entropy computes the softmax in place in the fp32 copy and turns it into
      the logits' gradient in place (``VocabParallelCrossEntropy``).
    - torchtitan: ``cross_entropy(pred.flatten(0, 1).float(), labels)`` in eager PyTorch (train.py at
      9dec370). Forward: the logits (``e``), their fp32 copy and ``log_softmax``'s fp32 output, which
      autograd saves: ``(e + 8) T V`` (``e = 4``: ``.float()`` returns the logits themselves, ``8 T V``).
      The loop then frees the logits (``del pred`` before ``loss.backward()``). Backward:
      ``nll_loss_backward`` allocates a zeroed fp32 gradient and ``_log_softmax_backward_data`` a
      third fp32 buffer while the saved output is still held: ``12 T V``. Reserved: PyTorch's caching
      allocator keeps freed blocks cached instead of returning them, and a freed block serves only a
      request that fits in it; the freed 16-bit logits (``e T V``) cannot hold an fp32 buffer, so the
      backward's third buffer is a new segment and the reserved peak is ``(e + 12) T V`` (fp32: ``12``).
    """
    n = tokens * vocab_local
    if framework == "megatron":
        return (e + 4.0) * n, (e + 4.0) * n
    upcast = 4.0 if e < 4.0 else 0.0  # a separate fp32 copy only when the logits are 16-bit
    allocated = max(e + upcast + 4.0, 12.0) * n
    reserved = allocated + (e * n if e < 4.0 else 0.0)
    return allocated, reserved


def stage_peak_bytes(layers: Mapping[str, tuple[LayerCost, int]], inflight: int, *,
                     embedding: LayerCost | None = None, head: LayerCost | None = None,
                     reserved: bool = False) -> float:
    """Peak bytes per GPU of a stage: ``layers`` maps a kind to (its cost, how many), ``inflight``
    micro-batches hold activations (1F1B: ``pp - stage index``), ``embedding`` / ``head`` on the first
    / last stage. Static bytes and activations add up; the scratch of the pieces a stage runs one
    after another (a layer's backward working set, the embedding's buffer, the head's logits) is
    never live at once, so the largest counts (as in ``Candidate.memory_bytes`` and the simulator).
    ``reserved``: also the blocks PyTorch's caching allocator keeps cached at that peak
    (``breakdown["allocator_cached_bytes"]`` of the head), i.e. what ``torch.cuda.max_memory_reserved``
    reports rather than ``max_memory_allocated``."""
    total, scratch = 0.0, 0.0
    for cost, n in layers.values():
        total += n * (cost.static_bytes + cost.activation_bytes * inflight)
        if n:
            scratch = max(scratch, cost.transient_bytes)
    for piece in (embedding, head):
        if piece is not None:
            total += piece.static_bytes + piece.activation_bytes * inflight
            scratch = max(scratch, piece.transient_bytes)
    peak = total + scratch
    if reserved and head is not None:  # cached blocks never shrink the reserved peak
        peak = max(peak, total + head.transient_bytes + head.breakdown.get("allocator_cached_bytes", 0.0))
    return peak
