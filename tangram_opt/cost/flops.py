"""FLOPs, bytes and kernels of one transformer layer on one GPU: the operation inventory.

Every layer is broken into operations, each with the FLOPs it executes and the bytes it moves, so
:mod:`tangram_opt.cost.model` can put each one on a roofline (``max(flops / achievable FLOP/s,
bytes / achievable bytes/s)`` plus a per-kernel overhead). Sizes are per GPU after tensor (``tp``),
context (``cp``) and expert (``ep``) parallelism. Sources:

- Matmul FLOPs are ``2 m n k`` per GEMM; a backward pass runs two GEMMs of the same size per
  forward GEMM (input gradient and weight gradient), so it costs 2x the forward FLOPs (Narayanan et
  al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", Sec. 5.1).
- Attention scores and the weighted sum are ``2 s_q s_kv d`` FLOPs per head each (same source).
  Materialized ("eager", "fused-softmax") attention computes the full square and masks it;
  FlashAttention skips fully masked blocks under a causal mask (half the square) and recomputes
  the scores in its backward, which therefore runs 5 matmuls for the forward's 2 (Dao 2023,
  "FlashAttention-2", Sec. 3.1).
- Mixture-of-experts layers route each token to ``top_k`` experts; the experts of one EP rank
  process ``top_k / ep`` of the tokens of its expert-parallel group, times the load imbalance
  (max/mean tokens per rank). Shared experts and the router see every token (DeepSeek-V2/V3,
  Qwen2-MoE).
- Multi-head latent attention (DeepSeek-V2, Sec. 2.1): queries and keys/values are compressed to
  ``q_lora_rank`` / ``kv_lora_rank`` and expanded per head; the score matmul uses
  ``qk_nope_head_dim + qk_rope_head_dim`` per head and the value matmul ``v_head_dim``.
- Memory-bound element-wise kernels (norms, residual adds with dropout, activation functions,
  rotary embedding, softmax) are counted in bytes read plus written; their backward moves about
  twice the forward bytes (gradient in, saved input, gradient out).
"""

from __future__ import annotations

from dataclasses import dataclass

from tangram_opt.specs.model import ModelSpec

#: How the attention core (scores, softmax, weighted sum) runs.
#: "flash": fused kernel (FlashAttention / cuDNN / TE fused attention), no score matrix in memory;
#: "fused-softmax": score matrix materialized, scale+mask+softmax fused in one kernel (Megatron-LM's
#: FusedScaleMaskSoftmax, 16-bit only); "eager": materialized with separate mask and softmax kernels
#: (PyTorch eager, and Megatron in fp32).
ATTENTION_KERNELS = ("flash", "fused-softmax", "eager")

#: Passes over the score matrix (element reads + writes) of the softmax part of materialized
#: attention, excluding the two batched matmuls' own write (scores) and read (probabilities).
#: "fused-softmax" (Megatron-LM's FusedScaleMaskSoftmax): forward reads and writes once (2);
#: backward reads the probabilities and their gradient and writes one gradient (3).
#: "eager" (unfused PyTorch: a scale and a mask kernel, then softmax): each element-wise kernel reads
#: and writes once (2 x 2); PyTorch's softmax over rows longer than 1,024 reads a row three times
#: (max, sum of exponentials, normalize) and writes once (4). Backward: the two element-wise kernels
#: again (2 x 2), softmax backward reads output and gradient twice (reduction, then update) and
#: writes once (5). Dropout on the probabilities adds a read and a write plus a 1-byte mask each way.
_SOFTMAX_PASSES_FWD = {"fused-softmax": 2.0, "eager": 8.0}
_SOFTMAX_PASSES_BWD = {"fused-softmax": 3.0, "eager": 9.0}
_DROPOUT_PASSES_FWD = 2.0
_DROPOUT_PASSES_BWD = 2.0
#: FlashAttention's backward runs 5 matmuls of the forward's size class for the forward's 2.
FLASH_BWD_FLOP_RATIO = 2.5


@dataclass(frozen=True, slots=True)
class Op:
    """One kernel class of a layer: FLOPs executed, bytes moved, how many launches.

    ``unit`` picks the roofline ceiling: "gemm" (matmul peak), "attention" (fused attention
    efficiency) or "memory" (bandwidth only).
    """

    name: str
    flops: float
    bytes: float
    unit: str
    kernels: int = 1
    #: for GEMMs: the matrix shapes executed, ``(m, n, k, count)`` each (``count`` GEMMs of ``m x k``
    #: by ``k x n``, batched or grouped); their ``2 m n k count`` add up to ``flops``. Empty when the
    #: shape is unknown: the GEMM then runs at the GPU's large-GEMM efficiency.
    gemms: tuple[tuple[float, float, float, float], ...] = ()


