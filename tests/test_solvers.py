"""The backend-neutral model and every installed backend agree on small MILPs."""

from __future__ import annotations

import itertools
import math

import pytest

from tangram_opt.errors import SpecError
from tangram_opt.solvers import (ArrayConstraint, Constraint, LinExpr, LinearModel, SolveOptions, SolveStatus,
                                 available_backends, get_backend, lsum, relative_gap, solve_model)

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


def test_an_lp_whose_warm_start_fails_is_solved_again_cold(monkeypatch):
    # HiGHS may end without an answer from another model's basis (a level-2 zone pattern after
    # the previous pattern's): the LP bound is then solved cold instead of being lost
    from tangram_opt.solvers import lp_relaxation_bound
    from tangram_opt.solvers.highs import HighsBackend
    from tangram_opt.solvers.protocol import SolveResult

    md = LinearModel()
    xs = [md.add_var(f"x{i}", 0, 10, integer=True) for i in range(4)]
    md.add(lsum(xs) >= 7.5, "cover")
    md.minimize(lsum((i + 1) * x for i, x in enumerate(xs)))
    assert lp_relaxation_bound(md) == pytest.approx(7.5) and "basis" in md.lp_cache
    solve, starts = HighsBackend.solve, []

    def failing_when_warm(self, model, options, *, relax=False):
        warm = "basis" in model.lp_cache
        starts.append(warm)
        if warm:
            return SolveResult(status=SolveStatus.ERROR, backend="highs", message="HiGHS status Unknown")
        return solve(self, model, options, relax=relax)

    monkeypatch.setattr(HighsBackend, "solve", failing_when_warm)
    assert lp_relaxation_bound(md) == pytest.approx(7.5)
    assert starts == [True, False]


def test_an_lp_with_presolve_starts_cold_and_has_the_same_bound(monkeypatch):
    # lp_relaxation_bound(presolve=True) (the level-2 zone-pattern LPs) runs HiGHS's presolve, which
    # a warm basis would skip: it starts cold, whatever basis the model holds, and bounds alike
    import math
    import random

    highspy = pytest.importorskip("highspy")
    from tangram_opt.solvers import lp_relaxation_bound

    rng = random.Random(7)
    warm_starts: list[int] = []
    set_basis = highspy.Highs.setBasis
    monkeypatch.setattr(highspy.Highs, "setBasis", lambda self, *a: (warm_starts.append(1), set_basis(self, *a))[1])
    for _ in range(20):
        md = LinearModel()
        xs = [md.add_var(f"x{i}", 0, rng.randint(1, 9), integer=rng.random() < 0.7) for i in range(8)]
        for r in range(6):
            md.add(lsum(rng.randint(0, 5) * x for x in xs) >= rng.uniform(1, 20), f"cover[{r}]")
        md.minimize(lsum(rng.uniform(0.5, 4) * x for x in xs))
        plain = lp_relaxation_bound(md)  # leaves its basis in the model
        assert math.isinf(plain) or "basis" in md.lp_cache
        warm_starts.clear()
        assert lp_relaxation_bound(md, presolve=True) == pytest.approx(plain, rel=1e-9, abs=1e-9)
        assert warm_starts == []
        if not math.isinf(plain):
            assert lp_relaxation_bound(md) == pytest.approx(plain, rel=1e-9, abs=1e-9)
            assert warm_starts == [1]  # without presolve the basis is used


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


@pytest.mark.parametrize("dual_feasible", [True, False])
def test_an_lp_highs_calls_optimal_with_a_feasible_dual_point_is_its_bound(monkeypatch, dual_feasible):
    # HiGHS can call a window LP optimal while its primal point misses the tolerance after
    # unscaling (primal solution status 1, "infeasible"): with a feasible dual point the objective
    # is still a valid bound of the relaxation and is used; without one the LP is not solved
    highspy = pytest.importorskip("highspy")

    class Info:
        def __init__(self, real):
            self.real = real

        def __getattr__(self, name):
            if name == "primal_solution_status":
                return 1
            if name == "dual_solution_status":
                return 2 if dual_feasible else 1
            return getattr(self.real, name)

    real_info = highspy.Highs.getInfo
    monkeypatch.setattr(highspy.Highs, "getInfo", lambda self: Info(real_info(self)))
    m = LinearModel("lp")
    x, y = m.add_var("x", 0, 4, integer=True), m.add_var("y", 0, 4, integer=True)
    m.add(2 * x + 2 * y >= 5)
    m.minimize(3 * x + 2 * y)
    res = get_backend("highs").solve(m, SolveOptions(time_limit_s=5), relax=True)
    if dual_feasible:
        assert res.status == SolveStatus.OPTIMAL and res.objective == pytest.approx(5.0) and res.bound == res.objective
    else:
        assert res.status != SolveStatus.OPTIMAL and res.bound is None


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


