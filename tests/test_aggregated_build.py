"""The aggregated model a window builds is exactly the frozen one: same columns, rows, coefficients,
bounds and order.

``AggregatedMIP.build`` is tuned for speed (coefficient dicts built directly, per-type numbers looked
up once, the neighbour rows' set filters as array masks); this pins what it builds, so a faster
build cannot change the model. The instance is synthetic (candidates, paths and stage types written
as numbers here, not priced by the cost model), so only the formulation can move the digests.

When a change to the formulation is meant to change the model, print the new digests with
``python tests/test_aggregated_build.py`` and replace ``FROZEN`` (say why in the commit).
"""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import replace

import pytest

from tangram_opt.cost import LayerCost, StageConfig
from tangram_opt.planner.candidates.table import BoundaryLink, Candidate
from tangram_opt.planner.formulations.aggregated import AggregatedMIP
from tangram_opt.planner.formulations.problem import FormulationOptions, PipelineProblem
from tangram_opt.planner.formulations.stage_types import StageType
from tangram_opt.solvers.model import LinearModel, LinExpr, Var, lsum

TICK_S = 1e-6
M = 8  # micro-batches: above 3, so the neighbour rows count stages sandwiched between two heavy ones


def _layer(fwd_s: float) -> LayerCost:
    return LayerCost(fwd_time_s=fwd_s, bwd_time_s=2 * fwd_s, weight_bytes=0.0, grad_bytes=0.0, optimizer_bytes=0.0,
                     activation_bytes=0.0)


def _problem(schedule: str = "1f1b") -> PipelineProblem:
    """Three islands (two zones: island 2 sits behind a slow shared link), three candidates each."""
    rng = random.Random(7)
    gpus = {0: 16, 1: 8, 2: 8}
    cands = []
    for i in gpus:
        for g in (1, 2, 4):
            cands.append(Candidate(island=i, config=StageConfig(tp=g), layer={"dense": _layer(1e-3)},
                                   embedding=_layer(1e-4), head=_layer(2e-4), capacity_bytes=1.0,
                                   p2p_nic_s=(0.5 + rng.random()) * 2e-3 / g,
                                   p2p_scale_up_s=(0.5 + rng.random()) * 2e-4))
    links = {(i, j): BoundaryLink(latency_s=(1 + rng.random()) * 1e-4, scale_up=i == j == 0,
                                  shared_s=4e-3 * rng.random() if 2 in (i, j) and i != j else 0.0)
             for i in gpus for j in gpus}
    return PipelineProblem(candidates=cands, kinds=("dense",), layers={"dense": 12}, island_gpus=gpus, links=links,
                           num_micro_batches=M, pipeline_micro_batch=1, max_stages=M, schedule=schedule)


def _types(problem: PipelineProblem) -> dict[str, list[StageType]]:
    """Stage types of 1-5 layers per candidate and role, with spread times, tails and memory."""
    rng = random.Random(11)
    out: dict[str, list[StageType]] = {}
    for role in ("first", "mid", "last"):
        out[role] = []
        for ci, c in enumerate(problem.candidates):
            per_layer_s = (1 + 2 * rng.random()) * 4e-3 / c.gpus ** 0.8
            for n in range(1, 6):
                time_s = n * per_layer_s + (2e-3 if role != "mid" else 0.0)
                fwd_s = time_s * (0.3 + 0.1 * rng.random())
                out[role].append(StageType(role=role, candidate=ci, layers=(("dense", n),), time_s=time_s,
                                           fwd_s=fwd_s, bwd_s=time_s - fwd_s, tail_s=rng.random() * 3e-2,
                                           tolerance=1 + int(rng.random() * (M + 2))))
    return out