@dataclass(frozen=True, slots=True)
class LayerParams:
    """Parameters of one layer split by how tensor parallelism stores them.

    ``sharded`` are divided across the TP ranks (column/row-parallel weights and column-parallel
    biases); ``replicated`` sit whole on every TP rank (norm weights, row-parallel output biases,
    the router, MLA down-projections and their norms). ``experts`` are all routed experts' matrices
    (sharded over TP and split over EP); ``expert_replicated`` their row-parallel biases.
    ``matmul_active`` counts the weights one token multiplies with (top-k routed experts only, no
    biases or norms): the parameter count of the MFU formula.
    """

    sharded: float
    replicated: float
    experts: float = 0.0
    expert_replicated: float = 0.0
    matmul_active: float = 0.0

    @property
    def total(self) -> float:
        return self.sharded + self.replicated + self.experts + self.expert_replicated

    def per_gpu(self, tp: int, ep: int) -> tuple[float, float]:
        """(dense, expert) parameters one GPU holds."""
        return self.sharded / tp + self.replicated, (self.experts / tp + self.expert_replicated) / ep


def _mlp_split(m: ModelSpec, ffn: int) -> tuple[float, float, float]:
    """(sharded, replicated, matmul) parameters of one MLP of width ``ffn``."""
    h = m.hidden_size
    mats = 3 if m.mlp_type == "swiglu" else 2
    weights = mats * h * ffn
    if m.mlp_bias:
        # column-parallel input biases are sharded; the row-parallel output bias is replicated
        return weights + (mats - 1) * ffn, float(h), weights
    return weights, 0.0, weights


def attention_matrices(m: ModelSpec) -> tuple[float, float]:
    """(tensor-parallel, replicated) attention weight-matrix parameters (no biases, no norms)."""
    h, nh = m.hidden_size, m.num_attention_heads
    if m.mla is not None:
        a = m.mla
        down = 0.0
        if a.q_lora_rank:
            down += h * a.q_lora_rank
            q_up = a.q_lora_rank * nh * a.qk_head_dim
        else:
            q_up = h * nh * a.qk_head_dim
        down += h * (a.kv_lora_rank + a.qk_rope_head_dim)
        kv_up = a.kv_lora_rank * nh * (a.qk_nope_head_dim + a.v_head_dim)
        o = nh * a.v_head_dim * h
        return float(q_up + kv_up + o), float(down)
    d, nkv = m.head_size, m.kv_heads
    return float(h * nh * d + 2 * h * nkv * d + nh * d * h), 0.0


def layer_params(m: ModelSpec, kind: str) -> LayerParams:
    """Exact parameters of one block, split as tensor parallelism stores them (Megatron-LM layout)."""
    h = m.hidden_size
    tp_mats, rep_mats = attention_matrices(m)
    attn_total = float(m.attention_params)
    attn_vectors = attn_total - tp_mats - rep_mats
    # Vectors: q/k/v biases are column-parallel (sharded), the output bias and norms are replicated.
    out_bias = float(h) if m.attention_bias in ("all", "out") else 0.0
    replicated_vectors = out_bias
    if m.mla is not None:
        replicated_vectors = attn_vectors  # MLA's low-rank norms (and any bias) sit with the down-projections
    elif m.qk_norm:
        replicated_vectors += 2.0 * m.head_size
    sharded = tp_mats + (attn_vectors - replicated_vectors)
    replicated = rep_mats + replicated_vectors + 2.0 * m.norm_params
    matmul = tp_mats + rep_mats
    if kind == "dense":
        s, r, mm = _mlp_split(m, m.ffn_hidden_size)
        return LayerParams(sharded=sharded + s, replicated=replicated + r, matmul_active=matmul + mm)
    moe = m.moe
    assert moe is not None, "moe layer of a dense model"
    es, er, emm = _mlp_split(m, moe.expert_ffn_hidden_size)
    shared_s, shared_r, shared_mm = 0.0, 0.0, 0.0
    if moe.num_shared_experts:
        ss, sr, smm = _mlp_split(m, moe.shared_ffn_hidden_size)
        shared_s, shared_r, shared_mm = moe.num_shared_experts * ss, moe.num_shared_experts * sr, \
            moe.num_shared_experts * smm
        if moe.shared_expert_gate:
            shared_r += h
            shared_mm += h
    router = float(m.router_params)
    return LayerParams(sharded=sharded + shared_s, replicated=replicated + shared_r + router,
                       experts=moe.num_experts * es, expert_replicated=moe.num_experts * er,
                       matmul_active=matmul + shared_mm + h * moe.num_experts + moe.top_k * emm)


