"""The cost benchmark (issue 30 item 4, benchmarks/cost.py): one small scenario end to end, the
page's check, and its inputs."""

from __future__ import annotations

import argparse

import pytest

from benchmarks.cost import _floors, cheaper_or_equal, page, run_scenario, unpriced_reason
from benchmarks.scenario_suite import load_scenarios


def test_tiny_scenario_cost_optimal_is_never_dearer_than_the_baselines():
    (sc,) = load_scenarios(["tiny-mixed-opt-350m"])
    assert unpriced_reason(sc) is None
    row = run_scenario(sc, [0.5, 0.95], quick=True, threads=1, cap_s=3)
    a = row["all"]
    assert a["gpus"] == 24 and a["usd_per_1m_tokens"] > 0
    low, high = row["floors"]
    # at half the all-GPU throughput the cheapest-first baseline leaves nodes idle and is cheaper
    # per token than using every GPU; the cost-optimal plan is no dearer than either
    assert low["cheapest"]["usd_per_1m_tokens"] < a["usd_per_1m_tokens"]
    for f in (low, high):
        o = f["optimal"]
        assert "error" not in o and o["tokens_per_s"] >= f["floor"] * (1 - 1e-9)
        assert o["usd_per_1m_tokens"] <= a["usd_per_1m_tokens"] * (1 + 1e-9)
    assert cheaper_or_equal([row]) == []
    text = page([row], [("h100-64-llama-3-8b", "one island: no choice of GPU type")], quick=True,
                floors=[0.5, 0.95], threads=1, cap_s=3)
    assert "**Check:**" in text and "tiny-mixed-opt-350m" in text and "Not priced" in text
    # a cost-optimal plan dearer than a baseline is reported, never hidden
    dear = {**row, "floors": [{**low, "optimal": {**low["optimal"], "usd_per_1m_tokens": 2 * a["usd_per_1m_tokens"]}}]}
    assert cheaper_or_equal([dear]) and "**Check failed**" in page([dear], [], quick=True, floors=[0.5], threads=1,
                                                                   cap_s=3)


@pytest.mark.parametrize("text", ["0", "1.5", "x", ""])
def test_bad_floors_are_refused(text):
    with pytest.raises(argparse.ArgumentTypeError, match="--floors"):
        _floors(text)
