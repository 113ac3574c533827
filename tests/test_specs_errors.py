"""User mistakes raise SpecError naming the field, the value and a fix -- never a traceback from inside."""

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tangram_opt.errors import FormatError, SpecError
from tangram_opt.specs import (MoESpec, ModelSpec, TrainingSpec, check_precision, cluster_from_dict, get_gpu_type,
                               load_cluster, load_model, load_training, make_cluster, model_from_hf_config)

FIXTURES = Path(__file__).parent / "fixtures" / "hf_configs"


def hf(arch: str, **changes) -> dict:
    data = json.loads((FIXTURES / f"{arch}.json").read_text())
    for key, value in changes.items():
        if value is ...:
            data.pop(key, None)
        else:
            data[key] = value
    return data


def group(**kw) -> dict:
    return {"gpu": "A100-80", "nodes": 2, "gpus_per_node": 8, "nic_gbps": 800, **kw}


def cluster(*groups, **top) -> dict:
    return {"name": "c", "node_groups": list(groups or [group()]), **top}


#: (case id, action, field named in the error, value that must appear in the message, regex on the message)
BAD_INPUTS = [
    ("unknown-gpu", lambda: make_cluster("c", [group(gpu="A100-80G")]),
     "node_groups[0].gpu", "'A100-80G'", r"is not a known GPU type.*did you mean A100-80"),
    ("negative-nodes", lambda: make_cluster("c", [group(nodes=-2)]),
     "node_groups[0].nodes", "-2", r"must be >= 1"),
    ("zero-gpus-per-node", lambda: make_cluster("c", [group(gpus_per_node=0)]),
     "node_groups[0].gpus_per_node", "0", r"must be >= 1"),
    ("fractional-nodes", lambda: make_cluster("c", [group(nodes=2.5)]),
     "node_groups[0].nodes", "2.5", r"must be a whole number"),
    ("quoted-count", lambda: make_cluster("c", [group(nodes="4")]),
     "node_groups[0].nodes", "'4'", r"not a string.*write 4 without quotes"),
    ("typo-in-group-key", lambda: make_cluster("c", [group(nic_gpbs=100)]),
     "node_groups[0].nic_gpbs", "100", r"is not a known field.*nic_gbps"),
    ("typo-in-top-level-key", lambda: cluster_from_dict({"name": "c", "node_group": [group()]}),
     "node_group", "'gpu'", r"is not a known field.*node_groups"),
    ("zones-without-link", lambda: make_cluster("c", [group(name="a", zone="z1"), group(name="b", zone="z2")]),
     "zone_links", "['z1', 'z2']", r"no link is given between these two zones.*zones: \[z1, z2\]"),
    ("link-to-unknown-zone", lambda: make_cluster("c", [group()], [{"zones": ["default", "moon"], "gbps": 10}]),
     "zone_links[0].zones", "'moon'", r"zone 'moon' has no node group"),
    ("duplicate-group-names", lambda: make_cluster("c", [group(name="x"), group(name="x", gpu="H100-SXM")]),
     "node_groups[1].name", "'x'", r"is already the name of node_groups\[0\]"),
    ("missing-nic", lambda: cluster_from_dict(cluster({"gpu": "H100", "nodes": 1})),
     "node_groups[0].nic_gbps", "None", r"is required but missing.*nic_gbps"),
    ("empty-node-groups", lambda: cluster_from_dict({"name": "c", "node_groups": []}),
     "node_groups", "[]", r"must be a non-empty list"),
    ("unknown-link", lambda: make_cluster("c", [group(intra_node_link="nvlink9")]),
     "node_groups[0].intra_node_link", "'nvlink9'", r"is not a known link type.*nvlink4"),
    ("custom-gpu-no-memory", lambda: cluster_from_dict(cluster(
        group(gpu="X"), gpu_types=[{"name": "X", "fp16_tflops": 100, "hbm_gbs": 1000}])),
     "gpu_types[0].memory_gb", "None", r"memory_gib"),
    ("bf16-on-v100", lambda: check_precision(TrainingSpec(global_batch_size=64, seq_len=2048),
                                             load_cluster("a100-v100")),
     "training.precision", "'bf16'", r"node group 'v100' has V100-16 GPUs.*no BF16.*fp16"),
    ("bf16-peak-on-v100", lambda: get_gpu_type("V100-32").peak_flops_per_s("bf16"),
     "training.precision", "'bf16'", r"V100-32 has no BF16 tensor cores"),
    ("bad-precision", lambda: load_training({"global_batch_size": 8, "seq_len": 2048, "precision": "int8"}),
     "training.precision", "'int8'", r"is not a known value.*bf16, fp16, fp32, fp8"),
    ("training-missing-field", lambda: load_training({"global_batch_size": 8}),
     "training.seq_len", "None", r"is required but missing"),
    ("training-typo", lambda: load_training({"global_batch_size": 8, "seq_length": 2048}),
     "training.seq_length", "2048", r"is not a known field.*seq_len"),
    ("heads-not-divisible-by-kv", lambda: model_from_hf_config(hf("llama", num_key_value_heads=5)),
     "num_key_value_heads", "5", r"does not divide num_attention_heads \(32\).*such as 4"),
    ("missing-config-field", lambda: model_from_hf_config(hf("mixtral", intermediate_size=...)),
     "intermediate_size", "None", r"is required in a mixtral config\.json"),
    ("string-in-config", lambda: model_from_hf_config(hf("qwen2", vocab_size="151936")),
     "vocab_size", "'151936'", r"must be a JSON number.*without quotes"),
    ("bool-field-wrong-type", lambda: model_from_hf_config(hf("llama", tie_word_embeddings="true")),
     "tie_word_embeddings", "'true'", r"must be true or false"),
    ("unknown-architecture", lambda: model_from_hf_config(hf("llama", model_type="lama")),
     "model_type", "'lama'", r"is not a supported architecture.*did you mean 'llama'"),
    ("no-architecture", lambda: model_from_hf_config(hf("llama", model_type=..., architectures=...)),
     "model_type", "None", r"is missing"),
    ("top-k-above-experts", lambda: model_from_hf_config(hf("qwen3_moe", num_experts_per_tok=129)),
     "num_experts_per_tok", "129", r"exceeds num_experts \(128\)"),
    ("top-k-above-experts-spec", lambda: MoESpec(num_experts=8, top_k=9, expert_ffn_hidden_size=64),
     "moe.top_k", "9", r"exceeds num_experts \(8\)"),
    ("interleaved-moe", lambda: model_from_hf_config(hf("deepseek_v2", moe_layer_freq=2)),
     "moe_layer_freq", "2", r"is not supported: it interleaves dense and MoE layers"),
    ("unknown-preset", lambda: load_model("llama3-8b"),
     "model", "'llama3-8b'", r"did you mean llama-3-8b"),
    ("model-spec-bad-head-count", lambda: ModelSpec(name="m", num_layers=2, hidden_size=100, ffn_hidden_size=10,
                                                    num_attention_heads=3, vocab_size=10),
     "num_attention_heads", "3", r"does not divide hidden_size \(100\)"),
    ("model-file-unknown-key", lambda: load_model({"name": "m", "num_layers": 2, "hidden_sise": 64}),
     "hidden_sise", "64", r"is not a known field.*hidden_size"),
]


