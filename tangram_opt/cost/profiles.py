"""Measured per-layer profiles: a file format, loaders, and the Sailor profiles shipped with the package.

A measured profile replaces the *computed compute time* of a layer kind for one GPU type, per
tensor-parallel degree and micro-batch size. Communication the measurement did not include is
still modelled (context-parallel exchange, expert all-to-all, ZeRO-3 gathers, gradient sync,
pipeline p2p); TP communication is added on top only when ``includes_tp_comm`` is false.

File format (JSON, ``tangram_opt.layer_profile`` version 1)::

    {
      "format": "tangram_opt.layer_profile", "version": 1,
      "model": "OPT-350", "gpu": "A100-40",          # gpu: a catalog name or alias
      "seq_len": 2048,                                # tokens per sequence when measured
      "precision": "tf32",                            # bf16 | fp16 | fp8 | fp32 | tf32 (fp32 storage, TF32 matmuls)
      "includes_tp_comm": true,                       # measured with real TP, all-reduces included
      "sequence_parallel": false,                     # how TP ran when measured
      "source": "free text: who measured it, how",
      "model_shape": {"num_layers": 24, "hidden_size": 1024, ...},   # optional: checked against the model
      "entries": [
        {"kind": "dense", "tp": 1, "micro_batch_size": 1, "fwd_s": 0.00231, "bwd_s": 0.00591},
        {"kind": "embedding", ...}, {"kind": "head", ...}, {"kind": "moe", ...}
      ]
    }

``kind`` is "dense" or "moe" (one transformer block), "embedding" (first-stage extra) or "head"
(final norm + LM head + loss). Times are seconds per micro-batch of ``micro_batch_size``
sequences on one GPU, forward and backward (without recomputation). Lookups interpolate linearly
in the micro-batch size between measured sizes, extrapolate linearly above the largest and
proportionally below the smallest; a TP degree that was not measured falls back to the analytical
model.

The Sailor profiles (ETH Zurich, MIT license, see ``tangram_opt/data/profiles/sailor/LICENSE``)
are shipped in their native nested format ``{micro_batch: {tp: {layer_index: [fwd_s, bwd_s,
optimizer_s]}}}`` and converted by :func:`load_sailor_profile`.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tangram_opt.errors import FormatError, SpecError
from tangram_opt.specs.hardware import get_gpu_type
from tangram_opt.specs.model import ModelSpec

PROFILE_FORMAT = "tangram_opt.layer_profile"
PROFILE_VERSION = 1
PROFILE_KINDS = ("dense", "moe", "embedding", "head")
PROFILE_PRECISIONS = ("bf16", "fp16", "fp8", "fp32", "tf32")


def precision_class(precision: str) -> str:
    """What a profile must share with the run: "32-bit" (fp32, tf32), "fp8" (FP8 linear layers) or
    "16-bit" (bf16, fp16): the GEMMs run at the same rate within a class."""
    return "32-bit" if precision in ("fp32", "tf32") else "fp8" if precision == "fp8" else "16-bit"
SAILOR_DIR = Path(__file__).resolve().parent.parent / "data" / "profiles" / "sailor"


@dataclass(frozen=True, slots=True, kw_only=True)
class ProfileEntry:
    kind: str
    tp: int
    micro_batch_size: int
    fwd_time_s: float
    bwd_time_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerProfile:
    """Measured per-layer times of one model on one GPU type."""

    model: str
    gpu: str
    seq_len: int
    precision: str
    entries: tuple[ProfileEntry, ...]
    includes_tp_comm: bool = True
    sequence_parallel: bool = False
    source: str = ""
    notes: tuple[str, ...] = ()
    #: the shape of the model measured (``MODEL_SHAPE_FIELDS``): planning refuses the profile for a
    #: model of another shape; without it the profile's ``model`` must name the model planned
    model_shape: Mapping[str, int] | None = field(default=None, compare=False)
    _index: dict[tuple[str, int], tuple[tuple[int, float, float], ...]] = field(
        init=False, default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.precision not in PROFILE_PRECISIONS:
            raise SpecError("profile.precision", self.precision, "is not a known precision",
                            f"use one of {', '.join(PROFILE_PRECISIONS)}")
        groups: dict[tuple[str, int], list[tuple[int, float, float]]] = {}
        for i, en in enumerate(self.entries):
            if en.kind not in PROFILE_KINDS:
                raise SpecError(f"profile.entries[{i}].kind", en.kind, "is not a layer kind",
                                f"use one of {', '.join(PROFILE_KINDS)}")
            if en.tp < 1 or en.micro_batch_size < 1:
                raise SpecError(f"profile.entries[{i}]", (en.tp, en.micro_batch_size),
                                "tp and micro_batch_size must be >= 1", "fix the entry")
            if not (en.fwd_time_s >= 0 and en.bwd_time_s >= 0):
                raise SpecError(f"profile.entries[{i}]", (en.fwd_time_s, en.bwd_time_s),
                                "times must be finite and >= 0", "fix the entry")
            groups.setdefault((en.kind, en.tp), []).append((en.micro_batch_size, en.fwd_time_s, en.bwd_time_s))
        for key, pts in groups.items():
            self._index[key] = tuple(sorted(pts))

    @property
    def gpu_name(self) -> str:
        """The catalog name of the GPU type (aliases such as Sailor's "GH-96" resolved)."""
        return get_gpu_type(self.gpu, field="profile.gpu").name

    def tps(self, kind: str = "dense") -> tuple[int, ...]:
        return tuple(sorted(tp for k, tp in self._index if k == kind))

    def micro_batch_sizes(self, kind: str, tp: int) -> tuple[int, ...]:
        return tuple(p[0] for p in self._index.get((kind, tp), ()))

    def lookup(self, kind: str, tp: int, micro_batch_size: int) -> tuple[float, float] | None:
        """(fwd_s, bwd_s) for ``kind`` at ``tp`` and ``micro_batch_size``, or None if tp was not measured."""
        pts = self._index.get((kind, tp))
        if not pts:
            return None
        b = micro_batch_size
        for mb, f, w in pts:
            if mb == b:
                return f, w
        if b < pts[0][0]:
            mb, f, w = pts[0]
            return f * b / mb, w * b / mb
        if b > pts[-1][0]:
            if len(pts) == 1:
                mb, f, w = pts[0]
                return f * b / mb, w * b / mb
            (m0, f0, w0), (m1, f1, w1) = pts[-2], pts[-1]
        else:
            i = next(i for i, p in enumerate(pts) if p[0] > b)
            (m0, f0, w0), (m1, f1, w1) = pts[i - 1], pts[i]
        x = (b - m0) / (m1 - m0)
        f, w = f0 + (f1 - f0) * x, w0 + (w1 - w0) * x
        # extrapolation of a noisy pair must not go below the proportional estimate from the last point
        return max(f, f1 * b / m1 * 0.5), max(w, w1 * b / m1 * 0.5)

    def to_dict(self) -> dict[str, Any]:
        shape = {"model_shape": dict(self.model_shape)} if self.model_shape else {}
        return {"format": PROFILE_FORMAT, "version": PROFILE_VERSION, "model": self.model, "gpu": self.gpu,
                "seq_len": self.seq_len, "precision": self.precision, "includes_tp_comm": self.includes_tp_comm,
                "sequence_parallel": self.sequence_parallel, "source": self.source, **shape,
                "entries": [{"kind": e.kind, "tp": e.tp, "micro_batch_size": e.micro_batch_size,
                             "fwd_s": e.fwd_time_s, "bwd_s": e.bwd_time_s} for e in self.entries]}


class ProfileSet:
    """Several :class:`LayerProfile` of one model, looked up by GPU type name."""

    def __init__(self, profiles: Iterable[LayerProfile] = ()):
        self._by_gpu: dict[str, LayerProfile] = {}
        for p in profiles:
            self.add(p)

    def add(self, profile: LayerProfile) -> None:
        name = profile.gpu_name
        if name in self._by_gpu:
            raise SpecError("profiles", profile.gpu, f"a profile for GPU type {name} is already present",
                            "pass one profile per GPU type")
        self._by_gpu[name] = profile

    def get(self, gpu_name: str) -> LayerProfile | None:
        return self._by_gpu.get(gpu_name)

    def __iter__(self) -> Iterator[LayerProfile]:
        return iter(self._by_gpu.values())

    def __len__(self) -> int:
        return len(self._by_gpu)


# --- our file format -----------------------------------------------------------------------------
def profile_from_dict(data: Any, *, source: str = "") -> LayerProfile:
    if not isinstance(data, Mapping):
        raise FormatError("profile", type(data).__name__, "must be a JSON object", "see tangram_opt.cost.profiles",
                          source=source)
    if data.get("format") != PROFILE_FORMAT:
        raise FormatError("profile.format", data.get("format"), f"is not {PROFILE_FORMAT!r}",
                          "convert Sailor files with load_sailor_profile()", source=source)
    if data.get("version") != PROFILE_VERSION:
        raise FormatError("profile.version", data.get("version"), f"is not {PROFILE_VERSION}",
                          "upgrade tangram_opt or convert the file", source=source)
    missing = [k for k in ("model", "gpu", "seq_len", "precision", "entries") if k not in data]
    if missing:
        raise FormatError(f"profile.{missing[0]}", None, "is required but missing", f"add {missing[0]!r}",
                          source=source)
    unknown = sorted(set(data) - set(_FILE_KEYS))
    if unknown:
        raise FormatError(f"profile.{unknown[0]}", data[unknown[0]], "is not a field of a layer profile",
                          f"use {', '.join(_FILE_KEYS)}", source=source)
    if not isinstance(data["entries"], list) or not data["entries"]:
        raise FormatError("profile.entries", data["entries"], "must be a non-empty list",
                          "give one entry per kind, tp and micro-batch size", source=source)
    entries = []
    for i, e in enumerate(data["entries"]):
        if not isinstance(e, Mapping):
            raise FormatError(f"profile.entries[{i}]", e, "must be an object", "give kind, tp, micro_batch_size, "
                              "fwd_s and bwd_s", source=source)
        for key in ("kind", "tp", "micro_batch_size", "fwd_s", "bwd_s"):
            if key not in e:
                raise FormatError(f"profile.entries[{i}].{key}", None, "is required but missing", f"add {key!r}",
                                  source=source)
        for key in ("tp", "micro_batch_size"):
            if isinstance(e[key], bool) or not isinstance(e[key], int) or e[key] < 1:
                raise FormatError(f"profile.entries[{i}].{key}", e[key], "must be an integer >= 1", "fix the entry",
                                  source=source)
        for key in ("fwd_s", "bwd_s"):
            v = e[key]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise FormatError(f"profile.entries[{i}].{key}", v, "must be a finite time in seconds > 0",
                                  "re-measure the entry", source=source)
        entries.append(ProfileEntry(kind=str(e["kind"]), tp=e["tp"], micro_batch_size=e["micro_batch_size"],
                                    fwd_time_s=float(e["fwd_s"]), bwd_time_s=float(e["bwd_s"])))
    seq = data["seq_len"]
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 1:
        raise FormatError("profile.seq_len", seq, "must be an integer >= 1", "give the measured sequence length",
                          source=source)
    shape = data.get("model_shape")
    if shape is not None:
        if not isinstance(shape, Mapping):
            raise FormatError("profile.model_shape", shape, "must be an object", "e.g. {hidden_size: 4096, ...}",
                              source=source)
        bad = sorted(set(shape) - set(MODEL_SHAPE_FIELDS))
        if bad:
            raise FormatError(f"profile.model_shape.{bad[0]}", shape[bad[0]], "is not a shape field",
                              f"use {', '.join(MODEL_SHAPE_FIELDS)}", source=source)
    try:
        return LayerProfile(model=str(data["model"]), gpu=str(data["gpu"]), seq_len=seq,
                            precision=str(data["precision"]), entries=tuple(entries),
                            includes_tp_comm=bool(data.get("includes_tp_comm", True)),
                            sequence_parallel=bool(data.get("sequence_parallel", False)),
                            source=str(data.get("source", source)),
                            model_shape=None if shape is None else {k: int(v) for k, v in shape.items()})
    except SpecError as e:
        raise FormatError(e.field, e.value, e.problem, e.fix, source=source) from None


#: keys a layer-profile file may hold
_FILE_KEYS = ("format", "version", "model", "gpu", "seq_len", "precision", "includes_tp_comm", "sequence_parallel",
              "source", "model_shape", "entries")
#: the model fields a profile's ``model_shape`` records (everything that sizes a block's work)
MODEL_SHAPE_FIELDS = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_kv_heads",
                      "head_dim", "vocab_size", "num_experts", "top_k", "expert_ffn_hidden_size")


