"""Plain PyTorch modules of one tensor-parallel rank of a model's layers, built from a :class:`ModelSpec`.

What is built is what one TP rank of a Megatron-LM-style layout computes (the layout
:func:`tangram_opt.cost.flops.layer_params` counts, and tests check the parameter counts against it):

- attention: fused QKV projection with ``heads / tp`` query heads and ``kv_heads / tp`` key/value
  heads of ``head_size`` (grouped-query attention), optional Q/K RMSNorm per head (Qwen3), rotary
  embeddings (RoPE) or none (learned positions live in the embedding), causal attention core, output
  projection; biases as ``attention_bias`` says (q/k/v biases are sharded, the output bias is
  replicated); attention dropout on the probabilities when the model trains with it;
- multi-head latent attention (DeepSeek-V2/V3, ``model.mla``): query down/up projections (or one query
  projection without ``q_lora_rank``), the joint KV down-projection with its decoupled RoPE key, the
  RMSNorms of the latents, the per-head KV up-projection, the score matmul over
  ``qk_nope_head_dim + qk_rope_head_dim`` and the value matmul over ``v_head_dim``; down-projections and
  latent norms are replicated, up-projections and the output projection sharded;
- MLP: SwiGLU (gate and up fused, ``2 ffn / tp`` wide) or a two-matrix GeLU/ReLU MLP (``ffn / tp``);
- MoE: router over all experts (replicated, fp32 softmax and top-k computed as in training), then
  **uniform routing forced**: assignment ``j`` of token ``t`` goes to local expert
  ``(t k + j) mod local_experts``, so every local expert receives the same number of token copies
  (``tokens x top_k / local_experts``, padded to equal size when it does not divide). The dispatch
  (sort by expert, gather), the experts as one grouped GEMM (``torch.bmm`` over the experts) and the
  weighted combine (``index_add_``) run for real. With ``ep`` > 1 the block holds ``num_experts / ep``
  experts and still receives ``tokens x top_k`` copies: the work of one EP rank under balanced
  routing, without the all-to-all (the cost model adds it). Shared experts (and Qwen2-MoE's shared
  gate) see every token;
- norms: RMSNorm (``torch.nn.functional.rms_norm`` where PyTorch has it) or LayerNorm, pre-norm;
  hidden dropout before each residual add when the model trains with it;
- embedding: vocab-parallel word embedding (``vocab / tp`` rows; every token id falls in the shard),
  learned positions, OPT's ``project_in``, embedding dropout;
- head: final norm, OPT's ``project_out``, vocab-parallel LM head, cross-entropy on fp32 logits.

Not included (the cost model adds what it needs): TP collectives, the vocab-parallel cross-entropy's
all-reduces, the expert all-to-all, MoE auxiliary losses, sequence parallelism.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tangram_opt.specs.model import ModelSpec

ATTENTION_IMPLS = ("sdpa", "eager")


def _torch_version() -> tuple[int, int]:
    parts = torch.__version__.split("+")[0].split(".")
    return int(parts[0]), int("".join(ch for ch in parts[1] if ch.isdigit()) or 0)


#: ``scaled_dot_product_attention(enable_gqa=...)`` exists from PyTorch 2.5; before, K/V heads are
#: repeated to the query heads (what Hugging Face's eager code does).
SDPA_GQA = _torch_version() >= (2, 5)


def _kw(device: Any, dtype: Any) -> dict[str, Any]:
    return {"device": device, "dtype": dtype}


class RMSNorm(nn.Module):
    """Weight-only RMS normalization (Zhang & Sennrich 2019), statistics in fp32."""

    def __init__(self, dim: int, eps: float = 1e-6, *, device: Any = None, dtype: Any = None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, **_kw(device, dtype)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if hasattr(F, "rms_norm"):
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


def make_norm(m: ModelSpec, dim: int, *, device: Any, dtype: Any) -> nn.Module:
    if m.norm_type == "layernorm":
        return nn.LayerNorm(dim, **_kw(device, dtype))
    return RMSNorm(dim, device=device, dtype=dtype)


class Rotary(nn.Module):
    """Rotary position embedding (Su et al. 2021), rotate-half form, tables for ``seq_len`` positions."""

    def __init__(self, dim: int, seq_len: int, base: float = 10000.0, *, device: Any = None, dtype: Any = None):
        super().__init__()
        inv = 1.0 / (base ** (torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim))
        ang = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv)
        emb = torch.cat((ang, ang), dim=-1)
        self.register_buffer("cos", emb.cos().to(dtype), persistent=False)
        self.register_buffer("sin", emb.sin().to(dtype), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [batch, heads, seq, dim]
        s = x.shape[-2]
        x1, x2 = x.chunk(2, dim=-1)
        return x * self.cos[:s] + torch.cat((-x2, x1), dim=-1) * self.sin[:s]


class AttentionCore(nn.Module):
    """Causal scores + softmax + weighted sum: ``sdpa`` (PyTorch's fused kernels) or ``eager``
    (materialized scores, masked fp32 softmax, dropout, as Megatron-LM's unfused path)."""

    def __init__(self, impl: str, dropout: float, seq_len: int, *, device: Any = None):
        super().__init__()
        assert impl in ATTENTION_IMPLS, impl
        self.impl = impl
        self.dropout = dropout
        if impl == "eager":
            mask = torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).triu(1)
            self.register_buffer("mask", mask, persistent=False)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        p = self.dropout if self.training else 0.0
        groups = q.shape[1] // k.shape[1]
        if self.impl == "sdpa":
            if groups > 1 and SDPA_GQA:
                return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True, enable_gqa=True)
            if groups > 1:
                k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
            return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        if groups > 1:
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        s = q.shape[-2]
        scores = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
        scores = scores.masked_fill(self.mask[:s, :s], float("-inf"))
        probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
        if p > 0:
            probs = F.dropout(probs, p=p, training=True)
        return torch.matmul(probs, v)


