"""The backend-neutral model and every installed backend agree on small MILPs."""

from __future__ import annotations

import itertools

import pytest

from tangram_opt.errors import SpecError
from tangram_opt.solvers import (LinearModel, SolveOptions, SolveStatus, available_backends, get_backend, lsum,
                                 solve_model)

BACKENDS = available_backends()


def knapsack(weights, values, cap):
    m = LinearModel("knapsack")
    xs = [m.add_binary(f"x{i}") for i in range(len(weights))]
    m.add(lsum(w * x for w, x in zip(weights, xs)) <= cap, "cap")
    m.minimize(lsum(-v * x for v, x in zip(values, xs)))
    return m, xs


def brute_knapsack(weights, values, cap):
    best = 0
    for pick in itertools.product((0, 1), repeat=len(weights)):
        if sum(w * p for w, p in zip(weights, pick)) <= cap:
            best = max(best, sum(v * p for v, p in zip(values, pick)))
    return -best


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_loose_gap_gives_a_valid_bound(backend):
    # a solver may stop as soon as it is within rel_gap and call that optimal: the bound it reports
    # must still be below every solution, not its objective
    import random

    rng = random.Random(7)
    w = [rng.randint(1, 40) for _ in range(40)]
    v = [rng.randint(1, 60) for _ in range(40)]
    cap = sum(w) // 3
    m, _ = knapsack(w, v, cap)
    table = [0] * (cap + 1)  # dynamic programme over the capacity: the exact optimum
    for wi, vi in zip(w, v):
        for c in range(cap, wi - 1, -1):
            table[c] = max(table[c], table[c - wi] + vi)
    best = -table[cap]  # the model minimizes minus the value
    res = solve_model(m, backend, SolveOptions(time_limit_s=20, rel_gap=0.5))
    assert res.status in (SolveStatus.OPTIMAL, SolveStatus.FEASIBLE)
    assert res.bound is not None and res.bound <= best + 1e-6
    assert res.objective >= best - 1e-6


def test_all_five_backends_are_installed():
    assert set(BACKENDS) == {"cp-sat", "scip", "highs", "cbc", "pulp-cbc"}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_backends_find_the_brute_force_optimum(backend, seed):
    import random

    rng = random.Random(seed)
    w = [rng.randint(1, 20) for _ in range(10)]
    v = [rng.randint(1, 30) for _ in range(10)]
    cap = sum(w) // 2
    m, _ = knapsack(w, v, cap)
    res = solve_model(m, backend, SolveOptions(time_limit_s=20))
    assert res.status == SolveStatus.OPTIMAL
    assert res.objective == pytest.approx(brute_knapsack(w, v, cap))
    # optimal means within the solver's relative gap: the bound is its dual bound (or the objective
    # less that gap), never above the objective
    rel_gap = SolveOptions().rel_gap
    assert res.objective - rel_gap * max(1.0, abs(res.objective)) - 1e-9 <= res.bound <= res.objective + 1e-9
    assert res.gap <= rel_gap * (1 + 1e-9)
    assert m.check(res.values) == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_infeasible_is_reported(backend):
    m = LinearModel("infeasible")
    x = m.add_var("x", 0, 10, integer=True)
    y = m.add_var("y", 0, 10, integer=True)
    m.add(x + y >= 15)
    m.add(x + y <= 12)
    m.minimize(x)
    res = solve_model(m, backend, SolveOptions(time_limit_s=5))
    assert res.status == SolveStatus.INFEASIBLE
    assert res.values is None


@pytest.mark.parametrize("backend", BACKENDS)
def test_hint_is_accepted_and_equalities_and_ranges_work(backend):
    m = LinearModel("ranges")
    x = m.add_var("x", 0, 20, integer=True)
    y = m.add_var("y", 0, 20, integer=True)
    m.add(x + 2 * y == 14)
    c = m.add(x - y >= -3)
    c.ub = 5  # a ranged row
    m.minimize(3 * x + y + 7)
    m.set_hint({x: 4, y: 5})
    res = solve_model(m, backend, SolveOptions(time_limit_s=5))
    # x + 2y = 14 with x even: (0,7) and (2,6) break x - y >= -3; (4,5) costs 12 + 5 + 7 = 24
    assert res.status == SolveStatus.OPTIMAL
    assert res.objective == pytest.approx(24)
    assert [round(v) for v in res.values] == [4, 5]


def test_cp_sat_rejects_fractional_models():
    m = LinearModel("frac")
    x = m.add_var("x", 0, 1)
    m.minimize(0.5 * x)
    with pytest.raises(SpecError, match="all-integer"):
        solve_model(m, "cp-sat")


def test_unknown_backend_names_the_choices():
    with pytest.raises(SpecError, match="pulp-cbc"):
        get_backend("gurobi")


def test_check_reports_violations():
    m, xs = knapsack([5, 5], [1, 1], 6)
    assert m.check([1.0, 1.0]) and "cap" in m.check([1.0, 1.0])[0]
    assert m.check([0.5, 0.0]) == ["x0 = 0.5 is not integral"]


