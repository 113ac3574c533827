"""The discrete-event replay: closed forms, an independent longest-path check, trace and memory accounting."""

from __future__ import annotations

import dataclasses
import math
import random

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tangram_opt.cost import CostModel
from tangram_opt.errors import SpecError
from tangram_opt.planner.islands import find_islands, island_link
from tangram_opt.planner.plan import PipelinePlan, Plan, StagePlan
from tangram_opt.sim import EVENT_KINDS, NO_MICRO_BATCH, StageWork, TraceEvent, op_order, replay, simulate
from tangram_opt.specs import ModelSpec, TrainingSpec, make_cluster

REL = 1e-9


def uniform(P: int, f: float, b: float, **kw) -> list[StageWork]:
    return [StageWork(fwd_time_s=f, bwd_time_s=b, **kw) for _ in range(P)]


# --- schedules ------------------------------------------------------------------------------
@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize("P", [1, 2, 3, 5])
@pytest.mark.parametrize("m", [1, 2, 4, 7])
def test_op_order_runs_every_forward_and_backward_once(schedule, P, m):
    for k in range(P):
        order = op_order(schedule, k, P, m)
        assert sorted(order) == sorted([("F", j) for j in range(m)] + [("B", j) for j in range(m)])
        assert all(order.index(("F", j)) < order.index(("B", j)) for j in range(m))
        if schedule == "1f1b":
            warm = min(P - k - 1, m)
            assert order[:warm] == [("F", j) for j in range(warm)]
            assert order[warm] == ("F", warm) if warm < m else order[warm] == ("B", 0)


def test_op_order_1f1b_matches_narayanan_figure():
    # stage 0 of 4 with 8 micro-batches (Narayanan et al. 2021, Fig. 4, top row)
    assert op_order("1f1b", 0, 4, 8) == [
        ("F", 0), ("F", 1), ("F", 2), ("F", 3), ("B", 0), ("F", 4), ("B", 1), ("F", 5), ("B", 2), ("F", 6), ("B", 3),
        ("F", 7), ("B", 4), ("B", 5), ("B", 6), ("B", 7)]
    assert op_order("1f1b", 3, 4, 3) == [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2)]


def test_unknown_schedule_is_a_spec_error():
    with pytest.raises(SpecError, match="schedule"):
        replay(uniform(2, 1.0, 2.0), num_micro_batches=2, schedule="zb-v")


