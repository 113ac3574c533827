"""Analytical cost model of one homogeneous pipeline stage (see docs/cost_model.md).

Inputs are specs only (model, training, node shape, stage configuration); outputs are
:class:`~tangram_opt.cost.config.LayerCost` records in seconds and bytes, per pipeline micro-batch
and per GPU. The pieces:

- :mod:`~tangram_opt.cost.flops`: the operation inventory (FLOPs, bytes, kernels) of each layer;
- :mod:`~tangram_opt.cost.memory`: ZeRO model states and Korthikanti activations;
- :mod:`~tangram_opt.cost.comm`: alpha-beta collectives with NCCL factors and node placement;
- :mod:`~tangram_opt.cost.calibration`: achievable fractions of the datasheet peaks;
- :mod:`~tangram_opt.cost.profiles`: measured per-layer times that replace computed compute time.

Overlap policy (what counts on the critical path):

- tensor-parallel all-reduces / reduce-scatters / all-gathers: exposed (Megatron-LM default, no
  TP communication overlap);
- context-parallel KV ring exchange: overlapped with the attention core of the same pass, only the
  excess is exposed (ring attention, Liu et al. 2023; Megatron-core CP);
- expert-parallel all-to-all (dispatch and combine, forward and backward): exposed;
- ZeRO-3 parameter all-gathers (forward and backward) and gradient reduce-scatters: prefetched and
  overlapped with the same pass's compute, only the excess is exposed;
- data-parallel gradient reduction (all-reduce for ZeRO-0, reduce-scatter for ZeRO-1/2): bucketed and
  overlapped with the last micro-batch's backward (Megatron ``--overlap-grad-reduce``). Per layer,
  the exposed part is ``max(0, reduce time - backward compute time of the layer)``: the reduction of
  one layer's bucket hides behind the backward of the layers before it. The ZeRO-1/2 parameter
  all-gather after the optimizer overlaps the next step's forward the same way
  (``--overlap-param-gather``). Both go to ``grad_sync_time_s``;
- the optimizer update (memory-bound Adam over this GPU's shard) is exposed: ``optimizer_time_s``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from tangram_opt.cost import comm, flops, memory
from tangram_opt.cost.calibration import Calibration
from tangram_opt.cost.config import LayerCost, StageConfig
from tangram_opt.cost.flops import ATTENTION_KERNELS, LayerShape, Op
from tangram_opt.cost.profiles import LayerProfile, ProfileSet, precision_class
from tangram_opt.errors import SpecError
from tangram_opt.specs.cluster import NodeSpec
from tangram_opt.specs.hardware import GPUType
from tangram_opt.specs.model import LayerKind, ModelSpec
from tangram_opt.specs.training import TrainingSpec

#: How fp32 matmuls run: "ieee" on CUDA cores (PyTorch's default on Ampere and later since 1.12),
#: or "tf32" on tensor cores at half the 16-bit tensor peak (A100: 156 of 312 TFLOP/s; H100: 494
#: of 989), on GPUs that have TF32 (those with BF16 tensor cores).
FP32_MATMUL_MODES = ("ieee", "tf32")


#: Output tile of one GEMM thread block (rows x columns of the result), and the fixed cost of a tile
#: (filling its software pipeline and writing its result) in units of its reduction dimension, for
#: 16-bit tensor-core GEMMs: NVIDIA's "Matrix Multiplication Background User's Guide" (tile and wave
#: quantization) uses 128 x 128 tiles; a multi-stage main loop of 64-wide k-blocks spends about two
#: of them outside the steady state. The fixed cost is latency, so for slower arithmetic (TF32 at
#: half the rate, fp32 on CUDA cores) it is worth proportionally less of the reduction.
GEMM_TILE = (128, 128)
GEMM_TILE_OVERHEAD_K = 128


def gemm_shape_efficiency(m: float, n: float, k: float, count: float, num_sms: int | None,
                          k_overhead: float = GEMM_TILE_OVERHEAD_K) -> float:
    """Fraction of a GPU's large-GEMM rate that ``count`` GEMMs of ``(m x k) @ (k x n)`` reach.

    Wave quantization: the result is cut into tiles that the SMs run in waves; the last wave of a
    small GEMM leaves SMs idle (``tiles / (waves x SMs)``). The reduction dimension: each tile pays a
    fixed pipeline fill and write-out, worth ``k_overhead`` of ``k`` (``k / (k + k0)``; 16-bit
    attention's per-head GEMMs, with k = 64-128, run at half speed). Both tend to 1 for the large
    GEMMs on which the calibration's matmul efficiency is measured.
    """
    waves_eff = 1.0
    if num_sms:
        tiles = math.ceil(m / GEMM_TILE[0]) * math.ceil(n / GEMM_TILE[1]) * max(1.0, count)
        waves_eff = tiles / (math.ceil(tiles / num_sms) * num_sms)
    return waves_eff * k / (k + k_overhead)


@dataclass(frozen=True, slots=True)
class _Rates:
    gemm_flops_per_s: float
    attn_fwd_flops_per_s: float
    attn_bwd_flops_per_s: float
    mem_bytes_per_s: float
    overhead_s: float
    num_sms: int | None = None
    k_overhead: float = GEMM_TILE_OVERHEAD_K
    #: FP8 linear GEMMs (training precision "fp8"; unit "gemm_fp8"), and their tile overhead
    gemm_fp8_flops_per_s: float = 0.0
    k_overhead_fp8: float = GEMM_TILE_OVERHEAD_K

    def time_s(self, ops: Iterable[Op]) -> float:
        total = 0.0
        for op in ops:
            if op.unit == "memory":
                t = op.bytes / self.mem_bytes_per_s
            elif op.unit in ("gemm", "gemm_fp8"):
                fp8 = op.unit == "gemm_fp8"
                rate = self.gemm_fp8_flops_per_s if fp8 else self.gemm_flops_per_s
                k0 = self.k_overhead_fp8 if fp8 else self.k_overhead
                if op.gemms:
                    compute = sum(2.0 * m * n * k * c / (rate * gemm_shape_efficiency(m, n, k, c, self.num_sms, k0))
                                  for m, n, k, c in op.gemms if m > 0 and n > 0 and k > 0)
                else:
                    compute = op.flops / rate
                t = max(compute, op.bytes / self.mem_bytes_per_s)
            else:
                rate = self.attn_bwd_flops_per_s if op.name.endswith(".bwd") else self.attn_fwd_flops_per_s
                t = max(op.flops / rate, op.bytes / self.mem_bytes_per_s)
            total += t + op.kernels * self.overhead_s
        return total


_MISSING = object()


def _chunk_overlap(comm_s: float, compute_s: float, chunks: int) -> float:
    """Exposed seconds of ``comm_s`` run in ``chunks`` pieces under ``compute_s`` split the same way:
    the excess over the compute, plus one chunk of the overlapped part (the pipeline's fill)."""
    return max(0.0, comm_s - compute_s) + min(comm_s, max(0.0, compute_s)) / max(1, chunks)


def _check_imbalance(value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (1.0 <= value < float("inf")):
        raise SpecError("moe_load_imbalance", value, "must be a finite ratio >= 1",
                        "pass max/mean tokens per expert-parallel rank (1.0 = uniform)")
    return float(value)


class CostModel:
    """Per-layer time and memory of a stage configuration on a node shape.

    Keyword options (all optional):

    - ``calibration``: achievable fractions of peak (:class:`Calibration`, documented defaults);
    - ``moe_load_imbalance``: max/mean tokens per EP rank (>= 1); the slowest rank sets the time.
      Either one ratio for every configuration, or a function ``(ep, gpus_per_node) -> ratio`` (the
      planner passes the best expert placement's ratio for each EP degree, see experts/);
    - ``profiles``: measured per-layer times (:class:`ProfileSet`, a :class:`LayerProfile` or a list)
      that replace the computed compute time on matching GPU types;
    - ``attention_kernel``: "auto" (per GPU type: flash in 16-bit where flash kernels run, i.e. Ampere
      and newer, Megatron's fused softmax in 16-bit on older GPUs, eager in fp32), "flash",
      "fused-softmax", "eager";
    - ``fp32_matmul``: "ieee" or "tf32", for ``precision="fp32"`` only;
    - ``dropout``: ``None`` (default) follows the model: attention dropout where
      ``model.attention_dropout > 0``, residual-path (hidden) dropout where ``model.hidden_dropout > 0``
      (most current LLMs, e.g. Llama, train with neither); ``True`` / ``False`` force both on or off
      (Korthikanti's formulas assume both);
    - ``framework``: what "selective" recomputation, the loss and ZeRO-3 mean (``memory.FRAMEWORKS``):
      "megatron" (default: Korthikanti's selective recomputation, fused vocab-parallel cross-entropy)
      or "torchtitan" (per-op selective activation checkpointing, eager fp32 cross-entropy, FSDP2
      keeping its root unit (embedding, head) and the last block gathered from forward to backward
      and prefetching the next block's weights); docs/cost_model.md §2.
    """

    def __init__(self, model: ModelSpec, training: TrainingSpec, *, calibration: Calibration | None = None,
                 moe_load_imbalance: float | Callable[[int, int], float] = 1.0,
                 profiles: ProfileSet | LayerProfile | Iterable[LayerProfile] | None = None,
                 attention_kernel: str = "auto", fp32_matmul: str = "ieee", dropout: bool | None = None,
                 framework: str = "megatron"):
        if not callable(moe_load_imbalance):
            _check_imbalance(moe_load_imbalance)
        if attention_kernel != "auto" and attention_kernel not in ATTENTION_KERNELS:
            raise SpecError("attention_kernel", attention_kernel, "is not an attention kernel",
                            f"use auto or one of {', '.join(ATTENTION_KERNELS)}")
        if fp32_matmul not in FP32_MATMUL_MODES:
            raise SpecError("fp32_matmul", fp32_matmul, "is not a mode", f"use one of {', '.join(FP32_MATMUL_MODES)}")
        if framework not in memory.FRAMEWORKS:
            raise SpecError("framework", framework, "is not a modelled framework",
                            f"use one of {', '.join(memory.FRAMEWORKS)}")
        self.framework = framework
        self.model = model
        self.training = training
        self.calibration = calibration or Calibration()
        self.moe_load_imbalance = moe_load_imbalance if callable(moe_load_imbalance) else float(moe_load_imbalance)
        if profiles is None:
            self.profiles = ProfileSet()
        elif isinstance(profiles, ProfileSet):
            self.profiles = profiles
        elif isinstance(profiles, LayerProfile):
            self.profiles = ProfileSet([profiles])
        else:
            self.profiles = ProfileSet(profiles)
        self.attention_kernel = attention_kernel
        self.fp32_matmul = fp32_matmul
        if dropout is not None and not isinstance(dropout, bool):
            raise SpecError("dropout", dropout, "must be None, True or False",
                            "leave it None to follow the model's attention_dropout / hidden_dropout")
        self.attention_dropout = model.attention_dropout > 0 if dropout is None else dropout
        self.hidden_dropout = model.hidden_dropout > 0 if dropout is None else dropout
        self._params = {k: flops.layer_params(model, k) for k in ("dense", "moe") if model.layers_of_kind(k)}
        self._cache: dict[tuple, LayerCost] = {}

    # --- validity --------------------------------------------------------------------------------
    def check_config(self, node: NodeSpec, cfg: StageConfig) -> list[str]:
        """Reasons ``cfg`` is not valid for this model on this node shape (empty when valid)."""
        m, t, problems = self.model, self.training, []
        if m.num_attention_heads % cfg.tp:
            problems.append(f"tp({cfg.tp}) does not divide attention heads ({m.num_attention_heads})")
        if m.mla is None and m.kv_heads % cfg.tp:
            problems.append(f"tp({cfg.tp}) does not divide KV heads ({m.kv_heads})")
        if m.num_dense_layers and m.ffn_hidden_size % cfg.tp:
            problems.append(f"tp({cfg.tp}) does not divide ffn_hidden_size ({m.ffn_hidden_size})")
        if m.moe is not None and m.moe.expert_ffn_hidden_size % cfg.tp:
            problems.append(f"tp({cfg.tp}) does not divide expert_ffn_hidden_size ({m.moe.expert_ffn_hidden_size})")
        if cfg.tp > node.gpus_per_node:
            problems.append(f"tp({cfg.tp}) exceeds GPUs per node ({node.gpus_per_node}) of {node.label}")
        g, n = cfg.gpus, node.gpus_per_node
        if (g > n and g % n) or (g < n and n % g):
            problems.append(f"tp({cfg.tp}) x cp({cfg.cp}) x dp({cfg.dp}) = {g} GPUs is neither a multiple nor a "
                            f"divisor of the {n} GPUs per node of {node.label}")
        if cfg.cp > 1 and t.seq_len % (2 * cfg.cp):
            problems.append(f"seq_len ({t.seq_len}) is not divisible by 2 x cp({cfg.cp}) (load-balanced causal CP)")
        if m.moe is None and cfg.ep > 1:
            problems.append(f"ep({cfg.ep}) > 1 on a dense model")
        if m.moe is not None and m.moe.num_experts % cfg.ep:
            problems.append(f"ep({cfg.ep}) does not divide the number of experts ({m.moe.num_experts})")
        if not node.gpu.supports(t.precision):
            problems.append(f"{node.gpu.name} does not support {t.precision}")
        if self.attention_kernel in ("flash", "fused-softmax") and t.precision == "fp32":
            problems.append(f"attention kernel {self.attention_kernel!r} needs 16-bit training, not fp32")
        if self.attention_kernel == "flash" and not node.gpu.flash_attention:
            problems.append(f"flash attention needs an Ampere or newer GPU (compute capability 8.0); "
                            f"{node.gpu.name} has {node.gpu.compute_capability}")
        return problems

    # --- memory ------------------------------------------------------------------------------------
    def usable_memory_bytes(self, node: NodeSpec) -> float:
        """HBM a stage may plan for: capacity minus the calibration's reserve (context, workspace, fragmentation)."""
        c = self.calibration
        return max(0.0, node.gpu.hbm_bytes * (1.0 - c.memory_reserve_fraction) - c.memory_reserve_bytes)

    # --- rates ---------------------------------------------------------------------------------------
    def _memo(self, key: tuple, make):  # type: ignore[no-untyped-def]
        """Memoize a pure sub-computation shared by many configurations (the planner prices
        tens of thousands of them; most share shapes, links and collectives)."""
        hit = self._cache.get(key, _MISSING)
        if hit is _MISSING:
            hit = self._cache[key] = make()
        return hit

    def _rates(self, node: NodeSpec) -> _Rates:
        return self._memo(("rates", node), lambda: self._rates_uncached(node))

    def _rates_uncached(self, node: NodeSpec) -> _Rates:
        gpu, c, prec = node.gpu, self.calibration, self.training.precision
        step = c.step(gpu.name)  # tensor-core kernels inside a training step
        if prec == "fp32":
            if self.fp32_matmul == "tf32" and gpu.bf16_flops_per_s is not None:
                gemm = 0.5 * gpu.fp16_flops_per_s * c.matmul(gpu.name) * step
            else:
                gemm = gpu.fp32_flops_per_s * c.fp32_matmul(gpu.name)
            attn_fwd = attn_bwd = gemm
        else:
            peak = gpu.peak_flops_per_s(prec) if gpu.supports(prec) else gpu.fp16_flops_per_s
            gemm = peak * c.matmul(gpu.name) * step
            attn_fwd = peak * c.attention(gpu.name) * step
            attn_bwd = peak * c.attention_bwd(gpu.name) * step
        tensor16 = gpu.fp16_flops_per_s * c.matmul(gpu.name) * step
        # FP8 GEMMs: the FP8 tensor-core peak at the same achievable fraction; a tile's fixed cost is
        # the same time, so at twice the rate it is worth twice the reduction depth
        fp8 = (gpu.fp8_flops_per_s or 0.0) * c.matmul(gpu.name) * step if prec == "fp8" else gemm
        return _Rates(gemm_flops_per_s=gemm, attn_fwd_flops_per_s=attn_fwd, attn_bwd_flops_per_s=attn_bwd,
                      mem_bytes_per_s=gpu.hbm_bw_bytes_per_s * c.memory(gpu.name), overhead_s=c.kernel_overhead_s,
                      num_sms=gpu.num_sms, k_overhead=GEMM_TILE_OVERHEAD_K * min(1.0, gemm / tensor16),
                      gemm_fp8_flops_per_s=fp8 or gemm, k_overhead_fp8=GEMM_TILE_OVERHEAD_K * fp8 / tensor16
                      if fp8 else GEMM_TILE_OVERHEAD_K)

    def kernel_for(self, gpu: GPUType) -> str:
        """The attention kernel a stage on ``gpu`` runs (``attention_kernel`` unless "auto")."""
        if self.attention_kernel != "auto":
            return self.attention_kernel
        if self.training.precision == "fp32":
            return "eager"
        return "flash" if gpu.flash_attention else "fused-softmax"

    def _profile(self, node: NodeSpec) -> LayerProfile | None:
        """The profile of this node's GPU type if it describes this run (sequence length, precision
        class); ``solve`` refuses a mismatched profile before it gets here (check_profiles)."""
        p = self.profiles.get(node.gpu.name) if len(self.profiles) else None
        if p is None or p.seq_len != self.training.seq_len:
            return None
        prec = self.training.precision
        if precision_class(p.precision) != precision_class(prec):
            return None
        return p

    def _measured(self, node: NodeSpec, cfg: StageConfig, kind: str, computed: tuple[float, float]
                  ) -> tuple[float, float, bool, float]:
        """Compute time of one block of ``kind`` from a measured profile: ``(fwd_s, bwd_s,
        tp_comm_inside, how)``; ``how`` is 1.0 for a measured point (this tp and micro-batch, no
        context parallelism), 0.5 for the computed time scaled by what the profile measured, 0.0
        without a profile.

        A profile covers a few (tp, micro-batch) points at cp = 1. Elsewhere the measurement still
        says how fast this GPU runs this model: the computed time is scaled by measured/computed at
        the same tp and micro-batch (a context-parallel stage: the block at full sequence, measured,
        times the computed cp share), else by the median ratio over the profile's points of this
        kind (of all kinds if it has none). A configuration outside the measured points therefore
        never escapes the measurement to the analytical model's optimism."""
        prof = self._profile(node)
        if prof is None:
            return computed[0], computed[1], False, 0.0
        point = prof.lookup(kind, cfg.tp, cfg.micro_batch_size)
        if point is not None and cfg.cp == 1:
            return point[0], point[1], prof.includes_tp_comm, 1.0
        if point is not None:
            f_ref, b_ref = self._reference_time(node, prof, kind, cfg.tp, cfg.micro_batch_size)
            ff, fb = point[0] / f_ref, point[1] / b_ref
        else:
            ff, fb = self._profile_factor(node, prof, kind)
        return computed[0] * ff, computed[1] * fb, False, 0.5

    def _reference_time(self, node: NodeSpec, prof: LayerProfile, kind: str, tp: int, mb: int
                        ) -> tuple[float, float]:
        """What the cost model computes for a profile point: one block at cp = 1, ep = 1, run as the
        profile ran (sequence parallelism as measured; TP collectives included if they were)."""
        cfg = StageConfig(tp=tp, micro_batch_size=mb, sequence_parallel=prof.sequence_parallel and tp > 1)
        if kind in ("embedding", "head"):
            fwd, bwd, tp_f, tp_b = self._vocab_compute(node, cfg, kind)
        else:
            fwd, bwd, _, _ = self._block_compute(node, cfg, kind, 1, 1.0)  # type: ignore[arg-type]
            tp_f = tp_b = self._tp_comm_per_pass(node, cfg, self._shape(cfg))
        if prof.includes_tp_comm:
            fwd, bwd = fwd + tp_f, bwd + tp_b
        return fwd, bwd

    def _profile_factor(self, node: NodeSpec, prof: LayerProfile, kind: str) -> tuple[float, float]:
        """Median measured/computed (fwd, bwd) over the profile's points of ``kind`` (all kinds if none)."""
        def make() -> tuple[float, float]:
            pts = [e for e in prof.entries if e.kind == kind and (e.kind != "moe" or self.model.moe is not None)]
            if not pts:
                pts = [e for e in prof.entries if e.kind != "moe" or self.model.moe is not None]
            ratios = []
            for e in pts:
                f_ref, b_ref = self._reference_time(node, prof, e.kind, e.tp, e.micro_batch_size)
                ratios.append((e.fwd_time_s / f_ref, e.bwd_time_s / b_ref))
            return statistics.median(r[0] for r in ratios), statistics.median(r[1] for r in ratios)
        return self._memo(("profile_factor", node, id(prof), kind), make)

    def _block_compute(self, node: NodeSpec, cfg: StageConfig, kind: LayerKind, ep: int, imbalance: float
                       ) -> tuple[float, float, float, float]:
        """Computed (fwd, bwd, attention-core fwd, attention-core bwd) seconds of one block's kernels
        (``imbalance``: hottest expert rank's load over the mean)."""
        m = self.model
        sh = self._shape(cfg)
        expert_tokens = 0.0
        if kind == "moe":
            assert m.moe is not None
            expert_tokens = sh.tokens * m.moe.top_k * imbalance
        local_experts = m.moe.num_experts // ep if kind == "moe" and m.moe is not None else 1
        return self._memo(("compute", node, kind, sh, expert_tokens, local_experts),
                          lambda: self._compute_times(kind, sh, expert_tokens, local_experts, self._rates(node),
                                                      self.kernel_for(node.gpu)))

    def _shape(self, cfg: StageConfig) -> LayerShape:
        s = self.training.seq_len
        return LayerShape(tokens=cfg.micro_batch_size * s / cfg.cp, seq_kv=float(s), batch=float(cfg.micro_batch_size),
                          tp=cfg.tp, sp=cfg.sequence_parallel and cfg.tp > 1,
                          elt_bytes=float(self.training.activation_bytes), causal=True)

    # --- communication helpers -------------------------------------------------------------------------
    def _coll(self, node: NodeSpec, kind: str, nbytes: float, n: int, stride: int = 1) -> float:
        return self._memo(("coll", node, kind, nbytes, n, stride), lambda: comm.collective_time_s(
            node, kind, nbytes, n, stride=stride, efficiency=self.calibration.network_efficiency))

    def _tp_comm_per_pass(self, node: NodeSpec, cfg: StageConfig, sh: LayerShape, n_pairs: int = 2) -> float:
        """``n_pairs`` all-reduces (no SP) or all-gather + reduce-scatter pairs (SP) of the layer activation."""
        if cfg.tp == 1:
            return 0.0
        msg = sh.tokens * self.model.hidden_size * sh.elt_bytes
        if sh.sp:
            return n_pairs * (self._coll(node, "all_gather", msg, cfg.tp)
                              + self._coll(node, "reduce_scatter", msg, cfg.tp))
        return n_pairs * self._coll(node, "all_reduce", msg, cfg.tp)

    # --- layers ----------------------------------------------------------------------------------------
    def imbalance(self, ep: int, gpus_per_node: int) -> float:
        """max/mean expert-rank load for an EP degree (1.0 without expert parallelism)."""
        if callable(self.moe_load_imbalance):
            return 1.0 if ep <= 1 else _check_imbalance(self.moe_load_imbalance(ep, gpus_per_node))
        return self.moe_load_imbalance

    def layer(self, node: NodeSpec, cfg: StageConfig, kind: LayerKind) -> LayerCost:
        """Cost of one transformer block of ``kind`` ("dense" or "moe") per pipeline micro-batch."""
        key = ("layer", node, cfg, kind)
        hit = self._cache.get(key)
        if hit is None:
            hit = self._cache[key] = self._layer(node, cfg, kind)
        return hit

    def _layer(self, node: NodeSpec, cfg: StageConfig, kind: LayerKind) -> LayerCost:
        m, t, c = self.model, self.training, self.calibration
        if kind == "moe" and m.moe is None:
            raise SpecError("kind", kind, f"model {m.name!r} has no MoE layers", 'use kind="dense"')
        params = self._params.get(kind) or flops.layer_params(m, kind)
        sh = self._shape(cfg)
        expert_tokens = 0.0
        if kind == "moe":
            assert m.moe is not None
            expert_tokens = sh.tokens * m.moe.top_k * self.imbalance(cfg.ep, node.gpus_per_node)
        fwd_all_s, bwd_all_s, attn_fwd_s, attn_bwd_s = self._block_compute(
            node, cfg, kind, cfg.ep, self.imbalance(cfg.ep, node.gpus_per_node) if kind == "moe" else 1.0)
        tp_comm = self._tp_comm_per_pass(node, cfg, sh)
        fwd_c, bwd_c, tp_inside, profiled = self._measured(node, cfg, kind, (fwd_all_s, bwd_all_s))
        if tp_inside:
            tp_comm = 0.0
        if profiled == 0.5:  # the attention core scales with its block (selective recomputation reruns it)
            attn_fwd_s *= fwd_c / fwd_all_s
        tp_fwd = tp_bwd = tp_comm
        if c.overlap_tp_comm and sh.sp and tp_comm > 0:
            # Transformer Engine userbuffers (Megatron --tp-comm-overlap): the all-gather before and the
            # reduce-scatter after each linear layer run as tp ring chunks under the GEMM's own chunks;
            # what the GEMMs cannot cover, and one chunk of what they do, stays exposed
            tp_fwd = _chunk_overlap(tp_comm, fwd_c - attn_fwd_s, cfg.tp)
            tp_bwd = _chunk_overlap(tp_comm, bwd_c - attn_bwd_s, cfg.tp)
        # context parallel: KV ring exchange overlapped with the attention core
        cp_fwd = cp_bwd = 0.0
        if cfg.cp > 1:
            if m.mla is not None:
                kv_width = m.num_attention_heads * (m.mla.qk_head_dim + m.mla.v_head_dim) / cfg.tp
            else:
                kv_width = 2 * m.kv_heads * m.head_size / cfg.tp
            kv_bytes = sh.tokens * kv_width * sh.elt_bytes
            ring = self._coll(node, "all_gather", kv_bytes * cfg.cp, cfg.cp, stride=cfg.tp)
            cp_fwd = max(0.0, ring - attn_fwd_s)
            cp_bwd = max(0.0, 2.0 * ring - attn_bwd_s)  # KV again plus their gradients
        # expert parallel: dispatch and combine all-to-alls, forward and backward
        ep_pass = 0.0
        if kind == "moe" and cfg.ep > 1:
            a2a = expert_tokens / (cfg.tp if sh.sp else 1) * m.hidden_size * sh.elt_bytes
            ep_pass = 2.0 * self._coll(node, "all_to_all", a2a, cfg.ep, stride=cfg.tp)
        dense_dp, expert_dp = cfg.dp * cfg.cp, max(1, cfg.dp * cfg.cp // cfg.ep)
        dense_local, expert_local = params.per_gpu(cfg.tp, cfg.ep)
        # ZeRO-3: gather weights before forward and backward, reduce-scatter gradients after backward
        z3_fwd = z3_bwd = 0.0
        if cfg.zero >= 3:
            gather = (self._coll(node, "all_gather", dense_local * t.weight_bytes, dense_dp, stride=cfg.tp)
                      + self._coll(node, "all_gather", expert_local * t.weight_bytes, expert_dp,
                                   stride=cfg.tp * cfg.ep))
            rs = (self._coll(node, "reduce_scatter", dense_local * t.grad_bytes, dense_dp, stride=cfg.tp)
                  + self._coll(node, "reduce_scatter", expert_local * t.grad_bytes, expert_dp,
                               stride=cfg.tp * cfg.ep))
            z3_fwd = max(0.0, gather - fwd_c)
            z3_bwd = max(0.0, gather + rs - bwd_c)
        # recomputation re-runs (part of) the forward inside the backward: full recomputation repeats
        # the whole layer with its communication (ZeRO-3 weights are still gathered for backward);
        # selective recomputation repeats the materialized attention core (nothing with flash, which
        # recomputes its scores inside its own backward kernel)
        if cfg.recompute == "full":
            recompute = fwd_c + tp_fwd + cp_fwd + ep_pass
        elif cfg.recompute == "selective" and self._sac_op(kind):
            # per-op SAC: the block's forward minus the saved matmuls and attention, with the
            # sequence-parallel all-gathers before them (half the TP traffic of a forward pass)
            recompute = self._sac_recompute_s(node, cfg, kind) * (fwd_c / fwd_all_s if fwd_all_s > 0 else 1.0)
            recompute += tp_fwd / 2 if sh.sp else 0.0
        elif cfg.recompute == "selective":
            recompute = attn_fwd_s if self.kernel_for(node.gpu) != "flash" else 0.0
        else:
            recompute = 0.0
        fwd = fwd_c + tp_fwd + cp_fwd + ep_pass + z3_fwd
        bwd = bwd_c + recompute + tp_bwd + cp_bwd + ep_pass + z3_bwd
        # step tail: gradient sync not hidden behind the last backward, and the optimizer
        grad_sync, param_gather = self._grad_sync(node, cfg, dense_local, expert_local, dense_dp, expert_dp)
        if c.overlap_grad_reduce:
            exposed = max(0.0, grad_sync - bwd_c) + max(0.0, param_gather - fwd_c)
        else:
            exposed = grad_sync + param_gather
        static = memory.model_state_bytes(params, t, tp=cfg.tp, ep=cfg.ep, dense_dp=dense_dp, expert_dp=expert_dp,
                                          zero=cfg.zero)
        act_shape = memory.ActivationShape(seq=sh.tokens / cfg.micro_batch_size, seq_kv=sh.seq_kv,
                                           batch=float(cfg.micro_batch_size), tp=cfg.tp, sp=sh.sp,
                                           elt_bytes=sh.elt_bytes, flash=self.kernel_for(node.gpu) == "flash",
                                           attention_dropout=self.attention_dropout,
                                           hidden_dropout=self.hidden_dropout)
        if cfg.recompute == "selective" and self._sac_op(kind):
            act = memory.sac_op_activation_bytes(m, act_shape)
        else:
            act = self._memo(("act", kind, act_shape, cfg.recompute, expert_tokens), lambda: memory.activation_bytes(
                m, kind, act_shape, cfg.recompute, expert_tokens=expert_tokens))
        # Backward working set of one layer: the activations the backward materializes (recomputed
        # ones, or the activation gradients, which are the same size), counted the same for every
        # recomputation mode; plus ZeRO-3's gathered copy of this layer's weights.
        work = self._memo(("act", kind, act_shape, "none", expert_tokens), lambda: memory.activation_bytes(
            m, kind, act_shape, "none", expert_tokens=expert_tokens))
        if cfg.zero >= 3 and dense_dp > 1:
            # FSDP2 prefetches the next block's weights while this one runs (torchtitan): two gathered
            gathered = 2 if self.framework == "torchtitan" else 1
            work += gathered * (dense_local + (expert_local if expert_dp > 1 else 0.0)) * t.weight_bytes
        opt = self._optimizer_time(node, cfg, dense_local, expert_local, dense_dp, expert_dp)
        # useful (balanced) work: the imbalance slows the time but adds no model FLOPs
        model_flops = flops.layer_model_flops(m, kind, sh.tokens, sh.seq_kv) / cfg.tp
        # fp8: Transformer Engine casts each linear weight to FP8 (and its transpose) at the step's
        # first micro-batch and keeps both for the step: 2 bytes per local parameter; under ZeRO-3
        # the parameters are gathered in FP8 (Megatron's fp8 parameter gather) and the copies are
        # sharded as the weights are
        fp8_weights = 0.0
        if t.precision == "fp8":
            fp8_weights = 2.0 * ((dense_local / dense_dp + expert_local / expert_dp) if cfg.zero >= 3
                                 else (dense_local + expert_local))
        return LayerCost(fwd_time_s=fwd, bwd_time_s=bwd, weight_bytes=static.weight_bytes + fp8_weights,
                         grad_bytes=static.grad_bytes, optimizer_bytes=static.optimizer_bytes,
                         activation_bytes=act, transient_bytes=work, grad_sync_time_s=exposed,
                         optimizer_time_s=opt, model_flops=model_flops,
                         breakdown={"compute_fwd": fwd_c, "compute_bwd": bwd_c, "recompute": recompute,
                                    "attention_core_fwd": attn_fwd_s, "tp_comm": tp_fwd + tp_bwd,
                                    "cp_comm": cp_fwd + cp_bwd, "ep_comm": 2 * ep_pass,
                                    "zero3_comm": z3_fwd + z3_bwd, "grad_sync_total": grad_sync + param_gather,
                                    "profiled": profiled})

    def _compute_times(self, kind: LayerKind, sh: LayerShape, expert_tokens: float, local_experts: int,
                       rates: _Rates, kernel: str) -> tuple[float, float, float, float]:
        """(forward, backward, attention-core forward, attention-core backward) compute seconds."""
        fwd_ops, bwd_ops = flops.block_ops(self.model, kind, sh, kernel=kernel,
                                           attention_dropout=self.attention_dropout, hidden_dropout=self.hidden_dropout,
                                           tokens_per_expert_rank=expert_tokens, local_experts=local_experts,
                                           fp8=self.training.precision == "fp8")
        core = [op for op in fwd_ops if op.name.startswith("attn.")]
        core_bwd = [op for op in bwd_ops if op.name.startswith("attn.")]
        return rates.time_s(fwd_ops), rates.time_s(bwd_ops), rates.time_s(core), rates.time_s(core_bwd)

    def _sac_op(self, kind: str) -> bool:
        """Whether "selective" means torchtitan's per-op SAC for this block kind."""
        return self.framework == "torchtitan" and memory.sac_op_supported(self.model, kind)

    def _sac_recompute_s(self, node: NodeSpec, cfg: StageConfig, kind: LayerKind) -> float:
        """Computed seconds the backward spends re-running the forward under per-op SAC: every
        memory-bound kernel of the block and the recomputed share of each GEMM
        (:func:`memory.sac_op_recompute_shares`); the attention kernel's output is saved."""
        sh = self._shape(cfg)

        def make() -> float:
            fwd_ops, _ = flops.block_ops(self.model, kind, sh, kernel=self.kernel_for(node.gpu),
                                         attention_dropout=self.attention_dropout,
                                         hidden_dropout=self.hidden_dropout,
                                         fp8=self.training.precision == "fp8")
            shares = memory.sac_op_recompute_shares(self.model, cfg.tp)
            rates = self._rates(node)
            total = 0.0
            for op in fwd_ops:
                if op.name.startswith("attn."):
                    continue
                share = shares.get(op.name, 0.0) if op.unit in ("gemm", "gemm_fp8") else 1.0
                total += share * rates.time_s([op])
            return total
        return self._memo(("sac_recompute", node, kind, sh), make)

    def _grad_sync(self, node: NodeSpec, cfg: StageConfig, dense_local: float, expert_local: float, dense_dp: int,
                   expert_dp: int) -> tuple[float, float]:
        """(gradient reduction, ZeRO-1/2 parameter all-gather) seconds per step, before overlap."""
        t = self.training
        if cfg.zero >= 3:
            return 0.0, 0.0  # reduce-scattered per micro-batch inside the backward
        groups = ((dense_local, dense_dp, cfg.tp), (expert_local, expert_dp, cfg.tp * cfg.ep))
        grad = gather = 0.0
        for n_params, group, stride in groups:
            if group <= 1 or n_params <= 0:
                continue
            if cfg.zero == 0:
                grad += self._coll(node, "all_reduce", n_params * t.grad_bytes, group, stride)
            else:  # distributed optimizer: reduce-scatter gradients, all-gather updated weights
                grad += self._coll(node, "reduce_scatter", n_params * t.grad_bytes, group, stride)
                gather += self._coll(node, "all_gather", n_params * t.weight_bytes, group, stride)
        return grad, gather

    def _optimizer_time(self, node: NodeSpec, cfg: StageConfig, dense_local: float, expert_local: float,
                        dense_dp: int, expert_dp: int) -> float:
        """Adam over this GPU's shard: read gradient and state, write state and 16-bit weight (memory-bound)."""
        t = self.training
        shard = dense_local / dense_dp + expert_local / expert_dp if cfg.zero >= 1 else dense_local + expert_local
        moved = shard * (t.grad_bytes + 2.0 * t.optimizer_bytes + t.weight_bytes)
        rate = node.gpu.hbm_bw_bytes_per_s * self.calibration.memory(node.gpu.name)
        return moved / rate + self.calibration.kernel_overhead_s

    # --- embedding and head ----------------------------------------------------------------------------
    def _vocab_params(self, which: str, cfg: StageConfig) -> tuple[float, float]:
        """(per-GPU params, full params) of the embedding or the head."""
        m = self.model
        h = m.hidden_size
        emb = getattr(m, "embed_dim", None) or h
        proj = emb * h if emb != h else 0
        vocab = m.vocab_size * emb
        if which == "embedding":
            pos = m.max_position_embeddings * h if m.position_embedding == "learned" else 0
            replicated = pos + proj
        else:
            replicated = (m.norm_params if getattr(m, "final_norm", True) else 0) + proj
            # a tied head keeps its own copy of the word embeddings on the last stage (Megatron-LM)
        return vocab / cfg.tp + replicated, float(vocab + replicated)

    def _vocab_compute(self, node: NodeSpec, cfg: StageConfig, which: str) -> tuple[float, float, float, float]:
        """Computed (fwd, bwd, TP fwd, TP bwd) seconds of the embedding or the head (with its loss)."""
        m = self.model
        sh = self._shape(cfg)
        e, tokens = sh.elt_bytes, sh.tokens

        def compute() -> tuple[float, float]:
            rates = self._rates(node)
            if which == "embedding":
                fwd_ops, bwd_ops = flops.embedding_ops(m, tokens, cfg.tp, sh.sp, e, self.hidden_dropout)
            else:
                fwd_ops, bwd_ops = flops.head_ops(m, tokens, cfg.tp, sh.sp, e)
            return rates.time_s(fwd_ops), rates.time_s(bwd_ops)

        fwd_s, bwd_s = self._memo(("vocab", node, which, tokens, cfg.tp, sh.sp), compute)
        msg = tokens * m.hidden_size * e
        tp_fwd = tp_bwd = 0.0
        if cfg.tp > 1:
            if which == "embedding":  # vocab-parallel lookup: partial sums reduced across TP
                tp_fwd = self._coll(node, "reduce_scatter" if sh.sp else "all_reduce", msg, cfg.tp)
                tp_bwd = self._coll(node, "all_gather", msg, cfg.tp) if sh.sp else 0.0
            else:
                ce = 3 * self._coll(node, "all_reduce", 4.0 * tokens, cfg.tp)  # max, sum-exp, target logit
                tp_fwd = (self._coll(node, "all_gather", msg, cfg.tp) if sh.sp else 0.0) + ce
                tp_bwd = self._coll(node, "reduce_scatter" if sh.sp else "all_reduce", msg, cfg.tp)
        return fwd_s, bwd_s, tp_fwd, tp_bwd

    def _vocab_cost(self, node: NodeSpec, cfg: StageConfig, which: str) -> LayerCost:
        m, t, c = self.model, self.training, self.calibration
        sh = self._shape(cfg)
        e, tokens = sh.elt_bytes, sh.tokens
        t_sp = tokens / cfg.tp if sh.sp else tokens
        vocab_fwd_s, vocab_bwd_s, tp_fwd, tp_bwd = self._vocab_compute(node, cfg, which)
        fwd_c, bwd_c, tp_inside, profiled = self._measured(node, cfg, which, (vocab_fwd_s, vocab_bwd_s))
        if tp_inside:
            tp_fwd = tp_bwd = 0.0
        recompute = fwd_c + tp_fwd if (cfg.recompute == "full" and which == "head") else 0.0
        local, _ = self._vocab_params(which, cfg)
        lp = flops.LayerParams(sharded=local * cfg.tp, replicated=0.0)  # per_gpu(tp) gives back `local`
        dense_dp = cfg.dp * cfg.cp
        static = memory.model_state_bytes(lp, t, tp=cfg.tp, ep=1, dense_dp=dense_dp, expert_dp=1, zero=cfg.zero)
        z3_fwd = z3_bwd = 0.0
        if cfg.zero >= 3:
            gather = self._coll(node, "all_gather", local * t.weight_bytes, dense_dp, stride=cfg.tp)
            rs = self._coll(node, "reduce_scatter", local * t.grad_bytes, dense_dp, stride=cfg.tp)
            z3_fwd, z3_bwd = max(0.0, gather - fwd_c), max(0.0, gather + rs - bwd_c)
        grad_sync, param_gather = self._grad_sync(node, cfg, local, 0.0, dense_dp, 1)
        if c.overlap_grad_reduce:
            exposed = max(0.0, grad_sync - bwd_c) + max(0.0, param_gather - fwd_c)
        else:
            exposed = grad_sync + param_gather
        opt = self._optimizer_time(node, cfg, local, 0.0, dense_dp, 1)
        reserved_extra = 0.0
        if which == "embedding":
            act = 8.0 * tokens + (t_sp * m.hidden_size * memory.MASK_BYTES if self.hidden_dropout else 0.0)
            transient = tokens * m.hidden_size * e  # gathered / reduced output buffer
            emb = getattr(m, "embed_dim", None) or m.hidden_size
            mf = 6.0 * tokens * emb * m.hidden_size / cfg.tp if emb != m.hidden_size else 0.0
        else:
            act = 2.0 * e * t_sp * m.hidden_size  # final-norm input and LM-head input (sharded with SP)
            # logits and loss buffers (memory.cross_entropy_bytes): Megatron's fused vocab-parallel
            # cross-entropy, or torchtitan's eager one on fp32-upcast logits
            transient, reserved = memory.cross_entropy_bytes(tokens, m.vocab_size / cfg.tp, e, self.framework)
            reserved_extra = reserved - transient
            emb = getattr(m, "embed_dim", None) or m.hidden_size
            proj = emb * m.hidden_size if emb != m.hidden_size else 0  # project_out (project_in: embedding)
            mf = 6.0 * tokens * (m.vocab_size * emb + proj) / cfg.tp
        weights = static.weight_bytes
        if cfg.zero >= 3 and dense_dp > 1 and self.framework == "torchtitan":
            # FSDP2 does not reshard the root unit (embedding, final norm, head) after its forward
            # (it is needed again at once): its gathered weights live from the step's first forward
            # to its last backward; torchtitan does not reshard the last block after forward either,
            # so at the loss its weights are gathered too
            weights += local * t.weight_bytes
            if which == "head" and self.model.num_dense_layers:
                dense_local_layer, _ = self._params["dense"].per_gpu(cfg.tp, 1)
                transient += dense_local_layer * t.weight_bytes
        elif cfg.zero >= 3 and dense_dp > 1:
            transient += local * t.weight_bytes
        return LayerCost(fwd_time_s=fwd_c + tp_fwd + z3_fwd, bwd_time_s=bwd_c + recompute + tp_bwd + z3_bwd,
                         weight_bytes=weights, grad_bytes=static.grad_bytes,
                         optimizer_bytes=static.optimizer_bytes, activation_bytes=act, transient_bytes=transient,
                         grad_sync_time_s=exposed, optimizer_time_s=opt, model_flops=mf,
                         breakdown={"compute_fwd": fwd_c, "compute_bwd": bwd_c, "recompute": recompute,
                                    "tp_comm": tp_fwd + tp_bwd, "zero3_comm": z3_fwd + z3_bwd,
                                    "grad_sync_total": grad_sync + param_gather, "profiled": profiled,
                                    "allocator_cached_bytes": reserved_extra})

    def embedding(self, node: NodeSpec, cfg: StageConfig) -> LayerCost:
        """Extra cost of the first stage: token (and position) embedding, vocab-parallel."""
        return self._vocab_cached(node, cfg, "embedding")

    def head(self, node: NodeSpec, cfg: StageConfig) -> LayerCost:
        """Extra cost of the last stage: final norm, LM head and loss; logits are transient."""
        return self._vocab_cached(node, cfg, "head")

    def _vocab_cached(self, node: NodeSpec, cfg: StageConfig, which: str) -> LayerCost:
        """``_vocab_cost`` keyed by what it reads: not the EP degree (the vocabulary is dense), and
        of the recomputation mode only whether the head is fully recomputed. MoE searches price
        the same embedding for every EP degree otherwise."""
        key = (which, node, cfg.tp, cfg.cp, cfg.dp, cfg.zero, cfg.micro_batch_size, cfg.sequence_parallel,
               which == "head" and cfg.recompute == "full")
        hit = self._cache.get(key)
        if hit is None:
            hit = self._cache[key] = self._vocab_cost(node, cfg, which)
        return hit

    # --- pipeline point-to-point -----------------------------------------------------------------------
    def p2p_bytes(self, pipeline_micro_batch: int) -> float:
        """Activation bytes one stage sends the next per micro-batch, summed over its GPUs (the
        gradient coming back is the same size)."""
        t = self.training
        return pipeline_micro_batch * t.seq_len * self.model.hidden_size * t.activation_bytes

    def p2p_shard_bytes(self, cfg: StageConfig) -> float:
        """Bytes one GPU of a stage sends (and receives) per micro-batch: every data-parallel replica
        and context-parallel rank holds its own slice, and with sequence parallelism each
        tensor-parallel rank its own ``1/tp`` of it; without it every TP rank sends the whole slice
        (Megatron-core's p2p shapes: ``seq_len / tp`` only under sequence parallelism)."""
        shards = cfg.dp * cfg.cp * (cfg.tp if cfg.sequence_parallel else 1)
        return self.p2p_bytes(cfg.pipeline_micro_batch) / shards

    def p2p_side_time_s(self, node: NodeSpec, cfg: StageConfig, *, intra_node: bool) -> float:
        """Seconds one side of a stage boundary needs to move its share of a micro-batch
        (:func:`~tangram_opt.cost.comm.p2p_side_time_s`)."""
        return comm.p2p_side_time_s(self.p2p_shard_bytes(cfg), node, intra_node=intra_node,
                                    efficiency=self.calibration.network_efficiency)

    def p2p_shared_time_s(self, pipeline_micro_batch: int, link: comm.PipelineLink) -> float:
        """Seconds the whole micro-batch needs on the link both sides share (a zone link; 0 inside a zone)."""
        return comm.shared_link_time_s(link, self.p2p_bytes(pipeline_micro_batch), self.calibration.network_efficiency)

    def p2p_time_s(self, src: tuple[NodeSpec, StageConfig], dst: tuple[NodeSpec, StageConfig],
                   link: comm.PipelineLink) -> float:
        """Seconds to send one micro-batch's activations from stage ``src`` to stage ``dst``
        ((node shape, configuration) each) over ``link``: latency plus the slowest of the two
        sides and the shared link (:func:`~tangram_opt.cost.comm.p2p_time_s`)."""
        (src_node, src_cfg), (dst_node, dst_cfg) = src, dst
        b = src_cfg.pipeline_micro_batch
        if dst_cfg.pipeline_micro_batch != b:
            raise SpecError("stage.micro_batch_size", (src_cfg.label, dst_cfg.label),
                            "consecutive stages carry different pipeline micro-batches",
                            "give every stage of a pipeline the same dp x micro_batch_size")
        sides = (self.p2p_side_time_s(src_node, src_cfg, intra_node=link.intra_node),
                 self.p2p_side_time_s(dst_node, dst_cfg, intra_node=link.intra_node))
        return comm.p2p_time_s(link, side_s=sides, shared_s=self.p2p_shared_time_s(b, link))

    # --- MFU ----------------------------------------------------------------------------------------------
    def model_flops_per_step(self) -> float:
        """Useful FLOPs of one optimizer step: ``tokens_per_step`` x ``flops.model_flops_per_token``.

        Narayanan et al. 2021 (Eq. 3) and PaLM (App. B) convention: 6 FLOPs per matmul parameter
        per token (active experts only, LM head included, embedding lookup excluded) plus the full
        attention square; recomputation is not counted. MFU = this / (step time x sum of GPU peaks).
        """
        return self.training.tokens_per_step * flops.model_flops_per_token(self.model, self.training.seq_len)


pipeline_link = comm.pipeline_link

__all__ = ["CostModel", "Calibration", "pipeline_link", "FP32_MATMUL_MODES"]
