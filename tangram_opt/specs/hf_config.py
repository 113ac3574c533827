"""Read a Hugging Face ``config.json`` into a :class:`~tangram_opt.specs.model.ModelSpec`.

No ``transformers`` import: each supported architecture has a small reader that takes exactly the
fields the corresponding ``transformers`` modelling code uses to size its weights, with the same
defaults where hub files commonly leave a field out (``num_key_value_heads``, ``head_dim``,
``tie_word_embeddings``, biases). Size fields that every hub file carries (``hidden_size``,
``num_hidden_layers``, ``intermediate_size``, ``vocab_size``, expert counts...) are required, so a
truncated file is reported instead of silently taking a library default. Everything else in the
file (``torch_dtype``, ``rope_scaling``, ``quantization_config``, token ids...) is ignored: it changes
neither the parameter count nor the per-layer work the planner models.

Mixture-of-experts layouts must be "dense layers first, then MoE layers" (DeepSeek's
``first_k_dense_replace``): the pipeline formulation places layer kinds in that order. A config
that interleaves dense and MoE blocks (``decoder_sparse_step`` > 1, ``mlp_only_layers`` that are not
a prefix, ``moe_layer_freq`` > 1) raises a :class:`~tangram_opt.errors.SpecError` saying so.

Not modelled: DeepSeek-V3's multi-token-prediction module (``num_nextn_predict_layers``; the
published 671B total excludes it), sliding-window and GPT-Neo local attention (they change
attention FLOPs at long sequence lengths but no parameter).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tangram_opt.errors import FormatError, SpecError
from tangram_opt.specs import _check
from tangram_opt.specs._io import parse_json, read_text
from tangram_opt.specs.model import MLASpec, ModelSpec, MoESpec

#: Supported ``model_type`` values and the models they cover.
SUPPORTED_ARCHITECTURES: dict[str, str] = {
    "llama": "Llama 2, Llama 3 / 3.1 / 3.2",
    "mistral": "Mistral 7B, Mistral NeMo",
    "mixtral": "Mixtral 8x7B, 8x22B",
    "qwen2": "Qwen2, Qwen2.5 (dense)",
    "qwen2_moe": "Qwen1.5-MoE, Qwen2-57B-A14B",
    "qwen3": "Qwen3 (dense)",
    "qwen3_moe": "Qwen3-30B-A3B, Qwen3-235B-A22B",
    "deepseek_v2": "DeepSeek-V2, DeepSeek-V2-Lite",
    "deepseek_v3": "DeepSeek-V3, DeepSeek-R1",
    "opt": "OPT-125M ... OPT-175B",
    "gpt_neox": "GPT-NeoX-20B, Pythia",
    "gpt_neo": "GPT-Neo 125M / 1.3B / 2.7B",
}

#: ``architectures[0]`` class names, used when a file has no ``model_type``.
_ARCHITECTURE_CLASSES: dict[str, str] = {
    "LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "MixtralForCausalLM": "mixtral",
    "Qwen2ForCausalLM": "qwen2", "Qwen2MoeForCausalLM": "qwen2_moe", "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe", "DeepseekV2ForCausalLM": "deepseek_v2",
    "DeepseekV3ForCausalLM": "deepseek_v3", "OPTForCausalLM": "opt", "GPTNeoXForCausalLM": "gpt_neox",
    "GPTNeoForCausalLM": "gpt_neo",
}

_REQUIRED = object()


class _Fields:
    """Typed access to the fields of one config, raising SpecError that names field, value and fix."""

    def __init__(self, data: Mapping[str, Any], arch: str, source: str):
        self.data = data
        self.arch = arch
        self.source = source

    def integer(self, key: str, default: Any = _REQUIRED, *, allow_zero: bool = False, hint: str = "") -> int:
        """An integer field; ``default`` (returned as is) when absent or null, else required."""
        value = self.data.get(key)
        if value is None:
            if default is _REQUIRED:
                raise SpecError(key, None, f"is required in a {self.arch} config.json but is missing",
                                hint or f'add "{key}": <integer>, as in the model\'s config.json on the Hub',
                                source=self.source)
            return default
        if isinstance(value, str):
            fix = (f'write "{key}": {value.strip()} without quotes' if value.strip().isdigit()
                   else f'write "{key}": <integer> as a JSON number')
            raise SpecError(key, value, "must be a JSON number, not a string", fix, source=self.source)
        return _check.positive_int(key, value, source=self.source, allow_zero=allow_zero)

    def opt_int(self, key: str) -> int | None:
        """An integer that may be absent or null (meaning "not used")."""
        return None if self.data.get(key) is None else self.integer(key)

    def flag(self, key: str, default: bool) -> bool:
        value = self.data.get(key)
        return default if value is None else _check.boolean(key, value, source=self.source)

    def fraction(self, key: str, default: float) -> float:
        value = self.data.get(key)
        return default if value is None else _check.fraction(key, value, source=self.source)

    def probability(self, *keys: str) -> float:
        """A dropout probability under the first of ``keys`` present (older configs use older names); 0.0 if none."""
        for key in keys:
            if self.data.get(key) is not None:
                return _check.probability(key, self.data[key], source=self.source)
        return 0.0

    def text(self, key: str, default: str) -> str:
        value = self.data.get(key)
        if value is None:
            return default
        if not isinstance(value, str):
            raise SpecError(key, value, "must be a string", f'write "{key}": "{default}"', source=self.source)
        return value

    def int_list(self, key: str) -> list[int]:
        value = self.data.get(key) or []
        if not isinstance(value, list):
            raise SpecError(key, value, "must be a list of layer indices", f'write "{key}": [] or e.g. [0, 1]',
                            source=self.source)
        return [_check.positive_int(f"{key}[{i}]", v, source=self.source, allow_zero=True)
                for i, v in enumerate(value)]

    def unsupported(self, key: str, value: Any, why: str, fix: str) -> SpecError:
        return SpecError(key, value, f"is not supported: {why}", fix, source=self.source)


# --- shared pieces ---------------------------------------------------------------------------

def _attention_heads(f: _Fields, hidden: int, *, heads_key: str = "num_attention_heads",
                     kv_key: str | None = "num_key_value_heads", head_dim_default: int | None = None,
                     read_head_dim: bool = True) -> dict[str, Any]:
    """Heads, KV heads and head width, checked with the config's own field names.

    ``read_head_dim=False`` for architectures whose modelling code has no ``head_dim`` field (OPT,
    GPT-Neo, GPT-NeoX: always hidden_size / heads).
    """
    heads = f.integer(heads_key)
    kv = f.integer(kv_key, heads) if kv_key else heads
    if heads % kv:
        raise SpecError(kv_key or heads_key, kv, f"does not divide {heads_key} ({heads})",
                        f"grouped-query attention needs {heads_key} to be a multiple of {kv_key}; "
                        f"use a divisor of {heads} such as {_divisor_near(heads, kv)}", source=f.source)
    head_dim = f.opt_int("head_dim") if read_head_dim else None
    if head_dim is None:
        head_dim = head_dim_default
    if head_dim is None and hidden % heads:
        raise SpecError(heads_key, heads, f"does not divide hidden_size ({hidden})",
                        'give "head_dim" explicitly or use a head count that divides hidden_size', source=f.source)
    return {"num_attention_heads": heads, "num_kv_heads": kv if kv != heads else None,
            "head_dim": head_dim if head_dim is not None and head_dim * heads != hidden else None}


def _divisor_near(n: int, k: int) -> int:
    return min((d for d in range(1, n + 1) if n % d == 0), key=lambda d: abs(d - k))


def _top_k(f: _Fields, key: str, num_experts: int, experts_key: str) -> int:
    top_k = f.integer(key)
    if top_k > num_experts:
        raise SpecError(key, top_k, f"exceeds {experts_key} ({num_experts})",
                        f"{key} is how many experts each token is routed to; make it at most {num_experts}",
                        source=f.source)
    return top_k


def _dense_prefix(f: _Fields, is_moe: Sequence[bool], key: str, value: Any) -> int:
    """Number of leading dense layers, if the layout is dense-then-MoE; raise on interleaving."""
    if True not in is_moe:
        return len(is_moe)
    first = is_moe.index(True)
    late_dense = [i for i in range(first, len(is_moe)) if not is_moe[i]]
    if late_dense:
        moe_layers = [i for i, m in enumerate(is_moe) if m]
        raise f.unsupported(
            key, value,
            f"it interleaves dense and MoE layers (MoE at layers {_ranges(moe_layers)}, dense at "
            f"{_ranges([i for i, m in enumerate(is_moe) if not m])}); the planner assumes every dense layer comes "
            "before every MoE layer (the DeepSeek first_k_dense_replace form)",
            "describe the model as a tangram model file with moe.first_dense_layers set to the number of dense "
            "layers (an approximation that keeps the layer counts), or use a dense-first variant")
    return first


def _ranges(idx: Sequence[int], limit: int = 8) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2, 5"`` (at most ``limit`` runs, then "...")."""
    out: list[str] = []
    start = prev = None
    for i in list(idx) + [None]:  # type: ignore[list-item]
        if start is None:
            start = prev = i
        elif i is not None and i == prev + 1:  # type: ignore[operator]
            prev = i
        else:
            out.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = prev = i
    return ", ".join(out[:limit]) + (", ..." if len(out) > limit else "")