# --- the objective's constant -------------------------------------------------------------------------------
# LinearModel objectives are ``sum a_i x_i + const``. Every backend must report the incumbent objective and the
# dual bound with the constant counted exactly once: CBC (through PuLP) never sees it and logs its numbers
# without it, CP-SAT takes integer objectives only (the constant may be fractional), HiGHS, SCIP and CBC through
# OR-Tools take it as the objective's offset.

ITEMS_W = [3, 4, 5, 9, 2, 7, 6, 8]
ITEMS_V = [4, 5, 7, 10, 3, 8, 6, 11]
CONSTANTS = [0.0, 7.0, -7.0, 2.5, -2.75, 1000.25]


def item_model(sense: str, integer: bool, const: float):
    """``min sum v x + const`` over covers (sum w x >= 17), or ``max sum v x + const`` over packings
    (sum w x <= 17) written as ``min -(sum v x + const)``; binaries or [0, 1] continuous."""
    m = LinearModel(f"{sense}-{'mip' if integer else 'lp'}")
    xs = [m.add_var(f"x{i}", 0, 1, integer=integer) for i in range(len(ITEMS_W))]
    weight = lsum(w * x for w, x in zip(ITEMS_W, xs))
    value = lsum(v * x for v, x in zip(ITEMS_V, xs))
    if sense == "min":
        m.add(weight >= 17, "cover")
        m.minimize(value + const)
    else:
        m.add(weight <= 17, "pack")
        m.minimize(-(value + const))
    return m


def item_optimum(sense: str, integer: bool) -> float:
    """Optimum of ``sum v x`` (min over covers / max over packings) without the constant: enumeration for
    binaries, the greedy by value per weight (exact for one row with [0, 1] bounds) for the LP."""
    if integer:
        values = []
        for pick in itertools.product((0, 1), repeat=len(ITEMS_W)):
            weight = sum(w * p for w, p in zip(ITEMS_W, pick))
            if (weight >= 17) if sense == "min" else (weight <= 17):
                values.append(sum(v * p for v, p in zip(ITEMS_V, pick)))
        return min(values) if sense == "min" else max(values)
    order = sorted(range(len(ITEMS_W)), key=lambda i: ITEMS_V[i] / ITEMS_W[i], reverse=(sense == "max"))
    left, total = 17.0, 0.0
    for i in order:
        take = min(1.0, left / ITEMS_W[i])
        total += take * ITEMS_V[i]
        left -= take * ITEMS_W[i]
        if left <= 0:
            break
    return total


def gap_allowance(opt: float, const: float) -> float:
    """How far below the optimum a solver that calls its answer optimal may put its bound: its relative gap
    measured with the constant (HiGHS, SCIP, CP-SAT) or without it (CBC never sees it)."""
    return SolveOptions().rel_gap * max(1.0, abs(opt), abs(opt - const)) + 1e-9


def assert_trajectory_counts_the_constant(res, opt: float) -> None:
    """Every point recorded during the solve is a solution value and a bound of the same objective."""
    assert res.trajectory
    for p in res.trajectory:
        assert p.incumbent is None or p.incumbent >= opt - 1e-6, (p, opt)
        assert p.bound is None or p.bound <= opt + 1e-6, (p, opt)
    assert res.trajectory[-1].incumbent == pytest.approx(res.objective)


