"""Exhaustive enumeration of the single-pipeline plan space, for tiny instances.

Used by the tests (and available to anyone studying the formulation) to check that solve() finds
no worse a plan than the best one that exists: every pipeline micro-batch size, every depth up to
``max_stages``, every split of the layers into contiguous stages, and every candidate per stage,
subject to the GPU budget of each island and the memory of each stage at its 1F1B position.
The cost is the closed-form model (pipeline_model.pipeline_timing), the same one the MIP certifies.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

from tangram_opt.planner.context import PlanningContext
from tangram_opt.planner.formulations.inflight import inflight_micro_batches
from tangram_opt.planner.formulations.problem import PipelineProblem, StageChoice, choices_timing


@dataclass(frozen=True, slots=True)
class BruteForceResult:
    step_time_s: float
    pipeline_micro_batch: int
    choices: tuple[StageChoice, ...]
    plans_evaluated: int


def _compositions(total: int, parts: int) -> Iterator[tuple[int, ...]]:
    for cut in itertools.combinations(range(1, total), parts - 1):
        bounds = (0, *cut, total)
        yield tuple(bounds[i + 1] - bounds[i] for i in range(parts))


def _layers_of(start: int, count: int, problem: PipelineProblem) -> dict[str, int]:
    dense = problem.layers.get("dense", 0) if len(problem.kinds) == 2 else 0
    out = {k: 0 for k in problem.kinds}
    for idx in range(start, start + count):
        out[problem.kinds[0] if idx < dense else problem.kinds[-1]] += 1
    return out


def enumerate_plans(problem: PipelineProblem, *, max_stages: int | None = None,
                    dense_on_first_stage: bool = True) -> Iterator[tuple[StageChoice, ...]]:
    """Every pipeline of ``problem`` that fits memory and the GPU budgets (stages in order)."""
    R = max_stages or problem.max_stages
    cands = problem.candidates
    m = problem.num_micro_batches
    L = sum(problem.layers.values())
    for P in range(1, min(R, L) + 1):
        for split in _compositions(L, P):
            if dense_on_first_stage and len(problem.kinds) == 2 and P > 1 and split[0] < problem.layers["dense"]:
                continue
            starts = [sum(split[:k]) for k in range(P)]
            layer_sets = [_layers_of(starts[k], split[k], problem) for k in range(P)]
            options = []
            for k in range(P):
                inflight = inflight_micro_batches(k, P, m, problem.schedule)
                options.append([ci for ci, c in enumerate(cands) if c.memory_bytes(
                    layer_sets[k], inflight, first=k == 0, last=k == P - 1) <= c.capacity_bytes])
            for pick in itertools.product(*options):
                used: dict[int, int] = {}
                for ci in pick:
                    used[cands[ci].island] = used.get(cands[ci].island, 0) + cands[ci].gpus
                if any(g > problem.island_gpus[i] for i, g in used.items()):
                    continue
                yield tuple(StageChoice(candidate=ci, layers=layer_sets[k]) for k, ci in enumerate(pick))


def brute_force(ctx: PlanningContext, *, max_stages: int | None = None,
                dense_on_first_stage: bool = True) -> BruteForceResult | None:
    """Best plan by exhaustive search (None if nothing fits).

    ``dense_on_first_stage`` applies the aggregated formulation's convention for models with
    dense-first layers (all of them on the first stage); set it False to search the larger space.
    """
    R = max_stages or ctx.max_stages
    best: tuple[float, int, tuple[StageChoice, ...]] | None = None
    count = 0
    for b in ctx.pipeline_micro_batches():
        problem = ctx.problem(b, max_stages=R)
        for choices in enumerate_plans(problem, dense_on_first_stage=dense_on_first_stage):
            t = choices_timing(problem, list(choices)).step_time_s
            count += 1
            if best is None or t < best[0] - 1e-15:
                best = (t, b, choices)
    if best is None:
        return None
    return BruteForceResult(step_time_s=best[0], pipeline_micro_batch=best[1], choices=best[2], plans_evaluated=count)


def brute_force_priced(ctx: PlanningContext, objective: str, *, budget_usd_per_h: float | None = None,
                       min_tokens_per_s: float | None = None, max_nodes: dict[str, int] | None = None,
                       max_stages: int | None = None, dense_on_first_stage: bool = False
                       ) -> tuple[float, float, float] | None:
    """Best plan under a dollar objective by exhaustive search: ``(objective value, closed-form
    step time, USD/h)`` of the best plan meeting the limits (None if none does).

    ``objective``: "throughput" (value: step time, s), "min_cost" (USD/h of the GPUs used, each
    island's cheapest node groups first) or "cost_per_token" (USD per 1M tokens). Prices come from
    the cluster (:mod:`tangram_opt.specs.pricing`), independently of the planner's price curves;
    ``max_nodes`` (group -> nodes) takes the rest of a group's GPUs out of its island. Cost per
    token includes cross-zone transfer at the zone links' ``egress_usd_per_gb``: activations and
    their gradients (2 x ``CostModel.p2p_bytes``) per micro-batch and stage boundary between zones.
    """
    from dataclasses import replace

    from tangram_opt.specs.pricing import price_steps, usd_per_hour_of

    R = max_stages or ctx.max_stages
    tokens = ctx.training.global_batch_size * ctx.training.seq_len
    nodes = {g.name: (max_nodes or {}).get(g.name, g.num_nodes) * g.node.gpus_per_node
             for g in ctx.cluster.node_groups}
    steps = {isl.index: tuple((g, min(n, nodes[g]), p) for g, n, p in price_steps(ctx.cluster, isl.node_groups))
             for isl in ctx.islands}
    zone = {isl.index: isl.zone for isl in ctx.islands}

    def egress_usd(b: int, m: int, choices) -> float:  # type: ignore[no-untyped-def]
        usd = 0.0
        isl = [problem.candidates[st.candidate].island for st in choices]
        for a, c in zip(isl, isl[1:]):
            link = ctx.cluster.zone_link(zone[a], zone[c]) if zone[a] != zone[c] else None
            if link is not None and link.egress_usd_per_gb:
                usd += 2 * ctx.cost.p2p_bytes(b) * m / 1e9 * link.egress_usd_per_gb
        return usd

    best: tuple[float, float, float] | None = None
    for b in ctx.pipeline_micro_batches():
        problem = ctx.problem(b, max_stages=R)
        problem = replace(problem, island_gpus={i: sum(n for _, n, _ in s) for i, s in steps.items()})
        for choices in enumerate_plans(problem, dense_on_first_stage=dense_on_first_stage):
            t = choices_timing(problem, list(choices)).step_time_s
            used: dict[int, int] = {}
            for st in choices:
                c = problem.candidates[st.candidate]
                used[c.island] = used.get(c.island, 0) + c.gpus
            usd_h = sum(usd_per_hour_of(steps[i], n) for i, n in used.items())
            if min_tokens_per_s is not None and tokens / t < min_tokens_per_s * (1 - 1e-12):
                continue
            if budget_usd_per_h is not None and usd_h > budget_usd_per_h * (1 + 1e-12):
                continue
            v = (t if objective == "throughput" else usd_h if objective == "min_cost"
                 else (usd_h * t / 3600 + egress_usd(b, problem.num_micro_batches, choices)) / tokens * 1e6)
            if best is None or v < best[0]:
                best = (v, t, usd_h)
    return best


__all__ = ["BruteForceResult", "brute_force", "brute_force_priced", "enumerate_plans"]