def _llama_like(f: _Fields, *, head_dim_default: int | None = None) -> dict[str, Any]:
    """Fields shared by every RMSNorm + RoPE + SwiGLU decoder (Llama, Mistral, Qwen, Mixtral)."""
    hidden = f.integer("hidden_size")
    return {
        "num_layers": f.integer("num_hidden_layers"), "hidden_size": hidden,
        "ffn_hidden_size": f.integer("intermediate_size"), "vocab_size": f.integer("vocab_size"),
        **_attention_heads(f, hidden, head_dim_default=head_dim_default),
        "tied_embeddings": f.flag("tie_word_embeddings", False),
        "mlp_type": "swiglu", "norm_type": "rmsnorm", "position_embedding": "rope",
        "attention_dropout": f.probability("attention_dropout"),  # no hidden dropout in these models
    }


# --- one reader per architecture -------------------------------------------------------------

def _llama(f: _Fields) -> dict[str, Any]:
    # LlamaAttention: q/k/v/o all take bias=config.attention_bias; LlamaMLP: bias=config.mlp_bias.
    spec = _llama_like(f)
    spec["attention_bias"] = "all" if f.flag("attention_bias", False) else "none"
    spec["mlp_bias"] = f.flag("mlp_bias", False)
    return spec


def _mixtral(f: _Fields) -> dict[str, Any]:
    # MixtralSparseMoeBlock: gate Linear(hidden, num_local_experts, bias=False) and
    # num_local_experts SwiGLU experts of width intermediate_size; every layer is MoE.
    spec = _llama_like(f)
    experts = f.integer("num_local_experts")
    spec["moe"] = MoESpec(num_experts=experts, top_k=_top_k(f, "num_experts_per_tok", experts, "num_local_experts"),
                          expert_ffn_hidden_size=spec["ffn_hidden_size"])
    return spec


