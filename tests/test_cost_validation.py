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


def test_published_runs_load_and_cover_three_generations_dense_and_moe():
    sys.path.insert(0, str(ROOT))
    from benchmarks.validation.published import load_runs

    runs = load_runs()
    assert len(runs) >= 20 and len({r.id for r in runs}) == len(runs)
    assert {r.generation for r in runs} >= {"A100", "H100", "Blackwell"}
    assert any(r.model.moe for r in runs) and any(not r.model.moe for r in runs)
    assert all(r.source["url"].startswith("https://") for r in runs)
    assert all((r.tokens_per_s_per_gpu or 0) > 0 or 0 < (r.mfu or 0) < 1 for r in runs)


def test_published_runs_are_predicted_within_the_targets(bench):
    """The default calibration against every published run (regression guard of
    docs/results/cost_model_validation.md: median |error| <= 10% overall, <= 15% per generation)."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.validation.published import load_runs, predict, summarize

    preds = [predict(r, time_limit_s=5.0) for r in load_runs()]
    assert all(p.error is not None for p in preds), [p.note for p in preds if p.error is None]
    stats = summarize(preds)
    assert stats["all"]["median_abs"] <= 0.10, stats
    assert all(st["median_abs"] <= 0.15 for st in stats.values()), stats
    megatron = [p for p in preds if p.run.id.startswith("megatron")]
    assert len(megatron) == 4 and all(abs(p.error) < 0.15 for p in megatron)


def test_benchmark_prints_tables(bench, capsys):
    assert bench.main(["--no-fit"]) == 0
    out = capsys.readouterr().out
    assert "median |err|" in out and "published end-to-end runs" in out and "GH200-96" in out
