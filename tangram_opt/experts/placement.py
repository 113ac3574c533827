"""The result type: what each slot holds, how the load is split, and how good it is (certificate).

Cross-node tokens (a precise definition, used by the MIP, the greedy and the benchmark):
tokens routed to expert ``e`` are generated uniformly over the ``R`` EP ranks (data-parallel batches),
so node ``n`` with ``R_n`` ranks originates ``o[e, n] = w[e] * R_n / R`` of them. A placement serves
``F[e, n]`` tokens of ``e`` on node ``n`` (the sum of its slots' shares there). A dispatcher that keeps
tokens on their node whenever the node's replicas have share left serves ``min(F[e, n], o[e, n])``
locally, and no dispatcher can do better, so

    cross_node_tokens = sum_e ( w[e] - sum_n min(F[e, n], o[e, n]) ).

A single-node EP group has no cross-node tokens.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tangram_opt.errors import SpecError
from tangram_opt.experts.problem import PlacementProblem

EMPTY = -1  # slot_expert value of an unused slot


@dataclass(frozen=True, slots=True, kw_only=True)
class PlacementCertificate:
    """How good a placement is, proven.

    ``bound`` is a valid lower bound on ``objective`` over *all* placements of the stated problem
    (fractional load shares), ``gap = (objective - bound) / objective``. ``max_load_bound`` is a valid
    lower bound on the maximum rank load of any placement (it is ``bound`` when both weights are 0).
    """

    status: str
    """``optimal`` (gap within the requested tolerance), ``feasible`` (time limit, gap says how far),
    or ``heuristic`` (a greedy placement whose gap comes from the combinatorial bounds only)."""
    objective: float
    bound: float
    max_load_bound: float
    backend: str = ""
    solve_time_s: float = 0.0
    bound_source: str = ""
    """Which argument gave ``max_load_bound`` (``mean``, ``replica-count``, ``mip``, ...)."""
    note: str = ""

    @property
    def gap(self) -> float:
        if self.objective <= 0:
            return 0.0
        return max(0.0, (self.objective - self.bound) / self.objective)

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "objective": self.objective, "bound": self.bound,
                "max_load_bound": self.max_load_bound, "gap": self.gap, "backend": self.backend,
                "solve_time_s": self.solve_time_s, "bound_source": self.bound_source, "note": self.note}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> PlacementCertificate:
        return PlacementCertificate(status=str(d["status"]), objective=float(d["objective"]), bound=float(d["bound"]),
                                    max_load_bound=float(d["max_load_bound"]), backend=str(d.get("backend", "")),
                                    solve_time_s=float(d.get("solve_time_s", 0.0)),
                                    bound_source=str(d.get("bound_source", "")), note=str(d.get("note", "")))


@dataclass(frozen=True, slots=True, kw_only=True)
class ExpertPlacement:
    """Expert replicas on EP ranks for one MoE layer.

    ``slot_expert[r][s]`` is the expert held by slot ``s`` of rank ``r`` (``-1``: empty) and
    ``slot_tokens[r][s]`` the tokens of that expert it serves. Ranks are numbered node by node
    (rank ``r`` is on node ``r // ranks_per_node``).
    """

    loads: tuple[float, ...]
    ranks_per_node: int
    slot_expert: tuple[tuple[int, ...], ...]
    slot_tokens: tuple[tuple[float, ...], ...]
    method: str
    certificate: PlacementCertificate
    cross_node_tokens: float = 0.0
    moved_experts: int = 0
    """Replicas that are on a rank which did not hold that expert in the ``current`` placement."""
    rank_loads: tuple[float, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "rank_loads", tuple(float(sum(t)) for t in self.slot_tokens))

    @property
    def experts(self) -> int:
        return len(self.loads)

    @property
    def ranks(self) -> int:
        return len(self.slot_expert)

    @property
    def nodes(self) -> int:
        return self.ranks // self.ranks_per_node

    @property
    def max_load(self) -> float:
        return max(self.rank_loads)

    @property
    def mean_load(self) -> float:
        return sum(self.loads) / self.ranks

    @property
    def imbalance(self) -> float:
        """max / mean rank load (1.0 is perfect balance); the factor on the MoE layer time."""
        return self.max_load / self.mean_load if self.mean_load > 0 else 1.0

    @property
    def replicas(self) -> tuple[int, ...]:
        """Number of replicas of each expert."""
        n = [0] * self.experts
        for row in self.slot_expert:
            for e in row:
                if e != EMPTY:
                    n[e] += 1
        return tuple(n)

    @property
    def redundant_replicas(self) -> int:
        return sum(self.replicas) - self.experts

    def experts_on(self, r: int) -> tuple[int, ...]:
        return tuple(e for e in self.slot_expert[r] if e != EMPTY)

    def to_dict(self) -> dict[str, Any]:
        return {"loads": list(self.loads), "ranks_per_node": self.ranks_per_node,
                "slot_expert": [list(r) for r in self.slot_expert], "slot_tokens": [list(r) for r in self.slot_tokens],
                "method": self.method, "certificate": self.certificate.to_dict(),
                "cross_node_tokens": self.cross_node_tokens, "moved_experts": self.moved_experts,
                # derived values, for readers of the JSON (ignored by from_dict)
                "rank_loads": list(self.rank_loads), "max_load": self.max_load, "mean_load": self.mean_load,
                "imbalance": self.imbalance}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> ExpertPlacement:
        try:
            return ExpertPlacement(loads=tuple(float(x) for x in d["loads"]), ranks_per_node=int(d["ranks_per_node"]),
                                   slot_expert=tuple(tuple(int(e) for e in r) for r in d["slot_expert"]),
                                   slot_tokens=tuple(tuple(float(t) for t in r) for r in d["slot_tokens"]),
                                   method=str(d["method"]), certificate=PlacementCertificate.from_dict(d["certificate"]),
                                   cross_node_tokens=float(d.get("cross_node_tokens", 0.0)),
                                   moved_experts=int(d.get("moved_experts", 0)))
        except KeyError as exc:
            raise SpecError(f"placement.{exc.args[0]}", None, "is missing", "pass a dict made by to_dict()") from None


# --- evaluation of raw placements ----------------------------------------------------------------------------
def cross_node_tokens(p: PlacementProblem, served: Sequence[Mapping[int, float]]) -> float:
    """Cross-node tokens (module docstring) of ``served[r][e]`` tokens of ``e`` served on rank ``r``."""
    if p.nodes == 1:
        return 0.0
    node_share = [dict() for _ in range(p.nodes)]  # type: list[dict[int, float]]
    for r, row in enumerate(served):
        d = node_share[p.node_of(r)]
        for e, t in row.items():
            d[e] = d.get(e, 0.0) + t
    frac = p.ranks_per_node / p.ranks
    local = sum(min(t, p.loads[e] * frac) for d in node_share for e, t in d.items())
    return max(0.0, p.total_load - local)


def moved_experts(p: PlacementProblem, holders: Sequence[Sequence[int]]) -> int:
    """Replicas placed on a rank that did not hold that expert in ``p.current`` (0 without one)."""
    if p.current is None:
        return 0
    return sum(1 for r, row in enumerate(holders) for e in set(row) if e not in p.current[r])


def served_by_rank(slot_expert: Sequence[Sequence[int]], slot_tokens: Sequence[Sequence[float]]
                   ) -> list[dict[int, float]]:
    """``served[r][e]`` from slot rows (the inverse of :func:`build_placement`)."""
    out: list[dict[int, float]] = []
    for es, ts in zip(slot_expert, slot_tokens):
        d: dict[int, float] = {}
        for e, t in zip(es, ts):
            if e != EMPTY:
                d[e] = d.get(e, 0.0) + t
        out.append(d)
    return out


def build_placement(p: PlacementProblem, served: Sequence[Mapping[int, float]], *, method: str,
                    certificate: PlacementCertificate,
                    holders: Sequence[Sequence[int]] | None = None) -> ExpertPlacement:
    """An :class:`ExpertPlacement` from ``served[r][e]`` tokens (``holders[r]`` lists replicas, default the keys).

    Replicas that serve no tokens are kept only when listed in ``holders`` (e.g. EPLB fills every slot)."""
    rows_e, rows_t = [], []
    for r in range(p.ranks):
        es = list(holders[r]) if holders is not None else sorted(served[r])
        ts = [float(served[r].get(e, 0.0)) if es.index(e) == i else 0.0 for i, e in enumerate(es)]
        pad = p.slots_per_rank[r] - len(es)
        assert pad >= 0, f"rank {r} holds {len(es)} replicas in {p.slots_per_rank[r]} slots"
        rows_e.append(tuple(es) + (EMPTY,) * pad)
        rows_t.append(tuple(ts) + (0.0,) * pad)
    hold = [[e for e in row if e != EMPTY] for row in rows_e]
    return ExpertPlacement(loads=p.loads, ranks_per_node=p.ranks_per_node, slot_expert=tuple(rows_e),
                           slot_tokens=tuple(rows_t), method=method, certificate=certificate,
                           cross_node_tokens=cross_node_tokens(p, served), moved_experts=moved_experts(p, hold))


def check_placement(p: PlacementProblem, pl: ExpertPlacement, *, rel_tol: float = 1e-6) -> list[str]:
    """Independent validity check: every expert served in full, slots and memory respected, the
    replica budget kept, shares non-negative. Returns the violations (empty when valid)."""
    bad = []
    if pl.ranks != p.ranks or pl.experts != p.experts:
        return [f"shape: placement has {pl.ranks} ranks / {pl.experts} experts, problem {p.ranks} / {p.experts}"]
    tol = rel_tol * max(1.0, p.total_load)
    served = [0.0] * p.experts
    for r in range(p.ranks):
        row_e, row_t = pl.slot_expert[r], pl.slot_tokens[r]
        if len(row_e) != p.slots_per_rank[r] or len(row_t) != len(row_e):
            bad.append(f"rank {r}: {len(row_e)} slots, expected {p.slots_per_rank[r]}")
        mem = 0.0
        for e, t in zip(row_e, row_t):
            if e == EMPTY:
                if abs(t) > tol:
                    bad.append(f"rank {r}: empty slot serves {t} tokens")
                continue
            if not 0 <= e < p.experts:
                bad.append(f"rank {r}: unknown expert {e}")
                continue
            if t < -tol:
                bad.append(f"rank {r}: expert {e} has negative share {t}")
            served[e] += t
            mem += p.bytes_of(e)
        if mem > p.memory_of(r) * (1 + 1e-9):
            bad.append(f"rank {r}: experts need {mem:.0f} bytes > {p.memory_of(r):.0f}")
    for e, (s, w) in enumerate(zip(served, p.loads)):
        if abs(s - w) > tol:
            bad.append(f"expert {e}: serves {s} tokens, load is {w}")
    reps = pl.replicas
    for e, n in enumerate(reps):
        if n < 1:
            bad.append(f"expert {e} has no replica")
    if sum(reps) > p.max_replicas:
        bad.append(f"{sum(reps)} replicas > {p.max_replicas} allowed (experts + max_redundant)")
    if not math.isclose(sum(pl.rank_loads), p.total_load, rel_tol=1e-6, abs_tol=tol):
        bad.append(f"rank loads sum to {sum(pl.rank_loads)}, total load is {p.total_load}")
    return bad


#: old name -> new one, still importable from here with a DeprecationWarning
_RENAMED = {"Placement": "ExpertPlacement", "Certificate": "PlacementCertificate"}


def __getattr__(name: str) -> Any:
    if name in _RENAMED:
        warnings.warn(f"tangram_opt.experts.placement.{name} is now tangram_opt.experts.placement.{_RENAMED[name]}; "
                      "the old name will be removed", DeprecationWarning, stacklevel=2)
        return globals()[_RENAMED[name]]
    raise AttributeError(f"module 'tangram_opt.experts.placement' has no attribute {name!r}")