def _qwen2(f: _Fields) -> dict[str, Any]:
    # Qwen2Attention: q_proj, k_proj, v_proj have bias=True, o_proj has none.
    spec = _llama_like(f)
    spec["attention_bias"] = "qkv"
    return spec


def _qwen3(f: _Fields) -> dict[str, Any]:
    # Qwen3Config defaults head_dim to 128; q_norm and k_norm are RMSNorms over head_dim; all four
    # projections take bias=config.attention_bias.
    spec = _llama_like(f, head_dim_default=128)
    spec["qk_norm"] = True
    spec["attention_bias"] = "all" if f.flag("attention_bias", False) else "none"
    return spec


def _qwen_moe_layout(f: _Fields, num_layers: int, num_experts: int) -> int:
    """Leading dense layers of a Qwen MoE model (Qwen2MoeDecoderLayer's sparse-layer rule)."""
    step = f.integer("decoder_sparse_step", 1)
    mlp_only = f.int_list("mlp_only_layers")
    for i, layer in enumerate(mlp_only):
        if layer >= num_layers:
            raise SpecError(f"mlp_only_layers[{i}]", layer, f"is not a layer index (num_hidden_layers is {num_layers})",
                            f"use indices 0..{num_layers - 1}", source=f.source)
    # A layer is sparse iff it is not in mlp_only_layers, num_experts > 0 and (i + 1) % step == 0.
    is_moe = [i not in mlp_only and num_experts > 0 and (i + 1) % step == 0 for i in range(num_layers)]
    key, value = ("decoder_sparse_step", step) if step != 1 else ("mlp_only_layers", mlp_only)
    return _dense_prefix(f, is_moe, key, value)


