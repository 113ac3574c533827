"""What a search optimizes and under which limits (issue 30 item 2, formulations/pipeline_mip.md §4b).

:class:`Objective` is what ``solve(objective=...)`` and ``tangram-opt plan --objective`` take:

- ``"throughput"`` (the default): the shortest step, i.e. the most tokens per second;
- ``"min_cost"``: the fewest US dollars per hour for the GPUs the plan uses (usually with a
  throughput floor; without one it is the cheapest plan that fits at all);
- ``"cost_per_token"``: the fewest dollars per token, i.e. USD/h of the GPUs used x step time.

Limits, with any objective: ``budget_usd_per_h`` (USD per hour of the GPUs the plan uses) and
``min_tokens_per_s`` (a throughput floor: step time <= tokens per step / floor), ``max_nodes``
(node group name -> most of its nodes the plan may use: a node budget per group). Prices are those of
:mod:`tangram_opt.specs.pricing` (the cluster file's ``price_per_gpu_hour``, else the default table),
per GPU: a plan pays for the GPUs its stages use, and GPUs it leaves idle are free to release (the
plan summary lists whole free nodes). Invalid values raise a :class:`SpecError` naming the field.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tangram_opt.errors import SpecError

if TYPE_CHECKING:
    from tangram_opt.specs.cluster import Cluster

#: ``Objective.kind`` values
OBJECTIVES = ("throughput", "min_cost", "cost_per_token")
#: how each objective's value is reported (certificate ``objective_unit``)
OBJECTIVE_UNITS = {"throughput": "s per step", "min_cost": "USD/h", "cost_per_token": "USD per 1M tokens"}
#: the formulation objective (FormulationOptions.objective) each one minimizes
FORMULATION_OBJECTIVE = {"throughput": "step_time", "min_cost": "usd_per_hour", "cost_per_token": "usd_per_step"}


def _limit(field: str, value: Any, unit: str, example: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecError(field, value, f"must be a number of {unit}", f"e.g. {field}={example}")
    if not math.isfinite(value) or value <= 0:
        raise SpecError(field, value, f"must be a finite number of {unit} > 0",
                        f"e.g. {field}={example}, or None for no limit")
    return float(value)


@dataclass(frozen=True, slots=True, kw_only=True)
class Objective:
    """What the plan optimizes (``kind``, one of :data:`OBJECTIVES`) and its limits."""

    kind: str = "throughput"
    budget_usd_per_h: float | None = None
    min_tokens_per_s: float | None = None
    max_nodes: dict[str, int] | None = None

    def __post_init__(self) -> None:
        if self.kind not in OBJECTIVES:
            raise SpecError("objective", self.kind, "is not a known objective", f"use one of {', '.join(OBJECTIVES)}")
        object.__setattr__(self, "budget_usd_per_h", _limit("budget_usd_per_h", self.budget_usd_per_h, "USD per hour",
                                                            "250"))
        object.__setattr__(self, "min_tokens_per_s", _limit("min_tokens_per_s", self.min_tokens_per_s,
                                                            "tokens per second", "500000"))
        if self.max_nodes is not None:
            if not isinstance(self.max_nodes, dict) or not self.max_nodes:
                raise SpecError("max_nodes", self.max_nodes, "must be a non-empty mapping of node group name to "
                                "a number of nodes", "e.g. max_nodes={'v100': 2}, or None for no node budget")
            for g, n in self.max_nodes.items():
                if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                    raise SpecError(f"max_nodes[{g!r}]", n, "must be a whole number of nodes >= 0",
                                    f"e.g. max_nodes={{{g!r}: 1}}")
            object.__setattr__(self, "max_nodes", dict(self.max_nodes))

    @property
    def is_default(self) -> bool:
        """Throughput without limits: the full search (windows, multi-pipeline level) runs."""
        return (self.kind == "throughput" and self.budget_usd_per_h is None and self.min_tokens_per_s is None
                and self.max_nodes is None)

    @property
    def needs_prices(self) -> bool:
        return self.kind != "throughput" or self.budget_usd_per_h is not None

    @property
    def unit(self) -> str:
        return OBJECTIVE_UNITS[self.kind]

    def limits(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.budget_usd_per_h is not None:
            out["budget_usd_per_h"] = self.budget_usd_per_h
        if self.min_tokens_per_s is not None:
            out["min_tokens_per_s"] = self.min_tokens_per_s
        if self.max_nodes is not None:
            out["max_nodes"] = dict(self.max_nodes)
        return out

    def describe(self) -> str:
        words = {"throughput": "maximize throughput", "min_cost": "minimize USD/h",
                 "cost_per_token": "minimize USD per token"}[self.kind]
        lim = [f"USD/h <= {self.budget_usd_per_h:g}" if self.budget_usd_per_h is not None else "",
               f"tokens/s >= {self.min_tokens_per_s:g}" if self.min_tokens_per_s is not None else "",
               "nodes " + ", ".join(f"{g} <= {n}" for g, n in self.max_nodes.items()) if self.max_nodes else ""]
        lim = [x for x in lim if x]
        return words + (f" subject to {' and '.join(lim)}" if lim else "")


def check_max_nodes(max_nodes: dict[str, int] | None, cluster: Cluster) -> None:
    """A node budget (checked by :class:`Objective`) against ``cluster``: every name is one of its
    node groups, no count is more than the group's nodes, and some GPU is left to plan on."""
    if max_nodes is None:
        return
    groups = {g.name: g for g in cluster.node_groups}
    for name, n in max_nodes.items():
        if name not in groups:
            raise SpecError(f"max_nodes[{name!r}]", n, f"is not a node group of cluster {cluster.name!r}",
                            f"use one of {', '.join(groups)}")
        if n > groups[name].num_nodes:
            raise SpecError(f"max_nodes[{name!r}]", n, f"is more than the group's {groups[name].num_nodes} nodes",
                            "give at most the group's node count")
    if not any(max_nodes.get(g.name, g.num_nodes) for g in cluster.node_groups):
        raise SpecError("max_nodes", max_nodes, f"leaves no node of cluster {cluster.name!r} to plan on (its groups: "
                        + ", ".join(f"{g.name} {g.num_nodes} x {g.node.gpus_per_node} GPUs" for g in groups.values())
                        + ")", "allow at least one node of some group, e.g. "
                        f"max_nodes={{{next(iter(groups))!r}: 1}}, or None for no node budget")


