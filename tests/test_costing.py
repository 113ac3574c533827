"""What a plan costs (tangram_opt/costing.py): dollars per hour of the GPUs used, per step and per
million tokens, idle groups, the cheapest-first fill of merged islands and cross-zone transfer.

One small plan is solved (module fixture, well under a second); the other plans are that plan with
its stages moved to other islands (dataclasses.replace), so every expected figure is computed here
from the stage layout and the prices, independently of the code under test.
"""

from __future__ import annotations

import dataclasses as dc

import pytest

import tangram_opt as to
from tangram_opt import SpecError, make_cluster
from tangram_opt.costing import plan_cost
from tangram_opt.planner.search import SearchOptions
from tangram_opt.specs import model_from_dict
from tangram_opt.specs.pricing import default_price

#: a small dense model with untied embeddings: its parameters are every gradient byte
MODEL = model_from_dict({"name": "tiny-untied", "num_layers": 4, "hidden_size": 1024, "ffn_hidden_size": 4096,
                         "num_attention_heads": 16, "vocab_size": 32000, "tied_embeddings": False})
TRAINING = to.TrainingSpec(global_batch_size=16, seq_len=1024, precision="bf16")
A100 = dict(gpu="A100-40", nodes=1, nic_gbps=400)


@pytest.fixture(scope="module")
def plan():
    one = make_cluster("one", [dict(name="g", **A100)])
    return to.solve(one, MODEL, TRAINING, time_limit_s=10, rel_gap=0.01, options=SearchOptions(multi_pipeline=False))


def moved(plan, *islands):
    """``plan`` with pipeline i's stages all on ``islands[i]``."""
    pipe = plan.pipelines[0]
    pipes = tuple(dc.replace(pipe, stages=tuple(dc.replace(s, island=isl) for s in pipe.stages)) for isl in islands)
    return dc.replace(plan, pipelines=pipes)


def test_dollars_per_hour_step_and_million_tokens(plan):
    c = make_cluster("c", [dict(name="g", **A100)])
    cost = plan_cost(plan, c)
    price = default_price("A100-40").usd_per_gpu_hour
    assert plan.gpus_used == 8
    assert cost.usd_per_hour == pytest.approx(8 * price) == cost.usd_per_hour_cluster
    step_usd = 8 * price * plan.step_time_s / 3600
    assert cost.usd_per_step == pytest.approx(step_usd)
    assert cost.usd_per_1m_tokens == pytest.approx(step_usd / (16 * 1024) * 1e6)
    assert cost.egress_usd_per_step == 0 and cost.idle_groups == () and cost.gpus_idle == 0
    assert "per 1M tokens" in cost.describe() and cost.to_dict()["usd_per_hour"] == cost.usd_per_hour


def test_idle_groups_are_listed_and_not_charged(plan):
    c = make_cluster("c", [dict(name="g", **A100, price_per_gpu_hour=2.0),
                           dict(name="spare", gpu="V100-16", nodes=3, nic_gbps=25, price_per_gpu_hour=1.5)])
    cost = plan_cost(plan, c)
    assert cost.idle_groups == ("spare",) and cost.gpus_idle == 24
    spare = cost.groups[1]
    assert (spare.gpus_used, spare.nodes_idle, spare.price_origin) == (0, 3, "cluster file")
    assert cost.usd_per_hour == pytest.approx(16.0)
    assert cost.usd_per_hour_cluster == pytest.approx(16.0 + 24 * 1.5)
    assert cost.usd_per_1m_tokens_cluster > cost.usd_per_1m_tokens
    assert "spare" in cost.describe() and "3 whole node(s) free" in cost.describe()


def test_a_merged_island_fills_its_cheapest_group_first(plan):
    # same node shape and zone: one island "dear+cheap" of 16 GPUs; the plan uses 8 of them
    c = make_cluster("c", [dict(name="dear", **A100, price_per_gpu_hour=3.0),
                           dict(name="cheap", **A100, price_per_gpu_hour=1.0)])
    cost = plan_cost(moved(plan, "dear+cheap"), c)
    used = {g.group: g.gpus_used for g in cost.groups}
    assert used == {"dear": 0, "cheap": 8} and cost.idle_groups == ("dear",)
    assert cost.usd_per_hour == pytest.approx(8.0)
    assert cost.usd_per_hour_nodes == pytest.approx(8.0)


