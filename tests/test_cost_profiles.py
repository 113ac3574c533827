"""Measured profiles: the shipped Sailor data, our file format, and profiles replacing computed compute time."""

from __future__ import annotations

import json

import pytest

from tangram_opt import units as u
from tangram_opt.cost import CostModel, LayerProfile, ProfileEntry, StageConfig, load_profile, save_profile
from tangram_opt.cost.flops import layer_params
from tangram_opt.cost.profiles import (SAILOR_DIR, SAILOR_MODELS, infer_sailor_precision, load_sailor_profile,
                                       read_sailor_raw, sailor_files, sailor_link_bandwidths, sailor_profiles)
from tangram_opt.errors import FormatError, SpecError
from tangram_opt.specs import NodeSpec, TrainingSpec, get_gpu_type


def test_sailor_data_ships_with_its_mit_license():
    text = (SAILOR_DIR / "LICENSE").read_text()
    assert "MIT License" in text and "ETH Zurich" in text
    assert (SAILOR_DIR / "README.md").is_file()
    files = sailor_files()
    assert len(files) == 17
    assert {g for _, g, _ in files} == {"A100-40", "A100-80", "GH-96", "V100-16", "RTX-2080", "RTX-3090", "Titan-RTX"}
    for _, g, _ in files:
        get_gpu_type(g)  # every Sailor GPU name resolves to a catalog type


@pytest.mark.parametrize("model", sorted(SAILOR_MODELS))
def test_sailor_model_specs_reproduce_llm_info_parameter_counts(model):
    info = json.loads((SAILOR_DIR / "llm_info.json").read_text())[model]["1"]
    spec = SAILOR_MODELS[model].spec
    assert info["1"]["params_floats"] == spec.layer_params("dense") == layer_params(spec, "dense").total
    assert info["0"]["params_floats"] == spec.embedding_params
    if SAILOR_MODELS[model].head_has_lm_head and model != "LLAMA-3-8":
        assert info[str(spec.num_layers + 1)]["params_floats"] == spec.head_params
    if model == "LLAMA-3-8":
        # sequence length 8192: one block's output is 8192 x 4096 floats per sequence
        assert info["1"]["act_output_floats"] == 8192 * 4096 == SAILOR_MODELS[model].seq_len * spec.hidden_size


def test_precision_is_inferred_from_throughput():
    path = SAILOR_DIR / "OPT-30" / "A100-40" / "profile.json"
    assert infer_sailor_precision(read_sailor_raw(path), "OPT-30", "A100-40")[0] == "fp32"
    path = SAILOR_DIR / "GPT-Neo-2.7" / "A100-40" / "profile.json"
    prec, best = infer_sailor_precision(read_sailor_raw(path), "GPT-Neo-2.7", "A100-40")
    assert prec == "tf32" and best > 19.5 * u.TFLOPS
    path = SAILOR_DIR / "OPT-350" / "V100-16" / "profile.json"
    assert infer_sailor_precision(read_sailor_raw(path), "OPT-350", "V100-16")[0] == "fp32"


def test_mislabelled_sailor_file_is_rejected():
    sets, skipped = sailor_profiles("GPT-Neo-2.7")
    assert "GH-96" in skipped and "24 blocks" in skipped["GH-96"]
    assert {p.gpu for p in sets} == {"A100-40", "A100-80", "V100-16"}
    with pytest.raises(SpecError):
        load_sailor_profile(SAILOR_DIR / "GPT-Neo-2.7" / "GH-96" / "profile.json", model="GPT-Neo-2.7")


def test_sailor_conversion_takes_block_median_and_sums_the_tail():
    path = SAILOR_DIR / "LLAMA-3-8" / "GH-96" / "profile.json"
    p = load_sailor_profile(path, model="LLAMA-3-8", precision="tf32")
    raw = read_sailor_raw(path)[1][1]
    assert p.lookup("dense", 1, 1) == (raw[2][0], raw[2][1])
    assert p.lookup("head", 1, 1) == pytest.approx((raw[33][0] + raw[34][0], raw[33][1] + raw[34][1]))
    assert p.lookup("embedding", 1, 1) == (raw[0][0], raw[0][1])
    assert p.gpu_name == "GH200-96" and p.seq_len == 8192


def test_lookup_interpolates_and_extrapolates_in_micro_batch():
    p = LayerProfile(model="m", gpu="A100-80", seq_len=2048, precision="bf16", entries=(
        ProfileEntry(kind="dense", tp=1, micro_batch_size=2, fwd_time_s=2.0, bwd_time_s=4.0),
        ProfileEntry(kind="dense", tp=1, micro_batch_size=4, fwd_time_s=3.0, bwd_time_s=6.0)))
    assert p.lookup("dense", 1, 3) == pytest.approx((2.5, 5.0))
    assert p.lookup("dense", 1, 8) == pytest.approx((5.0, 10.0))
    assert p.lookup("dense", 1, 1) == pytest.approx((1.0, 2.0))
    assert p.lookup("dense", 2, 2) is None


