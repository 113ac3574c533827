"""The validation benchmark runs, covers every measured profile, and reproduces Megatron-LM's MFU."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bench():
    path = ROOT / "benchmarks" / "validate_cost_model.py"
    spec = importlib.util.spec_from_file_location("validate_cost_model", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["validate_cost_model"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_every_sailor_block_measurement_is_compared(bench):
    rows, excluded = bench.collect_rows()
    blocks = [r for r in rows if r.kind == "block"]
    assert len(blocks) == 210
    assert {r.gpu for r in blocks} == {"A100-40", "A100-80", "GH200-96", "V100-16", "RTX-2080", "RTX-3090",
                                       "Titan-RTX"}
    assert len(excluded) == 1 and "GPT-Neo-2.7/GH-96" in excluded[0]
    pred = bench.Predictor()
    cal = bench.Calibration(network_efficiency=1.0)
    errs = [abs(sum(pred.predict(r, cal)) / r.measured_s - 1) for r in blocks if r.gpu == "V100-16"]
    assert sorted(errs)[len(errs) // 2] < 0.15


def test_megatron_mfu_is_reproduced_within_15_percent(bench):
    for run, step, mfu in bench.megatron_mfu():
        assert step > 0
        assert abs(mfu / run.published_mfu - 1) < 0.15, (run.name, mfu)


def test_benchmark_prints_tables(bench, capsys):
    assert bench.main(["--no-fit"]) == 0
    out = capsys.readouterr().out
    assert "median |err|" in out and "MFU published" in out and "GH200-96" in out
