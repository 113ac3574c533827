"""Bounds of the priced search that need no solver (formulations/pipeline_mip.md §4b): the
cheapest stage's USD/h, the priced work and, under a step cap, the capacity LP. Each is a lower
bound over every plan of a sub-problem; priced.py combines them per objective
(``PricedSearch.trivial_bound``)."""

from __future__ import annotations

import math

from tangram_opt.planner.formulations.problem import PipelineProblem, StageChoice


def cheapest_stage_usd_h(p: PipelineProblem) -> float:
    """USD/h of the cheapest stage that fits its island's (budgeted) GPUs: every plan has one."""
    return min((p.usd_per_hour([StageChoice(candidate=ci, layers={})]) for ci, c in enumerate(p.candidates)
                if c.gpus <= p.island_gpus[c.island]), default=math.inf)


def priced_work(p: PipelineProblem) -> float:
    """A lower bound on sum over stages of USD/h x stage time per micro-batch (USD/h x s): each
    layer (and the embedding and the head, once each) priced at the candidate that does it for the
    fewest GPU-seconds x the cheapest GPU-hour of its island. Every stage's time is at most step / m
    (the closed form's step is at least m x every stage's forward + backward), so a plan's USD/h x
    step is at least m x this: a budget bounds the step, a step cap (throughput floor) the USD/h."""
    cheapest = {i: min((price for _, price in steps), default=math.inf) for i, steps in p.island_prices.items()}
    cands = [c for c in p.candidates if c.gpus <= p.island_gpus[c.island]]
    if not cands:
        return 0.0

    def gpu_s(c, part) -> float:  # type: ignore[no-untyped-def]
        return cheapest.get(c.island, math.inf) * c.gpus * (part.fwd_time_s + part.bwd_time_s)

    work = sum(n * min((gpu_s(c, c.layer[k]) for c in cands if k in c.layer), default=math.inf)
               for k, n in p.layers.items() if n)
    work += min(gpu_s(c, c.embedding) for c in cands) + min(gpu_s(c, c.head) for c in cands)
    return work if math.isfinite(work) else 0.0


def capacity_work(p: PipelineProblem, max_step_s: float) -> float:
    """:func:`priced_work` with each island's GPUs as a capacity (USD/h x s per micro-batch): every
    plan whose step is at most ``max_step_s`` has USD/h x step >= m x this (infinity: none exists).

    The LP: ``y[i,j,k]`` layers of kind k (and ``e``, ``h``: the embedding and the head, once each)
    done on island i's price step j (``island_prices``: n GPUs at a price, cheapest first), each at
    the island's fewest GPU-seconds per micro-batch ``w[i,k]``; all layers placed; the GPU-seconds a
    step puts on a price step at most its GPUs x ``max_step_s`` / m (each stage is busy m x its
    forward + backward within the step, on its own GPUs); minimize the priced GPU-seconds. A plan
    is such an allocation at its true stage times and pays at least this for its GPUs (its island
    GPUs are priced cheapest step first), so the LP optimum bounds it. Where the cheapest GPUs
    cannot carry the floor alone, this charges the dearer ones the rest: the plain priced work
    prices everything at each island's cheapest rate with unlimited GPUs."""
    from tangram_opt.solvers import lp_relaxation_bound
    from tangram_opt.solvers.model import LinearModel, lsum

    m = p.num_micro_batches
    cands = [c for c in p.candidates if c.gpus <= p.island_gpus[c.island]]
    if not cands or not p.island_prices:
        return 0.0

    def best(island: int, part) -> float:  # type: ignore[no-untyped-def]
        return min((c.gpus * (part(c).fwd_time_s + part(c).bwd_time_s) for c in cands if c.island == island
                    and part(c) is not None), default=math.inf)

    parts = {k: (lambda c, k=k: c.layer.get(k)) for k, n in p.layers.items() if n}
    parts["embedding"], parts["head"] = (lambda c: c.embedding), (lambda c: c.head)
    need = {k: float(n) for k, n in p.layers.items() if n} | {"embedding": 1.0, "head": 1.0}
    md = LinearModel("capacity_work")
    placed: dict[str, list] = {k: [] for k in parts}
    cost, cap_rows = [], []
    for i, steps in p.island_prices.items():
        w = {k: best(i, part) for k, part in parts.items()}
        for j, (n_gpus, price) in enumerate(steps):
            load = []
            for k, wk in w.items():
                if math.isfinite(wk):
                    y = md.add_var(f"y[{i},{j},{k}]", 0, need[k])
                    placed[k].append(y)
                    load.append(wk * y)
                    cost.append(price * wk * y)
            if load:
                cap_rows.append((lsum(load), n_gpus * max_step_s / m))
    for k, ys in placed.items():
        if not ys:
            return math.inf
        md.add(lsum(ys) == need[k], f"place[{k}]")
    for r, (load, cap) in enumerate(cap_rows):
        md.add(load <= cap, f"capacity[{r}]")
    md.minimize(lsum(cost))
    value = lp_relaxation_bound(md, time_limit_s=5.0)
    return 0.0 if value is None else value


__all__ = ["capacity_work", "cheapest_stage_usd_h", "priced_work"]
