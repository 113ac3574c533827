"""Bad plan spaces, node budgets and list flags are refused by name; a space that leaves no stage layout
is diagnosed as such (which restriction, and why), not as a memory problem."""

from __future__ import annotations

import argparse

import pytest

from tangram_opt import cli
from tangram_opt.cli.common import _int_list, _zero_list
from tangram_opt.errors import InfeasibleError, SpecError
from tangram_opt.planner.context import PlanningContext
from tangram_opt.planner.diagnose import diagnose_infeasible
from tangram_opt.planner.search import solve
from tangram_opt.planner.search.objective import Objective, check_max_nodes, objective_input
from tangram_opt.planner.space import SearchSpace
from tangram_opt.specs import TrainingSpec, load_model, make_cluster

TRAINING = TrainingSpec(global_batch_size=8, seq_len=512, precision="bf16")


def _cluster():
    return make_cluster("c", [dict(name="a", gpu="A100-40", nodes=1, gpus_per_node=4, nic_gbps=200)])


def _diagnosis(space: SearchSpace, model: str = "opt-350m", cluster=None, training=TRAINING) -> str:
    ctx = PlanningContext(cluster or _cluster(), load_model(model), training, space=space)
    return str(diagnose_infeasible(ctx))


# --- SearchSpace fields ---------------------------------------------------------------------------------

@pytest.mark.parametrize("field, value", [
    ("tp", (0,)), ("tp", ()), ("tp", 4), ("ep", (0,)), ("cp", (-1,)), ("cp", (2.0,)),
    ("micro_batch_sizes", (True,)), ("micro_batch_sizes", ()),
    ("pipeline_micro_batches", (0,)), ("pipeline_micro_batches", ()),
    ("zero", ()), ("zero", 1), ("zero", (4,)), ("zero", (True,)),
    ("recompute", ()), ("recompute", ("some",)), ("recompute", "full"),
    ("max_stages", "2"), ("max_stages", 2.5), ("max_stages", 0), ("max_stages", True),
    ("heuristic_keep", "3"), ("heuristic_keep", 0),
])
def test_search_space_refuses_bad_fields_by_name(field, value):
    with pytest.raises(SpecError) as err:
        SearchSpace(**{field: value})
    assert err.value.field == f"space.{field}"
    assert err.value.fix


def test_search_space_scalar_for_a_tuple_says_give_a_tuple():
    with pytest.raises(SpecError, match=r"a tuple such as \(1, 2\)"):
        SearchSpace(tp=2)


def test_search_space_takes_lists_as_tuples():
    space = SearchSpace(tp=[1, 2], zero=[0, 3], recompute=["none"])
    assert space.tp == (1, 2) and space.zero == (0, 3) and space.recompute == ("none",)
    hash(space)


# --- restrictions that leave no stage layout ------------------------------------------------------------

@pytest.mark.parametrize("space, needles", [
    (SearchSpace(tp=(3,)), ("space.tp (3,) divides no island's node size (4)",)),
    (SearchSpace(tp=(16,)), ("space.tp (16,) divides no island's node size (4)",)),
    (SearchSpace(micro_batch_sizes=(16,)), ("space.micro_batch_sizes (16,) exceeds the global batch (8)",)),
    (SearchSpace(cp=(3,)), ("space.cp (3,)", "cp(3) divides no stage size", "2 x cp(3)")),
    (SearchSpace(pipeline_micro_batches=(1,), micro_batch_sizes=(2,)), ("space.micro_batch_sizes (2,)",
                                                                         "space.pipeline_micro_batches (1,)")),
])
def test_space_that_leaves_no_layout_is_named(space, needles):
    msg = _diagnosis(space)
    for n in needles:
        assert n in msg, msg
    assert "before memory is counted" in msg and "A single layer fits" not in msg


def test_expert_parallel_size_that_divides_no_expert_count_is_named():
    cluster = make_cluster("m", [dict(name="a", gpu="H100-SXM", nodes=2, nic_gbps=3200)])
    msg = _diagnosis(SearchSpace(ep=(3,)), "mixtral-8x7b", cluster, TrainingSpec(global_batch_size=16, seq_len=256))
    assert "space.ep (3,): ep(3) does not divide the number of experts (8)" in msg, msg