def objective_input(objective: Objective | str | None, budget_usd_per_h: Any = None,
                    min_tokens_per_s: Any = None, max_nodes: Any = None, *,
                    cluster: Cluster | None = None) -> Objective:
    """``solve``'s objective arguments as one :class:`Objective` (each value checked; the node
    budget also against ``cluster`` when it is given, :func:`check_max_nodes`)."""
    if objective is None:
        objective = "throughput"
    if isinstance(objective, Objective):
        if max_nodes is not None:
            raise SpecError("max_nodes", max_nodes, "is given together with an Objective",
                            "put the node budget into the Objective(...)")
        if budget_usd_per_h is not None or min_tokens_per_s is not None:
            raise SpecError("budget_usd_per_h" if budget_usd_per_h is not None else "min_tokens_per_s",
                            budget_usd_per_h if budget_usd_per_h is not None else min_tokens_per_s,
                            "is given together with an Objective", "put the limit into the Objective(...)")
        goal = objective
    elif not isinstance(objective, str):
        raise SpecError("objective", objective, "is not an objective name or an Objective",
                        f"use one of {', '.join(OBJECTIVES)} or tangram_opt.Objective(...)")
    else:
        goal = Objective(kind=objective, budget_usd_per_h=budget_usd_per_h, min_tokens_per_s=min_tokens_per_s,
                         max_nodes=max_nodes)
    if cluster is not None:
        check_max_nodes(goal.max_nodes, cluster)
    return goal


__all__ = ["FORMULATION_OBJECTIVE", "OBJECTIVES", "OBJECTIVE_UNITS", "Objective", "check_max_nodes", "objective_input"]
