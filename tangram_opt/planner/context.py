"""Everything derived once per planning call: islands, cost model, candidate tables, p2p paths."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from tangram_opt.cost import Calibration, CostModel
from tangram_opt.cost.profiles import ProfileSet
from tangram_opt.errors import SpecError
from tangram_opt.planner.candidates import AnalyticalCandidates, Candidate, CandidateProvider
from tangram_opt.planner.formulations.positional import PipelineProblem
from tangram_opt.planner.islands import Island, find_islands, island_link
from tangram_opt.planner.formulations.pipeline_model import BoundaryLink
from tangram_opt.planner.space import SearchSpace
from tangram_opt.specs.cluster import Cluster
from tangram_opt.specs.model import LAYER_KINDS, ModelSpec
from tangram_opt.specs.training import TrainingSpec

DEFAULT_MAX_STAGES = 32


@dataclass
class PlanningContext:
    cluster: Cluster
    model: ModelSpec
    training: TrainingSpec
    space: SearchSpace = field(default_factory=SearchSpace)
    cost: CostModel | None = None
    provider: CandidateProvider | None = None
    calibration: Calibration | None = None
    moe_load_imbalance: float | Callable[[int, int], float] = 1.0  # see CostModel
    profiles: ProfileSet | None = None  # measured layer times (CostModel); checked by solve

    def __post_init__(self) -> None:
        if self.cost is None:
            self.cost = CostModel(self.model, self.training, calibration=self.calibration,
                                  moe_load_imbalance=self.moe_load_imbalance, profiles=self.profiles)
        if self.provider is None:
            self.provider = AnalyticalCandidates(self.model, self.cost, self.space)
        self.islands: tuple[Island, ...] = find_islands(self.cluster)
        unsupported = [i for i in self.islands if not i.node.gpu.supports(self.training.precision)]
        if unsupported:
            names = ", ".join(sorted({i.gpu_name for i in unsupported}))
            raise SpecError("training.precision", self.training.precision,
                            f"is not supported by {names} in this cluster",
                            "train in bf16 (every GPU with BF16 tensor cores), or plan without those GPUs"
                            if self.training.precision == "fp8" and all(
                                i.node.gpu.supports("bf16") for i in self.islands)
                            else "train in fp16 (supported by every GPU type), or plan without those GPUs")
        self.kinds: tuple[str, ...] = tuple(k for k in LAYER_KINDS if self.model.layers_of_kind(k))
        self.layers = {k: self.model.layers_of_kind(k) for k in self.kinds}
        self._cands: dict[int, list[Candidate]] = {}

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
        if b not in self._cands:
            rows: list[Candidate] = []
            for isl in self.islands:
                rows.extend(self.provider.candidates(isl, b))  # type: ignore[union-attr]
            self._cands[b] = rows
        return self._cands[b]

    def links(self, b: int) -> dict[tuple[int, int], BoundaryLink]:
        """The p2p path between every ordered pair of islands, priced for pipeline micro-batch ``b``."""
        out = {}
        for a in self.islands:
            for c in self.islands:
                lk = island_link(self.cluster, a, c)
                out[a.index, c.index] = BoundaryLink(latency_s=lk.latency_s, scale_up=lk.intra_node,
                                                     shared_s=self.cost.p2p_shared_time_s(b, lk))  # type: ignore[union-attr]
        return out

    def problem(self, b: int, *, max_stages: int | None = None, min_stages: int = 1) -> PipelineProblem:
        return PipelineProblem(candidates=self.candidates(b), kinds=self.kinds, layers=self.layers,
                               island_gpus={i.index: i.num_gpus for i in self.islands}, links=self.links(b),
                               num_micro_batches=self.training.global_batch_size // b, pipeline_micro_batch=b,
                               max_stages=max_stages or self.max_stages, min_stages=min_stages,
                               schedule=self.space.schedule)