def test_profile_file_round_trip_and_errors(tmp_path):
    p = LayerProfile(model="m", gpu="H100", seq_len=4096, precision="bf16", includes_tp_comm=False, entries=(
        ProfileEntry(kind="dense", tp=2, micro_batch_size=1, fwd_time_s=1e-3, bwd_time_s=2e-3),))
    path = tmp_path / "p.json"
    save_profile(p, path)
    q = load_profile(path)
    assert q.entries == p.entries and q.includes_tp_comm is False and q.gpu_name == "H100-SXM"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(FormatError):
        load_profile(bad)
    bad.write_text("{not json")
    with pytest.raises(FormatError):
        load_profile(bad)
    with pytest.raises(SpecError):
        LayerProfile(model="m", gpu="H100", seq_len=1, precision="int8", entries=())


def _node(gpu: str, tp: int) -> NodeSpec:
    return NodeSpec(gpu=get_gpu_type(gpu), gpus_per_node=max(tp, 1), intra_node_link="nvlink3",
                    intra_node_bw_bytes_per_s=200 * u.GB_PER_S, intra_node_latency_s=3 * u.US,
                    nic_bw_bytes_per_s=100 * u.GBIT_PER_S)


def test_profiles_replace_compute_time_but_comm_is_still_modelled():
    sets, _ = sailor_profiles("OPT-30")
    spec = SAILOR_MODELS["OPT-30"].spec
    t = TrainingSpec(global_batch_size=8, seq_len=2048, precision="fp32")
    measured = CostModel(spec, t, profiles=sets)
    computed = CostModel(spec, t)
    a100 = _node("A100-40", 8)
    cfg = StageConfig(tp=2, dp=4, micro_batch_size=2, sequence_parallel=False)
    raw = read_sailor_raw(SAILOR_DIR / "OPT-30" / "A100-40" / "profile.json")[2][2]
    c = measured.layer(a100, cfg, "dense")
    assert c.breakdown["profiled"] == 1.0
    assert c.fwd_time_s == pytest.approx(raw[5][0])  # TP all-reduces are inside the measurement
    assert c.breakdown["grad_sync_total"] > 0  # data-parallel sync is still modelled
    assert computed.layer(a100, cfg, "dense").breakdown["profiled"] == 0.0
    # unmeasured TP degree: the computed time scaled by what the profile measured; other GPU type or
    # another sequence length: analytical
    tp8 = StageConfig(tp=8, micro_batch_size=1)
    assert measured.layer(a100, tp8, "dense").breakdown["profiled"] == 0.5
    assert measured.layer(_node("H100-SXM", 1), StageConfig(), "dense").breakdown["profiled"] == 0.0
    other = CostModel(spec, TrainingSpec(global_batch_size=8, seq_len=1024, precision="fp32"), profiles=sets)
    assert other.layer(a100, cfg, "dense").breakdown["profiled"] == 0.0
    # full recomputation adds the measured forward to the backward
    rf = measured.layer(a100, StageConfig(tp=2, dp=4, micro_batch_size=2, recompute="full",
                                          sequence_parallel=False), "dense")
    assert rf.bwd_time_s == pytest.approx(c.bwd_time_s + raw[5][0])


def test_sailor_link_bandwidths_are_read():
    bws = sailor_link_bandwidths()
    assert 240 * u.GB_PER_S < bws["A100-40"][2] < 250 * u.GB_PER_S
    assert set(bws["RTX-3090"]) == {2, 4, 8}


def _profile_dict(**over) -> dict:
    d = {"format": "tangram_opt.layer_profile", "version": 1, "model": "m", "gpu": "A100-80", "seq_len": 2048,
         "precision": "bf16", "entries": [{"kind": "dense", "tp": 1, "micro_batch_size": 1, "fwd_s": 1e-3,
                                           "bwd_s": 2e-3}]}
    d.update(over)
    return d


@pytest.mark.parametrize("over, field", [
    ({"entries": []}, "profile.entries"),
    ({"entries": [{"kind": "dense", "tp": 1, "micro_batch_size": 1, "fwd_s": 1e-3}]}, "profile.entries[0].bwd_s"),
    ({"entries": [{"kind": "dense", "tp": 0, "micro_batch_size": 1, "fwd_s": 1e-3, "bwd_s": 1e-3}]},
     "profile.entries[0].tp"),
    ({"entries": [{"kind": "dense", "tp": 1, "micro_batch_size": 1, "fwd_s": -1.0, "bwd_s": 1e-3}]},
     "profile.entries[0].fwd_s"),
    ({"entries": [{"kind": "dense", "tp": 1, "micro_batch_size": 1, "fwd_s": float("nan"), "bwd_s": 1e-3}]},
     "profile.entries[0].fwd_s"),
    ({"seq_len": "2048"}, "profile.seq_len"),
    ({"sequence_len": 2048}, "profile.sequence_len"),
    ({"model_shape": {"hidden": 4096}}, "profile.model_shape.hidden"),
    ({"precision": "int4"}, "profile.precision"),
])
def test_bad_profile_files_name_the_field(tmp_path, over, field):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(_profile_dict(**over)))
    with pytest.raises(FormatError) as exc:
        load_profile(path)
    assert exc.value.field == field and str(path) in str(exc.value)