@dataclass(frozen=True, slots=True)
class LayerShape:
    """Everything the op inventory needs about one layer's per-GPU shape (plain numbers)."""

    tokens: float  # tokens this GPU's GEMMs see (micro-batch x seq_len / cp)
    seq_kv: float  # keys each query attends to (the full sequence, also under context parallelism)
    batch: float  # sequences per GPU (micro-batch)
    tp: int
    sp: bool  # sequence parallelism: norms/dropout/residuals on tokens / tp
    elt_bytes: float  # bytes per activation element
    causal: bool = True


def _gemm(name: str, m: float, n: float, k: float, e: float, *, count: float = 1.0) -> Op:
    """``count`` GEMMs of ``(m x k) @ (k x n)``: tokens x input width by input x output width."""
    return Op(name, 2.0 * m * n * k * count, e * count * (m * k + k * n + m * n), "gemm", gemms=((m, n, k, count),))


def _gemm_bwd(fwd: Op) -> Op:
    # input gradient (m x n) @ (n x k) and weight gradient (k x m) @ (m x n): two GEMMs of the
    # forward's FLOPs, reading/writing ~2x its bytes; their shapes put the forward's k and m on the
    # reduction dimension instead
    shapes = tuple(g for m, n, k, c in fwd.gemms for g in ((m, k, n, c), (k, n, m, c)))
    return Op(fwd.name + ".bwd", 2.0 * fwd.flops, 2.0 * fwd.bytes, fwd.unit, 2 * fwd.kernels, gemms=shapes)


#: Bytes moved per element to quantize a GEMM operand for FP8 (Transformer Engine): read the bf16
#: tensor (2) and write its FP8 copy twice, row-wise for this GEMM and column-wise (transposed) for
#: the backward GEMM that reads it along the other dimension (1 + 1).
FP8_CAST_BYTES = 4.0


def fp8_linear_ops(fwd: list[Op], e: float) -> tuple[list[Op], dict[str, float]]:
    """``fwd`` with the linear layers' GEMMs in FP8 (unit ``gemm_fp8``, 1-byte operands) and a
    quantization pass before each (``FP8_CAST_BYTES`` per input element); returns the ops and, per
    cast op, the bytes of its backward (quantizing the output gradient, m x n elements).

    What runs in FP8 follows Transformer Engine in Megatron-LM: the projections and MLPs of every
    block (experts included). The attention core, the router and the LM head stay 16-bit."""
    out: list[Op] = []
    bwd_cast: dict[str, float] = {}
    for op in fwd:
        if op.unit != "gemm" or not op.gemms or op.name.startswith("attn.") or op.name == "router":
            out.append(op)
            continue
        inputs = sum(c * (m * k + k * n) for m, n, k, c in op.gemms)
        outputs = sum(c * m * n for m, n, k, c in op.gemms)
        cast = Op(op.name + ".fp8_cast", 0.0, FP8_CAST_BYTES * sum(c * m * k for m, n, k, c in op.gemms), "memory")
        bwd_cast[cast.name] = FP8_CAST_BYTES * outputs
        out += [cast, Op(op.name, op.flops, 1.0 * inputs + e * outputs, "gemm_fp8", op.kernels, op.gemms)]
    return out, bwd_cast


