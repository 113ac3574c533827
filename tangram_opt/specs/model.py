"""Transformer model shapes (dense and mixture-of-experts) and their exact parameter counts.

A :class:`ModelSpec` describes a decoder-only transformer layer by layer kind: ``"dense"`` layers
(attention + dense MLP) and ``"moe"`` layers (attention + routed experts, optional shared experts).
Dense layers, if any, come first (DeepSeek's ``first_k_dense_replace``); the planner relies on that
order. Parameter counts are exact for the architectures we load (every weight matrix, bias and
norm), so they can be checked against the published totals.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Literal

from tangram_opt.errors import SpecError
from tangram_opt.specs import _check

LayerKind = Literal["dense", "moe"]
LAYER_KINDS: tuple[LayerKind, ...] = ("dense", "moe")
#: MLP kinds: "swiglu" is gated (gate, up and down matrices: Llama, Mistral, Qwen, DeepSeek); "gelu" and
#: "relu" are plain two-matrix MLPs (GPT-Neo/GPT-NeoX and OPT respectively). Only the matrix count
#: matters for parameters and FLOPs.
MLP_TYPES = ("swiglu", "gelu", "relu")
NORM_TYPES = ("rmsnorm", "layernorm")  # weight only vs weight + bias
#: Which attention projections carry a bias: none (Llama, Mistral, DeepSeek), "qkv" (Qwen2: q, k and v
#: but not the output), "all" (OPT, GPT-NeoX: q, k, v and output) or "out" (GPT-Neo: output only).
ATTENTION_BIAS = ("none", "qkv", "all", "out")
POSITION_EMBEDDINGS = ("rope", "learned")


@dataclass(frozen=True, slots=True, kw_only=True)
class MoESpec:
    """Routed experts of the MoE layers.

    ``expert_ffn_hidden_size`` is the hidden width of one routed expert, ``shared_expert_ffn_hidden_size``
    that of one shared expert (default: same as a routed expert). ``first_dense_layers`` leading
    layers use the model's dense MLP instead (DeepSeek-V2/V3: ``first_k_dense_replace``).
    """

    num_experts: int
    top_k: int
    expert_ffn_hidden_size: int
    num_shared_experts: int = 0
    shared_expert_ffn_hidden_size: int | None = None
    shared_expert_gate: bool = False  # Qwen2-MoE: sigmoid gate (hidden -> 1) on the shared expert
    first_dense_layers: int = 0
    router_bias: bool = False  # DeepSeek-V3 e_score_correction_bias (one per expert)

    def __post_init__(self) -> None:
        f = "moe"
        _set_int(self, f, ("num_experts", "top_k", "expert_ffn_hidden_size"))
        _set_int(self, f, ("num_shared_experts", "first_dense_layers"), allow_zero=True)
        if self.shared_expert_ffn_hidden_size is not None:
            _set_int(self, f, ("shared_expert_ffn_hidden_size",))
        _check.boolean(f"{f}.shared_expert_gate", self.shared_expert_gate)
        _check.boolean(f"{f}.router_bias", self.router_bias)
        if self.top_k > self.num_experts:
            raise SpecError("moe.top_k", self.top_k, f"exceeds num_experts ({self.num_experts})",
                            "top_k is how many experts each token is routed to; it must be <= num_experts")

    @property
    def shared_ffn_hidden_size(self) -> int:
        return self.shared_expert_ffn_hidden_size or self.expert_ffn_hidden_size


@dataclass(frozen=True, slots=True, kw_only=True)
class MLASpec:
    """Multi-head latent attention (DeepSeek-V2/V3): low-rank compressed queries and keys/values.

    ``q_lora_rank`` is ``None`` when queries are not compressed (DeepSeek-V2-Lite).
    """

    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None = None

    def __post_init__(self) -> None:
        _set_int(self, "mla", ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"))
        if self.q_lora_rank is not None:
            _set_int(self, "mla", ("q_lora_rank",))

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """A decoder-only transformer. Sizes are counts (no units); see the module docstring."""

    name: str
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_kv_heads: int | None = None  # None: same as num_attention_heads (multi-head attention)
    head_dim: int | None = None  # None: hidden_size // num_attention_heads
    vocab_size: int
    tied_embeddings: bool = False
    mlp_type: str = "swiglu"
    norm_type: str = "rmsnorm"
    attention_bias: str = "none"
    mlp_bias: bool = False
    qk_norm: bool = False  # Qwen3: RMSNorm on each query and key head
    position_embedding: str = "rope"
    max_position_embeddings: int = 0  # rows of the learned position table (OPT: max + 2)
    # Width of the token embedding when it differs from hidden_size (OPT-350M: word_embed_proj_dim
    # 512 with hidden 1024); the model then has project_in (embedding -> hidden) and project_out
    # (hidden -> embedding) matrices without bias. None: same as hidden_size.
    embedding_dim: int | None = None
    final_norm: bool = True  # False for post-LN OPT (do_layer_norm_before: false), which has no final norm
    # Dropout probabilities in training: on the attention probabilities, and on the attention and MLP
    # outputs before each residual add (and on the embeddings). They change activation memory (a
    # one-byte mask per element) and memory traffic, not parameters. Most current LLMs use neither.
    attention_dropout: float = 0.0
    hidden_dropout: float = 0.0
    architecture: str = "custom"
    moe: MoESpec | None = None
    mla: MLASpec | None = None

    def __post_init__(self) -> None:
        _check.text("name", self.name)
        _set_int(self, "", ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "vocab_size"))
        for fl in ("num_kv_heads", "head_dim", "embedding_dim"):
            if getattr(self, fl) is not None:
                _set_int(self, "", (fl,))
        _set_int(self, "", ("max_position_embeddings",), allow_zero=True)
        for fl in ("tied_embeddings", "mlp_bias", "qk_norm", "final_norm"):
            _check.boolean(fl, getattr(self, fl))
        for fl in ("attention_dropout", "hidden_dropout"):
            object.__setattr__(self, fl, _check.probability(fl, getattr(self, fl)))
        for fl, allowed in (("mlp_type", MLP_TYPES), ("norm_type", NORM_TYPES), ("attention_bias", ATTENTION_BIAS),
                            ("position_embedding", POSITION_EMBEDDINGS)):
            object.__setattr__(self, fl, _check.one_of(fl, getattr(self, fl), allowed))
        if self.moe is not None and not isinstance(self.moe, MoESpec):
            raise SpecError("moe", self.moe, "must be a MoESpec", "build it with MoESpec(...) or use model_from_dict")
        if self.mla is not None and not isinstance(self.mla, MLASpec):
            raise SpecError("mla", self.mla, "must be a MLASpec", "build it with MLASpec(...) or use model_from_dict")
        if self.num_kv_heads is not None:
            if self.num_attention_heads % self.num_kv_heads:
                raise SpecError("num_kv_heads", self.num_kv_heads,
                                f"does not divide num_attention_heads ({self.num_attention_heads})",
                                "grouped-query attention needs heads to be a multiple of KV heads")
        if self.head_dim is None and self.mla is None and self.hidden_size % self.num_attention_heads:
            raise SpecError("num_attention_heads", self.num_attention_heads,
                            f"does not divide hidden_size ({self.hidden_size})", "give head_dim explicitly")
        if self.position_embedding == "learned":
            _check.positive_int("max_position_embeddings", self.max_position_embeddings)
        if self.mla is not None and self.attention_bias != "none":
            raise SpecError("attention_bias", self.attention_bias, "is not modelled with multi-head latent attention",
                            "use attention_bias: none (every released DeepSeek-V2/V3 model has no attention bias)")
        if self.moe is not None and self.moe.first_dense_layers >= self.num_layers:
            raise SpecError("moe.first_dense_layers", self.moe.first_dense_layers,
                            f"leaves no MoE layer among num_layers ({self.num_layers})",
                            "set first_dense_layers below num_layers, or drop moe for a dense model")

    # --- shape helpers ----------------------------------------------------------------------
    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_attention_heads

    @property
    def head_size(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def is_moe(self) -> bool:
        return self.moe is not None

    @property
    def num_dense_layers(self) -> int:
        return self.num_layers if self.moe is None else self.moe.first_dense_layers

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.num_dense_layers

    @property
    def layer_kinds(self) -> tuple[LayerKind, ...]:
        """Kind of each transformer block, in order (dense ones first)."""
        return ("dense",) * self.num_dense_layers + ("moe",) * self.num_moe_layers

    def layers_of_kind(self, kind: LayerKind) -> int:
        return self.num_dense_layers if kind == "dense" else self.num_moe_layers

    # --- parameter counts (exact) ---------------------------------------------------------
    @property
    def norm_params(self) -> int:
        """Parameters of one normalization over the hidden size."""
        return self.hidden_size * (2 if self.norm_type == "layernorm" else 1)

    @property
    def attention_params(self) -> int:
        """Q, K, V and output projections (incl. biases, MLA low-rank factors and their norms)."""
        h, nh = self.hidden_size, self.num_attention_heads
        if self.mla is not None:
            m = self.mla
            if m.q_lora_rank:
                q = h * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * nh * m.qk_head_dim
            else:
                q = h * nh * m.qk_head_dim
            kv = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank \
                + m.kv_lora_rank * nh * (m.qk_nope_head_dim + m.v_head_dim)
            o = nh * m.v_head_dim * h
            return q + kv + o
        d, nkv = self.head_size, self.kv_heads
        q, kv, o = h * nh * d, 2 * h * nkv * d, nh * d * h
        bias = 0
        if self.attention_bias in ("qkv", "all"):
            bias += nh * d + 2 * nkv * d
        if self.attention_bias in ("all", "out"):
            bias += h
        qk_norm = 2 * d if self.qk_norm else 0
        return q + kv + o + bias + qk_norm

    @property
    def mlp_matrices(self) -> int:
        """Weight matrices of one MLP: 3 when gated (SwiGLU), 2 otherwise."""
        return 3 if self.mlp_type == "swiglu" else 2

    def _mlp_params(self, ffn: int) -> int:
        h = self.hidden_size
        mats = self.mlp_matrices
        bias = (ffn * (mats - 1) + h) if self.mlp_bias else 0
        return mats * h * ffn + bias

    @property
    def dense_mlp_params(self) -> int:
        return self._mlp_params(self.ffn_hidden_size)

    @property
    def expert_params(self) -> int:
        """One routed expert."""
        assert self.moe is not None
        return self._mlp_params(self.moe.expert_ffn_hidden_size)

    @property
    def shared_expert_params(self) -> int:
        """All shared experts of one layer, with their gate."""
        assert self.moe is not None
        m = self.moe
        return m.num_shared_experts * self._mlp_params(m.shared_ffn_hidden_size) + (
            self.hidden_size if m.shared_expert_gate and m.num_shared_experts else 0)

    @property
    def router_params(self) -> int:
        assert self.moe is not None
        return self.hidden_size * self.moe.num_experts + (self.moe.num_experts if self.moe.router_bias else 0)

    def layer_params(self, kind: LayerKind) -> int:
        """All parameters of one transformer block of ``kind``."""
        base = self.attention_params + 2 * self.norm_params
        if kind == "dense":
            return base + self.dense_mlp_params
        assert self.moe is not None
        return base + self.moe.num_experts * self.expert_params + self.shared_expert_params + self.router_params

    def layer_active_params(self, kind: LayerKind) -> int:
        """Parameters one token touches in one block (top-k routed experts)."""
        if kind == "dense":
            return self.layer_params("dense")
        assert self.moe is not None
        return (self.attention_params + 2 * self.norm_params + self.moe.top_k * self.expert_params
                + self.shared_expert_params + self.router_params)

    @property
    def embed_dim(self) -> int:
        """Width of the token embedding and of the LM head's input (hidden_size unless projected)."""
        return self.embedding_dim or self.hidden_size

    @property
    def _embed_projection_params(self) -> int:
        """One of OPT's project_in / project_out matrices (0 when the embedding is hidden_size wide)."""
        return 0 if self.embed_dim == self.hidden_size else self.embed_dim * self.hidden_size

    @property
    def embedding_params(self) -> int:
        """First-stage parameters: token embedding, learned position table if any, and project_in."""
        pos = self.max_position_embeddings * self.hidden_size if self.position_embedding == "learned" else 0
        return self.vocab_size * self.embed_dim + pos + self._embed_projection_params

    @property
    def lm_head_matmul_params(self) -> int:
        """Size of the logits matrix multiply (vocab x embedding width), whether tied or not."""
        return self.vocab_size * self.embed_dim

    @property
    def head_params(self) -> int:
        """Last-stage parameters: final norm, project_out, and the output projection (0 when tied)."""
        norm = self.norm_params if self.final_norm else 0
        return norm + self._embed_projection_params + (0 if self.tied_embeddings else self.lm_head_matmul_params)

    @property
    def total_params(self) -> int:
        return (self.embedding_params + self.head_params
                + sum(self.layers_of_kind(k) * self.layer_params(k) for k in LAYER_KINDS if self.layers_of_kind(k)))

    @property
    def active_params(self) -> int:
        """Every parameter one token touches, embedding tables included (Mistral's and Qwen's convention)."""
        return (self.embedding_params + self.head_params
                + sum(self.layers_of_kind(k) * self.layer_active_params(k)
                      for k in LAYER_KINDS if self.layers_of_kind(k)))

    @property
    def active_compute_params(self) -> int:
        """Active parameters that enter a matrix multiply: :attr:`active_params` without the input
        embedding tables (token and learned position), of which a token reads one row. A tied embedding
        still counts once, as the LM head. This is N in the 6 N D FLOPs rule, and the convention DeepSeek's
        published "activated parameters" follow (V2 21B, V2-Lite 2.4B, V3 37B; with the embedding table
        V2-Lite would be 2.66B)."""
        pos = self.max_position_embeddings * self.hidden_size if self.position_embedding == "learned" else 0
        token_table = 0 if self.tied_embeddings else self.vocab_size * self.embed_dim
        return self.active_params - token_table - pos

    # --- misc -----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def with_layers(self, num_layers: int) -> ModelSpec:
        """The same model with a different depth (for small test instances)."""
        moe = self.moe
        if moe is not None and moe.first_dense_layers >= num_layers:
            moe = replace(moe, first_dense_layers=max(0, num_layers - 1))
        return replace(self, num_layers=num_layers, moe=moe, name=f"{self.name}-{num_layers}L")

    def describe(self) -> str:
        b = 1e9
        kind = "MoE" if self.is_moe else "dense"
        s = (f"Model {self.name!r} ({kind}, {self.architecture}): {self.num_layers} layers, hidden {self.hidden_size}, "
             f"heads {self.num_attention_heads}/{self.kv_heads} KV, vocab {self.vocab_size}; "
             f"{self.total_params / b:.2f}B parameters")
        if self.moe is not None:
            m = self.moe
            s += (f", {self.active_params / b:.2f}B active; {m.num_experts} experts top-{m.top_k}"
                  f" (+{m.num_shared_experts} shared), {self.num_dense_layers} dense-first layers")
        if self.mla is not None:
            s += f"; MLA kv_lora_rank {self.mla.kv_lora_rank}"
        return s


