"""solve's signature: user inputs as arguments, research knobs in one validated SearchOptions."""

from __future__ import annotations

import warnings

import pytest

import tangram_opt as to
from tangram_opt.cost import DEFAULT_CALIBRATION
from tangram_opt.errors import SpecError
from tangram_opt.planner.multi_pipeline import MultiPipelineOptions
from tangram_opt.planner.plan import CertificateStatus
from tangram_opt.planner.search import SearchOptions, solve
from tangram_opt.planner.search.api import default_training, planning_inputs
from tangram_opt.planner.space import SearchSpace
from tangram_opt.specs import TrainingSpec, load_cluster, load_model, make_cluster

SMALL = TrainingSpec(global_batch_size=8, seq_len=1024, precision="fp16")


def _tiny():
    return make_cluster("tiny", [dict(name="a100", gpu="A100-40", nodes=1, gpus_per_node=2, nic_gbps=200),
                                 dict(name="v100", gpu="V100-16", nodes=1, gpus_per_node=2, nic_gbps=100)])


@pytest.mark.parametrize("kw, field", [
    ({"formulation": "magic"}, "options.formulation"),
    ({"formulation": "positional", "windows": True}, "options.windows"),
    ({"formulation": "positional", "knapsack": True}, "options.knapsack"),
    ({"formulation": "positional", "sequence_leaves": True}, "options.sequence_leaves"),
    ({"windows": False, "sequence_leaves": True}, "options.sequence_leaves"),
    ({"multi_pipeline": False, "multi_pipeline_options": MultiPipelineOptions()}, "options.multi_pipeline_options"),
    ({"windows": "yes"}, "options.windows"),
    ({"warm_start": None}, "options.warm_start"),
])
def test_contradictory_or_malformed_options_are_refused(kw, field):
    with pytest.raises(SpecError) as exc:
        SearchOptions(**kw)
    assert exc.value.field == field


@pytest.mark.parametrize("name", ["windows", "knapsack", "sequence_leaves"])
def test_what_gpipe_has_not_is_refused_not_switched_off(name):
    with pytest.raises(SpecError) as exc:
        SearchOptions(**{name: True}).resolved("gpipe", 100.0)
    assert exc.value.field == f"options.{name}"
    off = SearchOptions().resolved("gpipe", 100.0)  # None: where it applies, i.e. not here
    assert not (off.windows or off.knapsack or off.sequence_leaves)


def test_none_means_where_it_applies():
    fast = SearchOptions().resolved("1f1b", 10.0)
    assert fast.windows and fast.knapsack and not fast.sequence_leaves
    assert SearchOptions().resolved("1f1b", 100.0).sequence_leaves
    positional = SearchOptions(formulation="positional").resolved("1f1b", 100.0)
    assert not (positional.windows or positional.knapsack or positional.sequence_leaves)


def test_default_training_is_valid_on_every_gpu():
    assert default_training(load_cluster("a100-v100")).precision == "fp16"  # V100: no bf16
    assert default_training(load_cluster("h100-64")).precision == "bf16"
    # a learned position table caps the default sequence (OPT: 2,050 rows, 2,048 positions)
    assert default_training(load_cluster("h100-64"), load_model("opt-350m")).seq_len == 2048
    assert default_training(load_cluster("h100-64"), load_model("llama-3-8b")).seq_len == 4096
    _, _, training = planning_inputs("a100-v100", "llama-3-8b")
    assert (training.global_batch_size, training.seq_len) == (512, 4096)


def test_solve_without_training_plans_on_a_cluster_without_bf16():
    plan = solve(_tiny(), load_model("opt-350m").with_layers(2), time_limit_s=10,
                 space=SearchSpace(micro_batch_sizes=(1, 2), cp=(1,)), options=SearchOptions(multi_pipeline=False))
    assert plan.precision == "fp16" and plan.global_batch_size == 512


def test_old_knob_keywords_still_work_with_a_warning():
    model = load_model("opt-350m").with_layers(2)
    with pytest.warns(DeprecationWarning, match="SearchOptions"):
        old = solve(_tiny(), model, SMALL, time_limit_s=10, multi_pipeline=False, warm_start=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        new = solve(_tiny(), model, SMALL, time_limit_s=10,
                    options=SearchOptions(multi_pipeline=False, warm_start=False))
    assert old.step_time_s == pytest.approx(new.step_time_s, rel=1e-12)
    assert "single-pipeline level" not in " ".join(new.certificate.notes)
    with pytest.raises(SpecError) as exc:
        solve(_tiny(), model, SMALL, time_limit_s=5, options=SearchOptions(), windows=False)
    assert exc.value.field == "options"
    with pytest.raises(TypeError, match="magic"):
        solve(_tiny(), model, SMALL, time_limit_s=5, magic=True)


def test_a_calibration_object_prices_the_plan():
    model = load_model("opt-350m").with_layers(2)
    base = solve(_tiny(), model, SMALL, time_limit_s=10, options=SearchOptions(multi_pipeline=False))
    slow = DEFAULT_CALIBRATION.with_gpu("A100-40", matmul_efficiency=0.2, attention_efficiency=0.1,
                                        attention_bwd_efficiency=0.1)
    slow = slow.with_gpu("V100-16", matmul_efficiency=0.2, attention_efficiency=0.1, attention_bwd_efficiency=0.1)
    cal = solve(_tiny(), model, SMALL, time_limit_s=10, calibration=slow, options=SearchOptions(multi_pipeline=False))
    assert cal.step_time_s > 1.3 * base.step_time_s


def test_certificate_status_is_an_enum_that_reads_as_its_string():
    plan = solve(_tiny(), load_model("opt-350m").with_layers(2), SMALL, time_limit_s=10)
    status = plan.certificate.status
    assert isinstance(status, CertificateStatus) and status == "optimal" and f"{status}" == "optimal"
    again = to.Plan.from_json(plan.to_json())
    assert again.certificate.status is CertificateStatus.OPTIMAL and again == plan
    with pytest.raises(SpecError) as exc:
        to.Certificate(status="great", backend="highs", objective_s=1.0, bound_s=1.0, gap=0.0, solve_time_s=0.0,
                       plan_space="")
    assert exc.value.field == "certificate.status"