def model_shape(model: ModelSpec) -> dict[str, int]:
    """The ``model_shape`` record of ``model`` (what a profile of it must match)."""
    shape = {"num_layers": model.num_layers, "hidden_size": model.hidden_size,
             "ffn_hidden_size": model.ffn_hidden_size, "num_attention_heads": model.num_attention_heads,
             "num_kv_heads": model.kv_heads, "head_dim": model.head_size, "vocab_size": model.vocab_size}
    if model.moe is not None:
        shape.update(num_experts=model.moe.num_experts, top_k=model.moe.top_k,
                     expert_ffn_hidden_size=model.moe.expert_ffn_hidden_size)
    return shape


def check_profiles(profiles: ProfileSet, model: ModelSpec, seq_len: int, precision: str) -> None:
    """Refuse profiles that do not describe this training run, naming the field: another model
    shape (or, without a recorded shape, another model name), another sequence length, another
    precision class (16-bit against fp32/TF32). A profile is never silently ignored."""
    want = model_shape(model)
    for p in profiles:
        where = f"profile {p.model}/{p.gpu}" + (f" ({p.source})" if p.source else "")
        if p.model_shape is not None:
            diff = {k: (v, want.get(k)) for k, v in p.model_shape.items() if want.get(k) != v}
            if diff:
                k, (got, exp) = next(iter(diff.items()))
                raise SpecError(f"profile.model_shape.{k}", got, f"{where} was measured on another model "
                                f"({model.name} has {k} = {exp})", f"profile {model.name} itself (tangram-opt profile)")
        elif p.model.strip().lower() != model.name.strip().lower():
            raise SpecError("profile.model", p.model, f"{where} has no model_shape and names another model than "
                            f"{model.name!r}", f"re-measure with 'tangram-opt profile --model {model.name}' (it "
                            "records the shape), or add a model_shape")
        if p.seq_len != seq_len:
            raise SpecError("profile.seq_len", p.seq_len, f"{where} was measured at sequence length {p.seq_len}, "
                            f"the run trains at {seq_len}", f"profile with --seq {seq_len}")
        if precision_class(p.precision) != precision_class(precision):
            raise SpecError("profile.precision", p.precision, f"{where} was measured in {p.precision}, the run "
                            f"trains in {precision}", f"profile with --precision {precision}")