def test_mps_round_trip_gives_the_same_optimum(tmp_path):
    import highspy

    # general integers (not only binaries) so that a reader ignoring integrality markers would differ
    m = LinearModel("mixed")
    x = m.add_var("x", 0, 10, integer=True)
    y = m.add_var("y", 0, 10, integer=True)
    m.add(2 * x + 2 * y >= 7)
    m.minimize(3 * x + 2 * y)
    path = tmp_path / "mixed.mps"
    m.write_mps(str(path))
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.readModel(str(path))
    h.run()
    assert h.getInfo().objective_function_value == pytest.approx(8)  # LP optimum would be 7

    m, _ = knapsack([3, 4, 5, 9, 2], [4, 5, 7, 10, 3], 12)
    m.objective.const = 2.5
    path = tmp_path / "k.mps"
    m.write_mps(str(path))
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.readModel(str(path))
    h.run()
    assert h.getInfo().objective_function_value == pytest.approx(-16 + 2.5)


def test_trajectory_is_monotone_and_ends_at_the_result():
    m, _ = knapsack(list(range(1, 25)), [i * 7 % 13 + 1 for i in range(24)], 60)
    seen = []
    res = solve_model(m, "cp-sat", SolveOptions(time_limit_s=10, on_progress=seen.append))
    assert res.trajectory and seen == res.trajectory
    incs = [p.incumbent for p in res.trajectory if p.incumbent is not None]
    bounds = [p.bound for p in res.trajectory if p.bound is not None]
    assert incs == sorted(incs, reverse=True) and bounds == sorted(bounds)
    assert incs[-1] == res.objective


def test_highs_solves_after_a_solve_with_another_thread_count():
    # HiGHS keeps one thread pool per process; a solve asking for a different thread count used
    # to fail with model status "Not Set" (every LP bound after a 2-thread MIP solve was lost)
    from tangram_opt.solvers import lp_relaxation_bound

    def model():
        md = LinearModel()
        xs = [md.add_var(f"x{i}", 0, 10, integer=True) for i in range(4)]
        md.add(lsum(xs) >= 7.5, "cover")
        md.minimize(lsum((i + 1) * x for i, x in enumerate(xs)))
        return md

    highs = get_backend("highs")
    for threads in (2, 1, 2):
        res = highs.solve(model(), SolveOptions(time_limit_s=5, threads=threads))
        assert res.status == SolveStatus.OPTIMAL and res.objective == pytest.approx(8.0)
        assert lp_relaxation_bound(model()) == pytest.approx(7.5)


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b != "cp-sat"])  # continuous variables
def test_free_and_one_sided_variables_and_an_empty_row(backend):
    # infinite bounds go to the solvers as they are (HiGHS takes them as its infinity)
    m = LinearModel("free")
    z = m.add_var("z", -float("inf"), float("inf"))  # free: only the rows bound it
    x = m.add_var("x", -float("inf"), 6, integer=True)
    y = m.add_var("y", 1.5)  # no upper bound
    m.add(z >= 2 * x - 11)
    m.add(z >= -x - 1)
    m.add(x + y >= 4.2)
    m.add(lsum([]) <= 1, "empty")  # a row without terms
    m.minimize(z + y)
    res = solve_model(m, backend, SolveOptions(time_limit_s=5))
    # z = max(2x - 11, -x - 1), y = max(1.5, 4.2 - x): x = 3 gives z = -4, y = 1.5
    assert res.status == SolveStatus.OPTIMAL
    assert res.objective == pytest.approx(-2.5)
    assert round(res.values[1]) == 3
    if backend == "highs":
        relaxed = get_backend("highs").solve(m, SolveOptions(time_limit_s=5), relax=True)
        # x = 10/3 balances the two rows of z: z = -13/3, y = 1.5
        assert relaxed.objective == pytest.approx(-13 / 3 + 1.5)
        assert relaxed.reduced_costs is not None and len(relaxed.reduced_costs) == 3


def test_highs_reports_a_model_it_rejects_as_an_error():
    # an infinite coefficient: HiGHS refuses the model, and the backend must not solve what is left
    m = LinearModel("huge")
    x, y = m.add_var("x", 0, 1), m.add_var("y", 0, 1)
    m.add(float("inf") * x + y <= 1)
    m.minimize(x + y)
    res = get_backend("highs").solve(m, SolveOptions(time_limit_s=5))
    assert res.status == SolveStatus.ERROR and "rejected" in res.message and res.values is None


@pytest.mark.parametrize("backend", BACKENDS)
def test_cutoff_keeps_solutions_below_it_and_reports_infeasible_when_there_are_none(backend):
    # the search passes its incumbent as the cutoff of every window MIP: a window with nothing
    # better comes back "infeasible" (closed) instead of being solved to its optimum. With a
    # cutoff below the optimum HiGHS prunes every node and still calls the solution its
    # heuristics found above the cutoff optimal, which the backend must not pass on
    import random

    rng = random.Random(3)
    w = [rng.randint(10, 60) for _ in range(30)]
    v = [x + rng.randint(-5, 9) for x in w]
    m, _ = knapsack(w, v, sum(w) // 2)
    best = solve_model(m, "highs", SolveOptions(time_limit_s=20)).objective
    above = solve_model(m, backend, SolveOptions(time_limit_s=20, cutoff=best + 0.5))
    assert above.status == SolveStatus.OPTIMAL and above.objective == pytest.approx(best)
    at = solve_model(m, backend, SolveOptions(time_limit_s=20, cutoff=best))
    assert at.status == SolveStatus.INFEASIBLE and at.values is None
    m.set_hint({x: 0.0 for x in m.vars})  # a feasible hint above the cutoff changes nothing
    below = solve_model(m, backend, SolveOptions(time_limit_s=20, cutoff=best - 5))
    assert below.status == SolveStatus.INFEASIBLE and below.values is None
