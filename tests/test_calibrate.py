"""tangram-opt calibrate: fitting a calibration to measured steps, its file, its errors."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest

from tangram_opt.calibrate import fit_measurements, load_measurements, measurements_from_dict, predict_step_s, scaled
from tangram_opt.cost import DEFAULT_CALIBRATION, load_calibration
from tangram_opt.errors import FormatError

ROW = dict(name="a", gpu="A100-80", nodes=1, gpus_per_node=4, model="opt-350m", seq_len=1024, global_batch_size=32,
           precision="bf16", tp=1, zero=1, recompute="none", micro_batch_size=2, step_time_s=1.0)


def _runs():
    rows = [ROW, {**ROW, "name": "b", "tp": 2, "zero": 0, "recompute": "selective", "micro_batch_size": 4},
            {**ROW, "name": "h", "gpu": "H100", "gpus_per_node": 2, "pp": 2, "micro_batch_size": 1}]
    return measurements_from_dict({"runs": rows})


def test_fit_recovers_the_factor_that_made_the_measurements():
    truth = scaled(scaled(DEFAULT_CALIBRATION, "A100-80", 0.6), "H100-SXM", 0.8)
    runs = [dataclasses.replace(r, step_time_s=predict_step_s(r, truth)) for r in _runs()]
    fit = fit_measurements(runs)
    assert fit.scales["A100-80"] == pytest.approx(0.6, abs=0.01)
    assert fit.scales["H100-SXM"] == pytest.approx(0.8, abs=0.01)
    assert all(abs(r.after_error) < 0.01 for r in fit.runs)
    assert all(r.before_error < -0.1 for r in fit.runs)  # the shipped table is faster than this "machine"
    assert fit.median_abs_error("after") < 0.01 < fit.median_abs_error("before")
    cal = fit.calibration
    assert cal.matmul("A100-80") == pytest.approx(0.6 * DEFAULT_CALIBRATION.matmul("A100-80"), rel=0.02)
    assert cal.attention_bwd("H100-SXM") == pytest.approx(0.8 * DEFAULT_CALIBRATION.attention_bwd("H100-SXM"),
                                                          rel=0.02)
    assert cal.matmul("V100-16") == DEFAULT_CALIBRATION.matmul("V100-16")  # not measured: untouched


def test_faster_than_peak_is_capped_and_reported():
    run = _runs()[0]
    fast = dataclasses.replace(run, step_time_s=predict_step_s(run, DEFAULT_CALIBRATION) * 0.3)
    fit = fit_measurements([fast])
    assert fit.calibration.matmul("A100-80") <= 1.0
    assert any("faster than the datasheet" in w for w in fit.warnings)


def test_csv_measurements_read_like_yaml(tmp_path):
    import pandas as pd

    path = tmp_path / "m.csv"
    pd.DataFrame([ROW, {**ROW, "name": "c", "step_time_s": None, "tokens_per_s": 50000.0}]).to_csv(path, index=False)
    runs = load_measurements(path)
    assert [r.name for r in runs] == ["a", "c"] and runs[0].tp == 1 and runs[0].dp == 4
    assert runs[1].step_time_s == pytest.approx(32 * 1024 / 50000.0)


@pytest.mark.parametrize("change, field", [
    ({"gpu": "A100-81"}, "runs[0].gpu"),
    ({"tp": 3}, "runs[0].tp"),
    ({"step_time_s": -1.0}, "runs[0].step_time_s"),
    ({"tokens_per_s": 5.0}, "runs[0].step_time_s"),  # two measurements
    ({"zero": 4}, "runs[0].zero"),
    ({"global_batch_size": 30}, "runs[0].global_batch_size"),
    ({"speed": 1}, "runs[0].speed"),
    ({"model": "no-such-model"}, "runs[0].model"),
])
def test_bad_runs_name_the_field(change, field):
    with pytest.raises(FormatError) as exc:
        measurements_from_dict({"runs": [{**ROW, **change}]}, source="m.yaml")
    assert exc.value.field.startswith(field), exc.value.field


def test_cli_calibrate_writes_a_file_plan_reads(tmp_path):
    truth = scaled(DEFAULT_CALIBRATION, "A100-80", 0.5)
    run = measurements_from_dict({"runs": [ROW]})[0]
    step = predict_step_s(run, truth)
    meas = tmp_path / "m.yaml"
    meas.write_text("runs:\n  - " + str({**ROW, "step_time_s": step}).replace("'", "") + "\n")
    out = tmp_path / "cal.yaml"
    env = {k: v for k, v in os.environ.items() if k != "TANGRAM_DEBUG"}
    res = subprocess.run([sys.executable, "-m", "tangram_opt", "calibrate", str(meas), "--output", str(out)],
                         capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "A100-80: compute efficiencies x 0.50" in res.stderr and "0.0% after" in res.stderr
    cal = load_calibration(out)
    assert cal.matmul("A100-80") == pytest.approx(0.5 * DEFAULT_CALIBRATION.matmul("A100-80"), rel=0.01)
    bad = subprocess.run([sys.executable, "-m", "tangram_opt", "calibrate", str(tmp_path / "missing.yaml"),
                          "--output", str(out)], capture_output=True, text=True, env=env, timeout=60)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


def test_a_calibration_pickles_to_an_equal_one():
    # the search's worker processes receive the cost model with its calibration (planner/search/tables.py)
    import pickle

    from tangram_opt.cost.calibration import Calibration

    cal = Calibration(matmul_efficiency={"*": 0.7, "A100-80": 0.8}, overlap_grad_reduce=False)
    for c in (DEFAULT_CALIBRATION, cal):
        back = pickle.loads(pickle.dumps(c))
        assert back == c and hash(back) == hash(c) and dict(back.matmul_efficiency) == dict(c.matmul_efficiency)
