"""Measure a model's layers on the local device and write a ``tangram_opt.layer_profile`` file.

:func:`check_request` refuses bad inputs before anything is imported or measured;
:func:`run_profile` builds each layer kind of one TP rank (:mod:`tangram_opt.profiling.blocks`),
times forward and backward (:mod:`tangram_opt.profiling.timer`) for every TP degree and
micro-batch size, and returns a :class:`ProfileResult` whose ``profile`` is a
:class:`~tangram_opt.cost.profiles.LayerProfile`; :func:`write_profile` saves it (one JSON file per
model, GPU type and precision) with a CSV of the raw measurements beside it.

The profile says ``includes_tp_comm: false``: a TP degree is measured as the per-rank shard (heads /
tp, ffn / tp, vocab / tp) on one device, without its collectives, which the cost model adds from the
link model (docs/cost_model.md §3.2). Only PyTorch is needed (the ``profile`` extra); it is imported
when a run starts, never at import time.
"""

from __future__ import annotations

import csv
import math
import platform
import re
import statistics
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tangram_opt.cost.flops import layer_model_flops
from tangram_opt.cost.profiles import (PROFILE_KINDS, LayerProfile, ProfileEntry, load_profile, load_profiles,
                                       model_shape, save_profile)
from tangram_opt.errors import SpecError, TangramError
from tangram_opt.specs.hardware import get_gpu_type
from tangram_opt.specs.model import ModelSpec

#: what a user without PyTorch is told to do
INSTALL_FIX = "install the profile extra: pip install 'tangram_opt[profile]'"
PRECISIONS = ("auto", "bf16", "fp16", "fp32", "tf32")
ATTENTION_IMPLS = ("sdpa", "eager")  # the same names as blocks.ATTENTION_IMPLS (which imports torch)
#: the command-line flag of each request field (the CLI names flags in its errors)
CLI_FLAGS = {"model": "--model", "gpu": "--gpu-name", "seq_len": "--seq", "micro_batch_sizes": "--micro-batch-sizes",
             "tp": "--tp", "precision": "--precision", "device": "--device", "attention": "--attention",
             "warmup": "--warmup", "repeats": "--repeats", "ep": "--ep", "kinds": "--kinds", "output_dir": "--output"}


class TorchUnavailableError(TangramError):
    """PyTorch is not installed (or does not import): profiling needs the ``profile`` extra."""


def import_torch() -> Any:
    try:
        import torch
    except ImportError as e:
        raise TorchUnavailableError(f"PyTorch is needed to measure layers and is not importable ({e}); {INSTALL_FIX}"
                                    ) from None
    return torch


@dataclass(frozen=True, slots=True, kw_only=True)
class ProfileRequest:
    """What to measure. ``gpu`` is the catalog GPU type the file stands for (None: recognized from
    the CUDA device's name); ``precision`` "auto" is bf16 on GPUs with bf16, fp16 on older ones and
    fp32 on the CPU; ``device`` "auto" is the first CUDA device if there is one, else the CPU;
    ``kinds`` None measures every layer kind of the model plus the embedding and the head; ``ep``
    (MoE) measures one expert-parallel rank: ``num_experts / ep`` experts receiving
    ``tokens x top_k`` token copies."""

    model: ModelSpec
    seq_len: int
    micro_batch_sizes: tuple[int, ...] = (1, 2, 4)
    tp: tuple[int, ...] = (1,)
    gpu: str | None = None
    precision: str = "auto"
    device: str = "auto"
    attention: str = "sdpa"
    warmup: int = 3
    repeats: int = 10
    ep: int = 1
    kinds: tuple[str, ...] | None = None

    @property
    def layer_kinds(self) -> tuple[str, ...]:
        if self.kinds is not None:
            return tuple(k for k in PROFILE_KINDS if k in self.kinds)
        own = tuple(k for k in ("dense", "moe") if self.model.layers_of_kind(k))  # type: ignore[arg-type]
        return own + ("embedding", "head")