def attention_core_ops(m: ModelSpec, sh: LayerShape, kernel: str, dropout: bool) -> tuple[list[Op], list[Op]]:
    """Forward and backward ops of scores + softmax + weighted sum for one layer on one GPU
    (``dropout``: attention dropout on the probabilities)."""
    nh = m.num_attention_heads / sh.tp
    if m.mla is not None:
        dqk, dv = float(m.mla.qk_head_dim), float(m.mla.v_head_dim)
        nkv = nh  # MLA expands keys and values per head before the core
    else:
        dqk = dv = float(m.head_size)
        nkv = m.kv_heads / sh.tp
    e = sh.elt_bytes
    t, skv = sh.tokens, sh.seq_kv
    qkvo_bytes = e * t * (nh * dqk + nh * dv) + e * sh.batch * skv * nkv * (dqk + dv)
    full_flops = 2.0 * t * skv * nh * (dqk + dv)  # QK^T plus PV over the full square
    if kernel == "flash":
        flops = full_flops * (0.5 if sh.causal else 1.0)
        fwd = [Op("attn.flash", flops, qkvo_bytes, "attention")]
        bwd = [Op("attn.flash.bwd", FLASH_BWD_FLOP_RATIO * flops, 2.0 * qkvo_bytes, "attention", 1)]
        return fwd, bwd
    scores = t * skv * nh  # elements of the score matrix
    mask_b = 1.0  # dropout masks are stored as bytes
    sq, heads = t / sh.batch, sh.batch * nh  # one batched GEMM per sequence and head
    qk = Op("attn.qk", 2.0 * t * skv * nh * dqk, e * (t * nh * dqk + sh.batch * skv * nkv * dqk + scores), "gemm",
            gemms=((sq, skv, dqk, heads),))
    pv = Op("attn.pv", 2.0 * t * skv * nh * dv, e * (scores + sh.batch * skv * nkv * dv + t * nh * dv), "gemm",
            gemms=((sq, dv, skv, heads),))
    sm_fwd = _SOFTMAX_PASSES_FWD[kernel] * e * scores
    sm_bwd = _SOFTMAX_PASSES_BWD[kernel] * e * scores
    n_sm = 1 if kernel == "fused-softmax" else 3
    if dropout:
        sm_fwd += _DROPOUT_PASSES_FWD * e * scores + mask_b * scores
        sm_bwd += _DROPOUT_PASSES_BWD * e * scores + mask_b * scores
        n_sm += 1
    fwd = [qk, Op("attn.softmax", 5.0 * scores, sm_fwd, "memory", n_sm), pv]
    bwd = [_gemm_bwd(pv), Op("attn.softmax.bwd", 8.0 * scores, sm_bwd, "memory", n_sm), _gemm_bwd(qk)]
    return fwd, bwd


