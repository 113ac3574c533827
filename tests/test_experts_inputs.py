"""Expert placement: inputs that must be refused naming the field, and time limits that are kept."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from tangram_opt import cli
from tangram_opt.errors import NoSolutionError, SpecError
from tangram_opt.experts import (best_lower_bound, check_placement, greedy_placement, make_problem, place_experts,
                                 solve_layer, synthetic_expert_loads)
from tangram_opt.experts.improve import local_search
from tangram_opt.experts.mip import build_and_solve
from tangram_opt.experts.profiles import MAX_SKEW
from tangram_opt.experts.split import optimal_split
from tangram_opt.solvers import SolveOptions, SolveStatus

L8 = [10, 20, 30, 40, 50, 60, 70, 80]


def _field(call) -> str:
    with pytest.raises(SpecError) as err:
        call()
    return err.value.field


@pytest.mark.parametrize("current, field", [
    ([[0, 1, 2, 3, 4], [2, 3], [4, 5], [6, 7]], "current[0]"),  # 5 experts on a rank with 2 slots
    ([[0, 1], [2, 3], [4, 5], [6, 7, -1, 1]], "current[3]"),  # -1 is an empty slot, but 3 experts remain
    ([[0, 1], ["2", 3], [4, 5], [6, 7]], "current[1]"),
    ([[0, 1], [2, 3.5], [4, 5], [6, 7]], "current[1]"),
    ([[0, True], [2, 3], [4, 5], [6, 7]], "current[0]"),
    ([[0, 1], [2, 3], [-2, 5], [6, 7]], "current[2]"),
    ([[0, 1], [2, 3], [4, 5], [6, 8]], "current[3]"),
    (7, "current"),
    ("0123", "current"),
])
def test_bad_current_placement_names_the_rank(current, field):
    assert _field(lambda: place_experts(L8, 4, 1, 2, time_limit_s=2, current=current)) == field


def test_current_with_empty_slots_and_numpy_ids_is_accepted():
    p = make_problem(L8, 4, 1, 2, current=np.array([[0, 1], [2, -1], [4, 5], [6, 7]]))
    assert p.current == ((0, 1), (2,), (4, 5), (6, 7))


@pytest.mark.parametrize("kw, field", [
    ({"rel_gap": 5}, "rel_gap"),
    ({"rel_gap": 1.0}, "rel_gap"),
    ({"rel_gap": -0.1}, "rel_gap"),
    ({"threads": 0}, "threads"),
    ({"threads": 2.0}, "threads"),
    ({"threads": True}, "threads"),
    ({"seed": -1}, "seed"),
    ({"seed": "1"}, "seed"),
])
def test_solver_knobs_out_of_range_are_refused(kw, field):
    assert _field(lambda: place_experts(L8, 4, 1, 2, time_limit_s=2, **kw)) == field
    assert _field(lambda: solve_layer(make_problem(L8, 4, 1, 2), time_limit_s=2, **kw)) == field


@pytest.mark.parametrize("loads, field", [
    (["1", "2"], "loads[0]"),
    ([1, True, 3, 4], "loads[1]"),
    ([[1, 2], [3, "4"]], "loads[1][1]"),
    (np.array([True, False]), "loads"),
    (np.array(["1", "2"]), "loads"),
])
def test_non_numeric_loads_are_refused_not_coerced(loads, field):
    assert _field(lambda: place_experts(loads, 2, 1, 2, time_limit_s=2)) == field


def test_make_problem_refuses_strings_and_booleans():
    assert _field(lambda: make_problem(["1", "2"], 2, 1, 1)) == "loads[0]"
    assert _field(lambda: make_problem([1, 2], 2, 1, 1, expert_bytes=[1, "2"], rank_memory_bytes=4)) == \
        "expert_bytes[1]"
    assert _field(lambda: make_problem([1, 2], 2, 1, 1, expert_bytes=[1, 2], rank_memory_bytes=True)) == \
        "rank_memory_bytes[0]"
    assert make_problem(np.array([1, 2], dtype=np.int32), 2, 1, 1).loads == (1.0, 2.0)


@pytest.mark.parametrize("kw, field", [
    ({"kind": "lognormal", "skew": 50}, "skew"),
    ({"kind": "zipf", "skew": MAX_SKEW + 0.1}, "skew"),
    ({"kind": "zipf", "skew": "1"}, "skew"),
    ({"kind": "zipf", "seed": -1}, "seed"),
    ({"kind": "zipf", "tokens": 2**53 + 1}, "tokens"),
])
def test_synthetic_profile_arguments_are_bounded(kw, field):
    assert _field(lambda: synthetic_expert_loads(experts=8, **kw)) == field


def test_synthetic_profile_at_the_skew_limit_still_spreads_tokens():
    for kind in ("zipf", "lognormal"):
        w = synthetic_expert_loads(kind, experts=64, skew=MAX_SKEW, tokens=10**6, seed=0)
        assert w.sum() == 10**6 and (w >= 0).all() and w.max() < 10**6
    assert (synthetic_expert_loads("uniform", experts=4, skew=50, tokens=8) == 2).all()  # skew unused


def test_cli_skew_overflow_names_the_flag(capsys):
    rc = cli.main(["experts", "--profile", "lognormal", "--experts", "8", "--skew", "1000", "--ranks", "2",
                   "--nodes", "1", "--slots", "4"])
    err = capsys.readouterr().err
    assert rc == 2 and "--skew = 1000" in err and "loads[" not in err and "internal error" not in err


def test_cli_profile_seed_names_the_flag(capsys):
    rc = cli.main(["experts", "--profile", "zipf", "--experts", "8", "--profile-seed", "-1", "--ranks", "2",
                   "--nodes", "1", "--slots", "4"])
    assert rc == 2 and "--profile-seed" in capsys.readouterr().err


# --- time limits --------------------------------------------------------------------------------------------
BIG = synthetic_expert_loads("zipf", experts=6000, skew=1.0, tokens=6_000_000, seed=3)


def test_large_instance_keeps_the_time_limit():
    """6,000 experts on 64 ranks: the greedy used to be quadratic in the experts and the local search, bounds
    and split LP ignored the limit (20,000 experts with a 2 s limit took a minute)."""
    limit = 0.5
    t = time.perf_counter()
    pl = place_experts(BIG, 64, 8, 100, time_limit_s=limit)
    elapsed = time.perf_counter() - t
    assert elapsed < limit + 1.0, elapsed
    assert pl.certificate.status in ("optimal", "feasible")
    assert check_placement(make_problem(BIG, 64, 8, 100), pl) == []


def test_parts_stop_at_their_deadline():
    p = make_problem(BIG, 64, 8, 100)
    start = greedy_placement(p)[1]
    t = time.perf_counter()
    out = local_search(p, start, time_limit_s=0.01)
    assert time.perf_counter() - t < 0.5
    assert check_placement(p, _as_placement(p, out)) == []
    t = time.perf_counter()
    lb = best_lower_bound(p, deadline=time.perf_counter())  # only the cheap bounds
    assert time.perf_counter() - t < 0.5 and lb.value >= p.total_load / p.ranks
    with pytest.raises(NoSolutionError):
        optimal_split(p, [list(d) for d in start], time_limit_s=0.0)
    late = build_and_solve(p, backend="highs", options=SolveOptions(time_limit_s=5), incumbent_objective=math.inf,
                           lower_bound=lb.value, hint_holders=None, hint_served=None, cross_node_weight=0.0,
                           move_weight=0.0, deadline=time.perf_counter())
    assert late.result.status == SolveStatus.NO_SOLUTION and late.served is None


def _as_placement(p, served):
    from tangram_opt.experts.placement import PlacementCertificate, build_placement

    cert = PlacementCertificate(status="heuristic", objective=0.0, bound=0.0, max_load_bound=0.0)
    return build_placement(p, served, method="test", certificate=cert)


def test_no_time_for_the_mip_gives_a_valid_feasible_placement():
    """With a weighted objective the combinatorial bound cannot close the gap; a limit spent by the
    heuristics leaves the MIP out and says so."""
    p = make_problem(BIG, 64, 8, 94)
    pl = solve_layer(p, time_limit_s=0.2, rel_gap=0.0, cross_node_weight=0.01)
    assert check_placement(p, pl) == []
    assert pl.certificate.status == "feasible"
    assert pl.certificate.note.startswith(("time limit", "MIP"))
