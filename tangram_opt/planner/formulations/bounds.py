"""Bounds and exact answers that need no solver, for one sub-problem (one pipeline micro-batch size).

- :func:`fluid_bottleneck_s`: every island's GPUs at their most efficient candidate, the work
  spread fluidly: a lower bound on the slowest stage's time;
- :func:`quick_lower_bound`: a lower bound on the step time of every plan of the sub-problem;
- :func:`best_single_stage`: the exact best pipeline of one stage (the models cover two or more).

The layer-covering knapsack (knapsack_bound.py) is the stronger bound on the slowest stage.
"""

from __future__ import annotations

import math

from tangram_opt.planner.formulations.inflight import inflight_micro_batches
from tangram_opt.planner.formulations.problem import PipelineProblem, StageChoice, choices_timing, island_capacities


def fluid_bottleneck_s(problem: PipelineProblem) -> float:
    """Lower bound on the bottleneck stage time: per layer kind, L_k / sum_i (N_i / min_{c in i} g_c t_c).

    Each island's GPUs deliver at most N_i GPU-seconds of work per second of bottleneck time (N_i:
    the GPUs its candidates' sizes can occupy, problem.largest_total), and a layer of kind k costs
    at least min g_c t_c GPU-seconds there.
    """
    cands = problem.candidates
    fluid = 0.0
    islands = {c.island for c in cands}
    cap = island_capacities(problem, range(len(cands)))  # what the candidates' sizes can occupy
    for k, n in problem.layers.items():
        rate = sum(cap[i] / min(c.gpus * c.layer[k].time_s for c in cands if c.island == i)
                   for i in islands)
        fluid = max(fluid, n / rate)
    return fluid


def quick_lower_bound(problem: PipelineProblem) -> float:
    """A valid lower bound on the step time of any plan of ``problem`` (no solver).

    Sum of stage times >= every layer at its fastest candidate plus the fastest embedding and head;
    the bottleneck >= that sum spread over the deepest pipeline, and >= the fluid bound.
    """
    cands = problem.candidates
    if not cands:
        return math.inf
    m = problem.num_micro_batches
    total = sum(n * min(c.layer[k].time_s for c in cands) for k, n in problem.layers.items())
    total += min(c.embedding.time_s for c in cands) + min(c.head.time_s for c in cands)
    return (m - 1) * max(fluid_bottleneck_s(problem), total / problem.max_stages) + total


def best_single_stage(problem: PipelineProblem) -> tuple[float, list[StageChoice]] | None:
    """Exact best one-stage pipeline (every layer, embedding and head on one stage)."""
    best = None
    layers = dict(problem.layers)
    inflight = inflight_micro_batches(0, 1, problem.num_micro_batches, problem.schedule)
    for ci, c in enumerate(problem.candidates):
        if c.memory_bytes(layers, inflight, first=True, last=True) > c.capacity_bytes:
            continue
        if c.gpus > problem.island_gpus[c.island]:
            continue
        choice = [StageChoice(candidate=ci, layers=dict(layers))]
        t = choices_timing(problem, choice).step_time_s
        if best is None or t < best[0]:
            best = (t, choice)
    return best


__all__ = ["best_single_stage", "fluid_bottleneck_s", "quick_lower_bound"]