def load_profiles(path: str | Path) -> ProfileSet:
    """One profile file, or every ``*.json`` profile in a directory, as a :class:`ProfileSet`."""
    p = Path(path)
    if p.is_dir():
        files = sorted(p.glob("*.json"))
        if not files:
            raise FormatError("profiles", str(p), "holds no *.json layer profile",
                              "point at the directory 'tangram-opt profile --output' wrote")
        return ProfileSet(load_profile(f) for f in files)
    return ProfileSet([load_profile(p)])


def load_profile(path: str | Path) -> LayerProfile:
    """Read a profile in the ``tangram_opt.layer_profile`` format."""
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FormatError("path", str(p), "file not found", "check the path") from None
    except json.JSONDecodeError as e:
        raise FormatError("file", str(p), f"is not valid JSON (line {e.lineno}: {e.msg})", "fix the JSON") from None
    return profile_from_dict(data, source=str(p))


def save_profile(profile: LayerProfile, path: str | Path) -> None:
    Path(path).write_text(json.dumps(profile.to_dict(), indent=1) + "\n", encoding="utf-8")


# --- Sailor ----------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class SailorModel:
    """A model as Sailor's profiler ran it (Megatron-style GPT blocks, vocabulary padded to 50304).

    The shapes reproduce the per-layer parameter counts of Sailor's ``llm_info.json`` exactly
    (checked in tests). ``head_has_lm_head`` is False where Sailor's last profiled layer holds only
    the final norm (GPT-Neo-2.7: 5,120 parameters), so its time cannot be compared with a head.
    """

    spec: ModelSpec
    seq_len: int
    head_has_lm_head: bool = True


