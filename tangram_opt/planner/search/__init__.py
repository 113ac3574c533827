"""The search: ``solve`` and the branch and bound behind it."""

from tangram_opt.planner.search.branch_and_bound import (FORMULATIONS, MULTI_PIPELINE_SINGLE_SHARE, SearchEvent,
                                                         fluid_bottleneck_s, quick_lower_bound, rounding_ticks,
                                                         solve)

__all__ = ["FORMULATIONS", "MULTI_PIPELINE_SINGLE_SHARE", "SearchEvent", "fluid_bottleneck_s", "quick_lower_bound",
           "rounding_ticks", "solve"]
