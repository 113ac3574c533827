"""``enumerate_types`` (planner/formulations/stage_types.py) prices every candidate at once with
numpy; its types must be the ones the one-at-a-time rules give (``stage_type``'s ``_tolerance`` and
``_type_of``, then the exact Pareto front of formulations/pipeline_mip.md §3), to the last bit and in
the same order: the window models are built from these lists in order."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tangram_opt.planner.candidates.table import sends_no_slower
from tangram_opt.planner.context import PlanningContext
from tangram_opt.planner.formulations import stage_types
from tangram_opt.planner.formulations.inflight import inflight_from_end
from tangram_opt.planner.formulations.stage_types import ROLES, _tolerance, _type_of, enumerate_types
from tangram_opt.planner.space import SearchSpace
from tangram_opt.specs import TrainingSpec, load_cluster, load_model, make_cluster


def one_at_a_time(problem, cutoff_s=None):
    """The rules of enumerate_types candidate by candidate, layer count by layer count, and the
    front kept by comparing each type with the ones kept before it (the implementation before numpy)."""
    m = problem.num_micro_batches
    gpipe = problem.schedule == "gpipe"
    q_mid = inflight_from_end(1, m, problem.schedule)
    kinds = problem.kinds
    cutoff = cutoff_s if cutoff_s else math.inf
    out = {r: [] for r in ROLES}
    for ci, c in enumerate(problem.candidates):
        for role in ROLES:
            first, last = role == "first", role == "last"
            q = inflight_from_end(0, m, problem.schedule) if last else q_mid
            main = kinds[-1]
            fixed = {kinds[0]: problem.layers[kinds[0]]} if (len(kinds) == 2 and first) else {}
            for n in range(0 if fixed else 1, problem.layers[main] + 1):
                layers = dict(fixed)
                layers[main] = layers.get(main, 0) + n
                if sum(layers.values()) < 1:
                    continue
                tol = _tolerance(c, layers, first=first, last=last, q_min=q, m=m)
                if tol < q:
                    break
                t = _type_of(c, ci, role, layers, m, tol)
                if (max(t.fwd_s, t.bwd_s) if gpipe else t.time_s) > cutoff / m * (2 if gpipe else 1):
                    break
                if (gpipe and tol < m) or t.time_s * m + t.tail_s > cutoff:
                    continue
                out[role].append(t)
    cands = problem.candidates
    for role in ROLES:
        groups = {}
        for t in out[role]:
            groups.setdefault((cands[t.candidate].island, t.layers), []).append(t)
        kept = []
        for group in groups.values():
            group.sort(key=lambda t: (t.time_s, cands[t.candidate].gpus, t.fwd_s, t.tail_s, -t.tolerance))
            front = []
            for t in group:
                if not any(f.time_s <= t.time_s and f.fwd_s <= t.fwd_s and f.tail_s <= t.tail_s
                           and f.tolerance >= t.tolerance and cands[f.candidate].gpus <= cands[t.candidate].gpus
                           and (not gpipe or f.bwd_s <= t.bwd_s)
                           and sends_no_slower(cands[f.candidate], cands[t.candidate]) for f in front):
                    front.append(t)
            kept.extend(front)
        out[role] = kept
    return out


def _cutoffs(problem):
    """No cutoff, and cutoffs at which some types go (a quarter, half and all of the slowest)."""
    types = one_at_a_time(problem)
    m = problem.num_micro_batches
    worst = max((t.time_s * m + t.tail_s for ts in types.values() for t in ts), default=1.0)
    return [None, worst / 4, worst / 2, worst]


GPUS = ["V100-32", "A100-40", "H100-SXM", "L4"]
# one kind of layer, MoE only, and dense layers before MoE ones (the first role holds them all)
MODELS = ["llama-3-8b", "mixtral-8x7b", "deepseek-v2-lite"]


@st.composite
def problems(draw):
    n_groups = draw(st.integers(1, 3))
    gpus = draw(st.lists(st.sampled_from(GPUS), min_size=n_groups, max_size=n_groups, unique=True))
    groups = [dict(name=f"g{i}", gpu=g, nodes=draw(st.integers(1, 2)), gpus_per_node=draw(st.sampled_from([1, 2, 4])),
                   nic_gbps=draw(st.sampled_from([25, 100, 400])))
              for i, g in enumerate(gpus)]
    model = load_model(draw(st.sampled_from(MODELS))).with_layers(draw(st.integers(2, 12)))
    training = TrainingSpec(global_batch_size=draw(st.sampled_from([4, 16, 64])), seq_len=draw(st.sampled_from([1024, 4096])),
                            precision="fp16" if "V100-32" in gpus else "bf16")
    space = SearchSpace(zero=(0, 1, 3), recompute=("none", "full"), cp=(1,), micro_batch_sizes=(1, 2),
                        schedule=draw(st.sampled_from(["1f1b", "gpipe"])))
    ctx = PlanningContext(make_cluster("random", groups), model, training, space=space)
    return ctx.problem(draw(st.sampled_from(ctx.pipeline_micro_batches()[:3])))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems())
def test_the_types_are_the_one_at_a_time_types_in_their_order(problem):
    for cutoff in _cutoffs(problem):
        assert enumerate_types(problem, cutoff) == one_at_a_time(problem, cutoff)


def test_a_table_of_thousands_of_candidates_gives_the_same_types():
    # two islands, an MoE model, a table as large as those of the communication-bound family
    ctx = PlanningContext(load_cluster("a100-v100"), load_model("mixtral-8x7b"),
                          TrainingSpec(global_batch_size=256, seq_len=4096, precision="fp16"))
    problem = ctx.problem(8)
    assert len(problem.candidates) > 1000
    for cutoff in (None, _cutoffs(problem)[1]):
        fast = enumerate_types(problem, cutoff)
        assert fast == one_at_a_time(problem, cutoff)
        assert sum(map(len, fast.values())) > 100


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(*[st.integers(0, 3)] * 4), min_size=1, max_size=40), st.integers(1, 7))
def test_dominated_rows_in_blocks_are_those_a_kept_earlier_row_dominates(rows, block):
    cols = np.array(sorted(rows), dtype=np.float64)  # sorted: every dominating row comes first or ties
    kept = []
    expect = []
    for r in cols.tolist():
        gone = any(all(a <= b for a, b in zip(f, r)) for f in kept)
        expect.append(gone)
        if not gone:
            kept.append(r)
    saved = stage_types._FRONT_BLOCK
    stage_types._FRONT_BLOCK = block
    try:
        assert stage_types._dominated(cols).tolist() == expect
    finally:
        stage_types._FRONT_BLOCK = saved