def _int(name: str, v: Any, minimum: int, fix: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise SpecError(name, v, f"must be an integer >= {minimum}", fix)
    return v


def _int_tuple(name: str, values: Any, what: str, example: str) -> tuple[int, ...]:
    vals = tuple(values) if values is not None else ()
    if not vals:
        raise SpecError(name, vals, f"is empty: give at least one {what}", f"e.g. {example}")
    for v in vals:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise SpecError(name, vals, f"lists {v!r}, but every {what} must be an integer >= 1", f"e.g. {example}")
    return tuple(sorted(set(vals)))


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


def check_request(req: ProfileRequest) -> None:
    """Refuse a request that cannot be measured, naming the field, the value and the fix (no torch needed)."""
    m = req.model
    if not isinstance(m, ModelSpec):
        raise SpecError("model", m, "must be a ModelSpec", "load one with tangram_opt.load_model(...)")
    _int("seq_len", req.seq_len, 1, "give the training sequence length in tokens, e.g. 4096")
    if m.position_embedding == "learned" and req.seq_len > m.max_position_embeddings:
        raise SpecError("seq_len", req.seq_len, f"exceeds the {m.max_position_embeddings} learned positions of "
                        f"{m.name}", f"profile at a sequence length <= {m.max_position_embeddings}")
    _int_tuple("micro_batch_sizes", req.micro_batch_sizes, "micro-batch size", "1,2,4")
    tps = _int_tuple("tp", req.tp, "tensor-parallel degree", "1,2")
    kinds = req.layer_kinds
    if req.kinds is not None:
        bad = [k for k in req.kinds if k not in PROFILE_KINDS]
        if bad or not req.kinds:
            raise SpecError("kinds", req.kinds, "must list layer kinds" if not bad else f"{bad[0]!r} is not a layer "
                            "kind", f"use some of {', '.join(PROFILE_KINDS)}")
        for k in ("dense", "moe"):
            if k in req.kinds and not m.layers_of_kind(k):  # type: ignore[arg-type]
                raise SpecError("kinds", req.kinds, f"{m.name} has no {k} layers",
                                f"leave {k} out (the model's block kinds: "
                                f"{', '.join(x for x in ('dense', 'moe') if m.layers_of_kind(x))})")  # type: ignore
    for tp in tps:
        problems = []
        if m.num_attention_heads % tp:
            problems.append(f"does not divide the {m.num_attention_heads} attention heads")
        if m.mla is None and m.kv_heads % tp:
            problems.append(f"does not divide the {m.kv_heads} key/value heads")
        if "dense" in kinds and m.ffn_hidden_size % tp:
            problems.append(f"does not divide ffn_hidden_size ({m.ffn_hidden_size})")
        if "moe" in kinds and m.moe is not None:
            if m.moe.expert_ffn_hidden_size % tp:
                problems.append(f"does not divide expert_ffn_hidden_size ({m.moe.expert_ffn_hidden_size})")
            shared = m.moe.num_shared_experts * m.moe.shared_ffn_hidden_size
            if shared % tp:
                problems.append(f"does not divide the shared experts' width ({shared})")
        if problems:
            common = math.gcd(m.num_attention_heads, m.kv_heads if m.mla is None else m.num_attention_heads)
            raise SpecError("tp", tp, f"{' and '.join(problems)} of {m.name}",
                            f"use tensor-parallel degrees that divide them (at most: {_divisors(common)})")
    _int("ep", req.ep, 1, "use 1, or an expert-parallel degree that divides the number of experts")
    if req.ep > 1:
        if m.moe is None:
            raise SpecError("ep", req.ep, f"{m.name} is a dense model", "leave ep at 1")
        if m.moe.num_experts % req.ep:
            raise SpecError("ep", req.ep, f"does not divide the {m.moe.num_experts} experts of {m.name}",
                            f"use one of {_divisors(m.moe.num_experts)}")
    if req.precision not in PRECISIONS:
        raise SpecError("precision", req.precision, "is not a precision", f"use one of {', '.join(PRECISIONS)}")
    if req.attention not in ATTENTION_IMPLS:
        raise SpecError("attention", req.attention, "is not an attention implementation",
                        "use sdpa (torch.nn.functional.scaled_dot_product_attention) or eager")
    _int("warmup", req.warmup, 0, "e.g. 3 untimed passes")
    _int("repeats", req.repeats, 1, "e.g. 10 timed passes (the median is recorded)")
    if req.gpu is not None:
        gpu = get_gpu_type(req.gpu, field="gpu")
        _check_gpu_precision(gpu.name, gpu.supports("bf16"), req.precision)
    if not isinstance(req.device, str) or not re.fullmatch(r"auto|cpu|cuda(:\d+)?", req.device):
        raise SpecError("device", req.device, "is not a device", "use auto, cpu, cuda or cuda:N")


def _check_gpu_precision(gpu_name: str, has_bf16: bool, precision: str) -> None:
    """A catalog GPU without BF16 tensor cores (V100, Turing) has neither bf16 nor TF32."""
    if not has_bf16 and precision in ("bf16", "tf32"):
        raise SpecError("precision", precision, f"{gpu_name} has no {precision} arithmetic (no BF16/TF32 tensor "
                        "cores)", "use --precision fp16 (or fp32) for this GPU type")


def check_output_dir(path: str | Path) -> Path:
    """Create ``path`` if needed and make sure a file can be written there (before measuring anything)."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise SpecError("output_dir", str(p), "is a file, not a directory", "give a directory for the profile files")
    try:
        p.mkdir(parents=True, exist_ok=True)
        probe = p / ".tangram-profile-write-test"
        probe.write_text("", encoding="utf-8")
        probe.unlink()
    except OSError as e:
        raise SpecError("output_dir", str(p), f"cannot be written ({e.strerror or e})",
                        "choose a directory you can write to") from None
    return p


# --- device, precision, attention kernel ------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceInfo:
    """The device measured on and what ran there."""

    device: Any  # torch.device
    description: str  # e.g. "cuda:0 NVIDIA A100-SXM4-80GB (compute capability 8.0)"
    gpu: str  # catalog GPU type the profile stands for
    precision: str
    dtype: Any  # torch dtype of parameters and activations
    notes: tuple[str, ...] = ()


def _gpu_from_device_name(name: str) -> str | None:
    """The catalog GPU type of a CUDA device name ("NVIDIA A100-SXM4-80GB" -> "A100-80"), or None."""
    base = re.sub(r"^(NVIDIA|Tesla|AMD)\s+", "", name.strip(), flags=re.IGNORECASE)
    for cand in (base.replace(" ", "-"), base.split(" ")[0], "-".join(base.split(" ")[:2])):
        try:
            return get_gpu_type(cand).name
        except SpecError:
            continue
    return None


def resolve_device(torch: Any, req: ProfileRequest) -> DeviceInfo:
    notes: list[str] = []
    want = req.device
    if want == "auto":
        want = "cuda" if torch.cuda.is_available() else "cpu"
    if want.startswith("cuda"):
        if not torch.cuda.is_available():
            raise SpecError("device", req.device, f"this PyTorch ({torch.__version__}) sees no CUDA device",
                            "run on a machine with a GPU and a CUDA build of PyTorch, or use --device cpu")
        dev = torch.device(want)
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        if index >= torch.cuda.device_count():
            raise SpecError("device", req.device, f"there are {torch.cuda.device_count()} CUDA devices",
                            f"use cuda:0 ... cuda:{torch.cuda.device_count() - 1}")
        dev = torch.device("cuda", index)
        torch.cuda.set_device(dev)
        dname = torch.cuda.get_device_name(dev)
        cc = torch.cuda.get_device_capability(dev)
        hip = getattr(torch.version, "hip", None)
        has_bf16 = bool(torch.cuda.is_bf16_supported()) if hip else cc >= (8, 0)
        description = f"{dev} {dname}" + ("" if hip else f" (compute capability {cc[0]}.{cc[1]})")
        seen = _gpu_from_device_name(dname)
    else:
        dev, dname, cc, hip, has_bf16, seen = torch.device("cpu"), platform.processor() or platform.machine(), None, \
            None, True, None
        description = f"cpu ({platform.machine()}, {torch.get_num_threads()} threads)"
    if req.gpu is None:
        if dev.type == "cpu":
            raise SpecError("gpu", None, "measuring on the CPU needs the GPU type name the file stands for",
                            "pass --gpu-name with a catalog name (e.g. A100-80); CPU times only test the workflow")
        if seen is None:
            raise SpecError("gpu", None, f"the device {dname!r} is not recognized as a catalog GPU type",
                            "pass --gpu-name with a catalog name or alias (e.g. A100-80, H100-SXM, V100-16)")
        gpu = seen
        notes.append(f"GPU type {gpu} recognized from the device name {dname!r}")
    else:
        gpu = get_gpu_type(req.gpu, field="gpu").name
        if seen is not None and seen != gpu:
            notes.append(f"warning: the device is {dname!r} ({seen}), but the file is labelled {gpu} (--gpu-name)")
        if dev.type == "cpu":
            notes.append(f"measuring on the CPU; the file is labelled {gpu}: CPU times only test the workflow")
    catalog_bf16 = get_gpu_type(gpu).supports("bf16")
    precision = req.precision
    if precision == "auto":
        precision = "fp32" if dev.type == "cpu" else ("bf16" if has_bf16 and catalog_bf16 else "fp16")
        notes.append(f"precision: {precision} (auto; pass --precision to choose)")
    _check_gpu_precision(gpu, catalog_bf16, precision)
    if dev.type == "cuda":
        if precision == "bf16" and not has_bf16:
            raise SpecError("precision", "bf16", f"{dname} ({description}) has no bf16 arithmetic",
                            "use --precision fp16 (V100 and Turing GPUs train in fp16)")
        if precision == "tf32" and (hip or cc < (8, 0)):
            raise SpecError("precision", "tf32", f"{dname} has no TF32 tensor cores (NVIDIA Ampere or newer)",
                            "use --precision fp32 or fp16")
    else:
        if precision == "tf32":
            raise SpecError("precision", "tf32", "TF32 is a tensor-core mode of NVIDIA GPUs (Ampere and newer); "
                            "the CPU has none", "use --precision fp32 on the CPU")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)
    if dev.type == "cpu" and precision in ("bf16", "fp16"):
        _probe_cpu_dtype(torch, dtype, precision)
    return DeviceInfo(device=dev, description=description, gpu=gpu, precision=precision, dtype=dtype,
                      notes=tuple(notes))


def _probe_cpu_dtype(torch: Any, dtype: Any, precision: str) -> None:
    """Refuse 16-bit on a CPU build of PyTorch that cannot run its matmuls or attention."""
    try:
        lin = torch.nn.Linear(16, 16, dtype=dtype)
        x = torch.randn(2, 2, 8, 16, dtype=dtype, requires_grad=True)
        y = torch.nn.functional.scaled_dot_product_attention(lin(x), x, x, is_causal=True)
        y.float().sum().backward()
    except (RuntimeError, NotImplementedError) as e:
        raise SpecError("precision", precision, f"this PyTorch ({torch.__version__}) cannot run {precision} matmuls "
                        f"or attention on the CPU ({str(e).splitlines()[0]})",
                        "use --precision fp32 on the CPU, or measure on a GPU") from None


@contextmanager
def matmul_precision(torch: Any, precision: str) -> Iterator[None]:
    """fp32 matmuls in TF32 for ``tf32``, in IEEE fp32 otherwise; the previous settings are restored."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # newer PyTorch deprecates allow_tf32 in favour of fp32_precision
        old = (torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.allow_tf32,
               torch.backends.cudnn.allow_tf32)
        tf32 = precision == "tf32"
        torch.set_float32_matmul_precision("high" if tf32 else "highest")
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
    try:
        yield
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.set_float32_matmul_precision(old[0])
            torch.backends.cuda.matmul.allow_tf32 = old[1]
            torch.backends.cudnn.allow_tf32 = old[2]


def sdpa_kernel_name(torch: Any, m: ModelSpec, tp: int, info: DeviceInfo) -> str:
    """Which fused kernel ``scaled_dot_product_attention`` can use for this model's heads here: the
    first that accepts the shapes in PyTorch's order of preference (flash, memory-efficient, cuDNN,
    math), or "auto" when this PyTorch cannot say."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        return "auto"
    from tangram_opt.profiling.blocks import SDPA_GQA

    if m.mla is not None:
        nh = nkv = m.num_attention_heads // tp
        dqk, dv = m.mla.qk_head_dim, m.mla.v_head_dim
    else:
        nh, nkv, dqk = m.num_attention_heads // tp, m.kv_heads // tp, m.head_size
        dv = dqk
    kw = {"device": info.device, "dtype": info.dtype}
    q, k, v = torch.randn(1, nh, 64, dqk, **kw), torch.randn(1, nkv, 64, dqk, **kw), torch.randn(1, nkv, 64, dv, **kw)
    extra = {"enable_gqa": True} if nkv < nh and SDPA_GQA else {}
    if nkv < nh and not SDPA_GQA:
        k, v = k.repeat_interleave(nh // nkv, 1), v.repeat_interleave(nh // nkv, 1)
    for name, backend in (("flash", "FLASH_ATTENTION"), ("memory-efficient", "EFFICIENT_ATTENTION"),
                          ("cudnn", "CUDNN_ATTENTION"), ("math", "MATH")):
        if not hasattr(SDPBackend, backend):
            continue
        try:
            with warnings.catch_warnings(), sdpa_kernel([getattr(SDPBackend, backend)]):
                warnings.simplefilter("ignore")
                torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                 dropout_p=m.attention_dropout, **extra)
            return name
        except RuntimeError:
            continue
    return "auto"


# --- measuring ----------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class EntryResult:
    """One measured entry: the profile entry, its raw measurement and the model FLOPs of the pass."""

    entry: ProfileEntry
    fwd_times_s: tuple[float, ...]
    bwd_times_s: tuple[float, ...]
    #: model FLOPs of forward + backward on this rank (the MFU convention, tangram_opt.cost.flops)
    model_flops: float
    parameters: int
    peak_allocated_bytes: int | None = None
    peak_over_base_bytes: int | None = None

    @property
    def achieved_flops_per_s(self) -> float | None:
        t = self.entry.fwd_time_s + self.entry.bwd_time_s
        return self.model_flops / t if self.model_flops > 0 and t > 0 else None


@dataclass(frozen=True, slots=True, kw_only=True)
class ProfileResult:
    profile: LayerProfile
    results: tuple[EntryResult, ...]
    device: str
    notes: tuple[str, ...] = ()
    #: (kind, tp, micro_batch_size, reason) of entries that could not be measured (out of memory)
    skipped: tuple[tuple[str, int, int, str], ...] = field(default=())


ProgressFn = Callable[[str, int, int], None]


def _model_flops(m: ModelSpec, kind: str, tokens: int, seq_len: int, tp: int) -> float:
    if kind in ("dense", "moe"):
        return layer_model_flops(m, kind, tokens, seq_len) / tp
    proj = 6.0 * tokens * m.embed_dim * m.hidden_size if m.embed_dim != m.hidden_size else 0.0
    if kind == "head":
        return 6.0 * tokens * m.vocab_size * m.embed_dim / tp + proj
    return proj


def _is_oom(torch: Any, exc: BaseException) -> bool:
    oom = getattr(torch.cuda, "OutOfMemoryError", None)
    return (oom is not None and isinstance(exc, oom)) or "out of memory" in str(exc).lower()


def _measure_one(torch: Any, req: ProfileRequest, info: DeviceInfo, kind: str, tp: int, mb: int,
                 on_pass: Callable[[], None]) -> EntryResult:
    from tangram_opt.profiling.blocks import build_layer, parameter_count, vocab_shard
    from tangram_opt.profiling.timer import measure

    m, s, dev, dt = req.model, req.seq_len, info.device, info.dtype
    module = build_layer(m, kind, tp=tp, seq_len=s, micro_batch_size=mb, attention=req.attention, ep=req.ep,
                         device=dev, dtype=dt)
    module.train()
    drop_input_grad: Callable[[], None] | None = None
    if kind == "embedding":
        ids = torch.randint(0, vocab_shard(m, tp), (mb, s), device=dev)
        grad = torch.randn(mb, s, m.hidden_size, device=dev, dtype=dt)

        def forward() -> Any:
            return module(ids)

        def backward(out: Any) -> None:
            out.backward(grad)
    else:
        x = torch.randn(mb, s, m.hidden_size, device=dev, dtype=dt, requires_grad=True)

        def drop_input_grad() -> None:  # a stage's input gradient is produced fresh, not accumulated
            x.grad = None

        if kind == "head":
            targets = torch.randint(0, vocab_shard(m, tp), (mb, s), device=dev)

            def forward() -> Any:
                return module(x, targets)

            def backward(out: Any) -> None:
                out.backward()
        else:
            grad = torch.randn(mb, s, m.hidden_size, device=dev, dtype=dt)

            def forward() -> Any:
                return module(x)

            def backward(out: Any) -> None:
                out.backward(grad)
    meas = measure(forward, backward, module, dev, warmup=req.warmup, repeats=req.repeats, on_pass=on_pass,
                   before_pass=drop_input_grad)
    entry = ProfileEntry(kind=kind, tp=tp, micro_batch_size=mb, fwd_time_s=meas.fwd_time_s,
                         bwd_time_s=meas.bwd_time_s)
    return EntryResult(entry=entry, fwd_times_s=meas.fwd_times_s, bwd_times_s=meas.bwd_times_s,
                       model_flops=_model_flops(m, kind, mb * s, s, tp), parameters=parameter_count(module),
                       peak_allocated_bytes=meas.peak_allocated_bytes, peak_over_base_bytes=meas.peak_over_base_bytes)


def run_profile(req: ProfileRequest, *, on_progress: ProgressFn | None = None,
                on_note: Callable[[str], None] | None = None,
                on_entry: Callable[[EntryResult], None] | None = None) -> ProfileResult:
    """Measure every requested entry; see the module docstring. ``on_progress(label, done, total)``
    is called after every pass (warm-up or timed), ``on_entry`` with each measured entry, and
    ``on_note`` with status lines as they arise."""
    check_request(req)
    torch = import_torch()
    info = resolve_device(torch, req)
    notes = list(info.notes)
    for n in notes:
        if on_note is not None:
            on_note(n)
    m = req.model
    mbs = tuple(sorted(set(req.micro_batch_sizes)))
    tps = tuple(sorted(set(req.tp)))
    kinds = req.layer_kinds
    plan = [(k, tp, mb) for k in kinds for tp in tps for mb in mbs]
    per_entry = req.warmup + req.repeats
    total, done = len(plan) * per_entry, 0
    kernels = sorted({sdpa_kernel_name(torch, m, tp, info) for tp in tps}) if req.attention == "sdpa" else []
    results: list[EntryResult] = []
    skipped: list[tuple[str, int, int, str]] = []
    torch.manual_seed(0)
    with matmul_precision(torch, info.precision):
        for kind, tp, mb in plan:
            label = f"{kind} tp{tp} mb{mb}"
            start = done
            if any(k == kind and t == tp and b < mb for k, t, b, _ in skipped):
                skipped.append((kind, tp, mb, "a smaller micro-batch ran out of memory"))
                done = start + per_entry
                if on_progress is not None:
                    on_progress(label + " (skipped)", done, total)
                continue

            def on_pass(label: str = label) -> None:
                nonlocal done
                done += 1
                if on_progress is not None:
                    on_progress(label, done, total)

            try:
                results.append(_measure_one(torch, req, info, kind, tp, mb, on_pass))
                if on_entry is not None:
                    on_entry(results[-1])
            except RuntimeError as e:
                if not _is_oom(torch, e):
                    raise
                if info.device.type == "cuda":
                    torch.cuda.empty_cache()
                skipped.append((kind, tp, mb, "out of memory"))
                done = start + per_entry
                if on_note is not None:
                    hint = "; --ep N measures an expert-parallel rank with fewer experts" if kind == "moe" else ""
                    on_note(f"{label}: out of memory on {info.description}; skipped (and larger micro-batches){hint}")
            if info.device.type == "cuda":
                torch.cuda.empty_cache()
    if not results:
        raise SpecError("micro_batch_sizes", mbs, f"nothing could be measured: every entry ran out of memory on "
                        f"{info.description}", "use smaller micro-batch sizes, a larger tp, or a shorter --seq")
    attention = f"sdpa ({', '.join(kernels)} kernel)" if req.attention == "sdpa" else "eager (materialized scores)"
    moe = ""
    if m.moe is not None and "moe" in kinds:
        local = m.moe.num_experts // req.ep
        moe = (f"; MoE: router computed, routing forced uniform (token copies round-robin over {local} local experts, "
               f"ep {req.ep}), experts as one grouped GEMM (torch.bmm), no all-to-all")
    prec = {"tf32": "fp32 parameters, TF32 matmuls", "fp32": "fp32 parameters, IEEE fp32 matmuls"}.get(
        info.precision, f"{info.precision} parameters and activations")
    from tangram_opt import __version__

    when = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    source = (f"tangram-opt profile {__version__} (torch {torch.__version__}) on {info.description}, {when}; "
              f"attention {attention}; {prec}; one TP rank's shard per tp on one device, without TP communication"
              f"{moe}; median of {req.repeats} timed passes after {req.warmup} warm-up")
    if skipped:
        source += "; not measured (out of memory): " + ", ".join(f"{k} tp{t} mb{b}" for k, t, b, _ in skipped)
    profile = LayerProfile(model=m.name, gpu=info.gpu, seq_len=req.seq_len, precision=info.precision,
                           entries=tuple(r.entry for r in results), includes_tp_comm=False, sequence_parallel=False,
                           source=source, notes=tuple(notes), model_shape=model_shape(m))
    return ProfileResult(profile=profile, results=tuple(results), device=info.description, notes=tuple(notes),
                         skipped=tuple(skipped))


# --- writing -----------------------------------------------------------------------------------------
def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-") or "model"


def profile_filename(profile: LayerProfile) -> str:
    """``<model>_<gpu>_<precision>_seq<N>.json``: one file per model, GPU type and precision."""
    return f"{_slug(profile.model)}_{_slug(profile.gpu)}_{profile.precision}_seq{profile.seq_len}.json"


CSV_COLUMNS = ("kind", "tp", "micro_batch_size", "fwd_s", "bwd_s", "fwd_min_s", "fwd_max_s", "bwd_min_s", "bwd_max_s",
               "repeats", "model_flops", "achieved_flops_per_s", "parameters", "peak_allocated_bytes",
               "peak_over_base_bytes")


def write_profile(result: ProfileResult, output_dir: str | Path) -> tuple[Path, Path, list[str]]:
    """Write the profile JSON and the raw measurements (``.measurements.csv``, not read by the
    planner) into ``output_dir``; returns both paths and warnings about the directory (e.g. a second
    profile of the same GPU type, which ``load_profiles`` refuses)."""
    out = check_output_dir(output_dir)
    path = out / profile_filename(result.profile)
    save_profile(result.profile, path)
    load_profile(path)  # what the planner will read must load
    csv_path = path.with_suffix(".measurements.csv")
    with csv_path.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(CSV_COLUMNS)
        for r in result.results:
            e = r.entry
            rate = r.achieved_flops_per_s
            w.writerow([e.kind, e.tp, e.micro_batch_size, f"{e.fwd_time_s:.6g}", f"{e.bwd_time_s:.6g}",
                        f"{min(r.fwd_times_s):.6g}", f"{max(r.fwd_times_s):.6g}", f"{min(r.bwd_times_s):.6g}",
                        f"{max(r.bwd_times_s):.6g}", len(r.fwd_times_s), f"{r.model_flops:.6g}",
                        "" if rate is None else f"{rate:.6g}", r.parameters,
                        "" if r.peak_allocated_bytes is None else r.peak_allocated_bytes,
                        "" if r.peak_over_base_bytes is None else r.peak_over_base_bytes])
    warns: list[str] = []
    try:
        load_profiles(out)
    except SpecError as e:
        warns.append(f"{out} does not load as one profile set ({e.problem}): keep one directory per training run "
                     "(model, sequence length, precision) with one file per GPU type")
    return path, csv_path, warns


def spread(times: Sequence[float]) -> float:
    """(max - min) / median of the timed passes: how noisy a measurement was."""
    med = statistics.median(times)
    return (max(times) - min(times)) / med if med > 0 else 0.0