def test_the_brute_force_optima_of_the_item_models():
    # by hand: cover 17 with weights 6 + 9 + 2 (value 6 + 10 + 3); pack 3 + 4 + 2 + 8 (value 4 + 5 + 3 + 11)
    assert item_optimum("min", True) == 19 and item_optimum("max", True) == 23
    # the LP fills by value per weight: weights 6 and 9 whole then 2/7 of weight 7 (16 + 16/7); 2, 5, 8 whole
    # then 2/3 of weight 3 (21 + 8/3)
    assert item_optimum("min", False) == pytest.approx(128 / 7) and item_optimum("max", False) == pytest.approx(71 / 3)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("const", CONSTANTS)
@pytest.mark.parametrize("sense", ["min", "max"])
@pytest.mark.parametrize("integer", [True, False], ids=["mip", "lp"])
def test_objective_and_bound_count_the_constant_once(backend, const, sense, integer):
    if backend == "cp-sat" and not integer:
        pytest.skip("cp-sat takes all-integer models only")
    m = item_model(sense, integer, const)
    best = item_optimum(sense, integer) + const  # of the problem as posed (a maximum for "max")
    opt = best if sense == "min" else -best  # of the model, which minimizes
    res = solve_model(m, backend, SolveOptions(time_limit_s=20))
    assert res.status == SolveStatus.OPTIMAL
    assert res.objective == pytest.approx(opt, abs=1e-6), (backend, const, sense)
    assert res.objective == pytest.approx(m.objective.value(res.values), abs=1e-9)
    if integer:  # a dual bound: below every solution, and within the solver's gap of the optimum
        assert opt - gap_allowance(opt, m.objective.const) <= res.bound <= opt + 1e-6, (backend, res.bound)
    else:  # an LP solved to optimality: its optimum is its bound
        assert res.bound == pytest.approx(opt, abs=1e-6), (backend, res.bound)
    assert res.gap == 0.0
    assert relative_gap(res.objective, res.bound) <= gap_allowance(opt, m.objective.const) / max(abs(opt), 1e-12)
    assert_trajectory_counts_the_constant(res, opt)
    if backend == "cp-sat":  # its pool of improving solutions carries the same objective
        assert res.pool and all(v == pytest.approx(m.objective.value(x)) for v, x in res.pool)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("const", [0.0, 3.5, -3.5])
def test_an_objective_that_is_only_a_constant(backend, const):
    m = LinearModel("constant")
    x = m.add_var("x", 0, 5, integer=True)
    y = m.add_var("y", 0, 5, integer=True)
    m.add(x + y >= 3)
    m.minimize(LinExpr(const=const))
    res = solve_model(m, backend, SolveOptions(time_limit_s=5))
    assert res.status == SolveStatus.OPTIMAL and m.check(res.values) == []
    assert res.objective == pytest.approx(const, abs=1e-12)
    assert const - gap_allowance(const, const) <= res.bound <= const + 1e-9
    assert res.gap == 0.0 and relative_gap(res.objective, res.bound) <= 1e-6


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("const", [-2.75, -0.5, 0.25, 2.7])
def test_a_fractional_constant_with_a_hint_and_a_cutoff(backend, const):
    # CP-SAT enforces a complete hint as an incumbent (only strictly better solutions are searched): the
    # row must be on the integer sum of terms. Rounding the hint's objective with the constant truncated
    # to an integer cut off the optimum (x = 11, one better than the hint) for some fractional constants
    m = LinearModel("hinted")
    x = m.add_var("x", 0, 20, integer=True)
    y = m.add_var("y", 0, 20, integer=True)
    m.add(x + y <= 11)
    m.minimize(-x + const)
    m.set_hint({x: 10, y: 0})
    opt = -11 + const
    res = solve_model(m, backend, SolveOptions(time_limit_s=5))
    assert res.status == SolveStatus.OPTIMAL
    assert res.objective == pytest.approx(opt) and round(res.values[0]) == 11
    assert opt - gap_allowance(opt, const) <= res.bound <= opt + 1e-9
    # the cutoff is on the objective with its constant
    above = solve_model(m, backend, SolveOptions(time_limit_s=5, cutoff=opt + 0.5))
    assert above.status == SolveStatus.OPTIMAL and above.objective == pytest.approx(opt)
    at = solve_model(m, backend, SolveOptions(time_limit_s=5, cutoff=opt))
    assert at.status == SolveStatus.INFEASIBLE and at.values is None