def _windows(classes: bool = False) -> dict[str, AggregatedMIP]:
    """Windows as the search builds them: the root, period windows, tail windows, excluded types, a
    cutoff without the order rows, GPipe, a floor on the stage count, and stage ranges of a window.
    Without the neighbour-class rows unless ``classes``: they came after the models were frozen,
    and their columns sit before Y and U, so they would shift every later index of the digest
    (test_neighbour_class_rows_come_on_top_of_the_frozen_rows checks them)."""
    problem = _problem()
    types = _types(problem)
    opts = FormulationOptions(tick_s=TICK_S, neighbour_classes=classes)
    mid_times = sorted(t.time_s for t in types["mid"])
    med = mid_times[len(mid_times) // 2]
    tails = sorted(t.tail_s for ts in types.values() for t in ts)

    def window(**kw) -> AggregatedMIP:  # type: ignore[no-untyped-def]
        kw.setdefault("problem", problem)
        kw.setdefault("options", opts)
        return AggregatedMIP(all_types=types, **kw).build()

    out = {"root": window(),
           "period": window(lower_tmax_s=0.5 * med, upper_tmax_s=med),
           "period_wide": window(lower_tmax_s=0.2 * med, upper_tmax_s=1.6 * med),
           "tail": window(lower_tmax_s=0.5 * med, upper_tmax_s=1.2 * med, lower_tail_s=tails[len(tails) // 2]),
           "tail_band": window(lower_tmax_s=0.3 * med, upper_tmax_s=1.6 * med, lower_tail_s=tails[len(tails) // 3],
                               upper_tail_s=tails[-4]),
           "excluded": window(lower_tmax_s=0.5 * med, upper_tmax_s=med, excluded_types=frozenset(
               (t.role, t.candidate, t.layers) for t in types["mid"][::4])),
           "cutoff_no_order_rows": window(options=replace(opts, cutoff_s=40 * med, order_rows=False),
                                          lower_tmax_s=0.5 * med, upper_tmax_s=med,
                                          lower_tail_s=tails[len(tails) // 2]),
           "gpipe": window(problem=_problem("gpipe"), lower_tmax_s=0.5 * med, upper_tmax_s=med),
           "min_stages": window(problem=replace(problem, min_stages=3), lower_tmax_s=0.5 * med, upper_tmax_s=med)}
    out["range_2_3"] = out["period_wide"].with_stage_range(2, 3)
    out["range_3_5"] = out["tail"].with_stage_range(3, 5)
    return out


def _number(x: float) -> str:
    return repr(float(x) + 0.0)  # as the LP reads it: 3 and 3.0 alike, -0.0 as 0.0


#: row families added since the models were frozen (the tail averages, islands in use, the link
#: rows per island): left out of the digest, so it still pins every other row as it was;
#: test_the_windows_hold_every_row_family sees them
ADDED = ("tail_gpus", "on_gpus", "comm_island")


def _rows(model: LinearModel) -> list:
    return [c for c in model.constraints if c.name.split("[")[0] not in ADDED]


def _canonical(model: LinearModel) -> str:
    lines = [model.name]
    lines += [f"var {v.index} {v.name} {_number(v.lb)} {_number(v.ub)} {int(v.integer)}" for v in model.vars]
    lines += [f"row {c.name} {_number(c.lb)} {_number(c.ub)} " + " ".join(f"{i}:{_number(a)}"
                                                                          for i, a in c.coefs.items())
              for c in _rows(model)]
    lines.append("min " + _number(model.objective.const) + " " +
                 " ".join(f"{i}:{_number(a)}" for i, a in model.objective.coefs.items()))
    return "\n".join(lines)


def _summary(mip: AggregatedMIP) -> tuple[int, int, str]:
    rows = _rows(mip.model)
    return len(rows), sum(len(c.coefs) for c in rows), hashlib.sha256(_canonical(mip.model).encode()).hexdigest()[:16]


#: (rows, nonzeros, digest of the canonical model) per window, from the build before it was tuned
FROZEN = {
    "root": (369, 2652, "e3b24901fb943ce3"),
    "period": (372, 9048, "97d231babdbf1e9d"),
    "period_wide": (398, 11525, "453f3f52c6f27788"),
    "tail": (381, 10628, "c7ceda7993dcd089"),
    "tail_band": (413, 12335, "0d6cc08dd377aabf"),
    "excluded": (344, 8053, "d6e5adcd6651e33d"),
    "cutoff_no_order_rows": (359, 8419, "1d0367f1b45eb153"),
    "gpipe": (355, 1744, "54d1dc758fafbb1f"),
    "min_stages": (373, 9070, "eee2e03ab542f69a"),
    "range_2_3": (406, 12049, "9e75f50c82467f57"),
    "range_3_5": (389, 11052, "ce41d026ccfefaef"),
}


@pytest.fixture(scope="module")
def windows() -> dict[str, AggregatedMIP]:
    return _windows()


def test_windows_build_the_frozen_models(windows):
    assert {name: _summary(mip) for name, mip in windows.items()} == FROZEN


def test_the_windows_hold_every_row_family(windows):
    # so the frozen models pin every family of rows, not only the ones every window has
    names = {c.name.split("[")[0] for mip in windows.values() for c in mip.model.constraints}
    for family in ("use", "layers", "gpus", "hall", "first_position", "Tmax", "mccormick", "fluid", "out", "connect",
                   "comm_send", "tmin_def", "link_block", "own_link", "short_def", "cycle_hi", "cycle_first_lo",
                   "neighbours", "neighbours_medium", "medium_def", "tail_mid", "tail_window", "tail_window_Y",
                   "successors", "successor_edges", "succ_ub", "Fmax", "stages_min", "min_stages", "island_block_hi",
                   "island_block_lo", *ADDED):
        assert family in names, family
    # and the neighbour rows of one island's heavy stages, besides those of every island's
    assert any(c.name.startswith("neighbours[") and "," in c.name for mip in windows.values()
               for c in mip.model.constraints)


def test_neighbour_class_rows_come_on_top_of_the_frozen_rows():
    # with the class rows every window keeps the frozen rows (their count), and some window has
    # each class family: edge counts, middle-stage neighbour counts and the pair thresholds
    with_classes = _windows(classes=True)
    families = set()
    for name, mip in with_classes.items():
        rows = [c.name.split("[")[0] for c in _rows(mip.model)]
        families |= {r for r in rows if r.startswith("class_")}
        assert sum(not r.startswith("class_") for r in rows) == FROZEN[name][0], name
    assert families == {"class_degree", "class_centre", "class_incid", "class_pairs"}, families


def test_linear_expressions_keep_their_arithmetic():
    # the model's rows are built with these: differences and sums as the plain definitions give
    # them, new variables appended in the order the right operand lists them
    rng = random.Random(3)
    xs = [Var(i, f"x{i}", 0.0, 1.0, False) for i in range(30)]
    for _ in range(200):
        a = LinExpr({rng.randrange(30): float(rng.randint(-3, 3)) for _ in range(rng.randint(0, 12))}, rng.random())
        b = LinExpr({rng.randrange(30): float(rng.randint(-3, 3)) for _ in range(rng.randint(0, 12))}, rng.random())
        plain_sum = dict(a.coefs)
        for i, c in b.coefs.items():
            plain_sum[i] = plain_sum.get(i, 0.0) + c
        plain_diff = dict(a.coefs)
        for i, c in b.coefs.items():
            plain_diff[i] = plain_diff.get(i, 0.0) + c * -1
        assert list((a + b).coefs.items()) == list(plain_sum.items())
        assert list((a - b).coefs.items()) == list(plain_diff.items())
        assert (a - b).const == a.const + b.const * -1 and (a + b).const == a.const + b.const
        pairs = [(x, rng.randint(-4, 4)) for x in rng.sample(xs, 8)]
        assert LinExpr.terms(pairs).coefs == lsum(k * x for x, k in pairs).coefs


def test_link_floor_is_latency_plus_own_side():
    problem = _problem()
    for ci, c in enumerate(problem.candidates):
        expected = problem.latency_lo_s(c.island) + problem.side_bounds_s(c)[0]
        assert problem.link_floor_s(ci) == expected
        assert problem.link_floor_s(ci) == expected  # remembered, the same
    assert math.isfinite(max(problem.link_floor_s(ci) for ci in range(len(problem.candidates))))


if __name__ == "__main__":
    for name, mip in _windows().items():
        print(f"    {name!r}: {_summary(mip)},")
