"""The plan validator: every rule broken once, all violations reported together with stage and field."""

from __future__ import annotations

import dataclasses

import pytest

from tangram_opt import validate
from tangram_opt.errors import SpecError
from tangram_opt.planner.islands import find_islands
from tangram_opt.planner.plan import PipelinePlan, Plan, StagePlan
from tangram_opt.sim import PlanValidationError, Violation, validate_or_raise
from tangram_opt.sim.validate import _packs
from tangram_opt.specs import ModelSpec, MoESpec, TrainingSpec, make_cluster
from tangram_opt.specs.presets import load_model

CLUSTER = make_cluster("val-test", [dict(name="a100", gpu="A100-40", nodes=1, gpus_per_node=4, nic_gbps=200),
                                    dict(name="v100", gpu="V100-16", nodes=2, gpus_per_node=4, nic_gbps=100),
                                    dict(name="l4", gpu="L4", nodes=1, gpus_per_node=6, nic_gbps=100)])
# 8 heads / 2 KV heads, 6 experts, 2 dense-first layers then 4 MoE layers
MODEL = ModelSpec(name="toy-moe", num_layers=6, hidden_size=1024, ffn_hidden_size=2816, num_attention_heads=8,
                  num_kv_heads=2, vocab_size=32000,
                  moe=MoESpec(num_experts=6, top_k=2, expert_ffn_hidden_size=1408, first_dense_layers=2))
TRAINING = TrainingSpec(global_batch_size=16, seq_len=1024, precision="fp16")
GPU = {"a100": "A100-40", "v100": "V100-16", "l4": "L4"}


def stage(island: str, first: int, dense: int, moe: int, *, tp: int = 1, cp: int = 1, dp: int = 2, ep: int = 1,
          mb: int = 1, zero: int = 0, recompute: str = "none", emb: bool = False, head: bool = False) -> StagePlan:
    return StagePlan(island=island, gpu=GPU.get(island, "?"), gpus=tp * cp * dp, tp=tp, cp=cp, dp=dp, ep=ep, zero=zero,
                     recompute=recompute, micro_batch_size=mb, first_layer=first, num_dense_layers=dense,
                     num_moe_layers=moe, has_embedding=emb, has_head=head, fwd_time_s=0.0, bwd_time_s=0.0,
                     tail_time_s=0.0, p2p_time_s=0.0, memory_bytes=0.0, capacity_bytes=0.0, inflight=0)


def valid_plan(precision: str = "fp16") -> Plan:
    stages = (stage("a100", 0, 2, 1, tp=2, dp=2, ep=2, emb=True),
              stage("v100", 3, 0, 2, tp=1, dp=2, cp=2, ep=2, zero=1),
              stage("v100", 5, 0, 1, tp=2, dp=2, recompute="full", head=True))
    pipe = PipelinePlan(stages=stages, pipeline_micro_batch=2, num_micro_batches=8, schedule="1f1b", makespan_s=1.0,
                        step_time_s=1.0, bottleneck_s=0.1)
    return Plan(cluster=CLUSTER.name, model=MODEL.name, method="hand", global_batch_size=16, seq_len=1024,
                precision=precision, pipelines=(pipe,), step_time_s=1.0, model_flops_per_step=1.0,
                used_peak_flops_per_s=1.0, cluster_peak_flops_per_s=1.0)


def with_stage(plan: Plan, k: int, **changes) -> Plan:
    pipe = plan.pipelines[0]
    stages = list(pipe.stages)
    stages[k] = dataclasses.replace(stages[k], **changes)
    return dataclasses.replace(plan, pipelines=(dataclasses.replace(pipe, stages=tuple(stages)),))


def with_pipe(plan: Plan, **changes) -> Plan:
    return dataclasses.replace(plan, pipelines=(dataclasses.replace(plan.pipelines[0], **changes),))


def keys(violations: list[Violation]) -> set[tuple]:
    return {(v.pipeline, v.stage, v.field) for v in violations}


def test_the_reference_plan_is_valid():
    assert validate(valid_plan(), CLUSTER, MODEL, TRAINING) == []
    validate_or_raise(valid_plan(), CLUSTER, MODEL, TRAINING)