def planted_market_split(const: float, rows: int = 6, n: int = 50, seed: int = 0):
    """Market split (Cornuejols-Dawande) with a planted exact split: ``min sum |a_i x - d_i| + const`` has the
    optimum ``const``, which branch and bound takes very long to find or prove (at 6 rows and 50 columns no
    backend here did within 30 s on three seeds); its LP bound is ``const``, and so is every dual bound."""
    import random

    rng = random.Random(seed)
    m = LinearModel("market-split")
    xs = [m.add_binary(f"x{j}") for j in range(n)]
    star = [rng.randint(0, 1) for _ in range(n)]
    slack = []
    for i in range(rows):
        a = [rng.randint(0, 99) for _ in range(n)]
        over = m.add_var(f"over{i}", 0, sum(a), integer=True)
        under = m.add_var(f"under{i}", 0, sum(a), integer=True)
        slack += [over, under]
        m.add(lsum(c * x for c, x in zip(a, xs)) - over + under == sum(c * s for c, s in zip(a, star)), f"split{i}")
    m.minimize(lsum(slack) + const)
    return m


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("const", [1000.5, -1000.5])
def test_a_solve_stopped_by_its_time_limit_counts_the_constant(backend, const):
    m = planted_market_split(const)
    res = solve_model(m, backend, SolveOptions(time_limit_s=1))
    assert res.status == SolveStatus.FEASIBLE, res.status  # the time limit, not a proof, ended it
    assert res.objective >= const and res.objective == pytest.approx(m.objective.value(res.values), abs=1e-9)
    # the bound without the constant would be 0; counted twice, 2 * const
    assert res.bound == pytest.approx(const, abs=1e-6), (backend, res.bound)
    assert res.gap == pytest.approx(relative_gap(res.objective, res.bound))
    assert res.gap == pytest.approx((res.objective - const) / abs(res.objective))
    assert_trajectory_counts_the_constant(res, const)


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b != "cp-sat"])  # continuous variables
def test_an_lp_stopped_by_its_time_limit_reports_no_bound_it_has_not_proven(backend):
    # HiGHS stops a zero-second LP at its starting point (x = 0, feasible here); it used to report that
    # point's objective as the bound (and, without any solution, HiGHS's MIP dual bound, 0, of an LP)
    m = item_model("max", False, 1000.5)
    opt = -(item_optimum("max", False) + 1000.5)
    res = solve_model(m, backend, SolveOptions(time_limit_s=0))
    if res.status.has_solution:
        assert res.objective >= opt - 1e-6
    if res.status == SolveStatus.OPTIMAL:
        assert res.objective == pytest.approx(opt)
    assert res.bound is None or res.bound <= opt + 1e-6, (backend, res.status, res.bound)


def test_cbc_log_numbers_get_the_constant_and_lose_their_rounding():
    from tangram_opt.solvers.protocol import Trajectory
    from tangram_opt.solvers.pulp_cbc import _printed_bound, read_log

    # CBC prints bounds rounded (%.3f in CBC 2.10's "Lower bound:", 6 significant digits elsewhere)
    assert _printed_bound("1234.568") == pytest.approx(1234.5675)
    assert _printed_bound("1234.57") == pytest.approx(1234.565)
    assert _printed_bound("1.23457e+07") == pytest.approx(12345650)
    assert _printed_bound("1000") == pytest.approx(999.995)
    assert _printed_bound("0") == 0.0 and _printed_bound("0.000") == pytest.approx(-0.0005)
    assert _printed_bound("-1e+50") is None and _printed_bound("inf") is None
    log = ("Cbc0012I Integer solution of 21 found by feasibility pump after 0 iterations and 0 nodes (0.03 seconds)\n"
           "Cbc0010I After 0 nodes, 1 on tree, 21 best solution, best possible 2.5 (0.15 seconds)\n"
           "Cbc0012I Integer solution of 9 found by heuristic after 11878 iterations and 2622 nodes (0.80 seconds)\n")
    traj = Trajectory(SolveOptions())
    read_log(log, traj, -1000.5)
    assert [(p.elapsed_s, p.incumbent, p.bound) for p in traj.points] == [
        (0.03, -979.5, None), (0.15, -979.5, pytest.approx(-998.05)), (0.80, -991.5, pytest.approx(-998.05))]