# --- closed forms ---------------------------------------------------------------------------
@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize("P", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("m", [1, 3, 4, 8, 16])
@pytest.mark.parametrize("f,b", [(1.0, 2.0), (0.3, 0.3), (2.5, 0.5)])
def test_uniform_pipeline_makespan_closed_form(schedule, P, m, f, b):
    res, _ = replay(uniform(P, f, b), num_micro_batches=m, schedule=schedule)
    assert res.makespan_s == pytest.approx((m + P - 1) * (f + b), rel=REL)
    assert res.step_time_s == pytest.approx(res.makespan_s, rel=REL)
    for k, s in enumerate(res.stages):
        assert s.busy_s == pytest.approx(m * (f + b), rel=REL)
        assert s.idle_s == pytest.approx((P - 1) * (f + b), rel=REL, abs=1e-12)
        assert s.bubble_fraction == pytest.approx((P - 1) / (m + P - 1), rel=REL, abs=1e-12)
        # stage k waits for its first gradient through the P - 1 - k stages after it, then never again
        assert s.stall_s == pytest.approx((P - 1 - k) * (f + b), rel=REL, abs=1e-12)
        assert s.first_forward_start_s == pytest.approx(k * f, rel=REL)


@pytest.mark.parametrize("P", [1, 2, 3, 4, 6])
@pytest.mark.parametrize("m", [1, 2, 3, 5, 9])
def test_inflight_micro_batches_closed_form(P, m):
    one, _ = replay(uniform(P, 1.0, 2.0), num_micro_batches=m, schedule="1f1b")
    gp, _ = replay(uniform(P, 1.0, 2.0), num_micro_batches=m, schedule="gpipe")
    assert [s.peak_inflight for s in one.stages] == [min(P - k, m) for k in range(P)]
    assert [s.peak_inflight for s in gp.stages] == [m] * P


def test_gpipe_flow_shop_closed_form_with_communication():
    # GPipe is two permutation flow shops (forwards, then backwards) whose machines are the stages and
    # the link channels: makespan = sum of every machine's time + (m - 1) x the slowest machine, per phase.
    for P, m, f, b, c in [(3, 4, 1.0, 2.0, 0.5), (4, 6, 1.0, 2.0, 1.5), (2, 5, 1.0, 1.0, 3.0), (5, 1, 0.7, 1.1, 0.2)]:
        res, _ = replay(uniform(P, f, b), num_micro_batches=m, schedule="gpipe", p2p_s=[c] * (P - 1))
        fwd = P * f + (P - 1) * c + (m - 1) * max(f, c if P > 1 else 0.0)
        bwd = P * b + (P - 1) * c + (m - 1) * max(b, c if P > 1 else 0.0)
        assert res.makespan_s == pytest.approx(fwd + bwd, rel=REL)


def test_1f1b_with_communication_hand_computed():
    # P=2, m=2, F=1, B=2, c=0.5. Stage 1: F0 [1.5, 2.5], B0 [2.5, 4.5], F1 [4.5, 5.5], B1 [5.5, 7.5];
    # stage 0: F0 [0, 1], F1 [1, 2], B0 [5, 7] (gradient arrives at 5), B1 [8, 10].
    res, events = replay(uniform(2, 1.0, 2.0), num_micro_batches=2, schedule="1f1b", p2p_s=[0.5])
    got = {(e.stage, e.kind, e.micro_batch): (e.start_s, e.end_s) for e in events}
    assert got[1, "F", 0] == (1.5, 2.5) and got[1, "B", 0] == (2.5, 4.5)
    assert got[1, "F", 1] == (4.5, 5.5) and got[1, "B", 1] == (5.5, 7.5)
    assert got[0, "B", 0] == (5.0, 7.0) and got[0, "B", 1] == (8.0, 10.0)
    assert got[0, "send_fwd", 1] == (2.0, 2.5) and got[1, "send_bwd", 1] == (7.5, 8.0)
    assert res.makespan_s == 10.0


def test_1f1b_uniform_steady_state_pays_the_round_trip_of_communication():
    # With p2p time c, stage 0 can start micro-batch j + P only after j's gradient has come back: the
    # steady-state period is (P (f + b) + 2 (P - 1) c) / P, not f + b. For m = q P the makespan is
    # q round trips plus the last forward chain's offset.
    P, f, b, c = 3, 1.0, 2.0, 0.25
    per = {}
    for m in (30, 60):
        res, _ = replay(uniform(P, f, b), num_micro_batches=m, schedule="1f1b", p2p_s=[c] * (P - 1))
        per[m] = res.makespan_s
    period = (per[60] - per[30]) / 30
    assert period == pytest.approx(((f + b) * P + 2 * (P - 1) * c) / P, rel=1e-9)


# --- an independent check: longest paths over the dependency graph ---------------------------
def longest_path_times(stages: list[StageWork], m: int, schedule: str, p2p: list[float]) -> dict:
    """Start/end of every op and transfer by fixed-point iteration on the dependency DAG (no event
    queue): an op starts after its predecessor on the stage and after its input arrived; a transfer
    starts after its producer and after the previous transfer on the same FIFO channel."""
    P = len(stages)
    orders = [op_order(schedule, k, P, m) for k in range(P)]
    end: dict = {}
    changed = True
    while changed:
        changed = False
        for k in range(P):
            prev = 0.0
            for kind, j in orders[k]:
                ready = prev
                if kind == "F" and k > 0:
                    ready = max(ready, end.get(("xf", k - 1, j), math.inf))
                if kind == "B" and k < P - 1:
                    ready = max(ready, end.get(("xb", k, j), math.inf))
                dur = stages[k].fwd_time_s if kind == "F" else stages[k].bwd_time_s
                e = ready + dur
                if end.get((kind, k, j)) != e:
                    end[kind, k, j] = e
                    changed = True
                prev = e
        for bnd in range(P - 1):
            for ch, src_kind, src_stage in (("xf", "F", bnd), ("xb", "B", bnd + 1)):
                prev = 0.0
                for j in range(m):
                    e = max(prev, end.get((src_kind, src_stage, j), math.inf)) + p2p[bnd]
                    if end.get((ch, bnd, j)) != e:
                        end[ch, bnd, j] = e
                        changed = True
                    prev = e
    return end


@settings(max_examples=60, deadline=None, derandomize=True)
@given(P=st.integers(1, 5), m=st.integers(1, 9), schedule=st.sampled_from(["1f1b", "gpipe"]),
       seed=st.integers(0, 10**6), comm=st.booleans())
def test_replay_equals_longest_paths(P, m, schedule, seed, comm):
    rng = random.Random(seed)
    stages = [StageWork(fwd_time_s=rng.uniform(0.1, 3), bwd_time_s=rng.uniform(0.1, 5)) for _ in range(P)]
    p2p = [rng.uniform(0, 2) if comm else 0.0 for _ in range(P - 1)]
    res, events = replay(stages, num_micro_batches=m, schedule=schedule, p2p_s=p2p)
    ref = longest_path_times(stages, m, schedule, p2p)
    for e in events:
        key = {"F": ("F", e.stage), "B": ("B", e.stage), "send_fwd": ("xf", e.stage),
               "send_bwd": ("xb", e.stage - 1)}[e.kind] + (e.micro_batch,)
        assert e.end_s == pytest.approx(ref[key], rel=1e-9, abs=1e-12), e
    assert res.makespan_s == pytest.approx(max(v for (kind, *_), v in ref.items() if kind == "B"), rel=1e-9)


# --- trace consistency ----------------------------------------------------------------------
@settings(max_examples=40, deadline=None, derandomize=True)
@given(P=st.integers(1, 5), m=st.integers(1, 8), schedule=st.sampled_from(["1f1b", "gpipe"]),
       seed=st.integers(0, 10**6))
def test_trace_respects_streams_channels_and_dependencies(P, m, schedule, seed):
    rng = random.Random(seed)
    stages = [StageWork(fwd_time_s=rng.uniform(0.1, 3), bwd_time_s=rng.uniform(0.1, 5),
                        tail_time_s=rng.uniform(0, 2)) for _ in range(P)]
    p2p = [rng.uniform(0, 2) for _ in range(P - 1)]
    res, events = replay(stages, num_micro_batches=m, schedule=schedule, p2p_s=p2p)
    by = {(e.stage, e.kind, e.micro_batch): e for e in events}
    assert all(e.kind in EVENT_KINDS and e.end_s >= e.start_s for e in events)
    # one compute stream per stage: F, B and tail never overlap; ops follow the schedule's order
    for k in range(P):
        ops = sorted((e for e in events if e.stage == k and e.kind in ("F", "B", "tail")), key=lambda e: e.start_s)
        assert all(a.end_s <= b.start_s + 1e-12 for a, b in zip(ops, ops[1:]))
        assert [(e.kind, e.micro_batch) for e in ops if e.kind != "tail"] == op_order(schedule, k, P, m)
        tail = [e for e in ops if e.kind == "tail"]
        assert len(tail) == 1 and tail[0].micro_batch == NO_MICRO_BATCH and tail[0] is ops[-1]
        assert tail[0].end_s == pytest.approx(res.stages[k].end_s)
    # each channel carries one transfer at a time, in micro-batch order; both directions are independent
    for k in range(P - 1):
        for kind, sender in (("send_fwd", k), ("send_bwd", k + 1)):
            xs = [by[sender, kind, j] for j in range(m)]
            assert all(a.end_s <= b.start_s + 1e-12 for a, b in zip(xs, xs[1:]))
            assert all(x.duration_s == pytest.approx(p2p[k]) for x in xs)
    # data dependencies
    for j in range(m):
        for k in range(P):
            assert by[k, "F", j].end_s <= by[k, "B", j].start_s + 1e-12
            if k < P - 1:
                assert by[k, "send_fwd", j].start_s >= by[k, "F", j].end_s - 1e-12
                assert by[k + 1, "F", j].start_s >= by[k, "send_fwd", j].end_s - 1e-12
                assert by[k + 1, "send_bwd", j].start_s >= by[k + 1, "B", j].end_s - 1e-12
                assert by[k, "B", j].start_s >= by[k + 1, "send_bwd", j].end_s - 1e-12
    assert len([e for e in events if e.kind in ("F", "B")]) == 2 * P * m
    assert len([e for e in events if e.kind.startswith("send")]) == 2 * (P - 1) * m


# --- monotonicity and bounds ------------------------------------------------------------------
@settings(max_examples=40, deadline=None, derandomize=True)
@given(P=st.integers(1, 5), m=st.integers(1, 8), schedule=st.sampled_from(["1f1b", "gpipe"]),
       seed=st.integers(0, 10**6), what=st.sampled_from(["fwd", "bwd", "tail", "p2p", "m"]))
def test_more_work_never_shortens_the_step(P, m, schedule, seed, what):
    rng = random.Random(seed)
    stages = [StageWork(fwd_time_s=rng.uniform(0.1, 3), bwd_time_s=rng.uniform(0.1, 5),
                        tail_time_s=rng.uniform(0, 2)) for _ in range(P)]
    p2p = [rng.uniform(0, 2) for _ in range(P - 1)]
    base, _ = replay(stages, num_micro_batches=m, schedule=schedule, p2p_s=p2p)
    k = rng.randrange(P)
    grow = rng.uniform(0.01, 3)
    m2 = m
    if what in ("fwd", "bwd", "tail"):
        stages[k] = dataclasses.replace(stages[k], **{f"{what}_time_s": getattr(stages[k], f"{what}_time_s") + grow})
    elif what == "p2p" and P > 1:
        p2p[k % (P - 1)] += grow
    elif what == "m":
        m2 = m + 1
    more, _ = replay(stages, num_micro_batches=m2, schedule=schedule, p2p_s=p2p)
    assert more.step_time_s >= base.step_time_s - 1e-12
    assert more.makespan_s >= base.makespan_s - 1e-12


@settings(max_examples=40, deadline=None, derandomize=True)
@given(P=st.integers(1, 6), m=st.integers(1, 10), schedule=st.sampled_from(["1f1b", "gpipe"]),
       seed=st.integers(0, 10**6))
def test_step_between_busiest_stage_and_fully_serialized(P, m, schedule, seed):
    rng = random.Random(seed)
    stages = [StageWork(fwd_time_s=rng.uniform(0.1, 3), bwd_time_s=rng.uniform(0.1, 5),
                        tail_time_s=rng.uniform(0, 2)) for _ in range(P)]
    p2p = [rng.uniform(0, 2) for _ in range(P - 1)]
    res, _ = replay(stages, num_micro_batches=m, schedule=schedule, p2p_s=p2p)
    busiest = max(m * s.time_s + s.tail_time_s for s in stages)
    serial = sum(m * s.time_s + s.tail_time_s for s in stages) + 2 * m * sum(p2p)
    assert busiest - 1e-9 <= res.step_time_s <= serial + 1e-9


# --- memory ---------------------------------------------------------------------------------
@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize("P,m", [(1, 1), (3, 2), (4, 8), (4, 4)])
def test_memory_peak_and_timeline(schedule, P, m):
    stages = [StageWork(fwd_time_s=1.0 + 0.1 * k, bwd_time_s=2.0, static_bytes=1000.0 * (k + 1),
                        activation_bytes=100.0, transient_bytes=7.0, capacity_bytes=1e9) for k in range(P)]
    res, _ = replay(stages, num_micro_batches=m, schedule=schedule, p2p_s=[0.1] * (P - 1))
    for k, s in enumerate(res.stages):
        inflight = m if schedule == "gpipe" else min(P - k, m)
        assert s.peak_inflight == inflight
        assert s.peak_memory_bytes == pytest.approx(1000.0 * (k + 1) + 100.0 * inflight + 7.0)
        tl = s.memory_timeline
        assert tl[0] == (0.0, 1000.0 * (k + 1)) and tl[-1][1] == pytest.approx(1000.0 * (k + 1))
        assert all(a[0] <= b[0] for a, b in zip(tl, tl[1:]))
        assert min(b for _, b in tl) == pytest.approx(1000.0 * (k + 1))
        assert s.fits


def test_gpipe_holds_more_activations_than_1f1b():
    stages = [StageWork(fwd_time_s=1.0, bwd_time_s=2.0, static_bytes=10.0, activation_bytes=5.0) for _ in range(4)]
    one, _ = replay(stages, num_micro_batches=8, schedule="1f1b")
    gp, _ = replay(stages, num_micro_batches=8, schedule="gpipe")
    assert all(g.peak_memory_bytes >= o.peak_memory_bytes for g, o in zip(gp.stages, one.stages))
    assert gp.stages[0].peak_memory_bytes == 10.0 + 8 * 5.0 > one.stages[0].peak_memory_bytes == 10.0 + 4 * 5.0


def test_overflow_is_reported_per_stage():
    stages = [StageWork(fwd_time_s=1.0, bwd_time_s=2.0, static_bytes=10.0, activation_bytes=5.0, capacity_bytes=24.0)
              for _ in range(3)]
    res, _ = replay(stages, num_micro_batches=4, schedule="1f1b")
    assert [s.fits for s in res.stages] == [False, True, True]  # stage 0 holds 3 micro-batches: 10 + 3 x 5 > 24


# --- simulate() on real plans: specs -> cost model -> replay ----------------------------------
CLUSTER = make_cluster("sim-test", [dict(name="a100", gpu="A100-40", nodes=1, gpus_per_node=4, nic_gbps=200),
                                    dict(name="v100", gpu="V100-16", nodes=1, gpus_per_node=8, nic_gbps=100)])
MODEL = ModelSpec(name="toy-1b", num_layers=8, hidden_size=2048, ffn_hidden_size=5632, num_attention_heads=16,
                  num_kv_heads=4, vocab_size=32000)
TRAINING = TrainingSpec(global_batch_size=16, seq_len=1024, precision="fp16")


def stage_plan(island: str, gpu: str, first: int, n: int, *, last: bool, tp: int = 1, dp: int = 1, cp: int = 1,
               mb: int = 1, zero: int = 0, recompute: str = "none", dense: bool = True) -> StagePlan:
    return StagePlan(island=island, gpu=gpu, gpus=tp * dp * cp, tp=tp, cp=cp, dp=dp, ep=1, zero=zero,
                     recompute=recompute, micro_batch_size=mb, first_layer=first,
                     num_dense_layers=n if dense else 0, num_moe_layers=0 if dense else n, has_embedding=first == 0,
                     has_head=last, fwd_time_s=0.0, bwd_time_s=0.0, tail_time_s=0.0, p2p_time_s=0.0,
                     memory_bytes=0.0, capacity_bytes=0.0, inflight=0)


def make_plan(stages: list[StagePlan], *, b: int, m: int, schedule: str = "1f1b", extra: list | None = None) -> Plan:
    pipes = [PipelinePlan(stages=tuple(stages), pipeline_micro_batch=b, num_micro_batches=m, schedule=schedule,
                          makespan_s=0.0, step_time_s=0.0, bottleneck_s=0.0)] + list(extra or [])
    return Plan(cluster=CLUSTER.name, model=MODEL.name, method="hand", global_batch_size=TRAINING.global_batch_size,
                seq_len=TRAINING.seq_len, precision=TRAINING.precision, pipelines=tuple(pipes), step_time_s=1.0,
                model_flops_per_step=1.0, used_peak_flops_per_s=1.0, cluster_peak_flops_per_s=1.0)


def three_stage_plan(schedule: str = "1f1b") -> Plan:
    return make_plan([stage_plan("a100", "A100-40", 0, 4, last=False, tp=2, dp=2, mb=1),
                      stage_plan("v100", "V100-16", 4, 2, last=False, tp=2, dp=2, zero=1, recompute="selective"),
                      stage_plan("v100", "V100-16", 6, 2, last=True, tp=4, dp=1, mb=2, recompute="full")],
                     b=2, m=8, schedule=schedule)


def test_simulate_prices_stages_from_the_specs():
    plan = three_stage_plan()
    res = simulate(plan, CLUSTER, MODEL, TRAINING)
    cost = CostModel(MODEL, TRAINING)
    isl = {i.name: i for i in find_islands(CLUSTER)}
    for s, sr in zip(plan.pipelines[0].stages, res.stages):
        node = isl[s.island].node
        parts = [(cost.layer(node, s.config, "dense"), s.num_dense_layers)]
        parts += [(cost.embedding(node, s.config), 1)] if s.has_embedding else []
        parts += [(cost.head(node, s.config), 1)] if s.has_head else []
        assert sr.fwd_time_s == pytest.approx(sum(c.fwd_time_s * n for c, n in parts))
        assert sr.bwd_time_s == pytest.approx(sum(c.bwd_time_s * n for c, n in parts))
        assert sr.tail_time_s == pytest.approx(sum(c.step_tail_time_s * n for c, n in parts))
        assert sr.capacity_bytes == cost.usable_memory_bytes(node)
        assert sr.busy_s == pytest.approx(8 * (sr.fwd_time_s + sr.bwd_time_s))
    # p2p on the actual link between the two stages' islands
    pipe = res.pipelines[0]
    for k in range(2):
        a, b = plan.pipelines[0].stages[k:k + 2]
        link = island_link(CLUSTER, isl[a.island], isl[b.island])
        assert pipe.p2p_time_s[k] == pytest.approx(cost.p2p_time_s((isl[a.island].node, a.config),
                                                                   (isl[b.island].node, b.config), link))
    assert pipe.p2p_time_s[0] != pipe.p2p_time_s[1]  # NIC between islands, NVLink inside the v100 node
    assert res.step_time_s == pytest.approx(max(s.end_s for s in res.stages))


def test_simulate_ignores_the_times_stored_in_the_plan_and_check_names_the_stage():
    plan = three_stage_plan()
    res = simulate(plan, CLUSTER, MODEL, TRAINING)
    pipe = plan.pipelines[0]
    # a plan whose stored times are the simulator's own (as the planner would write them) is confirmed ...
    stages = [dataclasses.replace(s, fwd_time_s=r.fwd_time_s, bwd_time_s=r.bwd_time_s, tail_time_s=r.tail_time_s,
                                  p2p_time_s=(res.pipelines[0].p2p_time_s + (0.0,))[k],
                                  memory_bytes=r.peak_memory_bytes)
              for k, (s, r) in enumerate(zip(pipe.stages, res.stages))]
    upstream = [sum(r.bwd_time_s + c for r, c in zip(res.stages[:k], res.pipelines[0].p2p_time_s)) for k in range(3)]
    good_pipe = dataclasses.replace(pipe, stages=tuple(stages), makespan_s=res.pipelines[0].makespan_s)
    good = dataclasses.replace(plan, pipelines=(good_pipe,), step_time_s=res.step_time_s)
    again = simulate(good, CLUSTER, MODEL, TRAINING)
    assert again.step_time_s == res.step_time_s
    cmp = again.compare_with(good)
    assert cmp.step_rel_diff == 0.0
    # the planner's end-of-tail model: makespan - sum_{j<k} (B_j + c_j) + tail_k
    for d, up, r in zip(cmp.stages, upstream, res.stages):
        assert d.predicted_end_s == pytest.approx(res.pipelines[0].makespan_s - up + r.tail_time_s)
    # ... a stage whose stored backward disagrees with the specs is named
    bad_stages = list(stages)
    bad_stages[1] = dataclasses.replace(stages[1], bwd_time_s=stages[1].bwd_time_s * 0.8)
    bad = dataclasses.replace(good, pipelines=(dataclasses.replace(good_pipe, stages=tuple(bad_stages)),))
    assert simulate(bad, CLUSTER, MODEL, TRAINING).step_time_s == res.step_time_s
    problems = again.check(bad)
    assert len(problems) == 1 and "pipeline 0 stage 1" in problems[0] and "bwd_time_s" in problems[0]
    # ... and so is a step time the replay does not confirm
    slow = dataclasses.replace(good, step_time_s=res.step_time_s * 0.9)
    problems = again.check(slow)
    assert len(problems) == 1 and "step time" in problems[0] and "stage" in problems[0]
    assert again.check(dataclasses.replace(good, step_time_s=res.step_time_s * 0.99)) == []


def test_simulate_reports_memory_overflow_by_stage():
    plan = make_plan([stage_plan("v100", "V100-16", 0, 8, last=True, tp=1, dp=1, mb=8)], b=8, m=2)
    res = simulate(plan, CLUSTER, MODEL, TRAINING)
    assert not res.fits and not res.stages[0].fits
    assert any("pipeline 0 stage 0" in p and "exceeds" in p for p in res.check(plan, rtol=1e9))


def test_simulate_gpipe_vs_1f1b_memory_and_schedule_override():
    plan = three_stage_plan()
    one = simulate(plan, CLUSTER, MODEL, TRAINING)
    gp = simulate(plan, CLUSTER, MODEL, TRAINING, schedule="gpipe")
    assert simulate(three_stage_plan("gpipe"), CLUSTER, MODEL, TRAINING).step_time_s == gp.step_time_s
    assert [s.peak_inflight for s in one.stages] == [3, 2, 1]
    assert [s.peak_inflight for s in gp.stages] == [8, 8, 8]
    for o, g in zip(one.stages, gp.stages):
        assert g.peak_memory_bytes > o.peak_memory_bytes


def test_several_pipelines_take_the_slowest_plus_the_cross_pipeline_hook():
    p1 = three_stage_plan()
    second = PipelinePlan(stages=(stage_plan("v100", "V100-16", 0, 8, last=True, tp=4, dp=1, mb=1,
                                             recompute="full"),),
                          pipeline_micro_batch=1, num_micro_batches=8, schedule="1f1b", makespan_s=0.0,
                          step_time_s=0.0, bottleneck_s=0.0)
    plan = dataclasses.replace(p1, pipelines=(p1.pipelines[0], second))
    res = simulate(plan, CLUSTER, MODEL, TRAINING)
    # issue 10: the default hook prices the all-reduce across pipelines (tangram_opt.sim.cross_sync),
    # and the optimizer runs after it (each stage's tail is then its gradient sync alone)
    assert len(res.pipelines) == 2 and res.cross_pipeline_sync_s > 0.0 and res.post_sync_time_s > 0.0
    assert res.step_time_s == pytest.approx(max(p.step_time_s for p in res.pipelines) + res.cross_pipeline_sync_s
                                            + res.post_sync_time_s)
    assert {e.pipeline for e in res.events} == {0, 1}
    hooked = simulate(plan, CLUSTER, MODEL, TRAINING, cross_pipeline_sync=lambda plan, pipes: 0.25)
    assert hooked.step_time_s == pytest.approx(res.step_time_s - res.cross_pipeline_sync_s + 0.25)


def test_trace_dataframes():
    res = simulate(three_stage_plan(), CLUSTER, MODEL, TRAINING)
    df = res.to_dataframe()
    assert isinstance(df, pd.DataFrame) and len(df) == len(res.events)
    assert list(df.columns) == ["pipeline", "stage", "kind", "micro_batch", "start_s", "end_s", "duration_s", "lane"]
    assert set(df.kind) == set(EVENT_KINDS)
    assert (df.start_s.diff().dropna() >= 0).all()  # sorted by start
    assert set(df.lane) >= {"p0.s0", "p0.s0>s1", "p0.s1>s0", "p0.s2>s1"}
    assert df[df.kind == "tail"].micro_batch.eq(NO_MICRO_BATCH).all()
    mem = res.memory_dataframe()
    assert list(mem.columns) == ["pipeline", "stage", "time_s", "bytes", "capacity_bytes"]
    assert mem.groupby("stage").bytes.max().tolist() == pytest.approx(list(res.peak_memory_bytes))
    rows = res.gpu_peak_memory()
    assert len(rows) == sum(s.gpus for s in three_stage_plan().stages) == 12
    assert isinstance(res.events[0], TraceEvent)


def test_unknown_island_is_a_spec_error():
    plan = make_plan([stage_plan("h100", "H100-SXM", 0, 8, last=True)], b=1, m=16)
    with pytest.raises(SpecError, match="island"):
        simulate(plan, CLUSTER, MODEL, TRAINING)


def test_the_checker_shares_no_code_with_the_planner_formulation():
    # independence (issue 5): the simulator and validator read only specs, the cost model, the
    # island map and the Plan types, never the candidate tables, the MIP or its closed form
    import ast
    from pathlib import Path

    import tangram_opt.sim as sim

    forbidden = ("tangram_opt.planner.formulations.pipeline_model", "tangram_opt.planner.formulations.positional",
                 "tangram_opt.planner.candidates", "tangram_opt.planner.assemble", "tangram_opt.planner.search",
                 "tangram_opt.planner.context", "tangram_opt.solvers", "tangram_opt.baselines")
    for path in Path(sim.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            assert not [n for n in names if n.startswith(forbidden)], f"{path.name} imports {names}"