def _qwen2_moe(f: _Fields) -> dict[str, Any]:
    # Qwen2MoeSparseMoeBlock: router gate (hidden -> num_experts, no bias), num_experts experts of
    # width moe_intermediate_size, one shared expert of width shared_expert_intermediate_size and a
    # shared_expert_gate Linear(hidden, 1, bias=False). Attention as Qwen2 (q/k/v bias).
    spec = _qwen2(f)
    experts = f.integer("num_experts", allow_zero=True)  # 0 makes every layer dense (Qwen2MoeConfig allows it)
    shared = f.integer("shared_expert_intermediate_size", allow_zero=True)
    dense = _qwen_moe_layout(f, spec["num_layers"], experts)
    if dense < spec["num_layers"]:
        spec["moe"] = MoESpec(
            num_experts=experts, top_k=_top_k(f, "num_experts_per_tok", experts, "num_experts"),
            expert_ffn_hidden_size=f.integer("moe_intermediate_size"), num_shared_experts=1 if shared else 0,
            shared_expert_ffn_hidden_size=shared or None, shared_expert_gate=bool(shared), first_dense_layers=dense)
    return spec


def _qwen3_moe(f: _Fields) -> dict[str, Any]:
    # Qwen3MoeSparseMoeBlock: router gate + routed experts only (no shared expert). Qwen3MoeConfig
    # has no head_dim default of its own: the attention falls back to hidden_size // heads.
    spec = _llama_like(f)
    spec["qk_norm"] = True
    spec["attention_bias"] = "all" if f.flag("attention_bias", False) else "none"
    experts = f.integer("num_experts", allow_zero=True)
    dense = _qwen_moe_layout(f, spec["num_layers"], experts)
    if dense < spec["num_layers"]:
        spec["moe"] = MoESpec(num_experts=experts, top_k=_top_k(f, "num_experts_per_tok", experts, "num_experts"),
                              expert_ffn_hidden_size=f.integer("moe_intermediate_size"), first_dense_layers=dense)
    return spec