@pytest.fixture
def bundled_cbc(monkeypatch):
    """The pulp-cbc backend on the CBC 2.10 binary bundled with PuLP (its log has the Cbc0010I/Cbc0012I
    progress lines and prints "Lower bound:" with 3 decimals) instead of the newer cbcbox binary."""
    import warnings

    pulp = pytest.importorskip("pulp")
    import tangram_opt.solvers.pulp_cbc as pulp_cbc

    def old(**kwargs):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            return pulp.PULP_CBC_CMD(**kwargs)

    try:
        ok = old(msg=False).available()
    except Exception:  # noqa: BLE001 (PuLP releases without a bundled binary raise here)
        ok = False
    if not ok:
        pytest.skip("PuLP has no bundled CBC binary here")
    monkeypatch.setattr(pulp_cbc, "_pulp_cbc", old)


@pytest.mark.skipif("pulp-cbc" not in BACKENDS, reason="pulp-cbc not installed")
@pytest.mark.parametrize("const", [1000.5, -1000.5])
def test_the_bundled_cbc_log_counts_the_constant(bundled_cbc, const):
    m = planted_market_split(const)
    res = solve_model(m, "pulp-cbc", SolveOptions(time_limit_s=1))
    assert res.status == SolveStatus.FEASIBLE
    assert res.bound == pytest.approx(const, abs=1e-6)
    assert len(res.trajectory) > 1  # the progress lines were read, with the constant
    assert_trajectory_counts_the_constant(res, const)
    m = item_model("max", True, const)
    opt = -(item_optimum("max", True) + const)
    res = solve_model(m, "pulp-cbc", SolveOptions(time_limit_s=20))
    assert res.status == SolveStatus.OPTIMAL and res.objective == pytest.approx(opt)
    assert opt - gap_allowance(opt, -const) <= res.bound <= opt + 1e-9


def test_lp_relaxations_of_forks_reuse_the_parents_rows_and_basis_with_the_same_optima():
    # a window's stage-range children are forks of its model with rows added: HiGHS gets the
    # parent's rows in array form and its optimal basis (highs.py); every optimum must be the one
    # of a cold solve of the same model
    import random

    import numpy as np

    from tangram_opt.solvers.highs import HighsBackend, _rows

    rng = random.Random(7)
    md = LinearModel(name="forks")
    xs = [md.add_var(f"x{i}", 0, rng.choice([1, 3, 10]), integer=True) for i in range(30)]
    for j in range(40):
        picked = rng.sample(xs, 6)
        md.add(sum((rng.randint(1, 9) * v for v in picked), LinExpr()) >= rng.randint(5, 40), f"cover{j}")
    md.minimize(sum((rng.randint(1, 20) * v for v in xs), LinExpr()))
    relax = dict(relax=True)

    def cold(model: LinearModel):
        copy = LinearModel(name="cold", vars=list(model.vars), constraints=list(model.constraints),
                           objective=model.objective)
        return HighsBackend().solve(copy, SolveOptions(), **relax)

    parent = HighsBackend().solve(md, SolveOptions(), **relax)
    assert "basis" in md.lp_cache and md.lp_cache["rows"][0] == 40
    optimal = 0
    for k in range(5):
        child = md.fork()
        picked = rng.sample(xs, 5)
        child.add(sum((v for v in picked), LinExpr()) >= 2 + k, f"more{k}")
        child.set_upper_bound(xs[k].index, 0.0)
        got, want = HighsBackend().solve(child, SolveOptions(), **relax), cold(child)
        assert got.status == want.status
        if want.status == SolveStatus.OPTIMAL:
            optimal += 1
            assert got.objective == pytest.approx(want.objective, rel=1e-9) and got.objective >= parent.objective - 1e-9
        # the cached prefix plus the new row are the arrays a cold conversion gives
        fresh = LinearModel(name="fresh", vars=child.vars, constraints=list(child.constraints))
        for a, b in zip(_rows(child, np), _rows(fresh, np)):
            assert np.array_equal(a, b)
    assert optimal >= 3 and md.lp_cache["rows"][0] == 40  # the forks' rows stay theirs


