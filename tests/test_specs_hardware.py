"""The GPU catalog: datasheet figures, aliases, lookups and user-registered types."""

import pytest

from tangram_opt import units as u
from tangram_opt.errors import SpecError
from tangram_opt.specs import GPUType, builtin_gpu_types, get_gpu_type, register_gpu_type
from tangram_opt.specs import hardware
from tangram_opt.specs.hardware import ALIASES, LINKS


def test_every_catalog_entry_is_sourced_and_consistent():
    for name, g in builtin_gpu_types().items():
        assert g.name == name and g.source, name
        assert g.default_link in LINKS
        assert g.bf16_flops_per_s is None or g.bf16_flops_per_s == g.fp16_flops_per_s
        assert g.fp32_flops_per_s < g.fp16_flops_per_s


def test_datasheet_figures():
    assert get_gpu_type("A100-80").bf16_flops_per_s == 312 * u.TFLOPS
    assert get_gpu_type("H100-SXM").bf16_flops_per_s == 989 * u.TFLOPS  # dense, not the 1,979 sparse figure
    assert get_gpu_type("H100-SXM").hbm_bw_bytes_per_s == 3350 * u.GB_PER_S
    assert get_gpu_type("V100-16").bf16_flops_per_s is None
    assert get_gpu_type("H200").hbm_bytes == 141 * u.GB


def test_aliases_resolve_case_insensitively():
    for alias, name in ALIASES.items():
        assert get_gpu_type(alias.upper()).name == name
    assert get_gpu_type(" h100-sxm ").name == "H100-SXM"


def test_unknown_gpu_suggests_close_names():
    with pytest.raises(SpecError, match=r"gpu = 'A100-81': is not a known GPU type.*did you mean A100-80"):
        get_gpu_type("A100-81")


def test_register_gpu_type(monkeypatch):
    monkeypatch.setattr(hardware, "_catalog", dict(hardware._catalog))  # keep the shared catalog unchanged
    g = GPUType(name="TestAccel-1", fp16_flops_per_s=100 * u.TFLOPS, bf16_flops_per_s=None,
                fp32_flops_per_s=10 * u.TFLOPS, hbm_bytes=16 * u.GiB, hbm_bw_bytes_per_s=500 * u.GB_PER_S,
                default_link="pcie4")
    assert register_gpu_type(g) is g and get_gpu_type("testaccel-1") is g
    register_gpu_type(g)  # same figures again is fine
    with pytest.raises(SpecError, match="already a catalog GPU"):
        register_gpu_type(GPUType(name="TestAccel-1", fp16_flops_per_s=1.0, bf16_flops_per_s=None,
                                  fp32_flops_per_s=1.0, hbm_bytes=1.0, hbm_bw_bytes_per_s=1.0, default_link="pcie4"))


def test_fp8_peaks_are_dense_and_only_where_the_tensor_cores_have_fp8():
    fp8 = {n: g.fp8_flops_per_s for n, g in builtin_gpu_types().items() if g.fp8_flops_per_s}
    assert set(fp8) == {"H100-SXM", "H200", "GH200-96", "B200", "GB200", "L4", "RTX-4090", "MI300X"}
    for n, v in fp8.items():  # dense FP8 is twice dense BF16 on every part listed
        assert v == pytest.approx(2 * builtin_gpu_types()[n].bf16_flops_per_s, rel=0.01), n
        assert "FP8" in builtin_gpu_types()[n].source, n
    h100, a100 = get_gpu_type("H100"), get_gpu_type("A100-80")
    assert h100.supports("fp8") and not a100.supports("fp8") and not get_gpu_type("V100").supports("fp8")
    assert h100.peak_flops_per_s("fp8") == h100.bf16_flops_per_s  # MFU is reported against the 16-bit peak
    with pytest.raises(SpecError) as exc:
        a100.peak_flops_per_s("fp8")
    assert "FP8" in str(exc.value) and "bf16" in exc.value.fix
    custom = hardware.gpu_type_from_dict({"name": "X1", "fp16_tflops": 100, "fp8_tflops": 200, "memory_gib": 40,
                                          "hbm_gbs": 1000})
    assert custom.fp8_flops_per_s == 200 * u.TFLOPS and custom.supports("fp8")