def _deepseek(f: _Fields, *, v3: bool) -> dict[str, Any]:
    # DeepSeek-V2/V3 (modeling_deepseek.py): MLA attention; layer i is MoE iff n_routed_experts is
    # set, i >= first_k_dense_replace and i % moe_layer_freq == 0. The shared experts are one MLP of
    # width moe_intermediate_size * n_shared_experts (same count as n_shared separate experts).
    # V3's noaux_tc router adds e_score_correction_bias (one value per routed expert).
    hidden = f.integer("hidden_size")
    layers = f.integer("num_hidden_layers")
    heads = f.integer("num_attention_heads")
    if f.flag("attention_bias", False):
        raise f.unsupported("attention_bias", True, "MLA projections with biases are not modelled",
                            'set "attention_bias": false (as in every released DeepSeek-V2/V3 config)')
    if "q_lora_rank" not in f.data:
        raise SpecError("q_lora_rank", None, f"is required in a {f.arch} config.json but is missing",
                        '"q_lora_rank": 1536 for compressed queries, or null for none (DeepSeek-V2-Lite)',
                        source=f.source)
    mla = MLASpec(kv_lora_rank=f.integer("kv_lora_rank"), qk_nope_head_dim=f.integer("qk_nope_head_dim"),
                  qk_rope_head_dim=f.integer("qk_rope_head_dim"), v_head_dim=f.integer("v_head_dim"),
                  q_lora_rank=f.opt_int("q_lora_rank"))
    spec: dict[str, Any] = {
        "num_layers": layers, "hidden_size": hidden, "ffn_hidden_size": f.integer("intermediate_size"),
        "num_attention_heads": heads, "vocab_size": f.integer("vocab_size"),
        "tied_embeddings": f.flag("tie_word_embeddings", False), "mlp_type": "swiglu", "norm_type": "rmsnorm",
        "position_embedding": "rope", "mla": mla, "attention_dropout": f.probability("attention_dropout"),
    }
    experts = f.opt_int("n_routed_experts")
    if experts is None:
        return spec
    first_k = f.integer("first_k_dense_replace", 0, allow_zero=True)
    freq = f.integer("moe_layer_freq", 1)
    is_moe = [i >= first_k and i % freq == 0 for i in range(layers)]
    dense = _dense_prefix(f, is_moe, "moe_layer_freq" if freq != 1 else "first_k_dense_replace",
                          freq if freq != 1 else first_k)
    if dense == layers:
        raise SpecError("first_k_dense_replace", first_k, f"leaves no MoE layer among {layers} layers",
                        'make it smaller than num_hidden_layers, or set "n_routed_experts": null for a dense model',
                        source=f.source)
    topk_method = f.text("topk_method", "noaux_tc" if v3 else "greedy")
    spec["moe"] = MoESpec(
        num_experts=experts, top_k=_top_k(f, "num_experts_per_tok", experts, "n_routed_experts"),
        expert_ffn_hidden_size=f.integer("moe_intermediate_size"),
        num_shared_experts=f.integer("n_shared_experts", 0, allow_zero=True), first_dense_layers=dense,
        router_bias=topk_method == "noaux_tc")
    return spec


def _opt(f: _Fields) -> dict[str, Any]:
    # OPTDecoder: embed_tokens (vocab x word_embed_proj_dim); learned positions with 2 extra rows
    # (OPTLearnedPositionalEmbedding offset); project_in / project_out (no bias) when
    # word_embed_proj_dim != hidden_size; final_layer_norm only if do_layer_norm_before and not
    # _remove_final_layer_norm. q/k/v/out_proj and fc1/fc2 take bias=enable_bias. ReLU MLP.
    hidden = f.integer("hidden_size")
    if not f.flag("layer_norm_elementwise_affine", True):
        raise f.unsupported("layer_norm_elementwise_affine", False, "LayerNorms without weights are not modelled",
                            "remove the field (every released OPT model uses affine LayerNorms)")
    bias = f.flag("enable_bias", True)
    embed = f.integer("word_embed_proj_dim", hidden)
    # OPTDecoderLayer: dropout (default 0.1) after self-attention and fc2, attention_dropout on the
    # probabilities, activation_dropout after fc1's activation (0.0 in every released OPT model)
    if f.probability("activation_dropout") > 0:
        raise f.unsupported("activation_dropout", f.data["activation_dropout"],
                            "dropout inside the MLP is not modelled",
                            'set "activation_dropout": 0.0 (as in every released OPT model)')
    heads = _attention_heads(f, hidden, kv_key=None, read_head_dim=False)
    return {
        "num_layers": f.integer("num_hidden_layers"), "hidden_size": hidden, "ffn_hidden_size": f.integer("ffn_dim"),
        "vocab_size": f.integer("vocab_size"), **heads, "tied_embeddings": f.flag("tie_word_embeddings", True),
        "mlp_type": "relu", "norm_type": "layernorm", "attention_bias": "all" if bias else "none", "mlp_bias": bias,
        "position_embedding": "learned", "max_position_embeddings": f.integer("max_position_embeddings", 2048) + 2,
        "embedding_dim": embed if embed != hidden else None,
        "final_norm": f.flag("do_layer_norm_before", True) and not f.flag("_remove_final_layer_norm", False),
        "attention_dropout": f.probability("attention_dropout"),
        "hidden_dropout": 0.1 if f.data.get("dropout") is None else f.probability("dropout"),
    }