def _cover_model(rows_as_arrays: bool) -> LinearModel:
    """A random covering MILP; with ``rows_as_arrays`` every other row is an ArrayConstraint (one
    of them with a zero coefficient, which ``add`` drops as it does in a dict row)."""
    import random

    rng = random.Random(11)
    md = LinearModel(name="arrays")
    xs = [md.add_var(f"x{i}", 0, rng.choice([1, 2, 5]), integer=True) for i in range(12)]
    for j in range(14):
        picked = rng.sample(range(len(xs)), 5)
        coefs = {i: float(rng.randint(1, 9)) for i in picked}
        if j == 3:
            coefs[picked[0]] = 0.0
        rhs = float(rng.randint(4, 20))
        if rows_as_arrays and j % 2:
            md.add(ArrayConstraint(list(coefs), list(coefs.values()), rhs, math.inf), f"cover{j}")
        else:
            md.add(Constraint(dict(coefs), rhs, math.inf), f"cover{j}")
    md.minimize(lsum(rng.randint(1, 9) * x for x in xs))
    return md


@pytest.mark.parametrize("backend", BACKENDS)
def test_array_rows_are_the_same_rows_to_every_backend(backend, tmp_path):
    # the dense rows of a window's model are ArrayConstraints, handed to HiGHS as arrays: every
    # backend, the checker and the MPS writer must see the model the dict rows make
    import numpy as np

    from tangram_opt.solvers.highs import _rows

    plain, arrays = _cover_model(False), _cover_model(True)
    assert plain.stats() == arrays.stats() and plain.size() == arrays.size()
    for a, b in zip(_rows(plain, np), _rows(arrays, np)):
        assert np.array_equal(a, b)
    want, got = solve_model(plain, backend), solve_model(arrays, backend)
    assert got.status == want.status == SolveStatus.OPTIMAL
    assert got.objective == pytest.approx(want.objective) and arrays.check(got.values) == []
    plain.write_mps(str(tmp_path / "plain.mps"))
    arrays.write_mps(str(tmp_path / "arrays.mps"))
    assert (tmp_path / "plain.mps").read_text() == (tmp_path / "arrays.mps").read_text()
    # a fork converts only its new rows and keeps the parent's arrays (HiGHS's cache)
    child = arrays.fork()
    child.add(ArrayConstraint([0, 5], [1.0, 1.0], 1.0, math.inf), "more")
    fresh = LinearModel(name="fresh", vars=child.vars, constraints=list(child.constraints))
    for a, b in zip(_rows(child, np), _rows(fresh, np)):
        assert np.array_equal(a, b)


def test_an_array_row_needs_one_index_per_value():
    with pytest.raises(ValueError, match="one index per value"):
        ArrayConstraint([0, 1], [1.0], 0.0, 1.0)


@pytest.mark.parametrize("backend", [b for b in ("highs", "cp-sat") if b in available_backends()])
def test_a_time_limit_already_passed_stops_the_solve_instead_of_lifting_it(backend, monkeypatch):
    # a deadline computed as "time left" can be negative: HiGHS refused such a limit and kept none
    # (no limit at all), CP-SAT called the model invalid
    m = LinearModel(name="late")
    x = m.add_var("x", 0, 10, integer=True)
    m.add(x >= 3)
    m.minimize(x)
    limits = []
    if backend == "highs":
        import highspy

        class Recording(highspy.Highs):
            def setOptionValue(self, key, value):  # noqa: N802 - HiGHS's name
                if key == "time_limit":
                    limits.append(value)
                return super().setOptionValue(key, value)

        monkeypatch.setattr(highspy, "Highs", Recording)
    res = solve_model(m, backend, SolveOptions(time_limit_s=-1.0))
    assert res.status != SolveStatus.ERROR
    if backend == "highs":
        assert limits == [0.0]  # a limit HiGHS takes: stop at once