def block_ops(m: ModelSpec, kind: str, sh: LayerShape, *, kernel: str, attention_dropout: bool, hidden_dropout: bool,
              tokens_per_expert_rank: float = 0.0, local_experts: int | None = None,
              fp8: bool = False) -> tuple[list[Op], list[Op]]:
    """Forward and backward ops of one transformer block on one GPU (no communication).

    ``attention_dropout``: dropout on the attention probabilities (materialized attention keeps a
    mask; FlashAttention regenerates it from the RNG state); ``hidden_dropout``: dropout on the
    attention and MLP outputs before each residual add.

    ``tokens_per_expert_rank`` is, for MoE layers, the token-expert assignments this GPU's experts
    process (``tokens * top_k * imbalance``; see :class:`tangram_opt.cost.model.CostModel`), spread
    over its ``local_experts`` (``num_experts / ep``; default all of them). ``fp8``: the linear
    layers run as FP8 GEMMs with their quantization passes (:func:`fp8_linear_ops`).
    """
    h, tp, e, t = m.hidden_size, sh.tp, sh.elt_bytes, sh.tokens
    t_sp = t / tp if sh.sp else t  # tokens the replicated element-wise kernels process
    fwd: list[Op] = []
    # --- attention projections (QKV column-parallel, output row-parallel) ----------------------
    if m.mla is not None:
        a = m.mla
        nh = m.num_attention_heads
        if a.q_lora_rank:
            fwd.append(_gemm("q_down", t, a.q_lora_rank, h, e))
            fwd.append(_gemm("q_up", t, nh * a.qk_head_dim / tp, a.q_lora_rank, e))
        else:
            fwd.append(_gemm("q", t, nh * a.qk_head_dim / tp, h, e))
        fwd.append(_gemm("kv_down", t, a.kv_lora_rank + a.qk_rope_head_dim, h, e))
        fwd.append(_gemm("kv_up", t, nh * (a.qk_nope_head_dim + a.v_head_dim) / tp, a.kv_lora_rank, e))
        fwd.append(_gemm("out", t, h, nh * a.v_head_dim / tp, e))
        rope_elems = t * (nh / tp + 1) * a.qk_rope_head_dim
        fwd.append(Op("mla.norms", 0.0, 2.0 * e * t * ((a.q_lora_rank or 0) + a.kv_lora_rank), "memory", 2))
    else:
        d, nh, nkv = m.head_size, m.num_attention_heads, m.kv_heads
        fwd.append(_gemm("qkv", t, (nh + 2 * nkv) * d / tp, h, e))
        fwd.append(_gemm("out", t, h, nh * d / tp, e))
        rope_elems = t * (nh + nkv) * d / tp
    if m.position_embedding == "rope":
        fwd.append(Op("rope", 0.0, 2.0 * e * rope_elems, "memory"))
    core_fwd, core_bwd = attention_core_ops(m, sh, kernel, attention_dropout)
    fwd.extend(core_fwd)
    # --- norms and residual adds (replicated across TP unless sequence parallel) ---------------
    norm_bytes = 2.0 * e * t_sp * h  # read x, write y (statistics are negligible)
    res_bytes = 3.0 * e * t_sp * h + (t_sp * h if hidden_dropout else 0.0)  # read x and residual, write, mask
    fwd += [Op("norm1", 0.0, norm_bytes, "memory"), Op("norm2", 0.0, norm_bytes, "memory"),
            Op("residual1", 0.0, res_bytes, "memory"), Op("residual2", 0.0, res_bytes, "memory")]
    # --- MLP ------------------------------------------------------------------------------------
    if kind == "dense":
        fwd += _mlp_ops(m, "mlp", t, m.ffn_hidden_size, tp, e)
    else:
        moe = m.moe
        assert moe is not None
        fwd.append(Op("router", 2.0 * t * h * moe.num_experts, e * (t * h + h * moe.num_experts)
                      + 4.0 * t * moe.num_experts * 3, "gemm", 3, gemms=((t, moe.num_experts, h, 1.0),)))
        if moe.num_shared_experts:
            fwd += _mlp_ops(m, "shared", t, moe.num_shared_experts * moe.shared_ffn_hidden_size, tp, e)
        fwd += _mlp_ops(m, "experts", tokens_per_expert_rank, moe.expert_ffn_hidden_size, tp, e,
                        weight_sets=max(1, local_experts or moe.num_experts))
        fwd.append(Op("moe.permute", 0.0, 4.0 * e * tokens_per_expert_rank * h, "memory", 2))
    bwd_cast: dict[str, float] = {}
    if fp8:
        fwd, bwd_cast = fp8_linear_ops(fwd, e)
    bwd: list[Op] = list(core_bwd)
    for op in fwd:
        if op.name.startswith("attn."):
            continue
        if op.name in bwd_cast:
            bwd.append(Op(op.name + ".bwd", 0.0, bwd_cast[op.name], "memory"))
        elif op.unit in ("gemm", "gemm_fp8"):
            bwd.append(_gemm_bwd(op))
        else:
            bwd.append(Op(op.name + ".bwd", 2.0 * op.flops, 2.0 * op.bytes, op.unit, op.kernels, op.gemms))
    return fwd, bwd


def _mlp_ops(m: ModelSpec, name: str, tokens: float, ffn: float, tp: int, e: float, *,
             weight_sets: int = 1) -> list[Op]:
    """fc1 (gate+up fused for SwiGLU), activation, fc2 on ``tokens`` tokens, width ``ffn`` split by tp."""
    h = m.hidden_size
    gated = m.mlp_type == "swiglu"
    f = ffn / tp
    width1 = 2 * f if gated else f
    # grouped GEMM over the local experts (``weight_sets`` of them, the tokens split evenly): each
    # expert's weights are read once
    per_set = tokens / weight_sets
    fc1 = _gemm(f"{name}.fc1", per_set, width1, h, e, count=weight_sets)
    fc2 = _gemm(f"{name}.fc2", per_set, h, f, e, count=weight_sets)
    act = Op(f"{name}.act", (4.0 if gated else 8.0) * tokens * f, e * tokens * (3 * f if gated else 2 * f),
             "memory")
    return [fc1, act, fc2]