def _gpt(name: str, layers: int, hidden: int, heads: int, *, tied: bool = False) -> ModelSpec:
    return ModelSpec(name=name, num_layers=layers, hidden_size=hidden, ffn_hidden_size=4 * hidden,
                     num_attention_heads=heads, vocab_size=50304, tied_embeddings=tied, mlp_type="gelu",
                     norm_type="layernorm", attention_bias="all", mlp_bias=True, position_embedding="learned",
                     max_position_embeddings=2048, architecture="sailor-gpt")


#: Sailor's four models. LLAMA-3-8 is profiled at sequence length 8192 (``act_output_floats`` in
#: llm_info.json is 8192 x 4096 per sequence) with 16 h^2 + 15 h parameters per block: full multi-head
#: attention with biases and a SwiGLU MLP of width 4h with biases, RMSNorm, GPT-2 vocabulary.
SAILOR_MODELS: dict[str, SailorModel] = {
    "OPT-350": SailorModel(spec=_gpt("OPT-350 (Sailor)", 24, 1024, 16), seq_len=2048),
    "GPT-Neo-2.7": SailorModel(spec=_gpt("GPT-Neo-2.7 (Sailor)", 32, 2560, 20, tied=True), seq_len=2048,
                               head_has_lm_head=False),
    "OPT-30": SailorModel(spec=_gpt("OPT-30 (Sailor)", 48, 7168, 56), seq_len=2048),
    "LLAMA-3-8": SailorModel(spec=ModelSpec(
        name="LLAMA-3-8 (Sailor)", num_layers=32, hidden_size=4096, ffn_hidden_size=16384, num_attention_heads=32,
        num_kv_heads=32, vocab_size=50304, mlp_type="swiglu", norm_type="rmsnorm", attention_bias="all",
        mlp_bias=True, position_embedding="rope", architecture="sailor-llama"), seq_len=8192),
}