def test_zeroed_fixes_columns_to_zero_inside_its_block_and_puts_their_bounds_back():
    md = LinearModel()
    x = md.add_var("x", 0, 5, integer=True)
    y = md.add_var("y", 0, 7)
    md.set_upper_bound(x.index, 3)
    before = list(md.vars)
    with md.zeroed([x.index]):
        assert md.vars[x.index].ub == 0 and md.vars[y.index].ub == 7
    assert md.vars == before  # back to 3, not to 5: the tightening before the block stays
    with pytest.raises(RuntimeError), md.zeroed(iter([x.index, y.index])):
        assert md.vars[y.index].ub == 0
        raise RuntimeError
    assert md.vars == before


def _grouped_model(seed: int) -> tuple[LinearModel, float]:
    """Three to five positions, each picking one of four to seven items of two or three groups,
    under a shared budget and with a price on each change of group between neighbours (which the
    LP relaxation underrates with spread items); and its optimum by brute force."""
    import random

    rng = random.Random(seed)
    P = rng.randint(3, 5)
    items = [[(rng.randint(0, 2), rng.randint(1, 9), rng.randint(1, 6)) for _ in range(rng.randint(4, 7))]
             for _ in range(P)]  # (group, cost, weight)
    cap = sum(min(w for _, _, w in pos) for pos in items) + rng.randint(0, 6)
    md = LinearModel()
    x = [[md.add_binary(f"x{p}_{j}") for j in range(len(pos))] for p, pos in enumerate(items)]
    for p in range(P):
        md.add(LinExpr({v.index: 1.0 for v in x[p]}) == 1, f"one{p}")
    md.add(LinExpr({v.index: float(w) for p, pos in enumerate(items) for v, (_, _, w) in zip(x[p], pos)}) <= cap, "cap")
    changes = []
    for p in range(P - 1):
        z = md.add_var(f"z{p}", 0, 1)
        changes.append(z)
        for g in range(3):  # z_p >= [group g at p] - [group g at p+1]
            coefs = {v.index: 1.0 for v, it in zip(x[p], items[p]) if it[0] == g}
            for v, it in zip(x[p + 1], items[p + 1]):
                if it[0] == g:
                    coefs[v.index] = coefs.get(v.index, 0.0) - 1.0
            coefs[z.index] = -1.0
            md.add(LinExpr(coefs) <= 0, f"chg{p}_{g}")
    md.minimize(LinExpr({**{v.index: float(c) for p, pos in enumerate(items) for v, (_, c, _) in zip(x[p], pos)},
                         **{z.index: 7.0 for z in changes}}))
    md.choice_groups = [[[v.index for v, it in zip(x[p], pos) if it[0] == g] for g in range(3)] for p, pos in
                        enumerate(items)]
    md.choice_groups = [[grp for grp in pos if grp] for pos in md.choice_groups]
    best = math.inf
    for pick in itertools.product(*[range(len(pos)) for pos in items]):
        chosen = [items[p][j] for p, j in enumerate(pick)]
        if sum(w for _, _, w in chosen) <= cap:
            best = min(best, sum(c for _, c, _ in chosen) + 7 * sum(a[0] != b[0] for a, b in zip(chosen, chosen[1:])))
    return md, best


@pytest.mark.parametrize("seed", range(12))
def test_group_branching_finds_the_brute_force_optimum_and_proves_a_cutoff(seed):
    md, best = _grouped_model(seed)
    res = solve_model(md, "highs", SolveOptions(time_limit_s=30, group_branching=True))
    assert res.status == SolveStatus.OPTIMAL and res.objective == pytest.approx(best)
    assert res.bound <= res.objective + 1e-9 and "group branching" in res.message
    assert solve_model(md, "highs", SolveOptions(time_limit_s=30, group_branching=True, cutoff=best - 0.5)).status \
        == SolveStatus.INFEASIBLE
    above = solve_model(md, "highs", SolveOptions(time_limit_s=30, group_branching=True, cutoff=best + 0.5))
    assert above.status == SolveStatus.OPTIMAL and above.objective == pytest.approx(best)


def test_group_branching_fixes_columns_by_reduced_cost_and_keeps_the_optimum():
    # with a cutoff just above the optimum, nodes fix the columns whose reduced cost reaches it;
    # every seed must still find the brute-force optimum (a wrong fixing would cut it off)
    fixed = 0
    for seed in range(12, 40):
        md, best = _grouped_model(seed)
        res = solve_model(md, "highs", SolveOptions(time_limit_s=30, group_branching=True, cutoff=best + 0.5))
        assert res.status == SolveStatus.OPTIMAL and res.objective == pytest.approx(best), seed
        fixed += int(res.message.split(", ")[1].split()[0])
    assert fixed > 0