# (name, mutation, expected (pipeline, stage, field), a word the message must contain)
CASES = [
    ("layer gap", lambda p: with_stage(with_stage(p, 1, first_layer=4, num_moe_layers=1), 2, first_layer=5),
     (0, 1, "first_layer"), "gap"),
    ("layer overlap", lambda p: with_stage(p, 2, first_layer=4, num_moe_layers=2), (0, 2, "first_layer"), "overlaps"),
    ("layer missing", lambda p: with_stage(p, 2, num_moe_layers=0), (0, None, "stages"), "6 layers"),
    ("empty stage", lambda p: with_stage(p, 2, num_moe_layers=0), (0, 2, "num_layers"), "no transformer layer"),
    ("layer out of range", lambda p: with_stage(p, 2, num_moe_layers=2), (0, 2, "first_layer"), "outside"),
    ("dense first", lambda p: with_stage(p, 0, num_dense_layers=1, num_moe_layers=2), (0, 0, "num_dense_layers"),
     "dense layers come first"),
    ("embedding off first", lambda p: with_stage(p, 1, has_embedding=True), (0, 1, "has_embedding"), "first stage"),
    ("embedding missing", lambda p: with_stage(p, 0, has_embedding=False), (0, 0, "has_embedding"), "first stage"),
    ("head missing", lambda p: with_stage(p, 2, has_head=False), (0, 2, "has_head"), "last stage"),
    ("head off last", lambda p: with_stage(p, 0, has_head=True), (0, 0, "has_head"), "last stage"),
    ("tp x cp x dp", lambda p: with_stage(p, 0, gpus=2), (0, 0, "gpus"), "tp(2) x cp(1) x dp(2) = 4"),
    ("node shape", lambda p: with_stage(p, 2, island="l4", gpu="L4"), (0, 2, "gpus"), "neither a divisor"),
    ("island budget", lambda p: with_stage(p, 1, island="a100", gpu="A100-40"), (None, None, "island[a100].gpus"),
     "island 'a100' has 4"),
    ("attention heads", lambda p: with_stage(p, 2, island="l4", gpu="L4", tp=3, gpus=6), (0, 2, "tp"),
     "8 attention heads"),
    ("kv heads", lambda p: with_stage(p, 0, tp=4, dp=1, gpus=4, micro_batch_size=2, ep=1), (0, 0, "tp"), "2 KV heads"),
    ("experts", lambda p: with_stage(p, 1, ep=4), (0, 1, "ep"), "6 experts"),
    ("ep vs dp x cp", lambda p: with_stage(p, 1, ep=3), (0, 1, "ep"), "dp(2) x cp(2) = 4"),
    ("context parallel seq_len", lambda p: with_stage(p, 2, island="l4", gpu="L4", tp=1, cp=3, dp=2, gpus=6, ep=2),
     (0, 2, "cp"), "2 x cp(3)"),
    ("tp across nodes", lambda p: with_stage(p, 1, tp=8, dp=1, cp=1, gpus=8, micro_batch_size=2, ep=1),
     (0, 1, "tp"), "exceeds"),
    ("zero stage", lambda p: with_stage(p, 1, zero=5), (0, 1, "zero"), "ZeRO"),
    ("recompute mode", lambda p: with_stage(p, 2, recompute="sometimes"), (0, 2, "recompute"), "recomputation"),
    ("micro-batch", lambda p: with_stage(p, 0, micro_batch_size=2), (0, 0, "micro_batch_size"),
     "pipeline micro-batch is 2"),
    ("global batch", lambda p: with_pipe(p, num_micro_batches=7), (None, None, "pipelines.num_micro_batches"),
     "global batch is 16"),
    ("unknown island", lambda p: with_stage(p, 1, island="h100"), (0, 1, "island"), "not an island"),
    ("gpu type", lambda p: with_stage(p, 0, gpu="A100-80"), (0, 0, "gpu"), "A100-40"),
    ("schedule", lambda p: with_pipe(p, schedule="zero-bubble"), (0, None, "schedule"), "1f1b"),
    ("training mismatch", lambda p: dataclasses.replace(p, seq_len=2048), (None, None, "seq_len"), "1024"),
]


@pytest.mark.parametrize("name,mutate,where,word", CASES, ids=[c[0] for c in CASES])
def test_each_rule_is_reported_with_stage_and_field(name, mutate, where, word):
    found = validate(mutate(valid_plan()), CLUSTER, MODEL, TRAINING)
    hits = [v for v in found if (v.pipeline, v.stage, v.field) == where]
    assert hits, f"{name}: expected a violation at {where}, got {[str(v) for v in found]}"
    assert any(word in v.message for v in hits), [str(v) for v in hits]


def test_precision_unsupported_by_the_island():
    bf16 = dataclasses.replace(TRAINING, precision="bf16")
    found = validate(valid_plan("bf16"), CLUSTER, MODEL, bf16)
    assert {(0, 1, "island"), (0, 2, "island")} <= keys(found)
    assert all("V100-16 does not support bf16" in v.message for v in found if v.field == "island")
    assert (0, 0, "island") not in keys(found)