def sailor_files(root: str | Path | None = None) -> list[tuple[str, str, Path]]:
    """(model, gpu, path) of every Sailor profile shipped (or under ``root``)."""
    base = Path(root) if root is not None else SAILOR_DIR
    out = []
    for p in sorted(base.glob("*/*/profile.json")):
        out.append((p.parent.parent.name, p.parent.name, p))
    return out


def read_sailor_raw(path: str | Path) -> dict[int, dict[int, dict[int, tuple[float, float, float]]]]:
    """The nested Sailor dict with integer keys: ``{mb: {tp: {layer: (fwd, bwd, opt)}}}``."""
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise FormatError("file", str(p), f"cannot be read as a Sailor profile ({e})", "check the path") from None
    out: dict[int, dict[int, dict[int, tuple[float, float, float]]]] = {}
    for mb, by_tp in data.items():
        for tp, layers in by_tp.items():
            out.setdefault(int(mb), {})[int(tp)] = {int(i): (float(v[0]), float(v[1]), float(v[2]))
                                                     for i, v in layers.items()}
    return out


def load_sailor_profile(path: str | Path, *, model: str, gpu: str | None = None, precision: str = "fp32",
                        num_layers: int | None = None, seq_len: int | None = None) -> LayerProfile:
    """Convert one Sailor ``profile.json`` to a :class:`LayerProfile`.

    Blocks are layers ``1..L``; their median forward and backward times form the "dense" entry
    (the first block is often a little slower: it also receives the embedding output). Layer 0 is
    the embedding; everything after the last block (final norm, LM head and loss; Sailor's LLAMA has
    them as two layers) is summed into the "head" entry. A file whose layer count does not match the
    model is rejected: Sailor's GPT-Neo-2.7/GH-96 file has 24 blocks, and is in fact a copy of the
    OPT-350/GH-96 file.
    """
    p = Path(path)
    info = SAILOR_MODELS.get(model)
    layers = num_layers if num_layers is not None else (info.spec.num_layers if info else None)
    if layers is None:
        raise SpecError("model", model, "is not a Sailor model and num_layers was not given",
                        f"use one of {', '.join(SAILOR_MODELS)} or pass num_layers=")
    raw = read_sailor_raw(p)
    entries: list[ProfileEntry] = []
    notes: list[str] = []
    for mb in sorted(raw):
        for tp in sorted(raw[mb]):
            lay = raw[mb][tp]
            n = len(lay)
            if n < layers + 2:
                raise SpecError("profile", str(p), f"has {n - 2} blocks at mb={mb} tp={tp}, but {model} has {layers}",
                                "check that the file belongs to this model")
            blocks = [lay[i] for i in range(1, layers + 1)]
            entries.append(ProfileEntry(kind="dense", tp=tp, micro_batch_size=mb,
                                        fwd_time_s=statistics.median(b[0] for b in blocks),
                                        bwd_time_s=statistics.median(b[1] for b in blocks)))
            entries.append(ProfileEntry(kind="embedding", tp=tp, micro_batch_size=mb,
                                        fwd_time_s=lay[0][0], bwd_time_s=lay[0][1]))
            tail = [lay[i] for i in range(layers + 1, n)]
            if info is None or info.head_has_lm_head:
                entries.append(ProfileEntry(kind="head", tp=tp, micro_batch_size=mb,
                                            fwd_time_s=sum(t[0] for t in tail), bwd_time_s=sum(t[1] for t in tail)))
    if info is not None and not info.head_has_lm_head:
        notes.append("last layer holds only the final norm: no head entry")
    return LayerProfile(model=model, gpu=gpu or p.parent.name, seq_len=seq_len or (info.seq_len if info else 2048),
                        precision=precision, entries=tuple(entries), includes_tp_comm=True,
                        sequence_parallel=False, source=f"Sailor (ETH Zurich, MIT license): {p.name}",
                        notes=tuple(notes))


