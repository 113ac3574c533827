"""Property test: on random tiny instances the certificate is valid against exhaustive search."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tangram_opt.errors import InfeasibleError
from tangram_opt.testing.exhaustive import brute_force
from tangram_opt.planner.context import PlanningContext
from tangram_opt.planner.search import SearchOptions, solve
from tangram_opt.planner.space import SearchSpace
from tangram_opt.specs import TrainingSpec, load_model, make_cluster

GPUS = ["V100-32", "A100-40", "A100-80", "H100-SXM", "L4", "RTX-4090"]
MODELS = ["llama-3-8b", "qwen2-7b", "mixtral-8x7b", "deepseek-v2-lite", "opt-350m"]


@st.composite
def instances(draw):
    n_groups = draw(st.integers(1, 3))
    gpus = draw(st.lists(st.sampled_from(GPUS), min_size=n_groups, max_size=n_groups, unique=True))
    groups = [dict(name=f"g{i}", gpu=g, nodes=1, gpus_per_node=draw(st.sampled_from([1, 2, 4])),
                   nic_gbps=draw(st.sampled_from([25, 100, 400]))) for i, g in enumerate(gpus)]
    model = load_model(draw(st.sampled_from(MODELS))).with_layers(draw(st.integers(2, 4)))
    training = TrainingSpec(global_batch_size=draw(st.sampled_from([4, 8])), seq_len=draw(st.sampled_from([512, 2048])),
                            precision="fp16" if "V100-32" in gpus else "bf16")
    space = SearchSpace(max_stages=3, zero=(0, 3), recompute=("none", "full"), cp=(1,), micro_batch_sizes=(1, 2),
                        schedule=draw(st.sampled_from(["1f1b", "gpipe"])))
    # narrow windows end in sequence leaves or in aggregated leaves (solve() picks by time limit)
    return make_cluster("random", groups), model, training, space, draw(st.booleans())


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(instances())
def test_certificate_is_valid_against_exhaustive_search(inst):
    cluster, model, training, space, sequence = inst
    # the exhaustive search enumerates single pipelines: so does the search here (a plan of several
    # pipelines may beat them all). GPipe pipelines have no windows, so neither kind of leaf (None)
    options = SearchOptions(sequence_leaves=sequence if space.schedule == "1f1b" else None, multi_pipeline=False)
    best = brute_force(PlanningContext(cluster, model, training, space=space))
    if best is None:
        try:
            solve(cluster, model, training, space=space, time_limit_s=30, options=options)
        except InfeasibleError:
            return
        raise AssertionError("solve() found a plan where exhaustive search found none")
    plan = solve(cluster, model, training, space=space, time_limit_s=30, rel_gap=1e-9, options=options)
    cert = plan.certificate
    assert cert.bound_s <= best.step_time_s * (1 + 1e-7), "the bound cuts off a real plan"
    assert cert.objective_s >= best.step_time_s * (1 - 1e-7), "the incumbent beats the exhaustive optimum"
    assert cert.objective_s <= best.step_time_s * (1 + cert.gap + 1e-7)


@__import__("pytest").mark.slow
@settings(max_examples=250, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(instances())
def test_certificate_is_valid_against_exhaustive_search_many(inst):
    """The same property on 250 instances (about a minute): `python -m pytest -m slow`."""
    test_certificate_is_valid_against_exhaustive_search.hypothesis.inner_test(inst)
