"""Plans read from files and handed to ``show`` / ``simulate``: every field checked (Plan.from_dict),
the CLI's plan file read by Plan.load, a plan refused against specs it was not made for, and output
paths refused before any work."""

from __future__ import annotations

import copy
import json

import matplotlib

matplotlib.use("Agg")

import pytest

import tangram_opt as to
from tangram_opt.cli import main
from tangram_opt.errors import FormatError, SpecError
from tangram_opt.export import PLAN_FILE_SCHEMA, save_plan_file
from tangram_opt.planner import plan as plan_module
from tangram_opt.sim import simulate

TRAINING = to.TrainingSpec(global_batch_size=32, seq_len=2048, precision="fp16")


@pytest.fixture(scope="module")
def specs():
    return to.load_cluster("tiny-mixed"), to.load_model("opt-350m")


@pytest.fixture(scope="module")
def plan(specs):
    cluster, model = specs
    return to.solve(cluster, model, TRAINING, time_limit_s=5)


@pytest.fixture(scope="module")
def envelope(plan, specs, tmp_path_factory):
    """The plan file ``tangram-opt plan --output`` writes, as a dict."""
    path = save_plan_file(tmp_path_factory.mktemp("plan") / "plan.json", plan, cluster=specs[0], model=specs[1],
                          training=TRAINING)
    return json.loads(path.read_text())


def write(tmp_path, envelope, edit=None, name="plan.json"):
    d = copy.deepcopy(envelope)
    if edit is not None:
        edit(d)
    path = tmp_path / name
    path.write_text(json.dumps(d))
    return str(path)


def cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def stage0(d):
    return d["plan"]["pipelines"][0]["stages"][0]


# --- 1. every field of a plan file is checked ----------------------------------------------------------
EDITS = [
    ("tp0", lambda d: stage0(d).update(tp=0), "pipelines[0].stages[0].tp = 0: must be >= 1"),
    ("negative layers", lambda d: stage0(d).update(num_dense_layers=-3), "pipelines[0].stages[0].num_dense_layers"),
    ("no stages", lambda d: d["plan"]["pipelines"][0].update(stages=[]), "pipelines[0].stages = []"),
    ("no pipelines", lambda d: d["plan"].update(pipelines=[]), "pipelines = []"),
    ("plan not an object", lambda d: d.update(plan="x"), "plan = 'str': must be a JSON object"),
    ("first_layer a string", lambda d: stage0(d).update(first_layer="0"), "first_layer = '0': must be an integer"),
    ("island not a string", lambda d: stage0(d).update(island=3), "pipelines[0].stages[0].island = 3"),
    ("has_head not a bool", lambda d: stage0(d).update(has_head=1), "has_head = 1: must be true or false"),
    ("negative bytes", lambda d: stage0(d).update(memory_bytes=-1.0), "memory_bytes = -1.0: must be >= 0"),
    ("zero step time", lambda d: d["plan"].update(step_time_s=0.0), "step_time_s = 0.0: must be > 0"),
    ("bad schedule", lambda d: d["plan"]["pipelines"][0].update(schedule="zb"), "schedule = 'zb'"),
    ("unknown key", lambda d: stage0(d).update(foo=1), "pipelines[0].stages[0].foo = 1: is not a field"),
    ("missing key", lambda d: stage0(d).pop("tp"), "pipelines[0].stages[0].tp = None: is missing"),
    ("gpus not tp x cp x dp", lambda d: stage0(d).update(gpus=stage0(d)["gpus"] + 1), "stages[0].gpus"),
    ("layers not from 0", lambda d: stage0(d).update(first_layer=1), "stages[0].first_layer = 1: must be 0"),
    ("batch not covered", lambda d: d["plan"]["pipelines"][0].update(num_micro_batches=999), "global_batch_size"),
]


@pytest.mark.parametrize("edit,expect", [e[1:] for e in EDITS], ids=[e[0] for e in EDITS])
def test_edited_plan_file_is_refused_naming_the_field_and_the_file(tmp_path, capsys, envelope, edit, expect):
    path = write(tmp_path, envelope, edit)
    for verb in (["show"], ["show", "--format", "megatron"], ["simulate"]):
        code, out, err = cli(capsys, *verb, path)
        assert code == 2 and out == "", (verb, err)
        assert expect in err and path in err and "internal error" not in err, (verb, err)
    with pytest.raises(SpecError, match=expect.replace("[", r"\[").replace("(", r"\(")):
        to.Plan.load(path)


def test_a_plan_round_trips_and_from_dict_refuses_a_non_object(plan):
    assert to.Plan.from_dict(json.loads(plan.to_json())) == plan
    with pytest.raises(FormatError, match="plan = 'list': must be a JSON object"):
        to.Plan.from_dict([])


def test_plan_load_refuses_a_binary_file_naming_it(tmp_path):
    path = tmp_path / "bin.json"
    path.write_bytes(b"\xff\xfe binary")
    with pytest.raises(FormatError, match="bin.json.*not a text"):
        to.Plan.load(path)


