"""solve's measured inputs (profiles, calibration files) and its numeric options.

A profile or calibration changes the prices the search optimizes and the simulator replays with; a
profile of another run is refused, and a knob no search can honour is an error naming it.
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from tangram_opt.cost import (DEFAULT_CALIBRATION, CostModel, LayerProfile, ProfileEntry, StageConfig, model_shape,
                              save_calibration, save_profile)
from tangram_opt.errors import SpecError
from tangram_opt.planner.islands import find_islands
from tangram_opt.planner.search import SearchOptions, solve
from tangram_opt.sim import simulate
from tangram_opt.specs import TrainingSpec, load_cluster, load_model, make_cluster

MODEL = "opt-350m"
SINGLE = SearchOptions(multi_pipeline=False)
TRAINING = TrainingSpec(global_batch_size=8, seq_len=1024, precision="fp16")


def _cluster():
    return make_cluster("two-a100", [{"name": "a100", "gpu": "A100-80", "nodes": 1, "gpus_per_node": 4,
                                                 "nic_gbps": 400}])


def _slow_profile(factor: float) -> LayerProfile:
    """A measured profile of the A100-80 whose dense blocks take ``factor`` times the computed time."""
    model, cluster = load_model(MODEL), _cluster()
    cost = CostModel(model, TRAINING)
    node = find_islands(cluster)[0].node
    entries = []
    for tp in (1, 2, 4):
        for mb in (1, 2, 4, 8):
            c = cost.layer(node, StageConfig(tp=tp, micro_batch_size=mb), "dense")
            entries.append(ProfileEntry(kind="dense", tp=tp, micro_batch_size=mb,
                                        fwd_time_s=factor * c.breakdown["compute_fwd"],
                                        bwd_time_s=factor * c.breakdown["compute_bwd"]))
    return LayerProfile(model="another name", gpu="A100-80", seq_len=TRAINING.seq_len, precision="fp16",
                        entries=tuple(entries), includes_tp_comm=False, model_shape=model_shape(model))


def test_profiles_from_a_directory_price_the_plan_and_the_replay(tmp_path):
    save_profile(_slow_profile(3.0), tmp_path / "a100-80.json")
    base = solve(_cluster(), MODEL, TRAINING, time_limit_s=20, options=SINGLE)
    measured = solve(_cluster(), MODEL, TRAINING, time_limit_s=20, options=SINGLE, profiles=tmp_path)
    assert measured.step_time_s > 1.5 * base.step_time_s
    model = load_model(MODEL)
    replay = simulate(measured, _cluster(), model, TRAINING, profiles=_slow_profile(3.0))
    assert replay.step_time_s == pytest.approx(measured.step_time_s, rel=0.02)
    # the same plan replayed without the profile is much faster: the profile was really used
    assert simulate(measured, _cluster(), model, TRAINING).step_time_s < 0.7 * measured.step_time_s


def test_profiles_of_another_run_are_refused_before_the_search(tmp_path):
    save_profile(_slow_profile(1.0), tmp_path / "p.json")
    with pytest.raises(SpecError) as exc:
        solve(_cluster(), MODEL, TrainingSpec(global_batch_size=8, seq_len=2048, precision="fp16"),
              time_limit_s=5, profiles=tmp_path / "p.json")
    assert exc.value.field == "profile.seq_len"
    with pytest.raises(SpecError) as exc:
        solve(_cluster(), "llama-2-7b", TRAINING, time_limit_s=5, profiles=tmp_path)
    assert exc.value.field.startswith("profile.model_shape.")
    with pytest.raises(SpecError) as exc:
        solve(_cluster(), MODEL, TRAINING, time_limit_s=5, profiles=[{"not": "a profile"}])
    assert exc.value.field == "profiles"


def test_calibration_file_path_is_read(tmp_path):
    slow = DEFAULT_CALIBRATION.with_gpu("A100-80", matmul_efficiency=0.3, attention_efficiency=0.2,
                                        attention_bwd_efficiency=0.15)
    path = tmp_path / "cal.yaml"
    save_calibration(slow, path)
    base = solve(_cluster(), MODEL, TRAINING, time_limit_s=20, options=SINGLE)
    cal = solve(_cluster(), MODEL, TRAINING, time_limit_s=20, options=SINGLE, calibration=str(path))
    assert cal.step_time_s > 1.3 * base.step_time_s
    with pytest.raises(SpecError) as exc:
        solve(_cluster(), MODEL, TRAINING, time_limit_s=5, calibration=3)
    assert exc.value.field == "calibration"


@pytest.mark.parametrize("kw, field", [
    ({"time_limit_s": -5}, "time_limit_s"), ({"time_limit_s": math.nan}, "time_limit_s"),
    ({"time_limit_s": math.inf}, "time_limit_s"),
    ({"time_limit_s": "60"}, "time_limit_s"), ({"threads": 0}, "threads"), ({"threads": 1.5}, "threads"),
    ({"seed": -1}, "seed"), ({"rel_gap": math.nan}, "rel_gap"), ({"rel_gap": -0.1}, "rel_gap"),
    ({"moe_load_imbalance": math.nan}, "moe_load_imbalance"), ({"moe_load_imbalance": 0.5}, "moe_load_imbalance"),
])
def test_numeric_options_no_search_can_honour_are_errors(kw, field):
    with pytest.raises(SpecError) as exc:
        solve(load_cluster("tiny-mixed"), MODEL, TRAINING, **kw)
    assert exc.value.field == field


def test_profile_file_written_by_save_profile_records_the_shape(tmp_path):
    save_profile(_slow_profile(1.0), tmp_path / "p.json")
    data = json.loads((tmp_path / "p.json").read_text())
    assert data["model_shape"]["hidden_size"] == load_model(MODEL).hidden_size


def _run_cli(*args: str):
    import os
    import subprocess
    import sys

    env = dict(os.environ)
    env.pop("TANGRAM_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "tangram_opt", *args], capture_output=True, text=True, env=env,
                          timeout=120)


@pytest.fixture()
def cluster_file(tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_text("name: two-a100\nnode_groups:\n  - {name: a100, gpu: A100-80, nodes: 1, gpus_per_node: 4, "
                    "nic_gbps: 400}\n")
    return path


def test_cli_plan_with_measured_inputs_and_simulate_replays_with_them(tmp_path, cluster_file):
    prof_dir = tmp_path / "profiles"
    prof_dir.mkdir()
    save_profile(_slow_profile(3.0), prof_dir / "a100-80.json")
    other = _slow_profile(1.0)
    save_profile(LayerProfile(model=other.model, gpu="H100", seq_len=other.seq_len, precision=other.precision,
                              entries=other.entries, model_shape=other.model_shape), prof_dir / "h100.json")
    cal = tmp_path / "cal.yaml"
    save_calibration(DEFAULT_CALIBRATION.with_gpu("A100-80", matmul_efficiency=0.5), cal)
    out = tmp_path / "plan.json"
    res = _run_cli("plan", "--cluster", str(cluster_file), "--model", MODEL, "--batch", "8", "--seq", "1024",
                   "--precision", "fp16", "--time-limit", "10", "--quiet", "--profiles", str(prof_dir),
                   "--calibration", str(cal), "--output", str(out))
    assert res.returncode == 0, res.stderr
    assert "measured profiles for A100-80" in res.stderr
    assert "profiles not used (no such GPU in two-a100): H100-SXM" in res.stderr
    data = json.loads(out.read_text())
    assert data["profiles"][0]["gpu"] == "A100-80" and data["calibration"]["gpus"]["A100-80"]["matmul_efficiency"] == 0.5
    sim = _run_cli("simulate", str(out))
    assert sim.returncode == 0, sim.stderr
    assert "+0.00%" in sim.stdout or "-0.00%" in sim.stdout, sim.stdout  # replayed with the same prices
    bad = _run_cli("plan", "--cluster", str(cluster_file), "--model", MODEL, "--batch", "8", "--seq", "2048",
                   "--precision", "fp16", "--time-limit", "5", "--quiet", "--profiles", str(prof_dir))
    assert bad.returncode != 0 and "profile.seq_len" in bad.stderr and "Traceback" not in bad.stderr


def test_fp8_plans_on_hopper_and_is_refused_where_a_gpu_has_no_fp8():
    fp8 = TrainingSpec(global_batch_size=16, seq_len=2048, precision="fp8")
    bf16 = TrainingSpec(global_batch_size=16, seq_len=2048, precision="bf16")
    cluster = make_cluster("h", [{"name": "h100", "gpu": "H100", "nodes": 1, "gpus_per_node": 8, "nic_gbps": 3200}])
    a = solve(cluster, "llama-2-7b", fp8, time_limit_s=20, options=SINGLE)
    b = solve(cluster, "llama-2-7b", bf16, time_limit_s=20, options=SINGLE)
    assert a.precision == "fp8" and a.step_time_s < b.step_time_s
    with pytest.raises(SpecError) as exc:
        solve(load_cluster("tiny-mixed"), "llama-2-7b", fp8, time_limit_s=5)
    assert exc.value.field == "training.precision"


def test_a_sequence_longer_than_a_learned_position_table_is_refused():
    # OPT has learned positions (2,048 + 2 rows): no framework trains it at 4,096 tokens
    with pytest.raises(SpecError) as err:
        solve(_cluster(), MODEL, TrainingSpec(global_batch_size=8, seq_len=4096, precision="fp16"), time_limit_s=1)
    assert err.value.field == "training.seq_len" and "max_position_embeddings" in str(err.value)


@pytest.mark.parametrize("model, loads, problem", [
    (MODEL, [[1, 2, 3]], "has no MoE layers"),
    ("mixtral-8x7b", [[1, 2, 3]], "has 3 loads per layer but mixtral-8x7b has 8 experts"),
])
def test_expert_loads_that_are_not_the_models_are_refused(model, loads, problem):
    with pytest.raises(SpecError) as err:
        solve(_cluster(), model, TRAINING, expert_loads=loads, time_limit_s=1)
    assert err.value.field == "expert_loads" and problem in str(err.value)


def test_a_calibration_that_reserves_all_memory_or_sets_nothing_is_refused(tmp_path):
    # the cost model plans with HBM x (1 - fraction) - reserve per GPU: 100 GiB of an A100-80 leaves nothing
    greedy = dataclasses.replace(DEFAULT_CALIBRATION, memory_reserve_bytes=100 * 2 ** 30)
    with pytest.raises(SpecError) as err:
        solve(_cluster(), MODEL, TRAINING, calibration=greedy, time_limit_s=1)
    assert err.value.field == "calibration.memory_reserve_gib" and "A100-80" in str(err.value)
    empty = tmp_path / "empty.yaml"
    empty.write_text("{}\n", encoding="utf-8")
    with pytest.raises(SpecError, match="sets no field"):
        solve(_cluster(), MODEL, TRAINING, calibration=empty, time_limit_s=1)
