"""tangram-opt calibrate: bad measurement files and base calibrations are refused, naming the file and field."""

from __future__ import annotations

import dataclasses

import pytest

from tangram_opt import cli
from tangram_opt import units as u
from tangram_opt.calibrate import (check_memory_reserve, fit_measurements, load_base_calibration, load_measurements,
                                   measurements_from_dict)
from tangram_opt.cost import DEFAULT_CALIBRATION
from tangram_opt.errors import FormatError, SpecError

ROW = dict(name="a", gpu="A100-80", nodes=1, gpus_per_node=4, model="opt-350m", seq_len=1024, global_batch_size=32,
           precision="bf16", tp=1, zero=1, recompute="none", micro_batch_size=2, step_time_s=1.0)
YAML_RUN = ("format: tangram_opt.measurements\nversion: 1\nruns:\n  - {name: r, gpu: A100-40, nodes: 1, "
            "gpus_per_node: 4, model: opt-350m, seq_len: 256, global_batch_size: 8, precision: bf16, tp: 1, zero: 1, "
            "recompute: none, micro_batch_size: 1, STEP}\n")


@pytest.mark.parametrize("text, problem", [
    ("", "empty CSV"),
    ("\n\n", "empty CSV"),
    ('a,b\n"x\n', "not valid CSV at line 2"),
    ("a,b\n1,2\n3,4,5\n", "not valid CSV at line 3"),
])
def test_unreadable_csv_is_a_format_error_naming_the_file(tmp_path, text, problem):
    path = tmp_path / "m.csv"
    path.write_text(text)
    with pytest.raises(FormatError) as err:
        load_measurements(path)
    assert err.value.field == "measurements" and err.value.value == str(path)
    assert problem in err.value.problem


def test_cli_calibrate_on_a_bad_csv_is_an_error_not_a_crash(tmp_path, capsys):
    path = tmp_path / "m.csv"
    path.write_text('a,b\n"x\n')
    assert cli.main(["calibrate", str(path), "--output", str(tmp_path / "c.yaml")]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and "internal error" not in err


def test_expert_parallelism_on_a_dense_model_is_refused():
    with pytest.raises(FormatError) as err:
        measurements_from_dict({"runs": [{**ROW, "ep": 2}]}, source="m.yaml")
    assert err.value.field == "runs[0].ep" and "dense" in err.value.problem
    assert measurements_from_dict({"runs": [{**ROW, "ep": 1}]})[0].ep == 1


@pytest.mark.parametrize("step, fix", [
    ("step_time_s: 1e-9", "write 1.0e-9"),  # PyYAML reads 1e-9 as a string
    ("tokens_per_s: 2e4", "write 2.0e+4"),
    ("step_time_s: '0.05'", "without quotes"),
])
def test_a_number_written_as_text_gets_a_fix_saying_how(tmp_path, step, fix):
    path = tmp_path / "m.yaml"
    path.write_text(YAML_RUN.replace("STEP", step))
    with pytest.raises(FormatError) as err:
        load_measurements(path)
    assert err.value.field == f"runs[0].{step.split(':')[0]}" and fix in err.value.fix
    assert ("exponent" in err.value.fix) == ("e" in step.split(":")[1])


def test_text_that_is_no_number_keeps_the_plain_message():
    with pytest.raises(FormatError) as err:
        measurements_from_dict({"runs": [{**ROW, "step_time_s": "abc"}]})
    assert err.value.field == "runs[0].step_time_s" and "YAML" not in err.value.fix


def test_memory_reserve_at_least_the_gpu_memory_is_refused():
    big = dataclasses.replace(DEFAULT_CALIBRATION, memory_reserve_bytes=100 * u.GiB)
    with pytest.raises(SpecError) as err:
        check_memory_reserve(big, ["A100-80"], source="cal.yaml")
    assert err.value.field == "calibration.memory_reserve_gib" and err.value.value == 100
    assert "A100-80" in err.value.problem
    runs = measurements_from_dict({"runs": [ROW]})
    with pytest.raises(SpecError):  # before any run is planned
        fit_measurements(runs, big)
    # the fraction counts too: 80 GiB x (1 - 0.5) = 40 GiB
    check_memory_reserve(dataclasses.replace(DEFAULT_CALIBRATION, memory_reserve_bytes=39 * u.GiB,
                                             memory_reserve_fraction=0.5), ["A100-80"])
    with pytest.raises(SpecError):
        check_memory_reserve(dataclasses.replace(DEFAULT_CALIBRATION, memory_reserve_bytes=40 * u.GiB,
                                                 memory_reserve_fraction=0.5), ["A100-80"])


def test_cli_base_with_a_huge_reserve_names_the_field(tmp_path, capsys):
    meas = tmp_path / "m.yaml"
    meas.write_text(YAML_RUN.replace("STEP", "step_time_s: 0.05"))
    base = tmp_path / "base.yaml"
    base.write_text("format: tangram_opt.calibration\nversion: 1\nmemory_reserve_gib: 100\n")
    assert cli.main(["calibrate", str(meas), "--base", str(base), "--output", str(tmp_path / "c.yaml")]) == 2
    err = capsys.readouterr().err
    assert "memory_reserve_gib" in err and str(base) in err
    assert not (tmp_path / "c.yaml").exists()


@pytest.mark.parametrize("text", ["{}\n", "format: tangram_opt.calibration\nversion: 1\n"])
def test_empty_base_calibration_is_refused(tmp_path, text):
    base = tmp_path / "base.yaml"
    base.write_text(text)
    with pytest.raises(FormatError) as err:
        load_base_calibration(base)
    assert err.value.field == "calibration" and "empty" in err.value.problem


def test_base_calibration_with_a_field_is_read(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text("memory_reserve_gib: 2.0\n")
    assert load_base_calibration(base).memory_reserve_bytes == 2 * u.GiB