def _gpt_neox(f: _Fields) -> dict[str, Any]:
    # GPTNeoXLayer: two LayerNorms, fused query_key_value and dense with bias=attention_bias
    # (default true), dense_h_to_4h / dense_4h_to_h with bias; final_layer_norm; untied embed_out.
    # rotary_pct (partial rotary) and use_parallel_residual change the dataflow, not the weights.
    hidden = f.integer("hidden_size")
    f.fraction("rotary_pct", 0.25)
    f.flag("use_parallel_residual", True)
    return {
        "num_layers": f.integer("num_hidden_layers"), "hidden_size": hidden,
        "ffn_hidden_size": f.integer("intermediate_size"), "vocab_size": f.integer("vocab_size"),
        **_attention_heads(f, hidden, kv_key=None, read_head_dim=False),
        "tied_embeddings": f.flag("tie_word_embeddings", False),
        "mlp_type": "gelu", "norm_type": "layernorm", "mlp_bias": True,
        "attention_bias": "all" if f.flag("attention_bias", True) else "none", "position_embedding": "rope",
        # GPTNeoXConfig: attention_dropout / hidden_dropout (older files: *_prob), default 0.0
        "attention_dropout": f.probability("attention_dropout", "attention_probs_dropout_prob"),
        "hidden_dropout": f.probability("hidden_dropout", "hidden_dropout_prob"),
    }


def _gpt_neo(f: _Fields) -> dict[str, Any]:
    # GPTNeoSelfAttention: q/k/v_proj have no bias, out_proj has one; c_fc / c_proj with bias;
    # learned wpe of max_position_embeddings rows; lm_head tied to wte. Field names differ from
    # the others: num_layers, num_heads; intermediate_size null means 4 x hidden_size.
    hidden = f.integer("hidden_size")
    layers = f.integer("num_layers")
    _check_attention_types(f, layers)
    # GPTNeoConfig: attention_dropout, resid_dropout (after attention and MLP), embed_dropout
    resid, embed = f.probability("resid_dropout"), f.probability("embed_dropout")
    if embed != resid:
        raise f.unsupported("embed_dropout", embed, f"an embedding dropout different from resid_dropout ({resid}) "
                            "is not modelled",
                            f'set "embed_dropout": {resid} (both are 0 in the released GPT-Neo models)')
    return {
        "num_layers": layers, "hidden_size": hidden, "ffn_hidden_size": f.integer("intermediate_size", 4 * hidden),
        "vocab_size": f.integer("vocab_size"),
        **_attention_heads(f, hidden, heads_key="num_heads", kv_key=None, read_head_dim=False),
        "tied_embeddings": f.flag("tie_word_embeddings", True), "mlp_type": "gelu", "norm_type": "layernorm",
        "mlp_bias": True, "attention_bias": "out", "position_embedding": "learned",
        "max_position_embeddings": f.integer("max_position_embeddings", 2048),
        "attention_dropout": f.probability("attention_dropout"), "hidden_dropout": resid,
    }


def _check_attention_types(f: _Fields, layers: int) -> None:
    """GPT-Neo's ``[[["global", "local"], 16]]`` must expand to one entry per layer."""
    value = f.data.get("attention_types", [[["global", "local"], layers // 2]])
    fix = 'write e.g. [[["global", "local"], N]] with 2 x N = num_layers'
    if not isinstance(value, list):
        raise SpecError("attention_types", value, "must be a list of [[kinds...], repeat] pairs", fix, source=f.source)
    total = 0
    for i, item in enumerate(value):
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], list)):
            raise SpecError(f"attention_types[{i}]", item, "must be a [[kinds...], repeat] pair", fix, source=f.source)
        kinds, repeat = item
        for k in kinds:
            if k not in ("global", "local"):
                raise SpecError(f"attention_types[{i}]", item, f"has unknown attention kind {k!r}",
                                'use "global" or "local"', source=f.source)
        total += len(kinds) * _check.positive_int(f"attention_types[{i}][1]", repeat, source=f.source)
    if total != layers:
        raise SpecError("attention_types", value, f"expands to {total} layers but num_layers is {layers}", fix,
                        source=f.source)