def test_memory_is_still_diagnosed_when_memory_is_the_cause():
    # tp 8 fits the A100 island only; llama-3-70b does not fit its 8 GPUs: a memory diagnosis, with the
    # V100 island's lack of a tp said, not a crash
    cluster = make_cluster("mix", [dict(name="a", gpu="A100-40", nodes=1, gpus_per_node=8, nic_gbps=200),
                                   dict(name="v", gpu="V100-16", nodes=1, gpus_per_node=4, nic_gbps=100)])
    msg = _diagnosis(SearchSpace(tp=(8,)), "llama-3-70b", cluster, TrainingSpec(global_batch_size=8, seq_len=4096,
                                                                                 precision="fp16"))
    assert "GiB" in msg and "before memory is counted" not in msg, msg
    assert "no tp of space.tp (8,)" in msg and "4 GPUs per node" in msg, msg


@pytest.mark.parametrize("objective", ["throughput", "min_cost"])
def test_solve_with_an_unfittable_tp_raises_the_diagnosis(objective):
    with pytest.raises(InfeasibleError, match=r"space\.tp \(3,\) divides no island's node size"):
        solve(_cluster(), "opt-350m", TRAINING, space=SearchSpace(tp=(3,)), objective=objective, time_limit_s=2,
              threads=1)


def test_solve_refuses_a_zero_degree_before_searching():
    with pytest.raises(SpecError, match=r"space\.pipeline_micro_batches"):
        solve(_cluster(), "opt-350m", TRAINING, space=SearchSpace(pipeline_micro_batches=(0,)), time_limit_s=2)


# --- node budgets ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("max_nodes, field, needle", [
    ({"a": 0}, "max_nodes", "leaves no node"),
    ({"b": 1}, "max_nodes['b']", "is not a node group"),
    ({"a": 2}, "max_nodes['a']", "more than the group's 1 nodes"),
])
def test_node_budget_is_checked_against_the_cluster(max_nodes, field, needle):
    for objective in ("throughput", "min_cost", Objective(kind="min_cost", max_nodes=max_nodes)):
        with pytest.raises(SpecError, match=needle) as err:
            objective_input(objective, max_nodes=None if isinstance(objective, Objective) else max_nodes,
                            cluster=_cluster())
        assert err.value.field == field


def test_node_budget_leaving_another_group_is_accepted():
    two = make_cluster("two", [dict(name="a", gpu="A100-40", nodes=1, gpus_per_node=4, nic_gbps=200),
                               dict(name="v", gpu="V100-16", nodes=1, gpus_per_node=4, nic_gbps=100)])
    check_max_nodes({"a": 0}, two)


@pytest.mark.parametrize("max_nodes", [{"a": -1}, {"a": 1.5}, {"a": True}])
def test_node_budget_counts_are_whole_numbers(max_nodes):
    with pytest.raises(SpecError, match="whole number of nodes"):
        objective_input("min_cost", max_nodes=max_nodes)


def test_solve_refuses_a_node_budget_that_leaves_no_gpu():
    with pytest.raises(SpecError, match="leaves no node"):
        solve(_cluster(), "opt-350m", TRAINING, max_nodes={"a": 0}, time_limit_s=2, threads=1)


# --- command line ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("text", ["0", "1,,2", ",", "1,2,", "-1", "x"])
def test_int_list_refuses_empty_items_and_values_below_one(text):
    with pytest.raises(argparse.ArgumentTypeError):
        _int_list(text)


def test_int_list_and_zero_list_accept_their_values():
    assert _int_list(" 1, 2,4") == (1, 2, 4)
    assert _zero_list("0,3") == (0, 3)
    with pytest.raises(argparse.ArgumentTypeError, match=">= 0"):
        _zero_list("-1")


PLAN = ["plan", "--cluster", "tiny-mixed", "--model", "opt-350m", "--batch", "8", "--seq", "256", "--time-limit",
        "1", "--quiet"]


@pytest.mark.parametrize("extra", [["--tp", "0"], ["--tp", "1,,2"], ["--cp", "0"], ["--zero", "-1"]])
def test_cli_list_flags_are_usage_errors(extra, capsys):
    assert cli.main(PLAN + extra) == cli.EXIT_BAD_INPUT
    assert extra[0] in capsys.readouterr().err


@pytest.mark.parametrize("tp", ["3", "16"])
def test_cli_unfittable_tp_is_diagnosed(tp, capsys):
    assert cli.main(PLAN + ["--tp", tp]) == cli.EXIT_INFEASIBLE
    err = capsys.readouterr().err
    assert f"space.tp ({tp},) divides no island's node size (8)" in err and "internal error" not in err