@pytest.mark.parametrize("case, action, field, value, pattern", BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_names_field_value_and_fix(case, action, field, value, pattern):
    with pytest.raises(SpecError, match=pattern) as e:
        action()
    msg = str(e.value)
    assert e.value.field == field, msg
    assert f"{field} = " in msg and value in msg, msg
    assert "Fix: " in msg and e.value.fix, msg


def test_at_least_fifteen_distinct_cases():
    assert len({c[0] for c in BAD_INPUTS}) >= 15


# --- file problems -----------------------------------------------------------------------

def test_malformed_yaml_gives_line_number(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("name: c\nnode_groups:\n  - gpu: A100-80\n    nodes: 2\n   nic_gbps: 100\n")
    with pytest.raises(FormatError, match=r"is not valid YAML \(line 5, column 4\).*Fix: fix the YAML syntax") as e:
        load_cluster(p)
    assert e.value.field == "file" and str(p) in str(e.value)


def test_duplicate_yaml_key_is_an_error(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("name: c\nnode_groups:\n  - gpu: A100-80\n    nodes: 2\n    nodes: 3\n    nic_gbps: 100\n")
    with pytest.raises(FormatError, match=r"line 5.*found the key 'nodes' twice"):
        load_cluster(p)


def test_malformed_json_gives_line_number(tmp_path):
    p = tmp_path / "c.json"
    p.write_text('{"name": "c",\n "node_groups": [\n  {"gpu": "A100-80",}\n ]\n}')
    with pytest.raises(FormatError, match=r"is not valid JSON \(line 3, column 21"):
        load_cluster(p)


def test_file_not_found_and_empty_file(tmp_path):
    with pytest.raises(SpecError, match=r"cluster = '.*nope\.yaml': is neither a file nor a built-in example.*two"):
        load_cluster(tmp_path / "nope.yaml")
    with pytest.raises(FormatError, match="file not found"):
        load_training(tmp_path / "nope.yaml")
    (tmp_path / "empty.yaml").write_text("# nothing here\n")
    with pytest.raises(FormatError, match="is empty"):
        load_cluster(tmp_path / "empty.yaml")
    (tmp_path / "binary.yaml").write_bytes(b"\xff\xfe\x00name")
    with pytest.raises(FormatError, match="is not UTF-8 text"):
        load_cluster(tmp_path / "binary.yaml")


def test_errors_from_files_name_the_file(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("name: c\nnode_groups:\n  - gpu: A100-80\n    nodes: 0\n    nic_gbps: 100\n")
    with pytest.raises(SpecError) as e:
        load_cluster(p)
    assert e.value.source == str(p) and str(e.value).startswith(f"{p}: node_groups[0].nodes = 0")
    t = tmp_path / "t.yaml"
    t.write_text("training:\n  global_batch_size: 8\n  seq_len: -1\n")
    with pytest.raises(SpecError, match=r"t\.yaml: training\.seq_len = -1"):
        load_training(t)


def test_wrong_top_level_types():
    with pytest.raises(SpecError, match=r"cluster = \[1, 2\]: must be a mapping"):
        cluster_from_dict([1, 2])
    with pytest.raises(SpecError, match=r"node_groups\[0\] = 'a100': must be a mapping"):
        cluster_from_dict({"node_groups": ["a100"]})
    with pytest.raises(SpecError, match="cannot be read from a float"):
        load_cluster(1.5)
    with pytest.raises(SpecError, match="cannot be read from a list"):
        load_training([1])


# --- no traceback from deep inside, whatever the input ------------------------------------

_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 10**6) | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6)


@settings(max_examples=100, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arch=st.sampled_from(sorted(p.stem for p in FIXTURES.glob("*.json"))), key=st.data(), value=_json_values)
def test_any_mutated_hf_config_gives_spec_error_or_model(arch, key, value):
    data = hf(arch)
    k = key.draw(st.sampled_from(sorted(data)))
    data[k] = value
    try:
        model_from_hf_config(data)
    except SpecError:
        pass


_group_keys = ["name", "gpu", "nodes", "gpus_per_node", "intra_node_link", "intra_node_gbs",
               "intra_node_latency_us", "nic_gbps", "nic_latency_us", "zone"]


@settings(max_examples=100, derandomize=True, deadline=None)
@given(key=st.sampled_from(_group_keys + ["zone_links", "gpu_types", "name", "description"]), value=_json_values)
def test_any_mutated_cluster_gives_spec_error_or_cluster(key, value):
    data = cluster(group(zone="a"), group(name="b", zone="b"), zone_links=[{"zones": ["a", "b"], "gbps": 100}])
    if key in _group_keys:
        data["node_groups"][0][key] = value
    else:
        data[key] = value
    try:
        cluster_from_dict(data)
    except SpecError:
        pass


@settings(max_examples=60, derandomize=True, deadline=None)
@given(data=st.dictionaries(st.sampled_from(["global_batch_size", "seq_len", "precision", "weight_bytes_per_param",
                                             "optimizer_bytes_per_param", "x"]), _json_values, max_size=4))
def test_any_training_dict_gives_spec_error_or_spec(data):
    try:
        load_training(data)
    except SpecError:
        pass


_model_keys = ["name", "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_kv_heads",
               "head_dim", "vocab_size", "tied_embeddings", "mlp_type", "attention_bias", "position_embedding",
               "embedding_dim", "final_norm", "moe", "mla", "moe.top_k", "moe.num_experts", "mla.q_lora_rank"]


@settings(max_examples=80, derandomize=True, deadline=None)
@given(key=st.sampled_from(_model_keys), value=_json_values)
def test_any_mutated_model_file_gives_spec_error_or_model(key, value):
    data = load_model("deepseek-v2-lite").to_dict()
    if "." in key:
        outer, inner = key.split(".")
        data[outer][inner] = value
    else:
        data[key] = value
    try:
        load_model(data)
    except SpecError:
        pass