def test_profiles_of_another_run_are_refused_not_ignored(tmp_path):
    from tangram_opt.cost import check_profiles, load_profiles, model_shape
    from tangram_opt.cost.profiles import ProfileSet
    from tangram_opt.specs import load_model as get_model

    model = get_model("llama-3-8b")
    shaped = _profile_dict(model="my-llama", model_shape=model_shape(model), seq_len=4096)
    (tmp_path / "a100.json").write_text(json.dumps(shaped))
    (tmp_path / "h100.json").write_text(json.dumps({**shaped, "gpu": "H100"}))
    profiles = load_profiles(tmp_path)
    assert len(profiles) == 2 and profiles.get("A100-80").model_shape == model_shape(model)
    check_profiles(profiles, model, 4096, "bf16")  # the shape matches: another name is fine
    with pytest.raises(SpecError) as exc:
        check_profiles(profiles, model, 8192, "bf16")
    assert exc.value.field == "profile.seq_len"
    with pytest.raises(SpecError) as exc:
        check_profiles(profiles, model, 4096, "fp32")
    assert exc.value.field == "profile.precision"
    with pytest.raises(SpecError) as exc:
        check_profiles(profiles, get_model("llama-3-70b"), 4096, "bf16")
    assert exc.value.field == "profile.model_shape.num_layers"
    unnamed = ProfileSet([load_profile(tmp_path / "a100.json")])
    bare = LayerProfile(model="other", gpu="A100-80", seq_len=4096, precision="bf16",
                        entries=unnamed.get("A100-80").entries)
    with pytest.raises(SpecError) as exc:
        check_profiles(ProfileSet([bare]), model, 4096, "bf16")
    assert exc.value.field == "profile.model"
    with pytest.raises(FormatError):
        load_profiles(tmp_path / "empty_dir_missing")


def test_configurations_outside_the_measured_points_are_scaled_by_the_measurement():
    """A profile 2x slower than computed at tp 1-2 makes tp 4 and context-parallel stages 2x slower
    too: no configuration escapes the measurement to the analytical model."""
    from tangram_opt.specs import load_model

    model = load_model("llama-2-7b")
    t = TrainingSpec(global_batch_size=8, seq_len=4096, precision="bf16")
    computed = CostModel(model, t)
    node = _node("A100-80", 8)
    entries = []
    for tp in (1, 2):
        for mb in (1, 2):
            c = computed.layer(node, StageConfig(tp=tp, micro_batch_size=mb, sequence_parallel=False), "dense")
            entries.append(ProfileEntry(kind="dense", tp=tp, micro_batch_size=mb,
                                        fwd_time_s=2 * c.breakdown["compute_fwd"],
                                        bwd_time_s=2 * c.breakdown["compute_bwd"]))
    prof = LayerProfile(model=model.name, gpu="A100-80", seq_len=4096, precision="bf16", entries=tuple(entries),
                        includes_tp_comm=False)
    measured = CostModel(model, t, profiles=prof)
    for cfg, how in ((StageConfig(tp=2, micro_batch_size=2, sequence_parallel=False), 1.0),
                     (StageConfig(tp=4, micro_batch_size=1), 0.5),
                     (StageConfig(tp=1, cp=2, micro_batch_size=2), 0.5),
                     (StageConfig(tp=2, micro_batch_size=3, sequence_parallel=False), 1.0)):
        a, b = computed.layer(node, cfg, "dense"), measured.layer(node, cfg, "dense")
        assert b.breakdown["profiled"] == how
        assert b.breakdown["compute_fwd"] == pytest.approx(2 * a.breakdown["compute_fwd"], rel=0.02)
        assert b.breakdown["compute_bwd"] == pytest.approx(2 * a.breakdown["compute_bwd"], rel=0.02)
        assert b.breakdown["tp_comm"] == a.breakdown["tp_comm"]  # still modelled: not inside the profile
    # no embedding or head points: they take the median ratio over the profile's points
    cfg = StageConfig(tp=2, micro_batch_size=1)
    assert measured.head(node, cfg).breakdown["compute_fwd"] == pytest.approx(
        2 * computed.head(node, cfg).breakdown["compute_fwd"])
