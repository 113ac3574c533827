"""Model presets (hub config.json files under tangram_opt/data/models) and load_model()."""

import json

import pytest
import yaml

from tangram_opt import ModelSpec, list_presets, load_model
from tangram_opt.errors import FormatError, SpecError
from tangram_opt.specs.presets import preset_path

REQUIRED_PRESETS = {
    "llama-2-7b", "llama-2-13b", "llama-2-70b", "llama-3-8b", "llama-3-70b", "llama-3-405b", "mistral-7b",
    "mixtral-8x7b", "mixtral-8x22b", "qwen2-7b", "qwen2-57b-a14b", "qwen3-30b-a3b", "qwen3-235b-a22b",
    "deepseek-v2", "deepseek-v2-lite", "deepseek-v3", "opt-350m", "opt-30b", "gpt-neo-2.7b", "gpt-neox-20b",
}

#: Exact totals published as integers: Hugging Face safetensors metadata of each hub repository, the
#: GPT-NeoX-20B paper (Black et al. 2022, 20,554,567,680 parameters).
EXACT_TOTALS = {
    "llama-2-7b": 6_738_415_616,
    "llama-2-13b": 13_015_864_320,
    "llama-3-8b": 8_030_261_248,
    "llama-3-70b": 70_553_706_496,
    "mistral-7b": 7_241_732_096,
    "mixtral-8x7b": 46_702_792_704,
    "qwen2-7b": 7_615_616_512,
    "opt-350m": 331_196_416,
    "gpt-neo-2.7b": 2_651_307_520,
    "gpt-neox-20b": 20_554_567_680,
}

#: preset: (published total in billions, published active in billions or None, source). "Active" is
#: compared with ModelSpec.active_params (every parameter a token touches, Mistral's and Qwen's
#: convention) except for DeepSeek, whose "activated" figures leave out the input embedding
#: (ModelSpec.active_compute_params).
PUBLISHED_B = {
    "llama-2-7b": (6.74, None, "HF meta-llama/Llama-2-7b-hf: 6.74B"),
    "llama-2-13b": (13.0, None, "HF meta-llama/Llama-2-13b-hf: 13.0B"),
    "llama-2-70b": (69.0, None, "HF meta-llama/Llama-2-70b-hf: 69.0B"),
    "llama-3-8b": (8.03, None, "HF meta-llama/Meta-Llama-3-8B: 8.03B"),
    "llama-3-70b": (70.6, None, "HF meta-llama/Meta-Llama-3-70B: 70.6B"),
    "llama-3-405b": (405, None, "Llama 3 paper (Dubey et al. 2024): 405B"),
    "mistral-7b": (7.24, None, "HF mistralai/Mistral-7B-v0.1: 7.24B"),
    "mixtral-8x7b": (46.7, 12.9, "Mistral AI, 'Mixtral of experts' (2023): 46.7B total, 12.9B per token"),
    "mixtral-8x22b": (141, 39, "Mistral AI, 'Cheaper, Better, Faster, Stronger' (2024): 39B active of 141B"),
    "qwen2-7b": (7.62, None, "HF Qwen/Qwen2-7B: 7.62B"),
    "qwen2-57b-a14b": (57.41, 14, "Qwen2 technical report (2024): 57.41B total, 14B activated"),
    "qwen3-8b": (8.2, None, "HF Qwen/Qwen3-8B model card: 8.2B"),
    "qwen3-30b-a3b": (30.5, 3.3, "HF Qwen/Qwen3-30B-A3B model card: 30.5B total, 3.3B activated"),
    "qwen3-235b-a22b": (235, 22, "HF Qwen/Qwen3-235B-A22B model card: 235B total, 22B activated"),
    "deepseek-v2": (236, 21, "DeepSeek-V2 paper (2024): 236B total, 21B activated"),
    "deepseek-v2-lite": (15.7, 2.4, "DeepSeek-V2 paper, Appendix B: V2-Lite 15.7B total, 2.4B activated"),
    "deepseek-v3": (671, 37, "DeepSeek-V3 technical report (2024): 671B total, 37B activated, MTP excluded"),
    "opt-350m": (0.331, None, "HF facebook/opt-350m: 331M"),
    "opt-30b": (30, None, "OPT paper (Zhang et al. 2022): 30B"),
    "gpt-neo-2.7b": (2.7, None, "EleutherAI GPT-Neo 2.7B model card"),
    "gpt-neox-20b": (20.6, None, "GPT-NeoX-20B paper: 20.6B"),
}


def _last_digit_unit(x: float) -> float:
    """The unit of the last written digit of a published figure: 46.7 -> 0.1, 671 -> 1, 0.331 -> 0.001."""
    text = repr(x)
    return 10.0 ** -len(text.split(".")[1]) if "." in text else 1.0