def head_ops(m: ModelSpec, tokens: float, tp: int, sp: bool, e: float) -> tuple[list[Op], list[Op]]:
    """Final norm, LM head (vocab-parallel) and softmax cross-entropy on fp32 logits."""
    h = m.hidden_size
    emb = getattr(m, "embed_dim", None) or h
    v = m.vocab_size / tp
    t_sp = tokens / tp if sp else tokens
    fwd = []
    if getattr(m, "final_norm", True):
        fwd.append(Op("final_norm", 0.0, 2.0 * e * t_sp * h, "memory"))
    if emb != h:
        fwd.append(_gemm("project_out", tokens, emb, h, e))
    fwd.append(_gemm("lm_head", tokens, v, emb, e))
    # cross-entropy: cast logits to fp32, max, exp-sum, gather target; writes softmax for backward
    fwd.append(Op("cross_entropy", 5.0 * tokens * v, (e + 4.0 * 3) * tokens * v, "memory", 4))
    bwd = [Op("cross_entropy.bwd", 2.0 * tokens * v, (4.0 * 2 + e) * tokens * v, "memory", 2)]
    for op in fwd:
        if op.unit == "gemm":
            bwd.append(_gemm_bwd(op))
        elif op.name != "cross_entropy":
            bwd.append(Op(op.name + ".bwd", 0.0, 2.0 * op.bytes, "memory"))
    return fwd, bwd


def embedding_ops(m: ModelSpec, tokens: float, tp: int, sp: bool, e: float, dropout: bool) -> tuple[
        list[Op], list[Op]]:
    """Token embedding lookup (vocab-parallel), learned positions, project_in, embedding dropout."""
    h = m.hidden_size
    emb = getattr(m, "embed_dim", None) or h
    fwd = [Op("embedding.lookup", 0.0, e * tokens * emb * 2 + 8.0 * tokens, "memory", 2)]
    if m.position_embedding == "learned":
        fwd.append(Op("embedding.positions", 0.0, 3.0 * e * tokens * h, "memory"))
    if emb != h:
        fwd.append(_gemm("project_in", tokens, h, emb, e))
    if dropout:
        t_sp = tokens / tp if sp else tokens
        fwd.append(Op("embedding.dropout", 0.0, 2.0 * e * t_sp * h + t_sp * h, "memory"))
    # backward: scatter-add of the output gradient into the (vocab-parallel) table
    bwd = [Op("embedding.lookup.bwd", 0.0, 3.0 * e * tokens * emb, "memory", 2)]
    for op in fwd[1:]:
        bwd.append(_gemm_bwd(op) if op.unit == "gemm" else Op(op.name + ".bwd", 0.0, 2.0 * op.bytes, "memory"))
    return fwd, bwd


def model_flops_per_token(m: ModelSpec, seq_len: int) -> float:
    """Useful forward+backward FLOPs per token of one training step (no recomputation).

    ``6 x (matmul parameters a token touches, incl. the LM head)
    + 6 x layers x seq_len x heads x (d_qk + d_v)`` (the attention scores and weighted sum over the
    full square). This is the count of Narayanan et al. 2021 (Eq. 3: ``72 B s l h^2 (1 + s/6h +
    V/12lh)`` for GPT with a 4h MLP) and of the PaLM paper (Chowdhery et al. 2022, App. B:
    ``6N + 12 L H Q T``), generalized to GQA/MLA, SwiGLU and MoE (active experts only). The
    embedding lookup is not a matmul and is not counted; the causal mask is not discounted, as in
    both papers, so MFU figures compare with theirs.
    """
    per_layer = 0.0
    for kind in ("dense", "moe"):
        n = m.layers_of_kind(kind)  # type: ignore[arg-type]
        if n:
            per_layer += n * layer_params(m, kind).matmul_active
    emb = getattr(m, "embed_dim", None) or m.hidden_size
    head = m.vocab_size * emb + (2 * emb * m.hidden_size if emb != m.hidden_size else 0)
    if m.mla is not None:
        dqk, dv = m.mla.qk_head_dim, m.mla.v_head_dim
    else:
        dqk = dv = m.head_size
    attn = m.num_layers * seq_len * m.num_attention_heads * (dqk + dv)
    return 6.0 * (per_layer + head) + 6.0 * attn


def layer_model_flops(m: ModelSpec, kind: str, tokens: float, seq_kv: float) -> float:
    """Useful fwd+bwd FLOPs of one layer for ``tokens`` tokens (same convention as above)."""
    if m.mla is not None:
        dqk, dv = m.mla.qk_head_dim, m.mla.v_head_dim
    else:
        dqk = dv = m.head_size
    return 6.0 * tokens * (layer_params(m, kind).matmul_active + seq_kv * m.num_attention_heads * (dqk + dv))