def test_memory_recomputed_from_the_cost_model():
    model = load_model("llama-3-8b").with_layers(8)
    cluster = make_cluster("one-v100", [dict(name="v100", gpu="V100-16", nodes=1, gpus_per_node=1, nic_gbps=100)])
    training = TrainingSpec(global_batch_size=4, seq_len=2048, precision="fp16")
    st = StagePlan(island="v100", gpu="V100-16", gpus=1, tp=1, cp=1, dp=1, ep=1, zero=0, recompute="none",
                   micro_batch_size=1, first_layer=0, num_dense_layers=8, num_moe_layers=0, has_embedding=True,
                   has_head=True, fwd_time_s=0.0, bwd_time_s=0.0, tail_time_s=0.0, p2p_time_s=0.0,
                   memory_bytes=1.0, capacity_bytes=1e12, inflight=1)  # the stored figures are not trusted
    pipe = PipelinePlan(stages=(st,), pipeline_micro_batch=1, num_micro_batches=4, schedule="1f1b", makespan_s=1.0,
                        step_time_s=1.0, bottleneck_s=1.0)
    plan = Plan(cluster="one-v100", model=model.name, method="hand", global_batch_size=4, seq_len=2048,
                precision="fp16", pipelines=(pipe,), step_time_s=1.0, model_flops_per_step=1.0,
                used_peak_flops_per_s=1.0, cluster_peak_flops_per_s=1.0)
    found = validate(plan, cluster, model, training)
    assert keys(found) == {(0, 0, "memory_bytes")}
    assert "exceeds the usable" in found[0].message and "V100-16" in found[0].message


def test_all_violations_are_reported_at_once():
    plan = valid_plan()
    plan = with_stage(plan, 0, gpus=2)  # tp x cp x dp
    plan = with_stage(plan, 1, zero=7, recompute="always", ep=3)  # two invalid values and an ep rule
    plan = with_stage(plan, 2, has_head=False, island="nowhere")
    plan = with_pipe(plan, num_micro_batches=4)
    found = validate(plan, CLUSTER, MODEL, TRAINING)
    expected = {(0, 0, "gpus"), (0, 1, "zero"), (0, 1, "recompute"), (0, 2, "has_head"), (0, 2, "island"),
                (None, None, "pipelines.num_micro_batches")}
    assert expected <= keys(found)
    with pytest.raises(PlanValidationError) as info:
        validate_or_raise(plan, CLUSTER, MODEL, TRAINING)
    err = info.value
    assert isinstance(err, SpecError) and err.violations == found
    text = str(err)
    for v in found:
        assert str(v) in text
    assert "pipeline 0 stage 1: zero:" in text


def test_two_pipelines_share_the_island_budget():
    plan = valid_plan()
    pipe = plan.pipelines[0]
    half = dataclasses.replace(pipe, num_micro_batches=4)
    two = dataclasses.replace(plan, pipelines=(half, half))
    found = validate(two, CLUSTER, MODEL, TRAINING)
    # each pipeline takes 4 A100s and 8 V100s: twice that exceeds both islands
    assert keys(found) == {(None, None, "island[a100].gpus"), (None, None, "island[v100].gpus")}
    assert validate(dataclasses.replace(two, pipelines=(half,)), CLUSTER, MODEL, TRAINING) == [
        Violation(pipeline=None, stage=None, field="pipelines.num_micro_batches",
                  message="pipeline_micro_batch x num_micro_batches summed over pipelines = 2 x 4 = 8 sequences, "
                          "but the global batch is 16")]


def test_node_packing_rule():
    # 30-GPU nodes: stages of 15 + 10 + 10 + 6 x 4 = 59 GPUs fit 60 in total but not without splitting one
    big = make_cluster("odd", [dict(name="odd", gpu="A100-80", nodes=2, gpus_per_node=30, nic_gbps=400)])
    (isl,) = find_islands(big)
    assert not _packs([6, 6, 6, 6, 10, 10, 15], isl)
    assert _packs([15, 15, 10, 10, 10], isl)
    assert _packs([30, 15, 10, 5], isl)
    assert not _packs([30, 30, 1], isl)


def test_violation_str_names_where():
    v = Violation(pipeline=0, stage=2, field="tp", message="x")
    assert str(v) == "pipeline 0 stage 2: tp: x"
    assert str(Violation(pipeline=None, stage=None, field="seq_len", message="y")) == "plan: seq_len: y"


def test_other_cost_model_rejections_are_reported_under_config():
    from tangram_opt.cost import CostModel

    fp32 = dataclasses.replace(TRAINING, precision="fp32")
    cost = CostModel(MODEL, fp32, attention_kernel="flash")  # flash attention needs 16-bit training
    found = validate(valid_plan("fp32"), CLUSTER, MODEL, fp32, cost=cost)
    assert keys(found) == {(0, 0, "config"), (0, 1, "config"), (0, 2, "config")}
    assert all("flash" in v.message for v in found)
    assert validate(valid_plan("fp32"), CLUSTER, MODEL, fp32) == []
