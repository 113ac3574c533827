"""GPU types and intra-node links: the built-in catalog and user-defined types.

Every figure comes from a public datasheet, cited in ``source``. "Dense" means without 2:4
structured sparsity: vendors often headline sparse figures, which are exactly twice the dense ones.
Tensor-core FP16/BF16 peaks for consumer cards are the FP32-accumulate figures (what mixed-precision
training uses). Memory capacities are the marketed sizes interpreted as binary units for HBM parts
(HBM stacks are power-of-two sized); the cost model keeps a reserve for the CUDA context, workspace
and fragmentation on top of that.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tangram_opt import units as u
from tangram_opt.errors import SpecError
from tangram_opt.specs import _check
from tangram_opt.specs._io import positive_number

#: Precisions the cost model understands. "bf16"/"fp16" are mixed precision with fp32 master
#: weights; "fp32" is full single precision on CUDA cores (no tensor cores).
PRECISIONS = ("bf16", "fp16", "fp32", "fp8")


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkType:
    """A named scale-up link, with per-GPU bandwidth in one direction and a per-message latency."""

    name: str
    bw_bytes_per_s: float
    latency_s: float
    source: str = ""


# Per-GPU one-direction bandwidth: NVIDIA quotes NVLink as the bidirectional aggregate
# (e.g. "600 GB/s" on A100 = 12 links x 25 GB/s x 2 directions), so we halve it. PCIe x16 figures
# are the theoretical per-direction rates of the generation.
LINKS: dict[str, LinkType] = {
    lk.name: lk
    for lk in (
        LinkType(name="nvlink2", bw_bytes_per_s=150 * u.GB_PER_S, latency_s=3 * u.US,
                 source="NVIDIA V100 datasheet: NVLink 300 GB/s bidirectional"),
        LinkType(name="nvlink3", bw_bytes_per_s=300 * u.GB_PER_S, latency_s=3 * u.US,
                 source="NVIDIA A100 datasheet: NVLink 600 GB/s bidirectional"),
        LinkType(name="nvlink4", bw_bytes_per_s=450 * u.GB_PER_S, latency_s=3 * u.US,
                 source="NVIDIA H100 datasheet: NVLink 900 GB/s bidirectional"),
        LinkType(name="nvlink5", bw_bytes_per_s=900 * u.GB_PER_S, latency_s=3 * u.US,
                 source="NVIDIA DGX B200 datasheet: NVLink 1.8 TB/s bidirectional per GPU"),
        LinkType(name="pcie3", bw_bytes_per_s=15.75 * u.GB_PER_S, latency_s=8 * u.US,
                 source="PCI-SIG: PCIe 3.0 x16, 8 GT/s x 16 lanes, 128b/130b"),
        LinkType(name="pcie4", bw_bytes_per_s=31.5 * u.GB_PER_S, latency_s=8 * u.US,
                 source="PCI-SIG: PCIe 4.0 x16, 16 GT/s x 16 lanes, 128b/130b"),
        LinkType(name="pcie5", bw_bytes_per_s=63 * u.GB_PER_S, latency_s=8 * u.US,
                 source="PCI-SIG: PCIe 5.0 x16, 32 GT/s x 16 lanes, 128b/130b"),
        LinkType(name="xgmi-mi250x", bw_bytes_per_s=200 * u.GB_PER_S, latency_s=4 * u.US,
                 source="AMD MI250X datasheet: 800 GB/s aggregate Infinity Fabric per package "
                        "(2 GCDs), taken as 200 GB/s per GCD per direction"),
        LinkType(name="xgmi-mi300x", bw_bytes_per_s=448 * u.GB_PER_S, latency_s=4 * u.US,
                 source="AMD MI300X datasheet: 896 GB/s aggregate Infinity Fabric bidirectional"),
    )
}


@dataclass(frozen=True, slots=True, kw_only=True)
class GPUType:
    """One accelerator model (one device as the framework sees it).

    ``bf16_flops_per_s`` is ``None`` on GPUs without BF16 tensor cores (V100, RTX 2080, Titan RTX);
    training in "bf16" on them is rejected with a message asking for "fp16". ``fp8_flops_per_s`` is
    the dense FP8 tensor-core peak (Hopper, Ada, Blackwell, MI300X; ``None`` elsewhere): "fp8"
    training (Transformer Engine's FP8 linear layers over bf16) needs it. ``num_sms`` is the
    number of streaming multiprocessors (AMD: compute units): a GEMM's output tiles run in waves of
    that many, so a small GEMM leaves part of the GPU idle (``None``: not modelled).
    ``compute_capability`` (NVIDIA) decides which kernels a framework can run on it: FlashAttention-2
    and its successors need 8.0 (Ampere) or newer, so V100 and Turing cards train with
    materialized attention. ``pcie_peer_to_peer`` says whether two of these GPUs can reach each
    other's memory over PCIe (CUDA peer access): NVIDIA disables it on GeForce and Titan cards, so
    NCCL stages their intra-node transfers through host memory (its SHM transport) and every byte
    crosses the PCIe path to the CPU (see :class:`~tangram_opt.specs.cluster.NodeSpec`).
    """

    name: str
    fp16_flops_per_s: float
    bf16_flops_per_s: float | None
    fp32_flops_per_s: float
    hbm_bytes: float
    hbm_bw_bytes_per_s: float
    default_link: str
    num_sms: int | None = None
    compute_capability: float | None = None
    fp8_flops_per_s: float | None = None
    pcie_peer_to_peer: bool = True
    vendor: str = "NVIDIA"
    source: str = ""
    notes: str = ""

    def __post_init__(self) -> None:
        where = f"gpu_types.{self.name}"
        if not self.name or not isinstance(self.name, str):
            raise SpecError("gpu_types.name", self.name, "must be a non-empty string", "name the GPU type")
        for fname in ("fp16_flops_per_s", "fp32_flops_per_s", "hbm_bytes", "hbm_bw_bytes_per_s"):
            _check.positive_float(f"{where}.{fname}", getattr(self, fname))
        if self.bf16_flops_per_s is not None:
            _check.positive_float(f"{where}.bf16_flops_per_s", self.bf16_flops_per_s)
        if self.fp8_flops_per_s is not None:
            _check.positive_float(f"{where}.fp8_flops_per_s", self.fp8_flops_per_s)
        if self.num_sms is not None:
            _check.positive_int(f"{where}.num_sms", self.num_sms)
        if self.compute_capability is not None:
            cuda_compute_capability(f"{where}.compute_capability", self.compute_capability)
        if self.default_link not in LINKS:
            raise SpecError(f"{where}.default_link", self.default_link, "is not a known link type",
                            f"use one of {', '.join(LINKS)}")

    def peak_flops_per_s(self, precision: str) -> float:
        """Dense peak FLOP/s that model FLOPs utilization is reported against in ``precision``:
        the matrix-multiply peak of "bf16", "fp16" or "fp32", and for "fp8" the BF16 peak (FP8 runs
        report MFU against the 16-bit peak, as the Llama 3 paper and NeMo's tables do; the FP8
        GEMMs themselves run at ``fp8_flops_per_s``)."""
        precision = _check.one_of("training.precision", precision, PRECISIONS)
        if precision == "fp8" and self.fp8_flops_per_s is None:
            raise SpecError("training.precision", "fp8", f"{self.name} has no FP8 tensor cores",
                            "train in bf16 (or fp16) on clusters that include this GPU")
        if precision in ("bf16", "fp8"):
            if self.bf16_flops_per_s is None:
                raise SpecError("training.precision", precision, f"{self.name} has no BF16 tensor cores",
                                "train in fp16 on clusters that include this GPU")
            return self.bf16_flops_per_s
        if precision == "fp16":
            return self.fp16_flops_per_s
        return self.fp32_flops_per_s

    def supports(self, precision: str) -> bool:
        if precision == "fp8":
            return self.fp8_flops_per_s is not None and self.bf16_flops_per_s is not None
        return precision != "bf16" or self.bf16_flops_per_s is not None

    def missing_for(self, precision: str) -> str:
        """What this GPU lacks to train in ``precision`` ("" if nothing)."""
        if self.supports(precision):
            return ""
        return "no FP8 tensor cores" if precision == "fp8" and self.bf16_flops_per_s is not None \
            else "no BF16 tensor cores"

    @property
    def flash_attention(self) -> bool:
        """Whether fused (flash) attention kernels run on it: NVIDIA compute capability 8.0 or newer
        (FlashAttention-2's requirement; cuDNN's fused attention likewise targets Ampere and later),
        AMD Instinct MI200/MI300 (FlashAttention-2's ROCm port). Unknown NVIDIA parts: assumed yes."""
        if self.vendor == "AMD":
            return True
        return self.compute_capability is None or self.compute_capability >= 8.0


#: Plausible CUDA compute capabilities: 3.0 (Kepler, the oldest any current framework built for) to
#: below 20 (Blackwell is 10.x and 12.x). A value such as 75 or 80 is 7.5 or 8.0 written without its dot.
COMPUTE_CAPABILITY_RANGE = (3.0, 20.0)


def cuda_compute_capability(field: str, value: Any, *, source: str = "") -> float:
    """A CUDA compute capability ``major.minor`` in :data:`COMPUTE_CAPABILITY_RANGE`, or a SpecError."""
    value = positive_number(field, value, source=source)
    low, high = COMPUTE_CAPABILITY_RANGE
    if not low <= value < high:
        dotted = f"{int(value) // 10}.{int(value) % 10}" if value.is_integer() and 30 <= value < 200 else "8.0"
        raise SpecError(field, value, f"is not a CUDA compute capability ({low:g} to below {high:g})",
                        f"write it as major.minor with the dot, e.g. {dotted}", source=source)
    return value


def _gpu(name: str, *, half_tflops: float, bf16: bool = True, fp32_tflops: float, mem_gib: float | None = None,
         mem_gb: float | None = None, hbm_gb_per_s: float, link: str, vendor: str = "NVIDIA", source: str,
         notes: str = "", fp8_tflops: float | None = None, pcie_p2p: bool = True) -> GPUType:
    sms = SM_COUNTS[name][0]
    cc = COMPUTE_CAPABILITY.get(name)
    mem = mem_gib * u.GiB if mem_gib is not None else mem_gb * u.GB  # type: ignore[operator]
    return GPUType(name=name, fp16_flops_per_s=half_tflops * u.TFLOPS,
                   bf16_flops_per_s=half_tflops * u.TFLOPS if bf16 else None,
                   fp32_flops_per_s=fp32_tflops * u.TFLOPS, hbm_bytes=mem, hbm_bw_bytes_per_s=hbm_gb_per_s * u.GB_PER_S,
                   default_link=link, num_sms=sms, compute_capability=cc, vendor=vendor, source=source, notes=notes,
                   fp8_flops_per_s=None if fp8_tflops is None else fp8_tflops * u.TFLOPS,
                   pcie_peer_to_peer=pcie_p2p)


#: GeForce and Titan cards: CUDA peer access over PCIe is disabled by the driver on consumer boards
#: (CUDA's p2pBandwidthLatencyTest prints "CANNOT Access Peer" between RTX 2080 Ti cards,
#: NVIDIA/nccl-tests issue #117; RTX 4090, nccl-tests issue #307), so NCCL falls back to its shared-
#: memory transport through the CPU (NCCL src/graph/paths.cc: "Divert all traffic through the CPU").
_NO_PCIE_P2P = "no GPU peer-to-peer over PCIe on GeForce/Titan boards (NCCL goes through host memory)"

#: Streaming multiprocessors (AMD: compute units) per device, with where the figure comes from.
#: Where a datasheet gives CUDA cores rather than SMs, the count is cores / cores per SM of the
#: architecture (64 on Volta, Turing and GA100; 128 on GA10x, Ada and Hopper).
SM_COUNTS: dict[str, tuple[int, str]] = {
    "V100-16": (80, "Volta whitepaper: 80 SMs (5,120 CUDA cores)"),
    "V100-32": (80, "Volta whitepaper: 80 SMs"),
    "A100-40": (108, "A100 whitepaper: 108 SMs (6,912 CUDA cores)"),
    "A100-80": (108, "A100 whitepaper: 108 SMs"),
    "H100-SXM": (132, "H100 whitepaper: 132 SMs on the SXM5 board (16,896 CUDA cores)"),
    "H200": (132, "H200 uses the H100 SXM5 configuration of GH100: 132 SMs"),
    "B200": (148, "Blackwell B200: 148 SMs over its two dies (as reported by NVIDIA's CUDA device query)"),
    "GB200": (148, "the Blackwell GPU of GB200: 148 SMs, as B200"),
    "GH200-96": (132, "GH200 datasheet: H100 GPU with 132 SMs"),
    "L4": (58, "L4 datasheet: 7,424 CUDA cores / 128 per Ada SM"),
    "A10G": (80, "A10G: 80 SMs as reported by the CUDA device query on AWS G5 (not in AWS documentation)"),
    "RTX-3090": (82, "GA102 whitepaper: 10,496 CUDA cores / 128 per SM"),
    "RTX-4090": (128, "Ada whitepaper: 16,384 CUDA cores / 128 per SM"),
    "RTX-2080": (46, "Turing whitepaper: 2,944 CUDA cores / 64 per SM"),
    "Titan-RTX": (72, "Turing whitepaper: 4,608 CUDA cores / 64 per SM"),
    "MI250X": (110, "AMD MI250X datasheet: 220 compute units per package, 110 per GCD"),
    "MI300X": (304, "AMD MI300X datasheet: 304 compute units"),
}

#: CUDA compute capability (NVIDIA's "CUDA GPUs" compute-capability table).
COMPUTE_CAPABILITY: dict[str, float] = {
    "V100-16": 7.0, "V100-32": 7.0, "A100-40": 8.0, "A100-80": 8.0, "H100-SXM": 9.0, "H200": 9.0, "B200": 10.0,
    "GB200": 10.0,
    "GH200-96": 9.0, "L4": 8.9, "A10G": 8.6, "RTX-3090": 8.6, "RTX-4090": 8.9, "RTX-2080": 7.5, "Titan-RTX": 7.5,
}

_BUILTIN: tuple[GPUType, ...] = (
    _gpu("V100-16", half_tflops=125, bf16=False, fp32_tflops=15.7, mem_gib=16, hbm_gb_per_s=900, link="nvlink2",
         source="NVIDIA Tesla V100 datasheet (SXM2): 125 TFLOPS tensor FP16, 15.7 TFLOPS FP32, 900 GB/s HBM2"),
    _gpu("V100-32", half_tflops=125, bf16=False, fp32_tflops=15.7, mem_gib=32, hbm_gb_per_s=900, link="nvlink2",
         source="NVIDIA Tesla V100 datasheet (SXM2 32 GB)"),
    _gpu("A100-40", half_tflops=312, fp32_tflops=19.5, mem_gib=40, hbm_gb_per_s=1555, link="nvlink3",
         source="NVIDIA A100 datasheet (SXM4 40 GB): 312 TFLOPS BF16/FP16 dense, 19.5 FP32, 1,555 GB/s"),
    _gpu("A100-80", half_tflops=312, fp32_tflops=19.5, mem_gib=80, hbm_gb_per_s=2039, link="nvlink3",
         source="NVIDIA A100 datasheet (SXM4 80 GB): 312 TFLOPS BF16/FP16 dense, 2,039 GB/s HBM2e"),
    _gpu("H100-SXM", half_tflops=989, fp32_tflops=67, mem_gib=80, hbm_gb_per_s=3350, link="nvlink4", fp8_tflops=1979,
         source="NVIDIA H100 datasheet (SXM5): 1,979 TFLOPS BF16 with sparsity = 989 dense, 3,958 FP8 with "
                "sparsity = 1,979 dense, 67 FP32, 3.35 TB/s"),
    _gpu("H200", half_tflops=989, fp32_tflops=67, mem_gb=141, hbm_gb_per_s=4800, link="nvlink4", fp8_tflops=1979,
         source="NVIDIA H200 datasheet (SXM): 989 TFLOPS BF16 dense, 3,958 FP8 with sparsity = 1,979 dense, "
                "141 GB HBM3e, 4.8 TB/s"),
    _gpu("B200", half_tflops=2250, fp32_tflops=75, mem_gb=180, hbm_gb_per_s=8000, link="nvlink5", fp8_tflops=4500,
         source="NVIDIA DGX/HGX B200 datasheets: 2.25 PFLOPS BF16 dense per GPU, FP8 72 PFLOPS with sparsity per "
                "8 GPUs = 4.5 dense per GPU, 1,440 GB / 8 GPUs, 64 TB/s / 8"),
    _gpu("GB200", half_tflops=2500, fp32_tflops=80, mem_gb=186, hbm_gb_per_s=8000, link="nvlink5", fp8_tflops=5000,
         source="NVIDIA GB200 NVL72 datasheet: 360 PFLOPS FP16/BF16 with sparsity (180 dense), 720 PFLOPS FP8 "
                "with sparsity (360 dense, 5 per GPU), 13.4 TB HBM3e "
                "at 576 TB/s for 72 GPUs: per GPU 2.5 PFLOPS dense, 186 GB, 8 TB/s. The FP32 CUDA-core peak is "
                "not on the datasheet: B200's 75 TFLOPS x 2500 / 2250 (same die, higher clock)",
         notes="one rack is one NVLink domain of 72 GPUs: describe it as nodes of 72 (or of the tray's 4 with "
               "nvlink5 as the NIC figure)"),
    _gpu("GH200-96", half_tflops=989, fp32_tflops=67, mem_gib=96, hbm_gb_per_s=4000, link="nvlink4", fp8_tflops=1979,
         source="NVIDIA GH200 Grace Hopper datasheet: H100 compute (1,979 FP8 TFLOPS dense), 96 GB HBM3 at 4 TB/s"),
    _gpu("L4", half_tflops=121, fp32_tflops=30.3, mem_gib=24, hbm_gb_per_s=300, link="pcie4", fp8_tflops=242.5,
         source="NVIDIA L4 datasheet: 242 TFLOPS FP16/BF16 with sparsity = 121 dense, 485 FP8 with sparsity = "
                "242.5 dense, 30.3 FP32, 300 GB/s GDDR6"),
    _gpu("A10G", half_tflops=70, fp32_tflops=31.2, mem_gib=24, hbm_gb_per_s=600, link="pcie4",
         source="AWS EC2 G5 documentation (A10G, 24 GB GDDR6, 600 GB/s); dense tensor FP16 not published, "
                "~70 TFLOPS commonly reported", notes="approximate tensor peak"),
    _gpu("RTX-3090", half_tflops=71, fp32_tflops=35.6, mem_gib=24, hbm_gb_per_s=936, link="pcie4",
         pcie_p2p=False, notes=_NO_PCIE_P2P,
         source="NVIDIA Ampere GA102 whitepaper: 71 TFLOPS FP16 tensor with FP32 accumulate, 936 GB/s"),
    _gpu("RTX-4090", half_tflops=165.2, fp32_tflops=82.6, mem_gib=24, hbm_gb_per_s=1008, link="pcie4",
         fp8_tflops=330.3, pcie_p2p=False, notes=_NO_PCIE_P2P,
         source="NVIDIA Ada Lovelace whitepaper: 165.2 TFLOPS FP16/BF16 and 330.3 FP8 tensor with FP32 "
                "accumulate, 1,008 GB/s"),
    _gpu("RTX-2080", half_tflops=40.3, bf16=False, fp32_tflops=10.1, mem_gib=8, hbm_gb_per_s=448, link="pcie3",
         pcie_p2p=False, notes=_NO_PCIE_P2P,
         source="NVIDIA Turing whitepaper: RTX 2080 40.3 TFLOPS FP16 tensor with FP32 accumulate, 448 GB/s"),
    _gpu("Titan-RTX", half_tflops=130.5, bf16=False, fp32_tflops=16.3, mem_gib=24, hbm_gb_per_s=672, link="pcie3",
         pcie_p2p=False, notes=_NO_PCIE_P2P,
         source="NVIDIA Turing whitepaper: Titan RTX 130.5 TFLOPS FP16 tensor with FP32 accumulate, 672 GB/s"),
    _gpu("MI250X", half_tflops=191.5, fp32_tflops=47.85, mem_gib=64, hbm_gb_per_s=1600, link="xgmi-mi250x",
         vendor="AMD",
         source="AMD Instinct MI250X datasheet: 383 TFLOPS BF16/FP16, 95.7 FP32 matrix, 128 GB, 3.2 TB/s "
                "per package of 2 GCDs; one entry is one GCD",
         notes="one MI250X package is two devices: count 8 devices per 4-package node"),
    _gpu("MI300X", half_tflops=1307.4, fp32_tflops=163.4, mem_gib=192, hbm_gb_per_s=5300, link="xgmi-mi300x",
         vendor="AMD", fp8_tflops=2614.9,
         source="AMD Instinct MI300X datasheet: 1,307.4 TFLOPS BF16 dense, 2,614.9 FP8 dense, 192 GB HBM3, "
                "5.3 TB/s"),
)

#: Alternative spellings accepted wherever a GPU type is named (lower-case keys).
ALIASES: dict[str, str] = {
    "v100": "V100-16", "v100-16gb": "V100-16", "v100-sxm2-16gb": "V100-16", "v100-32gb": "V100-32",
    "a100-40gb": "A100-40", "a100-sxm4-40gb": "A100-40", "a100-80gb": "A100-80", "a100-sxm4-80gb": "A100-80",
    "h100": "H100-SXM", "h100-80gb": "H100-SXM", "h100-sxm5": "H100-SXM", "h100-sxm5-80gb": "H100-SXM",
    "h200-sxm": "H200", "h200-141gb": "H200", "b200-180gb": "B200", "gh200": "GH200-96", "gh-96": "GH200-96",
    "gh200-96gb": "GH200-96", "l4-24gb": "L4", "a10g-24gb": "A10G", "rtx3090": "RTX-3090", "3090": "RTX-3090",
    "rtx4090": "RTX-4090", "4090": "RTX-4090", "rtx2080": "RTX-2080", "titan-rtx": "Titan-RTX",
    "titanrtx": "Titan-RTX", "mi250x-gcd": "MI250X", "mi300x-192gb": "MI300X",
}

_catalog: dict[str, GPUType] = {g.name: g for g in _BUILTIN}


def builtin_gpu_types() -> Mapping[str, GPUType]:
    """The built-in catalog (name -> GPUType), plus anything added with :func:`register_gpu_type`."""
    return dict(_catalog)


def catalog_name(name: str) -> str | None:
    """The catalog GPU ``name`` means (a catalog name or alias, case-insensitive), or ``None``."""
    by_lower = {k.lower(): k for k in _catalog}
    key = name.strip().lower()
    return by_lower.get(key) or by_lower.get(ALIASES.get(key, "").lower())


def register_gpu_type(gpu: GPUType, *, replace: bool = False) -> GPUType:
    """Add a user-defined GPU type to the catalog so clusters can refer to it by name."""
    if gpu.name in _catalog and not replace and _catalog[gpu.name] != gpu:
        raise SpecError("gpu_types.name", gpu.name, "is already a catalog GPU with different figures",
                        "pick another name or pass replace=True")
    _catalog[gpu.name] = gpu
    return gpu


def get_gpu_type(name: str, *, field: str = "gpu", extra: Mapping[str, GPUType] | None = None,
                 source: str = "") -> GPUType:
    """Look a GPU type up by name or alias (case-insensitive), naming close matches on failure."""
    pool = dict(_catalog)
    if extra:
        pool.update(extra)
    if not isinstance(name, str):
        raise SpecError(field, name, "must be a GPU type name", f"use one of {', '.join(pool)}", source=source)
    by_lower = {k.lower(): v for k, v in pool.items()}
    key = name.strip().lower()
    if key in by_lower:
        return by_lower[key]
    if key in ALIASES and ALIASES[key].lower() in by_lower:
        return by_lower[ALIASES[key].lower()]
    guesses = _check.closest(name, list(pool) + list(ALIASES))
    raise SpecError(field, name, "is not a known GPU type",
                    f"use a catalog name (did you mean {', '.join(guesses)}?) or define it under gpu_types:",
                    source=source)


def get_link(name: str, *, field: str = "intra_node_link", source: str = "") -> LinkType:
    key = str(name).strip().lower()
    if key in LINKS:
        return LINKS[key]
    raise SpecError(field, name, "is not a known link type",
                    f"use one of {', '.join(LINKS)} or give intra_node_gbs explicitly", source=source)


_GPU_FIELDS = ("name", "fp16_tflops", "bf16_tflops", "fp8_tflops", "fp32_tflops", "memory_gib", "memory_gb",
               "hbm_gbs", "link", "num_sms", "compute_capability", "pcie_p2p", "vendor", "source", "notes",
               "replaces_catalog")


def gpu_type_from_dict(data: Mapping[str, Any], *, field: str = "gpu_types", source: str = "") -> GPUType:
    """Build a user GPU type from file fields (TFLOPS, GiB/GB, GB/s); converts units once here.

    A name the catalog already has (or an alias of one) is refused unless ``replaces_catalog: true``
    says the figures are meant to replace the catalog's for this cluster (the calibration, looked up
    by name, then still applies). No check that FP32 is below FP16: Pascal GeForce/Tesla cards (GP102,
    GP104: FP16 at 1/64 of the FP32 rate) really are faster in FP32.
    """
    _check.mapping(field, data, source=source)
    _check.no_unknown_keys(field, data, _GPU_FIELDS, source=source)
    name = _check.text(f"{field}.name", _check.required(field, data, "name", source=source), source=source)
    f = field  # index-based path (gpu_types[0].memory_gib): the name may itself be the mistake
    replaces = _check.boolean(f"{f}.replaces_catalog", data.get("replaces_catalog", False), source=source)
    known = catalog_name(name)
    if known is None and replaces:
        raise SpecError(f"{f}.replaces_catalog", True, f"{name!r} is not a catalog GPU, so there is nothing to replace",
                        "remove replaces_catalog (or name the catalog GPU whose figures these replace)", source=source)
    if known is not None and (not replaces or known.lower() != name.strip().lower()):
        fix = (f"name it {known} (the catalog spelling) to replace the catalog's figures" if replaces else
               f"pick another name for your GPU type, or add replaces_catalog: true to replace the catalog's {known} "
               "in this cluster")
        raise SpecError(f"{f}.name", name, f"is already the catalog GPU {known}", fix, source=source)
    half = positive_number(f"{f}.fp16_tflops", _check.required(f, data, "fp16_tflops", source=source), source=source)
    bf16 = data.get("bf16_tflops", half)
    fp32 = positive_number(f"{f}.fp32_tflops", data.get("fp32_tflops", half / 8), source=source)
    if "memory_gib" in data and "memory_gb" in data:
        # refused even when they agree: 80 GiB is 85.9 GB, so two figures that "agree" are a rounding apart
        # and one of them would be silently ignored
        raise SpecError(f"{f}.memory_gb", data["memory_gb"],
                        f"is given together with memory_gib ({data['memory_gib']})",
                        "keep one of them: memory_gib for GiB (2^30 bytes, HBM) or memory_gb for GB (10^9 bytes)",
                        source=source)
    if "memory_gib" in data:
        mem = positive_number(f"{f}.memory_gib", data["memory_gib"], source=source) * u.GiB
    else:
        mem = positive_number(f"{f}.memory_gb", _check.required(
            f, data, "memory_gb", source=source, hint="add memory_gib: (or memory_gb:)"), source=source) * u.GB
    hbm = positive_number(f"{f}.hbm_gbs", _check.required(f, data, "hbm_gbs", source=source), source=source)
    link = data.get("link", "pcie4")
    get_link(link, field=f"{f}.link", source=source)
    return GPUType(name=str(name), fp16_flops_per_s=half * u.TFLOPS,
                   bf16_flops_per_s=None if bf16 is None else positive_number(
                       f"{f}.bf16_tflops", bf16, source=source) * u.TFLOPS,
                   fp32_flops_per_s=fp32 * u.TFLOPS, hbm_bytes=mem, hbm_bw_bytes_per_s=hbm * u.GB_PER_S,
                   default_link=str(link).lower(),
                   num_sms=None if data.get("num_sms") is None else _check.positive_int(
                       f"{f}.num_sms", data["num_sms"], source=source),
                   compute_capability=None if data.get("compute_capability") is None else cuda_compute_capability(
                       f"{f}.compute_capability", data["compute_capability"], source=source),
                   fp8_flops_per_s=None if data.get("fp8_tflops") is None else positive_number(
                       f"{f}.fp8_tflops", data["fp8_tflops"], source=source) * u.TFLOPS,
                   pcie_peer_to_peer=_check.boolean(f"{f}.pcie_p2p", data.get("pcie_p2p", True), source=source),
                   vendor=str(data.get("vendor", "custom")),
                   source=str(data.get("source", "user-defined")), notes=str(data.get("notes", "")))


__all__ = ["GPUType", "LinkType", "LINKS", "PRECISIONS", "builtin_gpu_types", "catalog_name", "cuda_compute_capability",
           "get_gpu_type", "get_link", "gpu_type_from_dict", "register_gpu_type"]
