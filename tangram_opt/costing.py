"""What a plan costs in dollars: per hour, per step, per million tokens, and which GPUs stay idle.

:func:`plan_cost` prices a :class:`~tangram_opt.planner.plan.Plan` on its cluster with the prices of
:mod:`tangram_opt.specs.pricing` (the cluster file's ``price_per_gpu_hour``, else the default
on-demand table). It reads only the plan's stage layout (islands and GPU counts, pipelines and
micro-batches) and the cluster; it never looks at how the plan was found.

Accounting (each figure's name says what it covers):

- ``usd_per_hour``: the GPUs the plan uses, each at its node group's price per GPU-hour. This is
  the figure a per-GPU price in the planner's candidate tables adds up to. When an island merges
  node groups at different prices (same node shape and zone), its used GPUs are taken from the
  cheapest group first (:func:`~tangram_opt.specs.pricing.price_steps`).
- ``usd_per_hour_nodes``: the whole nodes those GPUs sit on (``ceil(used / GPUs per node)`` per
  group): what renting only the nodes the plan touches costs where a provider bills per instance.
- ``usd_per_hour_cluster``: every GPU of the cluster, used or not.
- ``egress_usd_per_step``: bytes the step moves across zone links times each link's
  ``egress_usd_per_gb``. Counted: pipeline activations and their gradients crossing a stage
  boundary between zones (``CostModel.p2p_bytes`` per micro-batch and direction, what the cost
  model puts on a zone link), and the rings of the gradient all-reduce between pipelines of a
  multi-pipeline plan (:func:`tangram_opt.sim.cross_sync.cross_pipeline_allreduce`). Collectives
  never cross zones (they stay inside islands), so nothing else does.
- ``usd_per_step = usd_per_hour x step time / 3600 + egress_usd_per_step``, and
  ``usd_per_1m_tokens = usd_per_step / tokens per step x 10^6``. Both charge only the GPUs in use:
  idle GPUs are listed (``idle_groups``, :attr:`GroupUse.gpus_idle`) so they can be released, and
  ``usd_per_1m_tokens_cluster`` charges the whole cluster instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from tangram_opt import units as u
from tangram_opt.errors import SpecError
from tangram_opt.planner.islands import find_islands
from tangram_opt.planner.plan import Plan
from tangram_opt.specs.cluster import Cluster
from tangram_opt.specs.model import ModelSpec
from tangram_opt.specs.pricing import fill_cheapest, group_price, price_steps
from tangram_opt.specs.training import TrainingSpec

TOKENS_PER_MILLION = 10**6


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupUse:
    """One node group: its GPUs, how many the plan uses, and its price."""

    group: str
    gpu: str
    zone: str
    island: str
    gpus_per_node: int
    nodes: int
    gpus: int
    gpus_used: int
    usd_per_gpu_hour: float
    #: "cluster file" or "default: <provider instance, region, price date>"
    price_origin: str

    @property
    def gpus_idle(self) -> int:
        return self.gpus - self.gpus_used

    @property
    def nodes_used(self) -> int:
        """Nodes holding the used GPUs, packed as tightly as the node size allows."""
        return math.ceil(self.gpus_used / self.gpus_per_node)

    @property
    def nodes_idle(self) -> int:
        """Whole nodes with no GPU in use: these can be released."""
        return self.nodes - self.nodes_used

    @property
    def usd_per_hour_used(self) -> float:
        return self.gpus_used * self.usd_per_gpu_hour

    @property
    def usd_per_hour_nodes(self) -> float:
        return self.nodes_used * self.gpus_per_node * self.usd_per_gpu_hour

    @property
    def usd_per_hour(self) -> float:
        return self.gpus * self.usd_per_gpu_hour


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanCost:
    """The dollar figures of one plan on one cluster (see the module docstring for what each covers)."""

    cluster: str
    groups: tuple[GroupUse, ...]
    step_time_s: float
    tokens_per_step: int
    #: bytes moved across each zone link per step, both directions: ``((zone_a, zone_b), bytes)``
    egress_bytes_per_step: tuple[tuple[tuple[str, str], float], ...] = ()
    egress_usd_per_step: float = 0.0

    @property
    def usd_per_hour(self) -> float:
        return sum(g.usd_per_hour_used for g in self.groups)

    @property
    def usd_per_hour_nodes(self) -> float:
        return sum(g.usd_per_hour_nodes for g in self.groups)

    @property
    def usd_per_hour_cluster(self) -> float:
        return sum(g.usd_per_hour for g in self.groups)

    @property
    def egress_usd_per_hour(self) -> float:
        return self.egress_usd_per_step * u.HOUR / self.step_time_s

    @property
    def usd_per_step(self) -> float:
        return self.usd_per_hour * self.step_time_s / u.HOUR + self.egress_usd_per_step

    @property
    def usd_per_1m_tokens(self) -> float:
        return self.usd_per_step / self.tokens_per_step * TOKENS_PER_MILLION

    @property
    def usd_per_1m_tokens_cluster(self) -> float:
        """Per million tokens when every GPU of the cluster is paid for, used or not."""
        step = self.usd_per_hour_cluster * self.step_time_s / u.HOUR + self.egress_usd_per_step
        return step / self.tokens_per_step * TOKENS_PER_MILLION

    @property
    def gpus_used(self) -> int:
        return sum(g.gpus_used for g in self.groups)

    @property
    def gpus_idle(self) -> int:
        return sum(g.gpus_idle for g in self.groups)

    @property
    def idle_groups(self) -> tuple[str, ...]:
        """Node groups the plan does not use at all."""
        return tuple(g.group for g in self.groups if g.gpus_used == 0)

    def describe(self) -> str:
        head = (f"cost on {self.cluster}: ${self.usd_per_hour:,.2f}/h for the {self.gpus_used} GPUs used "
                f"(${self.usd_per_hour_nodes:,.2f}/h for their nodes, ${self.usd_per_hour_cluster:,.2f}/h for the "
                f"whole cluster) | ${self.usd_per_step:,.4f} per step | ${self.usd_per_1m_tokens:,.4f} per 1M tokens")
        lines = [head]
        if self.egress_usd_per_step:
            lines.append(f"  cross-zone transfer: ${self.egress_usd_per_step:,.4f} per step "
                         f"(${self.egress_usd_per_hour:,.2f}/h), included above")
        for g in self.groups:
            idle = f", {g.gpus_idle} idle ({g.nodes_idle} whole node(s) free)" if g.gpus_idle else ""
            lines.append(f"  {g.group:<14} {g.gpus_used:>5}/{g.gpus:<5} {g.gpu:<9} at ${g.usd_per_gpu_hour:.4f}/GPU-h "
                         f"({g.price_origin}){idle}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"cluster": self.cluster, "usd_per_hour": self.usd_per_hour,
                "usd_per_hour_nodes": self.usd_per_hour_nodes,
                "usd_per_hour_cluster": self.usd_per_hour_cluster, "usd_per_step": self.usd_per_step,
                "usd_per_1m_tokens": self.usd_per_1m_tokens, "egress_usd_per_step": self.egress_usd_per_step,
                "gpus_used": self.gpus_used, "gpus_idle": self.gpus_idle, "idle_groups": list(self.idle_groups),
                "groups": [{"group": g.group, "gpu": g.gpu, "gpus": g.gpus, "gpus_used": g.gpus_used,
                            "nodes_idle": g.nodes_idle, "usd_per_gpu_hour": g.usd_per_gpu_hour,
                            "price_origin": g.price_origin} for g in self.groups]}


def plan_cost(plan: Plan, cluster: Cluster, *, model: ModelSpec | None = None,
              training: TrainingSpec | None = None) -> PlanCost:
    """Price ``plan`` on ``cluster`` (the cluster it was made for).

    ``model`` (and ``training``, default: the plan's batch, sequence length and precision) are needed
    only when a zone link has an ``egress_usd_per_gb`` and the plan moves data across it. Raises
    :class:`SpecError` naming ``node_groups[i].price_per_gpu_hour`` when a group has no price, and
    when the plan does not fit the cluster.
    """
    islands = {isl.name: isl for isl in find_islands(cluster)}
    used = plan.gpus_by_island()
    for name, n in used.items():
        if name not in islands:
            raise SpecError("plan", plan.cluster, f"uses island {name!r}, which cluster {cluster.name!r} does not have",
                            f"price the plan on the cluster it was made for (islands: {', '.join(islands)})")
        if n > islands[name].num_gpus:
            raise SpecError("plan", plan.cluster, f"uses {n} GPUs of island {name!r}, which has "
                            f"{islands[name].num_gpus}", "price the plan on the cluster it was made for")
    taken: dict[str, int] = {}
    island_of: dict[str, str] = {}
    for isl in islands.values():
        taken.update(fill_cheapest(price_steps(cluster, isl.node_groups), used.get(isl.name, 0)))
        island_of.update({g: isl.name for g in isl.node_groups})
    groups = []
    for g in cluster.node_groups:
        p = group_price(cluster, g)
        groups.append(GroupUse(group=g.name, gpu=g.gpu.name, zone=g.zone, island=island_of[g.name],
                               gpus_per_node=g.node.gpus_per_node, nodes=g.num_nodes, gpus=g.num_gpus,
                               gpus_used=taken.get(g.name, 0), usd_per_gpu_hour=p.usd_per_gpu_hour,
                               price_origin=p.origin))
    moved, egress_usd = _egress(plan, cluster, model, training)
    return PlanCost(cluster=cluster.name, groups=tuple(groups), step_time_s=plan.step_time_s,
                    tokens_per_step=plan.global_batch_size * plan.seq_len, egress_bytes_per_step=moved,
                    egress_usd_per_step=egress_usd)


def _crossings(plan: Plan, cluster: Cluster) -> list[tuple[tuple[str, str], int, int]]:
    """Stage boundaries between zones: ``((zone_a, zone_b), pipeline micro-batch, micro-batches)``."""
    zone = {isl.name: isl.zone for isl in find_islands(cluster)}
    out = []
    for pipe in plan.pipelines:
        for a, b in zip(pipe.stages, pipe.stages[1:]):
            za, zb = zone[a.island], zone[b.island]
            if za != zb:
                out.append(((min(za, zb), max(za, zb)), pipe.pipeline_micro_batch, pipe.num_micro_batches))
    return out


def _egress(plan: Plan, cluster: Cluster, model: ModelSpec | None,
            training: TrainingSpec | None) -> tuple[tuple[tuple[tuple[str, str], float], ...], float]:
    priced = [(i, z) for i, z in enumerate(cluster.zone_links) if z.egress_usd_per_gb]
    crossings = _crossings(plan, cluster)
    if not priced or (not crossings and len(plan.pipelines) < 2):
        return (), 0.0
    if model is None:
        i = priced[0][0]
        raise SpecError("model", None, f"is needed to price the plan's cross-zone traffic (zone_links[{i}]."
                        "egress_usd_per_gb is set)", "pass model= (the ModelSpec the plan was made for)")
    from tangram_opt.cost import CostModel
    from tangram_opt.sim.cross_sync import cross_pipeline_allreduce

    training = training or TrainingSpec(global_batch_size=plan.global_batch_size, seq_len=plan.seq_len,
                                        precision=plan.precision)
    cost = CostModel(model, training)
    moved: dict[tuple[str, str], float] = {}
    for link, b, m in crossings:
        # forward activations one way, their gradients back: 2 x p2p bytes per micro-batch
        moved[link] = moved.get(link, 0.0) + 2 * cost.p2p_bytes(b) * m
    for (za, zb), nbytes in cross_pipeline_allreduce(plan, cluster, cost).zone_link_bytes:
        key = (min(za, zb), max(za, zb))
        moved[key] = moved.get(key, 0.0) + nbytes
    usd = 0.0
    for (za, zb), nbytes in moved.items():
        link = cluster.zone_link(za, zb)
        assert link is not None  # every pair of zones holding groups has a link (Cluster checks)
        usd += nbytes / u.GB * (link.egress_usd_per_gb or 0.0)
    return tuple(sorted(moved.items())), usd


__all__ = ["TOKENS_PER_MILLION", "GroupUse", "PlanCost", "plan_cost"]