def sailor_block_flops(model: str, micro_batch_size: int, tp: int) -> float:
    """Forward FLOPs of one block of a Sailor model per GPU (full attention square, as executed)."""
    info = SAILOR_MODELS[model]
    m, s = info.spec, info.seq_len
    from tangram_opt.cost.flops import layer_params

    mats = layer_params(m, "dense").matmul_active
    return (2.0 * micro_batch_size * s * mats + 4.0 * micro_batch_size * s * s * m.hidden_size) / tp


def infer_sailor_precision(raw: Mapping[int, Mapping[int, Mapping[int, tuple[float, float, float]]]], model: str,
                           gpu_name: str) -> tuple[str, float]:
    """Which arithmetic a Sailor file ran in, from its best block throughput.

    Sailor trains in fp32 storage. If the best block forward reaches more than the GPU's FP32
    (CUDA-core) peak, its matmuls must have run on tensor cores: TF32 on GPUs that have it (those
    with BF16 tensor cores: Ampere and later), else fp16. Otherwise IEEE fp32. Returns the precision
    and the best achieved FLOP/s.
    """
    gpu = get_gpu_type(gpu_name)
    best = 0.0
    for mb, by_tp in raw.items():
        for tp, lay in by_tp.items():
            fwd = statistics.median(lay[i][0] for i in range(1, SAILOR_MODELS[model].spec.num_layers + 1)
                                    if i in lay)
            if fwd > 0:
                best = max(best, sailor_block_flops(model, mb, tp) / fwd)
    if best > gpu.fp32_flops_per_s:
        return ("tf32" if gpu.bf16_flops_per_s is not None else "fp16"), best
    return "fp32", best


def sailor_link_bandwidths(root: str | Path | None = None) -> dict[str, dict[int, float]]:
    """Sailor's measured intra-node bandwidth (bytes/s) per GPU type and GPUs per node ("peak" figures)."""
    base = Path(root) if root is not None else SAILOR_DIR
    path = base / "network" / "intra_node_bandwidths.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    return {gpu: {int(n): float(v[1]) for n, v in by_n.items()} for gpu, by_n in data.items()}


def sailor_profiles(model: str, *, root: str | Path | None = None) -> tuple[ProfileSet, dict[str, str]]:
    """Every shipped Sailor profile of ``model`` that matches its layer count, with the precision inferred.

    Returns the set and a mapping ``gpu -> reason`` for files that were skipped.
    """
    out, skipped = ProfileSet(), {}
    for mname, gpu, path in sailor_files(root):
        if mname != model:
            continue
        try:
            raw = read_sailor_raw(path)
            precision, _ = infer_sailor_precision(raw, model, gpu)
            out.add(load_sailor_profile(path, model=model, gpu=gpu, precision=precision))
        except SpecError as e:
            skipped[gpu] = e.problem
    return out, skipped
