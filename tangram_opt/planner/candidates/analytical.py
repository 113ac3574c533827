"""The default candidate provider: enumerate the search space, price it, prune it exactly.

Pruning is exact: a candidate is dropped only when another candidate of the same island is at
least as good in every coefficient the formulations use (Pareto dominance), or when it cannot hold
a single layer anywhere in the pipeline (memory pre-filter). :func:`heuristic_prune` (not exact) is
used only when the search space asks for it, or by the search's restricted primal heuristic.
"""

from __future__ import annotations

import math

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from tangram_opt.cost import CostModel, StageConfig
from tangram_opt.planner.candidates.table import Candidate, CandidateProvider, price_candidate
from tangram_opt.planner.islands import Island
from tangram_opt.planner.space import SearchSpace
from tangram_opt.specs.model import LAYER_KINDS, ModelSpec


@dataclass(slots=True)
class PruningStats:
    """Candidate counts per (island, pipeline micro-batch): enumerated, valid, fitting, Pareto-optimal."""

    enumerated: int = 0
    invalid: int = 0
    no_fit: int = 0
    dominated: int = 0
    heuristic: int = 0
    kept: int = 0
    by_key: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)

    def merge(self, other: PruningStats) -> None:
        self.enumerated += other.enumerated
        self.invalid += other.invalid
        self.no_fit += other.no_fit
        self.dominated += other.dominated
        self.heuristic += other.heuristic
        self.kept += other.kept
        self.by_key.update(other.by_key)


def _divisors(n: int) -> list[int]:
    """The divisors of ``n`` in increasing order (trial division up to sqrt(n): a pipeline
    micro-batch of 2^20 sequences made the scan of every number up to n cost 6 s per table)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


class AnalyticalCandidates:
    """The default provider: enumerate the search space and price it with the cost model."""

    def __init__(self, model: ModelSpec, cost: CostModel, space: SearchSpace):
        self.model = model
        self.cost = cost
        self.space = space
        self.stats = PruningStats()
        self._cache: dict[tuple[int, int], list[Candidate]] = {}

    def configs(self, island: Island, b: int) -> list[StageConfig]:
        """Every stage configuration of the search space with pipeline micro-batch ``b`` on ``island``."""
        sp, m = self.space, self.model
        sizes = set(island.valid_stage_sizes())
        tps = sp.tp if sp.tp is not None else [d for d in _divisors(island.gpus_per_node)]
        out = []
        for tp in tps:
            for cp in sp.cp:
                for dp in _divisors(b):
                    mb = b // dp
                    if mb not in sp.micro_batch_sizes or tp * cp * dp not in sizes:
                        continue
                    if m.moe is None:
                        eps = [1]
                    elif sp.ep is not None:
                        eps = [e for e in sp.ep if (dp * cp) % e == 0 and m.moe.num_experts % e == 0]
                    else:
                        eps = [e for e in _divisors(dp * cp) if m.moe.num_experts % e == 0]
                    for ep in eps:
                        for zero in sp.zero:
                            if zero > 0 and dp * cp == 1:
                                continue  # nothing to shard over: identical to ZeRO-0
                            for rc in sp.recompute:
                                out.append(StageConfig(tp=tp, cp=cp, dp=dp, ep=ep, zero=zero, recompute=rc,
                                                       micro_batch_size=mb))
        return out

    def candidates(self, island: Island, pipeline_micro_batch: int) -> list[Candidate]:
        key = (island.index, pipeline_micro_batch)
        if key not in self._cache:
            self.adopt(key, *self.price(island, pipeline_micro_batch))
        return self._cache[key]

    def has(self, island: Island, pipeline_micro_batch: int) -> bool:
        """Whether the table of ``island`` and ``pipeline_micro_batch`` is priced already."""
        return (island.index, pipeline_micro_batch) in self._cache

    def price(self, island: Island, pipeline_micro_batch: int) -> tuple[list[Candidate], PruningStats]:
        """The pruned table of ``island`` and ``pipeline_micro_batch`` and its counts, kept nowhere:
        what a worker process runs when the search prices tables ahead (planner/search/tables.py)."""
        key = (island.index, pipeline_micro_batch)
        st = PruningStats()
        kinds = [k for k in LAYER_KINDS if self.model.layers_of_kind(k)]
        rows: list[Candidate] = []
        for cfg in self.configs(island, pipeline_micro_batch):
            st.enumerated += 1
            if self.cost.check_config(island.node, cfg):
                st.invalid += 1
                continue
            cand = price_candidate(self.cost, island, cfg, kinds)
            # memory pre-filter: must hold one layer of some kind in the most favourable position
            if all(cand.max_layers(k, 1, first=False, last=False) < 1 for k in kinds):
                st.no_fit += 1
                continue
            rows.append(cand)
        kept = pareto_filter(rows, kinds, schedule=self.space.schedule)
        st.dominated = len(rows) - len(kept)
        if self.space.heuristic_keep is not None:
            pareto = len(kept)
            kept = heuristic_prune(kept, kinds, self.space.heuristic_keep)
            st.heuristic = pareto - len(kept)
        st.kept = len(kept)
        st.by_key[key] = (st.enumerated, st.kept)
        return kept, st

    def adopt(self, key: tuple[int, int], kept: list[Candidate], st: PruningStats) -> None:
        """Keep a table priced by :meth:`price` (here or in a worker) and count it."""
        self.stats.merge(st)
        self._cache[key] = kept

    def fresh(self) -> AnalyticalCandidates:
        """The same provider with no table priced: what a worker process receives."""
        return AnalyticalCandidates(self.model, self.cost, self.space)


def price_table(provider: AnalyticalCandidates, island: Island, pipeline_micro_batch: int
                ) -> tuple[list[Candidate], PruningStats]:
    """``provider.price(island, pipeline_micro_batch)``, as a module-level function a worker process
    can run (solvers/workers.py, ``SolverWorker.call``)."""
    return provider.price(island, pipeline_micro_batch)


class HeuristicallyPruned:
    """Another provider's candidates cut by :func:`heuristic_prune` (not exact). The rows are the
    base provider's own objects, so a plan over them is a plan over the base table too."""

    def __init__(self, base: CandidateProvider, kinds: Sequence[str], keep: int):
        self.base, self.kinds, self.keep = base, tuple(kinds), keep
        self._cache: dict[tuple[int, int], list[Candidate]] = {}

    def candidates(self, island: Island, pipeline_micro_batch: int) -> list[Candidate]:
        key = (island.index, pipeline_micro_batch)
        if key not in self._cache:
            self._cache[key] = heuristic_prune(self.base.candidates(island, pipeline_micro_batch), self.kinds,
                                               self.keep)
        return self._cache[key]