_READERS: dict[str, Callable[[_Fields], dict[str, Any]]] = {
    "llama": _llama, "mistral": _llama, "mixtral": _mixtral, "qwen2": _qwen2, "qwen2_moe": _qwen2_moe,
    "qwen3": _qwen3, "qwen3_moe": _qwen3_moe, "deepseek_v2": lambda f: _deepseek(f, v3=False),
    "deepseek_v3": lambda f: _deepseek(f, v3=True), "opt": _opt, "gpt_neox": _gpt_neox, "gpt_neo": _gpt_neo,
}
assert set(_READERS) == set(SUPPORTED_ARCHITECTURES)


# --- entry point -----------------------------------------------------------------------------

def read_hf_config(path: str | Path) -> tuple[dict[str, Any], str]:
    """The parsed ``config.json`` at ``path`` (a file, or a directory holding one) and its path."""
    p = Path(path)
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise FormatError("path", str(path), "is a directory without a config.json",
                              "point at the model directory that holds config.json, or at the file itself")
        p = p / "config.json"
    p, text = read_text(p)
    data = parse_json(text, str(p))
    if not isinstance(data, dict):
        raise FormatError("file", str(p), f"holds a JSON {type(data).__name__}, not an object",
                          "a Hugging Face config.json is one JSON object { ... }")
    return data, str(p)


def architecture_of(data: Mapping[str, Any], *, source: str = "") -> str:
    """The supported ``model_type`` of a config (from ``model_type``, else ``architectures``)."""
    supported = ", ".join(SUPPORTED_ARCHITECTURES)
    other = ("for another decoder-only transformer, write a tangram model file instead "
             "(see docs/user_guide/inputs.md)")
    model_type = data.get("model_type")
    if model_type is not None:
        if not isinstance(model_type, str):
            raise SpecError("model_type", model_type, "must be a string", f"use one of {supported}", source=source)
        key = model_type.strip().lower().replace("-", "_")
        if key in _READERS:
            return key
        guess = _check.near_misses(key, SUPPORTED_ARCHITECTURES, 1)
        hint = f"did you mean {guess[0]!r}? " if guess else ""
        raise SpecError("model_type", model_type, "is not a supported architecture",
                        f"{hint}supported: {supported}; {other}", source=source)
    classes = data.get("architectures")
    if isinstance(classes, list) and classes:
        for cls in classes:
            if isinstance(cls, str) and cls in _ARCHITECTURE_CLASSES:
                return _ARCHITECTURE_CLASSES[cls]
        raise SpecError("architectures", classes, "names no supported model class",
                        f"add \"model_type\": one of {supported}; {other}", source=source)
    raise SpecError("model_type", None, "is missing (and there is no known 'architectures' entry)",
                    f'add "model_type": one of {supported}', source=source)


def model_from_hf_config(config: Mapping[str, Any] | str | Path, name: str | None = None) -> ModelSpec:
    """A :class:`ModelSpec` from a Hugging Face ``config.json``.

    ``config`` is the parsed dict, a path to ``config.json`` or a directory containing one. ``name``
    defaults to the last part of ``_name_or_path`` if the file has one, else the directory name,
    else the architecture.
    """
    source = ""
    if isinstance(config, (str, Path)):
        data, source = read_hf_config(config)
    elif isinstance(config, Mapping):
        data = dict(config)
    else:
        raise SpecError("config", config, f"cannot be read from a {type(config).__name__}",
                        "give the parsed config.json dict, its path, or the model directory")
    arch = architecture_of(data, source=source)
    fields = _READERS[arch](_Fields(data, arch, source))
    with _check.in_source(source):
        return ModelSpec(name=name or _default_name(data, arch, source), architecture=arch, **fields)


def _default_name(data: Mapping[str, Any], arch: str, source: str) -> str:
    hub_id = data.get("_name_or_path")
    if isinstance(hub_id, str) and hub_id.strip():
        return hub_id.rstrip("/").split("/")[-1]
    if source and Path(source).parent.name:
        return Path(source).parent.name
    return arch


def looks_like_hf_config(data: Mapping[str, Any]) -> bool:
    """True if ``data`` has the keys that mark a Hugging Face config (not a tangram model file)."""
    return "model_type" in data or "architectures" in data


__all__ = ["SUPPORTED_ARCHITECTURES", "architecture_of", "looks_like_hf_config", "model_from_hf_config",
           "read_hf_config"]
