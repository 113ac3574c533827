"""The published end-to-end runs (benchmarks/data/published_runs.yaml) load, validate and plan.

No test here checks prediction accuracy: the cost model is being changed; these tests keep the data
set well-formed and the predictor working.
"""

from __future__ import annotations

import copy
import time

import pytest
import yaml

import tangram_opt as to
from benchmarks.published_runs import DATA_FILE, compare, load_runs, predict

SMALL_ROW = "llmfoundry-a100-80-mpt7b-s2048-bf16-8"


@pytest.fixture(scope="module")
def runs():
    return load_runs()


@pytest.fixture(scope="module")
def raw():
    return yaml.safe_load(DATA_FILE.read_text(encoding="utf-8"))


def test_file_loads_with_enough_rows(runs):
    assert len(runs) >= 20
    assert len({r.id for r in runs}) == len(runs)


def test_every_row_has_a_public_source(runs):
    for r in runs:
        assert r.source.url.startswith("https://"), r.id
        assert r.source.table.strip() and r.source.version.strip(), r.id
        assert r.source.accessed == "2026-12-04", r.id


def test_gpu_generations_and_catalog_names(runs):
    gpus = {r.gpu for r in runs}
    for g in gpus:
        assert to.get_gpu_type(g).name == g
    assert {"A100", "H100", "Blackwell"} <= {r.generation for r in runs}
    assert gpus & {"A100-40", "A100-80"} and "H100-SXM" in gpus and gpus & {"B200", "GB200"}


def test_dense_and_moe_present(runs):
    assert any(r.is_moe for r in runs) and any(not r.is_moe for r in runs)
    moe = {r.model.name for r in runs if r.is_moe}
    assert len(moe) >= 3


def test_rows_are_consistent(runs):
    for r in runs:
        assert r.tp * r.pp * r.cp * r.dp == r.num_gpus, r.id
        if r.micro_batch_size is not None:
            assert r.global_batch_size % (r.micro_batch_size * r.dp) == 0, r.id
        assert r.precision in ("bf16", "fp16", "fp8"), r.id
        if r.precision == "fp8" or (r.virtual_pipeline or 1) > 1:
            assert not r.representable, r.id
        m = r.measured
        assert any(v is not None for v in (m.tokens_per_s_per_gpu, m.step_time_s, m.mfu, m.model_tflops_per_gpu))


def test_precision_is_marked_in_the_id(runs):
    # fp8 rows are admitted only when clearly marked: the id names the precision of every row
    for r in runs:
        assert f"-{r.precision}" in r.id, r.id
    assert sum(r.precision == "bf16" for r in runs) > len(runs) // 2


def test_representable_rows_leave_no_planner_choice_open(runs):
    # a row that claims the whole configuration is representable publishes every planner input
    for r in runs:
        if r.representable:
            assert None not in (r.micro_batch_size, r.zero, r.recompute), r.id
            assert (r.virtual_pipeline or 1) == 1 and r.precision != "fp8", r.id


def test_published_parameter_counts_match_the_shapes(runs):
    checked = [r for r in runs if r.model_params_published is not None]
    assert len(checked) >= 10  # every llm-foundry row prints NumParams
    for r in checked:
        assert r.model.total_params == r.model_params_published, r.id


def _write(tmp_path, data):
    p = tmp_path / "runs.yaml"
    p.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return p


@pytest.mark.parametrize("mutate, field", [
    (lambda row: row.update(gpu="A100-80G"), "gpu"),
    (lambda row: row["source"].update(url=None), "source.url"),
    (lambda row: row.pop("micro_batch_size"), "micro_batch_size"),
    (lambda row: row.update(dp=7), "dp"),
    (lambda row: row.update(model={"preset": "no-such-model"}), "model.preset"),
    (lambda row: row.update(recompute="sometimes"), "recompute"),
    (lambda row: row.update(model_params_published=123), "model_params_published"),
    (lambda row: row.update(gpu_memory_gib=-96), "gpu_memory_gib"),
    (lambda row: row.update(gpu_memory_gib="96 GB"), "gpu_memory_gib"),
])
def test_bad_rows_are_rejected_with_the_field_named(tmp_path, raw, mutate, field):
    data = copy.deepcopy(raw)
    mutate(data["runs"][0])
    with pytest.raises(to.SpecError) as e:
        load_runs(_write(tmp_path, data))
    assert field in e.value.field


def test_predict_runs_on_a_small_row(runs):
    run = next(r for r in runs if r.id == SMALL_ROW)
    t0 = time.perf_counter()
    p = predict(run, time_limit_s=5.0)
    assert time.perf_counter() - t0 < 10.0
    assert p.error is None, p.error
    assert p.tokens_per_s_per_gpu > 0 and 0 < p.mfu < 1 and p.peak_memory_gib > 0
    assert p.matches_published and p.num_stages == run.pp == 1 and p.gpus_used == run.num_gpus
    c = compare(run, p)
    assert c.metric == "tokens_per_s_per_gpu" and c.published == run.measured.tokens_per_s_per_gpu
    assert c.error is not None