def coefficient_matrix(rows: Sequence[Candidate], kinds: Sequence[str], *, schedule: str) -> np.ndarray:
    """Every coefficient the formulation reads, oriented so that smaller is better."""
    vecs = []
    for c in rows:
        v = [float(c.gpus), c.layer_transient_bytes]
        for k in kinds:
            lc = c.layer[k]
            v += [lc.static_bytes, lc.activation_bytes, lc.step_tail_time_s]
            v += [lc.fwd_time_s, lc.bwd_time_s] if schedule == "gpipe" else [lc.time_s, -lc.bwd_time_s]
        for lc in (c.embedding, c.head):
            v += [lc.static_bytes, lc.activation_bytes, lc.transient_bytes, lc.step_tail_time_s]
            v += [lc.fwd_time_s, lc.bwd_time_s] if schedule == "gpipe" else [lc.time_s, -lc.bwd_time_s]
        v += [-c.capacity_bytes, c.p2p_nic_s, c.p2p_scale_up_s]
        vecs.append(v)
    return np.array(vecs, dtype=float).reshape(len(rows), -1)


def pareto_filter(rows: list[Candidate], kinds: Sequence[str], *, schedule: str) -> list[Candidate]:
    """Drop candidates dominated by another of the same island (<= everywhere, < somewhere).

    Among exact duplicates the first is kept. This is exact: a dominated candidate can be replaced
    by its dominator in any plan without making the plan worse or infeasible.
    """
    if len(rows) <= 1:
        return list(rows)
    by_island: dict[int, list[int]] = {}
    for idx, c in enumerate(rows):
        by_island.setdefault(c.island, []).append(idx)
    keep = np.zeros(len(rows), dtype=bool)
    for members in by_island.values():
        a = coefficient_matrix([rows[i] for i in members], kinds, schedule=schedule)
        alive = np.ones(len(members), dtype=bool)
        order = np.lexsort(a.T[::-1])  # lexicographic: a dominator always comes before what it dominates
        for pos, i in enumerate(order):
            if not alive[i]:
                continue
            rest = order[pos + 1:]
            rest = rest[alive[rest]]
            if len(rest) == 0:
                continue
            dominated = np.all(a[i] <= a[rest] + 1e-12 * np.abs(a[rest]), axis=1)
            alive[rest[dominated]] = False
        keep[np.array(members)[alive]] = True
    return [c for c, k in zip(rows, keep) if k]


def heuristic_prune(rows: list[Candidate], kinds: Sequence[str], keep: int) -> list[Candidate]:
    """Keep, per (island, GPU count), the ``keep`` fastest candidates plus the most memory-frugal one.

    This is *not* exact: a dropped candidate may be part of the optimum. It is off by default;
    when on, the certificate's plan space says so and the gap is valid only for the pruned space.
    """
    groups: dict[tuple[int, int], list[Candidate]] = {}
    for c in rows:
        groups.setdefault((c.island, c.gpus), []).append(c)
    out = []
    for group in groups.values():
        by_time = sorted(group, key=lambda c: sum(c.layer[k].time_s for k in kinds))
        frugal = min(group, key=lambda c: sum(c.layer[k].static_bytes + c.layer[k].activation_bytes for k in kinds))
        chosen = by_time[:keep] + ([frugal] if frugal not in by_time[:keep] else [])
        out.extend(chosen)
    return out


__all__ = ["AnalyticalCandidates", "HeuristicallyPruned", "PruningStats", "coefficient_matrix", "heuristic_prune",
           "pareto_filter"]
