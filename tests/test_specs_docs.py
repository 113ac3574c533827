"""docs/user_guide/inputs.md stays true: its generated tables match the code and its examples load."""

import importlib.util
import re
from pathlib import Path

import yaml

from tangram_opt import load_cluster, load_model, load_training, make_cluster
from tangram_opt.specs import cluster_from_dict

ROOT = Path(__file__).resolve().parent.parent
DOC = (ROOT / "docs" / "user_guide" / "inputs.md").read_text()


def _gen():
    spec = importlib.util.spec_from_file_location("_gen_tables", ROOT / "docs" / "user_guide" / "_gen_tables.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    return gen


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", DOC, flags=re.S)


def test_generated_tables_are_current():
    gen = _gen()
    for table in (gen.gpu_table(), gen.link_table(), gen.preset_table(), gen.architecture_table(),
                  gen.price_table()):
        assert table in DOC, "run: python docs/user_guide/_gen_tables.py and paste its output into inputs.md"


def test_yaml_examples_load():
    cluster_yaml, model_yaml, training_yaml = _blocks("yaml")
    c = cluster_from_dict(yaml.safe_load(cluster_yaml))
    assert c.num_gpus == 64 and c.zones == ("zone-a", "zone-b")
    m = load_model(yaml.safe_load(model_yaml))
    assert m.is_moe and m.total_params == load_model("mixtral-8x7b").total_params
    t = load_training(yaml.safe_load(training_yaml))
    assert (t.weight_bytes, t.grad_bytes, t.optimizer_bytes) == (2, 2, 12)


def test_python_cluster_example_runs():
    snippet = next(b for b in _blocks("python") if "make_cluster(" in b)
    exec(snippet, {"load_cluster": load_cluster, "make_cluster": make_cluster})
