"""The knobs of the multi-pipeline level (part of the plan space its certificate declares)."""

from __future__ import annotations

from dataclasses import dataclass

from tangram_opt.errors import SpecError


@dataclass(frozen=True, slots=True, kw_only=True)
class MultiPipelineOptions:
    """Knobs of the multi-pipeline level (all part of the declared plan space).

    - ``max_pipelines``: R_max, the most pipelines in a plan;
    - ``cluster_scales``: k for the sub-clusters with every island's node count divided by k;
    - ``island_scales``: k for the sub-clusters made of one island with its nodes divided by k;
    - ``template_share``: fraction of the multi-pipeline time budget spent generating templates
      (the sub-cluster solves); the rest goes to the level-2 MIP;
    - ``one_stage``: include the one-stage templates (every candidate holding the whole model).
    """

    max_pipelines: int = 8
    cluster_scales: tuple[int, ...] = (2, 4, 8)
    island_scales: tuple[int, ...] = (1, 2, 4)
    template_share: float = 0.35
    one_stage: bool = True

    def __post_init__(self) -> None:
        if self.max_pipelines < 2:
            raise SpecError("multi_pipeline.max_pipelines", self.max_pipelines, "must be >= 2",
                            "allow at least two pipelines, or SearchOptions(multi_pipeline=False)")
        if not 0.0 <= self.template_share < 1.0:
            raise SpecError("multi_pipeline.template_share", self.template_share, "must be in [0, 1)",
                            "e.g. 0.35: a third of the multi-pipeline budget for the sub-cluster solves")


__all__ = ["MultiPipelineOptions"]
