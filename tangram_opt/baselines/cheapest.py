"""The "cheapest dollars per TFLOP first" baseline, and the node selections it is built from (issue 30).

**The baseline** (:func:`cheapest_first`): rent nodes in order of USD per peak FLOP/s and plan the
rented nodes with the greedy baseline (greedy.py); stop at the first set of nodes whose greedy plan
meets the throughput floor. It is what a cost-minded engineer does by hand ("fill up on the
cheapest compute until the run is fast enough"); the cost benchmark (benchmarks/cost.py) sets the
priced search against it.

**Node selections** are also what starts the priced search (planner/search/priced.py): a dollar
objective rewards plans that leave expensive nodes idle, and the priced MIP's relaxation sees
little of that (its products of price and step time are linearized). The pieces:

- :func:`node_order`: every node the plan may use, cheapest USD per dense peak FLOP/s first (the
  node group's price per GPU-hour over its GPU's peak at the training precision; ties by group
  order). A *selection* is a prefix of that order: the first ``k`` nodes.
- :func:`selection_cluster`: the cluster that keeps only a selection's nodes. Plans on it use the
  full cluster's candidate table (:class:`~tangram_opt.planner.multi_pipeline.generation.SubProvider`)
  and map back onto it stage by stage (:func:`~tangram_opt.planner.multi_pipeline.generation.choices_of`).
- :func:`greedy_on`: the greedy baseline's pipelines (tangram_opt/baselines/greedy.py) on a selection,
  as stage choices of the full cluster's sub-problems.
- :func:`first_meeting`: the smallest prefix whose pipelines meet a throughput floor, by doubling
  then bisection on ``k`` (a heuristic where throughput is not monotone in ``k``: the prefix it
  returns meets the floor, a smaller one might too).

Nothing here bounds anything: these are plans. The priced search re-scores each exactly and the
certificate's bound comes from its MIPs (priced.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from tangram_opt.baselines.greedy import greedy_by_micro_batch
from tangram_opt.errors import InfeasibleError, TangramError
from tangram_opt.planner.assemble import make_plan, pipeline_plan
from tangram_opt.planner.context import PlanningContext
from tangram_opt.planner.formulations.problem import StageChoice, choices_timing
from tangram_opt.planner.multi_pipeline.generation import SubProvider, choices_of
from tangram_opt.planner.plan import Plan
from tangram_opt.specs.cluster import Cluster
from tangram_opt.specs.pricing import group_price

#: stage choices per pipeline micro-batch size: ``{b: (step time s, choices)}``
Pipelines = dict[int, tuple[float, list[StageChoice]]]


def node_order(ctx: PlanningContext, max_nodes: Mapping[str, int] | None = None) -> list[str]:
    """Node group name of every node a plan may use (``max_nodes`` of a group, else all), cheapest
    USD per peak FLOP/s first."""
    prec = ctx.training.precision

    def usd_per_flop(g) -> float:  # type: ignore[no-untyped-def]
        return group_price(ctx.cluster, g).usd_per_gpu_hour / g.gpu.peak_flops_per_s(prec)

    ranked = sorted(enumerate(ctx.cluster.node_groups), key=lambda ig: (usd_per_flop(ig[1]), ig[0]))
    return [g.name for _, g in ranked for _ in range(min(g.num_nodes, (max_nodes or {}).get(g.name, g.num_nodes)))]


def prefix(order: list[str], k: int) -> dict[str, int]:
    """Nodes per group of the first ``k`` nodes of ``order``."""
    out: dict[str, int] = {}
    for name in order[:k]:
        out[name] = out.get(name, 0) + 1
    return out


def selection_cluster(cluster: Cluster, nodes: Mapping[str, int]) -> Cluster:
    """``cluster`` with ``nodes[group]`` nodes of each group (groups without nodes dropped)."""
    groups = tuple(replace(g, num_nodes=nodes[g.name]) for g in cluster.node_groups if nodes.get(g.name, 0) > 0)
    zones = {g.zone for g in groups}
    links = tuple(z for z in cluster.zone_links if z.zone_a in zones and z.zone_b in zones)
    return Cluster(name=f"{cluster.name}-selection", node_groups=groups, zone_links=links)


def selection_context(ctx: PlanningContext, nodes: Mapping[str, int]) -> tuple[Cluster, PlanningContext]:
    """The selection's cluster and its planning context (the full cluster's candidate table)."""
    sub = selection_cluster(ctx.cluster, nodes)
    return sub, PlanningContext(sub, ctx.model, ctx.training, space=ctx.space, cost=ctx.cost,
                                provider=SubProvider(ctx), calibration=ctx.calibration,
                                moe_load_imbalance=ctx.moe_load_imbalance, profiles=ctx.profiles)


def greedy_on(ctx: PlanningContext, nodes: Mapping[str, int], *, thorough: bool = False) -> Pipelines:
    """The greedy baseline's best pipeline per pipeline micro-batch size on the selection ``nodes``,
    as choices of ``ctx``'s sub-problems, with ``ctx``'s closed-form step times."""
    sub, sctx = selection_context(ctx, nodes)
    out: Pipelines = {}
    for b, (_, ch) in greedy_by_micro_batch(sctx, thorough=thorough).items():
        mapped = choices_of(ctx, pipeline_plan(sctx, sctx.problem(b), ch), sub)
        if mapped is not None:
            out[b] = (choices_timing(ctx.problem(b), mapped).step_time_s, mapped)
    return out


def plan_on(ctx: PlanningContext, nodes: Mapping[str, int], solver: Callable[..., Plan], *, time_limit_s: float,
            backend: str, threads: int, seed: int, rel_gap: float) -> Pipelines:
    """The single-pipeline search (``solver``) on the selection ``nodes``, as choices of ``ctx``'s
    sub-problems (empty when it finds nothing or its plan does not map)."""
    sub, _ = selection_context(ctx, nodes)
    try:
        plan = solver(sub, ctx.model, ctx.training, time_limit_s=time_limit_s, backend=backend, threads=threads,
                      seed=seed, rel_gap=rel_gap, space=ctx.space, provider=SubProvider(ctx),
                      calibration=ctx.calibration, profiles=ctx.profiles, moe_load_imbalance=ctx.moe_load_imbalance)
    except TangramError:
        return {}
    pipe = plan.pipelines[0]
    mapped = choices_of(ctx, pipe, sub)
    if mapped is None:
        return {}
    b = pipe.pipeline_micro_batch
    return {b: (choices_timing(ctx.problem(b), mapped).step_time_s, mapped)}


def fastest(pipes: Pipelines) -> float:
    """The shortest step among ``pipes`` (infinity when empty)."""
    return min((t for t, _ in pipes.values()), default=float("inf"))


def first_meeting(n: int, test: Callable[[int], bool]) -> int | None:
    """The smallest ``k`` in 1..n with ``test(k)`` found by doubling then bisection (None when
    ``test(n)`` is false). ``test`` is called O(log n) times, at most once per ``k``."""
    seen: dict[int, bool] = {}

    def meets(k: int) -> bool:
        if k not in seen:
            seen[k] = test(k)
        return seen[k]

    if n < 1:
        return None
    hi = 1
    while hi < n and not meets(hi):
        hi = min(2 * hi, n)
    if not meets(hi):
        return None
    lo = hi // 2  # meets(lo) is false (or lo = 0)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if meets(mid):
            hi = mid
        else:
            lo = mid
    return hi


@dataclass(frozen=True, slots=True)
class CheapestFirstResult:
    """The baseline's plan, the nodes it rented (group -> nodes) and how many node sets it planned."""

    plan: Plan
    nodes: dict[str, int]
    node_sets_planned: int