# --- 2. Plan.load reads the CLI's plan file ------------------------------------------------------------
def test_plan_load_reads_the_cli_plan_file(tmp_path, plan, envelope):
    loaded = to.Plan.load(write(tmp_path, envelope))
    assert loaded == to.Plan.from_dict(envelope["plan"])  # (the file writes non-finite numbers as null)
    assert loaded.pipelines == plan.pipelines and loaded.step_time_s == plan.step_time_s
    assert plan_module.PLAN_FILE_SCHEMA == PLAN_FILE_SCHEMA  # the envelope is a layer above; one name
    with pytest.raises(FormatError, match="schema = 'tangram_opt.plan/9'"):
        to.Plan.load(write(tmp_path, envelope, lambda d: d.update(schema="tangram_opt.plan/9")))


# --- 3. a plan against specs it was not made for -------------------------------------------------------
def test_simulate_refuses_a_plan_file_whose_model_was_edited(tmp_path, capsys, envelope):
    path = write(tmp_path, envelope, lambda d: d["model"].update(num_layers=12))
    code, out, err = cli(capsys, "simulate", path)
    assert code == 2 and "agrees" not in out
    assert "layers: pipeline 0 holds 24 layers" in err and "has 12" in err


@pytest.mark.parametrize("verb", ["simulate", "show"])
def test_cluster_and_model_flags_are_used_and_checked_against_the_plan(tmp_path, capsys, envelope, verb):
    path = write(tmp_path, envelope)
    code, _, err = cli(capsys, verb, path, "--model", "llama-3-8b")
    assert code == 2 and "model: the plan is for 'opt-350m'" in err and "drop --model" in err
    code, _, err = cli(capsys, verb, path, "--cluster", "h100-64")
    assert code == 2 and "island 'a100': not an island of cluster 'h100-64'" in err
    assert cli(capsys, verb, path, "--model", "opt-350m", "--cluster", "tiny-mixed")[0] == 0


def test_simulate_refuses_a_training_run_the_plan_was_not_made_for(tmp_path, capsys, envelope):
    path = write(tmp_path, envelope, lambda d: d["training"].update(global_batch_size=64))
    code, _, err = cli(capsys, "simulate", path)
    assert code == 2 and "global_batch_size: the plan has 32, the training run 64" in err


# --- 4. simulate() takes the input forms solve takes ---------------------------------------------------
def test_simulate_takes_names_dicts_and_the_plans_own_run(plan, specs):
    cluster, model = specs
    want = simulate(plan, cluster, model, TRAINING).step_time_s
    assert simulate(plan, "tiny-mixed", "opt-350m", TRAINING).step_time_s == want
    assert simulate(plan, cluster, model, TRAINING.to_dict()).step_time_s == want
    assert simulate(plan, cluster, model, None).step_time_s == want


@pytest.mark.parametrize("args,field", [
    (("tiny-mixed", "llama-3-8b", TRAINING), "model: the plan is for 'opt-350m'"),
    (("tiny-mixed", "opt-350m", {"global_batch_size": 32, "seq_len": 1024, "precision": "fp16"}), "seq_len"),
    (("tiny-mixed", "opt-350m", {"global_batch_size": 32, "seq_len": 2048}), "precision"),
    (("h100-64", "opt-350m", TRAINING), "island 'a100'"),
    ((5, "opt-350m", TRAINING), "cluster = 5"),
    (("tiny-mixed", "opt-350m", 5), "training = 5"),
])
def test_simulate_refuses_specs_the_plan_was_not_made_for(plan, args, field):
    with pytest.raises(SpecError, match=field.replace("(", r"\(")):
        simulate(plan, *args)


def test_simulate_refuses_what_is_not_a_plan():
    with pytest.raises(SpecError, match="plan = 'dict': is not a Plan"):
        simulate({}, "tiny-mixed", "opt-350m", TRAINING)


# --- 5. output paths are checked before the work -------------------------------------------------------
@pytest.mark.parametrize("argv,flag", [
    (["simulate", "{plan}", "--trace", "/proc/x.csv"], "--trace"),
    (["simulate", "{plan}", "--trace", "{dir}"], "--trace"),
    (["simulate", "{plan}", "--picture", "{dir}/t.jpg"], "--picture"),
    (["show", "{plan}", "--islands-picture", "{dir}/i.gif"], "--islands-picture"),
    (["show", "{plan}", "--memory-picture", "/proc/m.png"], "--memory-picture"),
])
def test_output_paths_are_refused_before_the_work(tmp_path, capsys, envelope, argv, flag):
    path = write(tmp_path, envelope)
    code, out, err = cli(capsys, *(a.format(plan=path, dir=tmp_path) for a in argv))
    assert code == 2 and out == "" and f"error: {flag} = " in err


def test_trace_and_pictures_are_written_into_new_directories(tmp_path, capsys, envelope):
    path = write(tmp_path, envelope)
    code, _, err = cli(capsys, "simulate", path, "--trace", str(tmp_path / "a" / "trace.csv"),
                       "--picture", str(tmp_path / "b" / "t.svg"))
    assert code == 0, err
    assert (tmp_path / "a" / "trace.csv").stat().st_size > 0 and (tmp_path / "b" / "t.svg").is_file()
