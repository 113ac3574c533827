"""Named unit constants.

Inside tangram_opt every quantity is in base SI-like units: bytes, seconds, FLOP, FLOP/s and
bytes/s. Names of quantities carry their unit (``hbm_bytes``, ``step_time_s``,
``nic_bw_bytes_per_s``). Conversions happen once, at the input and output boundary, with the
constants below; never write a bare ``1e9`` or ``2**30`` elsewhere.

Datasheets mix decimal and binary prefixes: GPU memory is sold in GB but allocators report GiB;
link speeds are quoted in Gb/s (bits) for NICs and GB/s (bytes) for NVLink. The constants make
the choice explicit at every call site.
"""

from __future__ import annotations

# --- bytes -------------------------------------------------------------------------------
KB = 10**3
MB = 10**6
GB = 10**9
TB = 10**12
KiB = 2**10
MiB = 2**20
GiB = 2**30
TiB = 2**40

# --- bandwidth ---------------------------------------------------------------------------
BITS_PER_BYTE = 8
GB_PER_S = GB  # bytes/s in one GB/s (NVLink, HBM and PCIe figures)
TB_PER_S = TB
GBIT_PER_S = 10**9 / BITS_PER_BYTE  # bytes/s in one Gb/s (NIC figures)

# --- compute -----------------------------------------------------------------------------
GFLOP = 10**9
TFLOP = 10**12
PFLOP = 10**15
TFLOPS = TFLOP  # FLOP/s in one TFLOP/s
PFLOPS = PFLOP

# --- time --------------------------------------------------------------------------------
US = 1e-6  # seconds in one microsecond
MS = 1e-3  # seconds in one millisecond
MINUTE = 60.0
HOUR = 3600.0


def fmt_bytes(n_bytes: float) -> str:
    """Human-readable binary size, e.g. ``fmt_bytes(3 * GiB) == '3.00 GiB'``."""
    for unit, scale in (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if abs(n_bytes) >= scale:
            return f"{n_bytes / scale:.2f} {unit}"
    return f"{n_bytes:.0f} B"


def fmt_seconds(t_s: float) -> str:
    """Human-readable duration with a unit that keeps 3 significant digits."""
    if abs(t_s) >= 1.0:
        return f"{t_s:.3f} s"
    if abs(t_s) >= MS:
        return f"{t_s / MS:.2f} ms"
    return f"{t_s / US:.1f} us"
