"""Property tests (hypothesis): on random small instances every combinatorial bound is below the brute-force
optimum, and both methods return valid placements with the MIP at the optimum and never above the greedy."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tangram_opt.experts import check_placement, lower_bounds, make_problem, place_experts
from test_experts import brute_force


@st.composite
def instances(draw):
    E = draw(st.integers(2, 5))
    R = draw(st.integers(1, 3))
    S = draw(st.integers(math.ceil(E / R), math.ceil(E / R) + 1))
    loads = draw(st.lists(st.integers(0, 40), min_size=E, max_size=E))
    if sum(loads) == 0:
        loads[0] = 1
    K = draw(st.one_of(st.none(), st.integers(0, R * S - E)))
    return loads, R, S, K


@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(instances())
def test_bounds_below_optimum_and_mip_optimal(inst):
    loads, R, S, K = inst
    opt = brute_force(loads, R, S, K)
    p = make_problem(loads, R, 1, S, max_redundant=K)
    for b in lower_bounds(p):
        assert b.value <= opt * (1 + 1e-9) + 1e-9, (b, opt)
    g = place_experts(loads, R, 1, S, max_redundant=K, method="greedy")
    m = place_experts(loads, R, 1, S, max_redundant=K, rel_gap=1e-6, time_limit_s=5)
    assert check_placement(p, g) == [] and check_placement(p, m) == []
    assert m.max_load == pytest.approx(opt, rel=1e-6, abs=1e-9)
    assert m.max_load <= g.max_load * (1 + 1e-9) + 1e-9
    assert m.certificate.max_load_bound <= opt * (1 + 1e-9) + 1e-9
