"""Everything derived once per planning call: islands, cost model, candidate tables, p2p paths.

The context is where the specs meet the cost model and become numbers: the candidate tables of
each pipeline micro-batch size, the p2p path between every pair of islands, the prices of the
cross-pipeline sync, and the :class:`PipelineProblem` each formulation reads. It is frozen: what a
planning call works on does not change under it; the tables are computed on first use and kept.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from tangram_opt.cost import Calibration, CostModel
from tangram_opt.cost.profiles import LayerProfile, ProfileSet
from tangram_opt.errors import SpecError
from tangram_opt.planner.candidates import (AnalyticalCandidates, BoundaryLink, Candidate, CandidateProvider,
                                            SyncPrices)
from tangram_opt.planner.formulations.problem import PipelineProblem
from tangram_opt.planner.islands import Island, find_islands, island_link
from tangram_opt.planner.space import SearchSpace
from tangram_opt.specs.cluster import Cluster
from tangram_opt.specs.model import LAYER_KINDS, ModelSpec
from tangram_opt.specs.training import TrainingSpec

DEFAULT_MAX_STAGES = 32


@dataclass(frozen=True, init=False, eq=False)
class PlanningContext:
    """The inputs of one planning call and what is derived from them.

    ``cost`` (default: ``CostModel(model, training, calibration=..., moe_load_imbalance=...,
    profiles=...)``) prices the candidates of ``provider`` (default: :class:`AnalyticalCandidates`
    over ``space``); pass either to plan with another cost model or homogeneous planner.
    """

    cluster: Cluster
    model: ModelSpec
    training: TrainingSpec
    space: SearchSpace
    cost: CostModel
    provider: CandidateProvider
    calibration: Calibration | None
    moe_load_imbalance: float | Callable[[int, int], float]
    profiles: ProfileSet | None
    #: the cluster's islands (index = position)
    islands: tuple[Island, ...]
    #: layer kinds of the model, in model order (dense first), and how many layers of each
    kinds: tuple[str, ...]
    layers: Mapping[str, int]
    _tables: dict[tuple[str, int], Any]

    def __init__(self, cluster: Cluster, model: ModelSpec, training: TrainingSpec, *,
                 space: SearchSpace | None = None, cost: CostModel | None = None,
                 provider: CandidateProvider | None = None, calibration: Calibration | None = None,
                 moe_load_imbalance: float | Callable[[int, int], float] = 1.0,
                 profiles: ProfileSet | LayerProfile | Iterable[LayerProfile] | None = None):
        space = space if space is not None else SearchSpace()
        if profiles is not None and not isinstance(profiles, ProfileSet):
            profiles = ProfileSet([profiles] if isinstance(profiles, LayerProfile) else profiles)
        if cost is None:
            cost = CostModel(model, training, calibration=calibration, moe_load_imbalance=moe_load_imbalance,
                             profiles=profiles)
        islands = find_islands(cluster)
        unsupported = [i for i in islands if not i.node.gpu.supports(training.precision)]
        if unsupported:
            names = ", ".join(sorted({i.gpu_name for i in unsupported}))
            raise SpecError("training.precision", training.precision, f"is not supported by {names} in this cluster",
                            "train in bf16 (every GPU with BF16 tensor cores), or plan without those GPUs"
                            if training.precision == "fp8" and all(i.node.gpu.supports("bf16") for i in islands)
                            else "train in fp16 (supported by every GPU type), or plan without those GPUs")
        kinds = tuple(k for k in LAYER_KINDS if model.layers_of_kind(k))
        fields = {"cluster": cluster, "model": model, "training": training, "space": space, "cost": cost,
                  "provider": provider if provider is not None else AnalyticalCandidates(model, cost, space),
                  "calibration": calibration, "moe_load_imbalance": moe_load_imbalance,
                  "profiles": profiles,
                  "islands": islands, "kinds": kinds,
                  "layers": MappingProxyType({k: model.layers_of_kind(k) for k in kinds}), "_tables": {}}
        for name, value in fields.items():
            object.__setattr__(self, name, value)

    def _memo(self, key: tuple[str, int], make: Callable[[], Any]) -> Any:
        hit = self._tables.get(key)
        if hit is None:
            hit = self._tables[key] = make()
        return hit

    @property
    def max_stages(self) -> int:
        cap = self.space.max_stages or DEFAULT_MAX_STAGES
        return max(1, min(cap, self.model.num_layers, self.cluster.num_gpus))

    def pipeline_micro_batches(self) -> list[int]:
        """Pipeline micro-batch sizes b (sequences) with b dividing the global batch."""
        B = self.training.global_batch_size
        if self.space.pipeline_micro_batches is not None:
            bad = [b for b in self.space.pipeline_micro_batches if B % b]
            if bad:
                raise SpecError("space.pipeline_micro_batches", bad, f"do not divide the global batch ({B})",
                                "use divisors of training.global_batch_size")
            return sorted(set(self.space.pipeline_micro_batches))
        return [b for b in range(1, B + 1) if B % b == 0]

    def candidates(self, b: int) -> list[Candidate]:
        """The candidate table of pipeline micro-batch ``b``: every island's rows, in island order."""
        def make() -> list[Candidate]:
            rows: list[Candidate] = []
            for isl in self.islands:
                rows.extend(self.provider.candidates(isl, b))
            return rows

        return self._memo(("candidates", b), make)

    def links(self, b: int) -> dict[tuple[int, int], BoundaryLink]:
        """The p2p path between every ordered pair of islands, priced for pipeline micro-batch ``b``."""
        out = {}
        for a in self.islands:
            for c in self.islands:
                lk = island_link(self.cluster, a, c)
                out[a.index, c.index] = BoundaryLink(latency_s=lk.latency_s, scale_up=lk.intra_node,
                                                     shared_s=self.cost.p2p_shared_time_s(b, lk))
        return out

    def sync_prices(self) -> SyncPrices:
        """What the gradient all-reduce across pipelines costs (multi-pipeline plans)."""
        return self._memo(("sync", 0), lambda: SyncPrices(self.cost, self.cluster, self.islands, self.kinds))

    def problem(self, b: int, *, max_stages: int | None = None, min_stages: int = 1) -> PipelineProblem:
        """The sub-problem of pipeline micro-batch ``b``: what every formulation reads."""
        return PipelineProblem(candidates=self.candidates(b), kinds=self.kinds, layers=dict(self.layers),
                               island_gpus={i.index: i.num_gpus for i in self.islands}, links=self.links(b),
                               num_micro_batches=self.training.global_batch_size // b, pipeline_micro_batch=b,
                               max_stages=max_stages or self.max_stages, min_stages=min_stages,
                               schedule=self.space.schedule)


__all__ = ["DEFAULT_MAX_STAGES", "PlanningContext"]