def _set_int(obj: Any, prefix: str, names: tuple[str, ...], *, allow_zero: bool = False) -> None:
    """Validate integer fields of a frozen dataclass and store them as ``int`` (YAML may give 4096.0)."""
    for fl in names:
        path = f"{prefix}.{fl}" if prefix else fl
        object.__setattr__(obj, fl, _check.positive_int(path, getattr(obj, fl), allow_zero=allow_zero))


def model_from_dict(data: Any, *, source: str = "") -> ModelSpec:
    """Inverse of :meth:`ModelSpec.to_dict` (the tangram model file form); unknown keys are errors."""
    _check.mapping("model", data, source=source)
    _check.no_unknown_keys("", data, [f.name for f in fields(ModelSpec)], source=source)
    d = dict(data)
    with _check.in_source(source):
        if d.get("moe") is not None:
            d["moe"] = _sub_spec(MoESpec, "moe", d["moe"], ("num_experts", "top_k", "expert_ffn_hidden_size"))
        if d.get("mla") is not None:
            d["mla"] = _sub_spec(MLASpec, "mla", d["mla"],
                                 ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"))
        for key in ("name", "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "vocab_size"):
            _check.required("", d, key, hint=f"add '{key}:' (see docs/user_guide/inputs.md)")
        return ModelSpec(**d)


def _sub_spec(cls: type, field: str, data: Any, needed: tuple[str, ...]) -> Any:
    _check.mapping(field, data)
    _check.no_unknown_keys(field, data, [f.name for f in fields(cls)])
    for key in needed:
        _check.required(field, data, key)
    return cls(**data)