def test_group_branching_lps_each_get_their_own_time_limit():
    # HiGHS's time limit bounds an object's run time summed over its runs: the LP object of island
    # branching must give every LP the time asked for, not what is left of the first LP's limit
    import random

    from tangram_opt.solvers.group_branching import _Lp

    rng = random.Random(0)
    md = LinearModel()
    xs = [md.add_var(f"x{j}", 0, 1) for j in range(300)]
    for r in range(120):
        md.add(LinExpr({v.index: rng.random() for v in rng.sample(xs, 40)}) <= 5, f"r{r}")
    md.minimize(LinExpr({v.index: -rng.random() for v in xs}))
    lp = _Lp(md)
    limit = 0.05
    for _ in range(2000):  # cold solves until their run time adds up to twice the limit
        lp.h.clearSolver()
        assert lp.solve(limit)[0] == "optimal"
        if lp.h.getRunTime() > 2 * limit:
            break
    assert lp.h.getRunTime() > 2 * limit


def test_group_branching_lps_run_after_a_two_thread_solve():
    # a two-thread solve leaves HiGHS's process-wide pool at two threads, where a one-thread LP
    # ends at once without an answer (island branching then solved whole subtrees as MIPs): the
    # LP object sizes the pool to one thread before every LP
    from tangram_opt.solvers.group_branching import _Lp

    md, best = _grouped_model(9)
    highs = get_backend("highs")
    assert highs.solve(_grouped_model(9)[0], SolveOptions(time_limit_s=10, threads=2)).objective == pytest.approx(best)
    assert _Lp(md).solve(10.0)[0] == "optimal"
    # ... also when the two-thread solve comes between LPs of one object (island branching's
    # restricted MIPs run with the caller's threads)
    lp = _Lp(md)
    assert lp.solve(10.0)[0] == "optimal"
    assert highs.solve(_grouped_model(9)[0], SolveOptions(time_limit_s=10, threads=2)).objective == pytest.approx(best)
    lp.h.clearSolver()  # solved again from scratch, as after a jump across the tree
    assert lp.solve(10.0)[0] == "optimal"
    res = highs.solve(md, SolveOptions(time_limit_s=10, threads=1, group_branching=True))
    assert res.status == SolveStatus.OPTIMAL and res.objective == pytest.approx(best)


@pytest.mark.parametrize("threads", [1, 2])
def test_group_branching_with_one_group_per_position_solves_the_restricted_mip(threads):
    md, best = _grouped_model(5)
    md.choice_groups = [[sorted(j for grp in pos for j in grp)] for pos in md.choice_groups]
    res = solve_model(md, "highs", SolveOptions(time_limit_s=30, group_branching=True, threads=threads))
    assert res.status == SolveStatus.OPTIMAL and res.objective == pytest.approx(best)


def test_group_branching_after_a_solve_with_another_thread_count():
    # its LPs run on one thread and its restricted MIPs on the caller's, in a process whose HiGHS
    # thread pool other solves resize (a solve asking for more threads than the pool holds fails)
    md, best = _grouped_model(7)
    highs = get_backend("highs")
    for threads in (2, 1):
        assert highs.solve(_grouped_model(7)[0], SolveOptions(time_limit_s=10, threads=threads)).objective \
            == pytest.approx(best)
        res = highs.solve(md, SolveOptions(time_limit_s=10, threads=threads, group_branching=True))
        assert res.status == SolveStatus.OPTIMAL and res.objective == pytest.approx(best)
        assert "group branching" in res.message


def test_group_branching_stopped_at_once_reports_a_bound_no_higher_than_the_optimum():
    md, best = _grouped_model(3)
    res = solve_model(md, "highs", SolveOptions(time_limit_s=0.0, group_branching=True))
    assert res.status in (SolveStatus.NO_SOLUTION, SolveStatus.FEASIBLE)
    assert res.bound is None or res.bound <= best + 1e-9
