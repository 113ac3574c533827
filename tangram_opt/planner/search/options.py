"""The research knobs of the search, in one validated object.

``solve`` takes what a user states about the run in its signature (cluster, model, training, time
limit, backend, ...). The modelling choices that docs/notebooks/solver_gaps.ipynb and
formulations/pipeline_mip.md compare live here, with the planner's defaults. ``None`` means "where
it applies": decided by the formulation, the schedule of the search space and the time limit
(:meth:`SearchOptions.resolved`). A combination that cannot be honoured is refused with a
:class:`~tangram_opt.errors.SpecError` naming the field; nothing is switched off silently.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tangram_opt.errors import SpecError
from tangram_opt.planner.multi_pipeline.options import MultiPipelineOptions
from tangram_opt.planner.search import tuning

#: ``SearchOptions.formulation``: the aggregated model (formulations/pipeline_mip.md §3) or the
#: positional one (§4, the design sketch's model, for comparison and small instances)
FORMULATIONS = ("aggregated", "positional")


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchOptions:
    """How the search models and explores the plan space (the defaults are the planner's).

    - ``formulation``: "aggregated" or "positional" (:data:`FORMULATIONS`);
    - ``windows``: branch and bound on the bottleneck stage time (formulations/pipeline_mip.md §5);
      they exist for the aggregated formulation on 1F1B pipelines, and None means exactly there;
    - ``fluid_cuts``: the per-island rows ``sum g T <= N_i Smax`` (valid; they tighten the LP);
    - ``knapsack``: start each sub-problem's window at the layer-covering knapsack bound
      (formulations/knapsack_bound.py) and try its covers as plans; aggregated formulation, 1F1B
      (None: there);
    - ``sequence_leaves``: solve the narrowest windows per stage count with the order-exact
      sequence model (formulations/stage_sequence.py) instead of aggregated leaves split on the
      step tail; needs windows. None: when the time limit (``solve``'s whole ``time_limit_s``,
      also with the multi-pipeline level) is at least ``tuning.SEQUENCE_MIN_TIME_S`` (below it
      the aggregated leaves reach the smaller gap);
    - ``warm_start``: start from the thorough greedy plan of every pipeline micro-batch size;
    - ``multi_pipeline``: after the single-pipeline search (then given
      ``tuning.MULTI_PIPELINE_SINGLE_SHARE`` of the time, and what the multi-pipeline level leaves
      over when its bound limits the certificate), search plans of several data-parallel
      pipelines (docs/multi_pipeline.md) and return the better plan; the certificate covers both;
    - ``multi_pipeline_options``: the knobs of that level (None: its defaults).
    """

    formulation: str = "aggregated"
    windows: bool | None = None
    fluid_cuts: bool = True
    knapsack: bool | None = None
    sequence_leaves: bool | None = None
    warm_start: bool = True
    multi_pipeline: bool = True
    multi_pipeline_options: MultiPipelineOptions | None = None

    def __post_init__(self) -> None:
        if self.formulation not in FORMULATIONS:
            raise SpecError("options.formulation", self.formulation, "is not a known formulation",
                            f"use one of {', '.join(FORMULATIONS)}")
        for name in ("windows", "knapsack", "sequence_leaves"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, bool):
                raise SpecError(f"options.{name}", value, "must be True, False or None",
                                "None lets the search use it where it applies")
        for name in ("fluid_cuts", "warm_start", "multi_pipeline"):
            if not isinstance(getattr(self, name), bool):
                raise SpecError(f"options.{name}", getattr(self, name), "must be True or False", "e.g. True")
        if self.multi_pipeline_options is not None and not isinstance(self.multi_pipeline_options,
                                                                       MultiPipelineOptions):
            raise SpecError("options.multi_pipeline_options", type(self.multi_pipeline_options).__name__,
                            "is not a MultiPipelineOptions", "pass MultiPipelineOptions(...) or None")
        positional = self.formulation == "positional"
        for name in ("windows", "knapsack", "sequence_leaves"):
            if positional and getattr(self, name):
                raise SpecError(f"options.{name}", True, "needs the aggregated formulation",
                                f"leave {name} None (or False) with formulation='positional'")
        if self.sequence_leaves and self.windows is False:
            raise SpecError("options.sequence_leaves", True, "solves narrow bottleneck windows, and windows=False "
                            "has none", "leave sequence_leaves None (or False), or windows None")
        if not self.multi_pipeline and self.multi_pipeline_options is not None:
            raise SpecError("options.multi_pipeline_options", self.multi_pipeline_options,
                            "is given with multi_pipeline=False", "drop it, or set multi_pipeline=True")

    def resolved(self, schedule: str, single_time_limit_s: float) -> SearchOptions:
        """These options with every ``None`` decided for a search of pipelines with ``schedule``
        and a time limit of ``single_time_limit_s`` seconds (``solve`` passes its whole limit); refuses what that schedule
        cannot honour (windows, the knapsack and sequence leaves exist for 1F1B only)."""
        if schedule != "1f1b":
            for name in ("windows", "knapsack", "sequence_leaves"):
                if getattr(self, name):
                    raise SpecError(f"options.{name}", True, f"is not available with the {schedule} schedule",
                                    f"leave {name} None (or False), or plan 1F1B pipelines (space.schedule)")
        where = self.formulation == "aggregated" and schedule == "1f1b"
        windows = where if self.windows is None else self.windows
        knapsack = where if self.knapsack is None else self.knapsack
        sequence = (windows and single_time_limit_s >= tuning.SEQUENCE_MIN_TIME_S) if self.sequence_leaves is None \
            else self.sequence_leaves
        return replace(self, windows=windows, knapsack=knapsack, sequence_leaves=sequence)


__all__ = ["FORMULATIONS", "SearchOptions"]