def close_to_published(measured_b: float, published_b: float) -> bool:
    """Within 1% of the published figure, or within one unit of its last digit when the figure is rounded
    more coarsely than 1% (a "37B" only says 36.5-37.5 if rounded, 37-38 if truncated)."""
    return abs(measured_b - published_b) <= max(0.01 * published_b, _last_digit_unit(published_b))


def test_required_presets_exist():
    assert REQUIRED_PRESETS <= set(list_presets())


@pytest.mark.parametrize("name", sorted(EXACT_TOTALS))
def test_exact_totals(name):
    assert load_model(name).total_params == EXACT_TOTALS[name]


@pytest.mark.parametrize("name", sorted(PUBLISHED_B))
def test_counts_match_published_figures(name):
    total_b, active_b, source = PUBLISHED_B[name]
    m = load_model(name)
    assert close_to_published(m.total_params / 1e9, total_b), (m.total_params, source)
    if active_b is not None:
        active = m.active_compute_params if m.architecture.startswith("deepseek") else m.active_params
        assert close_to_published(active / 1e9, active_b), (active, source)
    else:
        assert not m.is_moe


def test_headline_counts_within_one_percent():
    """The issue's four headline checks, at a plain 1%."""
    def pct(measured, published):
        return abs(measured / published - 1)
    assert pct(load_model("llama-3-8b").total_params, 8.03e9) < 0.01
    assert pct(load_model("llama-3-70b").total_params, 70.6e9) < 0.01
    mixtral = load_model("mixtral-8x7b")
    assert pct(mixtral.total_params, 46.7e9) < 0.01 and pct(mixtral.active_params, 12.9e9) < 0.01
    v3 = load_model("deepseek-v3")
    assert pct(v3.total_params, 671e9) < 0.01
    assert pct(v3.active_compute_params, 37e9) < 0.011  # 36.63B: "37B" is rounded up from it


@pytest.mark.parametrize("name", list_presets())
def test_preset_files_are_hub_config_json(name):
    data = json.loads(preset_path(name).read_text())
    assert {"model_type", "architectures", "_name_or_path"} <= set(data)
    m = load_model(name)
    assert m.name == name
    assert ModelSpec(**{**m.to_dict(), "moe": m.moe, "mla": m.mla}) == m


def test_preset_lookup_is_case_insensitive_and_accepts_hub_ids():
    assert load_model("Llama-3-8B") == load_model("llama-3-8b")
    assert load_model("meta-llama/Meta-Llama-3-8B").name == "llama-3-8b"
    assert load_model("  deepseek-ai/DeepSeek-V3 ").total_params == load_model("deepseek-v3").total_params


def test_typo_gets_close_matches():
    with pytest.raises(SpecError, match=r"model = 'lama-3-8b': is not a model preset.*did you mean llama-3-8b") as e:
        load_model("lama-3-8b")
    assert e.value.field == "model"
    with pytest.raises(SpecError, match="did you mean mixtral-8x7b"):
        load_model("mixtral-8x7")


def test_load_model_accepts_every_form(tmp_path):
    m = load_model("qwen3-30b-a3b")
    assert load_model(m) is m
    hf = json.loads(preset_path("qwen3-30b-a3b").read_text())
    assert load_model(hf).total_params == m.total_params  # HF dict
    assert load_model(m.to_dict()) == m  # tangram dict
    (tmp_path / "model.yaml").write_text(yaml.safe_dump(m.to_dict()))
    assert load_model(tmp_path / "model.yaml") == m  # tangram YAML
    (tmp_path / "model.json").write_text(json.dumps(m.to_dict()))
    assert load_model(str(tmp_path / "model.json")) == m  # tangram JSON
    (tmp_path / "hub").mkdir()
    (tmp_path / "hub" / "config.json").write_text(json.dumps(hf))
    assert load_model(tmp_path / "hub", name="q").total_params == m.total_params  # model directory
    assert load_model(tmp_path / "hub" / "config.json").name == "Qwen3-30B-A3B"
    assert load_model("qwen3-30b-a3b", name="mine").name == "mine"
    assert load_model(m.to_dict(), name="renamed").total_params == m.total_params


def test_load_model_errors(tmp_path):
    with pytest.raises(FormatError, match=r"model = '.*missing\.yaml': file not found"):
        load_model(tmp_path / "missing.yaml")
    with pytest.raises(SpecError, match=r"model = 3: cannot be read from a int"):
        load_model(3)
    (tmp_path / "m.yaml").write_text("name: x\nnum_layers: 2\nhidden: 64\n")
    with pytest.raises(SpecError, match=r"m\.yaml: hidden = 64: is not a known field.*hidden_size") as e:
        load_model(tmp_path / "m.yaml")
    assert e.value.source.endswith("m.yaml")