class Attention(nn.Module):
    """Multi-head / grouped-query attention of one TP rank."""

    def __init__(self, m: ModelSpec, tp: int, seq_len: int, impl: str, *, device: Any = None, dtype: Any = None):
        super().__init__()
        h, d = m.hidden_size, m.head_size
        self.nh, self.nkv, self.d = m.num_attention_heads // tp, m.kv_heads // tp, d
        self.qkv = nn.Linear(h, (self.nh + 2 * self.nkv) * d, bias=m.attention_bias in ("qkv", "all"),
                             **_kw(device, dtype))
        self.out = nn.Linear(self.nh * d, h, bias=m.attention_bias in ("all", "out"), **_kw(device, dtype))
        self.q_norm = RMSNorm(d, device=device, dtype=dtype) if m.qk_norm else None
        self.k_norm = RMSNorm(d, device=device, dtype=dtype) if m.qk_norm else None
        self.rope = Rotary(d, seq_len, device=device, dtype=dtype) if m.position_embedding == "rope" else None
        self.core = AttentionCore(impl, m.attention_dropout, seq_len, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.qkv(x).split([self.nh * self.d, self.nkv * self.d, self.nkv * self.d], dim=-1)
        q = q.view(b, s, self.nh, self.d).transpose(1, 2)
        k = k.view(b, s, self.nkv, self.d).transpose(1, 2)
        v = v.view(b, s, self.nkv, self.d).transpose(1, 2)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rope is not None:
            q, k = self.rope(q), self.rope(k)
        o = self.core(q, k, v)
        return self.out(o.transpose(1, 2).reshape(b, s, self.nh * self.d))


class LatentAttention(nn.Module):
    """Multi-head latent attention of one TP rank (DeepSeek-V2, Sec. 2.1)."""

    def __init__(self, m: ModelSpec, tp: int, seq_len: int, impl: str, *, device: Any = None, dtype: Any = None):
        super().__init__()
        a = m.mla
        assert a is not None
        h = m.hidden_size
        kw = _kw(device, dtype)
        self.nh = m.num_attention_heads // tp
        self.nope, self.rope_d, self.v_d, self.kv_rank = a.qk_nope_head_dim, a.qk_rope_head_dim, a.v_head_dim, \
            a.kv_lora_rank
        self.qk_d = a.qk_head_dim
        if a.q_lora_rank:
            self.q_down: nn.Module | None = nn.Linear(h, a.q_lora_rank, bias=False, **kw)
            self.q_norm: nn.Module | None = RMSNorm(a.q_lora_rank, device=device, dtype=dtype)
            self.q = nn.Linear(a.q_lora_rank, self.nh * self.qk_d, bias=False, **kw)
        else:
            self.q_down = self.q_norm = None
            self.q = nn.Linear(h, self.nh * self.qk_d, bias=False, **kw)
        self.kv_down = nn.Linear(h, a.kv_lora_rank + a.qk_rope_head_dim, bias=False, **kw)
        self.kv_norm = RMSNorm(a.kv_lora_rank, device=device, dtype=dtype)
        self.kv_up = nn.Linear(a.kv_lora_rank, self.nh * (a.qk_nope_head_dim + a.v_head_dim), bias=False, **kw)
        self.out = nn.Linear(self.nh * a.v_head_dim, h, bias=False, **kw)
        self.rope = Rotary(a.qk_rope_head_dim, seq_len, device=device, dtype=dtype)
        self.core = AttentionCore(impl, m.attention_dropout, seq_len, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        qin = self.q_norm(self.q_down(x)) if self.q_down is not None and self.q_norm is not None else x
        q = self.q(qin).view(b, s, self.nh, self.qk_d).transpose(1, 2)
        q_nope, q_pe = q.split([self.nope, self.rope_d], dim=-1)
        c, k_pe = self.kv_down(x).split([self.kv_rank, self.rope_d], dim=-1)
        kv = self.kv_up(self.kv_norm(c)).view(b, s, self.nh, self.nope + self.v_d).transpose(1, 2)
        k_nope, v = kv.split([self.nope, self.v_d], dim=-1)
        k_pe = self.rope(k_pe.view(b, 1, s, self.rope_d)).expand(b, self.nh, s, self.rope_d)
        q = torch.cat((q_nope, self.rope(q_pe)), dim=-1)
        k = torch.cat((k_nope, k_pe), dim=-1)
        o = self.core(q, k, v)
        return self.out(o.transpose(1, 2).reshape(b, s, self.nh * self.v_d))


def _activation(m: ModelSpec, y: torch.Tensor) -> torch.Tensor:
    if m.mlp_type == "swiglu":
        gate, up = y.chunk(2, dim=-1)
        return F.silu(gate) * up
    return F.gelu(y) if m.mlp_type == "gelu" else F.relu(y)


class MLP(nn.Module):
    """fc1 (gate and up fused for SwiGLU), activation, fc2, ``ffn_local`` wide (one TP rank's share)."""

    def __init__(self, m: ModelSpec, ffn_local: int, *, device: Any = None, dtype: Any = None):
        super().__init__()
        self.m = m
        width1 = 2 * ffn_local if m.mlp_type == "swiglu" else ffn_local
        self.fc1 = nn.Linear(m.hidden_size, width1, bias=m.mlp_bias, **_kw(device, dtype))
        self.fc2 = nn.Linear(ffn_local, m.hidden_size, bias=m.mlp_bias, **_kw(device, dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(_activation(self.m, self.fc1(x)))


class MoE(nn.Module):
    """Router + top-k routed experts (uniform routing forced, see the module docstring) + shared experts."""

    def __init__(self, m: ModelSpec, tp: int, ep: int, tokens: int, *, device: Any = None, dtype: Any = None):
        super().__init__()
        moe = m.moe
        assert moe is not None
        h, kw = m.hidden_size, _kw(device, dtype)
        self.m, self.top_k, self.local = m, moe.top_k, moe.num_experts // ep
        f = moe.expert_ffn_hidden_size // tp
        width1 = 2 * f if m.mlp_type == "swiglu" else f
        self.router = nn.Linear(h, moe.num_experts, bias=False, **kw)
        # DeepSeek-V3's e_score_correction_bias: steers the top-k choice, not trained by the optimizer
        self.router_bias = nn.Parameter(torch.zeros(moe.num_experts, **kw), requires_grad=False) \
            if moe.router_bias else None
        self.w1 = nn.Parameter(torch.empty(self.local, h, width1, **kw).normal_(0.0, 0.02))
        self.w2 = nn.Parameter(torch.empty(self.local, f, h, **kw).normal_(0.0, 0.02))
        self.b1 = nn.Parameter(torch.zeros(self.local, 1, width1, **kw)) if m.mlp_bias else None
        self.b2 = nn.Parameter(torch.zeros(self.local, 1, h, **kw)) if m.mlp_bias else None
        self.shared = MLP(m, moe.num_shared_experts * moe.shared_ffn_hidden_size // tp, device=device, dtype=dtype) \
            if moe.num_shared_experts else None
        self.shared_gate = nn.Linear(h, 1, bias=False, **kw) if moe.num_shared_experts and moe.shared_expert_gate \
            else None
        # the forced balanced assignment of the tokens x top_k copies, and where each copy sits in the
        # padded [local experts x capacity] buffer of the grouped GEMM (sorted by expert)
        n = tokens * self.top_k
        self.capacity = -(-n // self.local)
        expert = torch.arange(n, device=device) % self.local
        self.register_buffer("expert", expert.view(tokens, self.top_k), persistent=False)
        order = torch.argsort(expert, stable=True)
        rank_in_expert = torch.arange(n, device=device) - torch.searchsorted(expert[order].contiguous(),
                                                                             expert[order].contiguous())
        self.register_buffer("slot", expert[order] * self.capacity + rank_in_expert, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        xt = x.reshape(b * s, h)
        probs = torch.softmax(self.router(xt).float(), dim=-1)
        scores = probs if self.router_bias is None else probs + self.router_bias.float()
        torch.topk(scores, self.top_k, dim=-1)  # the router's choice, computed and then overridden
        weights = probs.gather(1, self.expert)  # gate values at the forced (balanced) experts
        weights = (weights / weights.sum(-1, keepdim=True)).to(x.dtype)
        # dispatch: sort the token copies by expert, gather them into equal-size expert groups
        order = torch.argsort(self.expert.reshape(-1), stable=True)
        token = order // self.top_k
        grouped = xt.new_zeros(self.local * self.capacity, h).index_copy(0, self.slot, xt.index_select(0, token))
        grouped = grouped.view(self.local, self.capacity, h)
        y = torch.bmm(grouped, self.w1) if self.b1 is None else torch.baddbmm(self.b1, grouped, self.w1)
        y = _activation(self.m, y)
        y = torch.bmm(y, self.w2) if self.b2 is None else torch.baddbmm(self.b2, y, self.w2)
        # combine: back to token order, weighted by the gate values, summed over each token's copies
        y = y.view(-1, h).index_select(0, self.slot) * weights.reshape(-1)[order].unsqueeze(-1)
        out = xt.new_zeros(b * s, h).index_add(0, token, y)
        if self.shared is not None:
            sh = self.shared(xt)
            if self.shared_gate is not None:
                sh = torch.sigmoid(self.shared_gate(xt)) * sh
            out = out + sh
        return out.view(b, s, h)


class Block(nn.Module):
    """One transformer block of one TP rank (pre-norm; post-norm models run the same kernels)."""

    def __init__(self, m: ModelSpec, kind: str, *, tp: int, seq_len: int, micro_batch_size: int, attention: str,
                 ep: int = 1, device: Any = None, dtype: Any = None):
        super().__init__()
        attn_cls = LatentAttention if m.mla is not None else Attention
        self.norm1 = make_norm(m, m.hidden_size, device=device, dtype=dtype)
        self.attn = attn_cls(m, tp, seq_len, attention, device=device, dtype=dtype)
        self.norm2 = make_norm(m, m.hidden_size, device=device, dtype=dtype)
        if kind == "dense":
            self.mlp: nn.Module = MLP(m, m.ffn_hidden_size // tp, device=device, dtype=dtype)
        else:
            self.mlp = MoE(m, tp, ep, micro_batch_size * seq_len, device=device, dtype=dtype)
        self.drop = nn.Dropout(m.hidden_dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop(self.attn(self.norm1(x)))
        return x + self.drop(self.mlp(self.norm2(x)))


def vocab_shard(m: ModelSpec, tp: int) -> int:
    """Rows of the vocab-parallel embedding / LM head on one TP rank."""
    return -(-m.vocab_size // tp)


class Embedding(nn.Module):
    """Word embedding (vocab-parallel), learned positions, project_in, embedding dropout."""

    def __init__(self, m: ModelSpec, tp: int, seq_len: int, *, device: Any = None, dtype: Any = None):
        super().__init__()
        kw = _kw(device, dtype)
        self.word = nn.Embedding(vocab_shard(m, tp), m.embed_dim, **kw)
        self.project_in = nn.Linear(m.embed_dim, m.hidden_size, bias=False, **kw) \
            if m.embed_dim != m.hidden_size else None
        self.positions = nn.Embedding(m.max_position_embeddings, m.hidden_size, **kw) \
            if m.position_embedding == "learned" else None
        self.register_buffer("pos_ids", torch.arange(seq_len, device=device), persistent=False)
        self.drop = nn.Dropout(m.hidden_dropout)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.word(ids)
        if self.project_in is not None:
            x = self.project_in(x)
        if self.positions is not None:
            x = x + self.positions(self.pos_ids[: ids.shape[1]])
        return self.drop(x)


class Head(nn.Module):
    """Final norm, project_out, vocab-parallel LM head and cross-entropy on fp32 logits."""

    def __init__(self, m: ModelSpec, tp: int, *, device: Any = None, dtype: Any = None):
        super().__init__()
        kw = _kw(device, dtype)
        self.norm = make_norm(m, m.hidden_size, device=device, dtype=dtype) if m.final_norm else None
        self.project_out = nn.Linear(m.hidden_size, m.embed_dim, bias=False, **kw) \
            if m.embed_dim != m.hidden_size else None
        self.lm_head = nn.Linear(m.embed_dim, vocab_shard(m, tp), bias=False, **kw)

    def forward(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if self.norm is not None:
            x = self.norm(x)
        if self.project_out is not None:
            x = self.project_out(x)
        logits = self.lm_head(x)
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def build_layer(m: ModelSpec, kind: str, *, tp: int, seq_len: int, micro_batch_size: int, attention: str = "sdpa",
                ep: int = 1, device: Any = None, dtype: Any = None) -> nn.Module:
    """The module of one layer kind ("dense", "moe", "embedding", "head") of one TP rank."""
    if kind == "embedding":
        return Embedding(m, tp, seq_len, device=device, dtype=dtype)
    if kind == "head":
        return Head(m, tp, device=device, dtype=dtype)
    return Block(m, kind, tp=tp, seq_len=seq_len, micro_batch_size=micro_batch_size, attention=attention, ep=ep,
                 device=device, dtype=dtype)


def parameter_count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())