def cheapest_first(ctx: PlanningContext, *, min_tokens_per_s: float,
                   max_nodes: Mapping[str, int] | None = None) -> CheapestFirstResult:
    """The baseline: the fewest nodes, cheapest USD per peak FLOP/s first, whose greedy plan meets
    ``min_tokens_per_s`` (doubling then bisection on the node count: :func:`first_meeting`), and
    that plan (its fastest pipeline micro-batch size). Raises :class:`InfeasibleError` when the
    greedy plan on every node the budget allows stays below the floor."""
    order = node_order(ctx, max_nodes)
    tokens = ctx.training.global_batch_size * ctx.training.seq_len
    found: dict[int, Pipelines] = {}

    def meets(k: int) -> bool:
        found[k] = greedy_on(ctx, prefix(order, k))
        return tokens / fastest(found[k]) >= min_tokens_per_s if found[k] else False

    k = first_meeting(len(order), meets)
    if k is None:
        best = max((tokens / fastest(p) for p in found.values() if p), default=0.0)
        raise InfeasibleError(f"the greedy plan on all {len(order)} node(s) reaches {best:,.0f} tokens/s, below the "
                              f"floor of {min_tokens_per_s:,.0f}: lower min_tokens_per_s",
                              closest={"tokens_per_s": best})
    b, (_, choices) = min(found[k].items(), key=lambda kv: kv[1][0])
    plan = make_plan(ctx, [pipeline_plan(ctx, ctx.problem(b), choices)], method="cheapest-first")
    return CheapestFirstResult(plan=plan, nodes=prefix(order, k), node_sets_planned=len(found))


__all__ = ["CheapestFirstResult", "Pipelines", "cheapest_first", "fastest", "first_meeting", "greedy_on", "node_order",
           "plan_on", "prefix", "selection_cluster", "selection_context"]