def test_partial_nodes_are_charged_whole_in_the_node_figure(plan):
    stage = plan.pipelines[0].stages[0]
    half = dc.replace(plan, pipelines=(dc.replace(plan.pipelines[0], stages=(dc.replace(stage, gpus=4),)),))
    c = make_cluster("c", [dict(name="g", gpu="A100-40", nodes=2, nic_gbps=400, price_per_gpu_hour=1.0)])
    cost = plan_cost(half, c)
    g = cost.groups[0]
    assert (g.gpus_used, g.nodes_used, g.nodes_idle, g.gpus_idle) == (4, 1, 1, 12)
    assert cost.usd_per_hour == pytest.approx(4.0) and cost.usd_per_hour_nodes == pytest.approx(8.0)


def two_zones(egress):
    return make_cluster("z", [dict(name="za", **A100, zone="a", price_per_gpu_hour=1.0),
                              dict(name="zb", **A100, zone="b", price_per_gpu_hour=1.0)],
                        [dict(zones=["a", "b"], gbps=100, latency_ms=1, egress_usd_per_gb=egress)])


def test_pipeline_traffic_across_zones_is_priced_per_gb(plan):
    # the plan's stages, then the same stages again on the other zone: one boundary crosses a -> b
    pipe = plan.pipelines[0]
    stages = tuple(dc.replace(s, island="za") for s in pipe.stages) + tuple(dc.replace(s, island="zb")
                                                                           for s in pipe.stages)
    crossing = dc.replace(plan, pipelines=(dc.replace(pipe, stages=stages),))
    cost = plan_cost(crossing, two_zones(0.02), model=MODEL)
    # activations forward and their gradients back: 2 x (sequences x tokens x hidden x 2 bytes) per micro-batch
    nbytes = 2 * pipe.num_micro_batches * pipe.pipeline_micro_batch * 1024 * MODEL.hidden_size * 2
    assert cost.egress_bytes_per_step == ((("a", "b"), pytest.approx(nbytes)),)
    assert cost.egress_usd_per_step == pytest.approx(nbytes / 1e9 * 0.02)
    assert cost.usd_per_step == pytest.approx(16 * 1.0 * plan.step_time_s / 3600 + nbytes / 1e9 * 0.02)
    assert plan_cost(crossing, two_zones(0.0), model=MODEL).egress_usd_per_step == 0


def test_the_gradient_sync_between_pipelines_in_two_zones_is_priced(plan):
    cost = plan_cost(moved(plan, "za", "zb"), two_zones(0.01), model=MODEL, training=TRAINING)
    # two pipelines: a ring of 2 all-reduces every gradient byte, 2 (R-1)/R = 1 times each way across the link
    nbytes = 2 * 2 * MODEL.total_params
    ((link, got),) = cost.egress_bytes_per_step
    assert link == ("a", "b") and got == pytest.approx(nbytes, rel=1e-9)
    assert cost.egress_usd_per_step == pytest.approx(nbytes / 1e9 * 0.01)
    assert cost.egress_usd_per_hour == pytest.approx(cost.egress_usd_per_step * 3600 / plan.step_time_s)


def test_priced_egress_needs_the_model(plan):
    with pytest.raises(SpecError) as e:
        plan_cost(moved(plan, "za", "zb"), two_zones(0.01))
    assert e.value.field == "model" and "zone_links[0].egress_usd_per_gb" in e.value.problem


def test_missing_price_and_a_foreign_cluster_name_the_problem(plan):
    mi = make_cluster("c", [dict(name="g", gpu="MI300X", nodes=1, nic_gbps=400)])
    with pytest.raises(SpecError) as e:
        plan_cost(plan, mi)
    assert e.value.field == "node_groups[0].price_per_gpu_hour"
    other = make_cluster("c", [dict(name="h", **A100)])
    with pytest.raises(SpecError, match="does not have"):
        plan_cost(plan, other)
    small = make_cluster("c", [dict(name="g", gpu="A100-40", nodes=1, gpus_per_node=4, nic_gbps=400)])
    with pytest.raises(SpecError, match="which has 4"):
        plan_cost(plan, small)
