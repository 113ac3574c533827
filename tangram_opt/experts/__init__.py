"""Expert placement for MoE layers: a certified MIP and the public greedy baseline.

``place_experts(loads, ranks, nodes, slots, ...)`` puts every routed expert (and redundant replicas of
the hot ones) on expert-parallel ranks so that the hottest rank's load, which sets the pace of the MoE
layer, is as low as possible; ``imbalance_for`` turns a load profile into the planner's max/mean ratio;
``synthetic_expert_loads`` makes reproducible skewed profiles. See docs/expert_placement.md and
formulations/expert_placement.md.

Renamed (the old names still work, with a DeprecationWarning): ``Placement`` -> ``ExpertPlacement``,
``Certificate`` -> ``PlacementCertificate``, ``load_profile`` -> ``synthetic_expert_loads``.

Layer: expert placement, above the cost model and solver backends; of the planner, only the search
imports it (``ImbalanceModel``, when expert loads are given).
"""

import warnings
from typing import Any

from tangram_opt.experts.api import (DEFAULT_PLACEMENT_BACKEND, METHODS, ImbalanceModel, imbalance_for, place_experts,
                                     solve_layer)
from tangram_opt.experts.bounds import LoadBound, best_lower_bound, lower_bounds
from tangram_opt.experts.greedy import greedy_placement
from tangram_opt.experts.placement import EMPTY, ExpertPlacement, PlacementCertificate, check_placement
from tangram_opt.experts.problem import PlacementProblem, make_problem
from tangram_opt.experts.profiles import PROFILE_KINDS, synthetic_expert_loads

#: old public name -> new one (issue 28: one name, one thing across the package)
RENAMED = {"Placement": "ExpertPlacement", "Certificate": "PlacementCertificate",
           "load_profile": "synthetic_expert_loads"}


def __getattr__(name: str) -> Any:
    if name in RENAMED:
        warnings.warn(f"tangram_opt.experts.{name} is now tangram_opt.experts.{RENAMED[name]}; the old name will "
                      "be removed", DeprecationWarning, stacklevel=2)
        return globals()[RENAMED[name]]
    raise AttributeError(f"module 'tangram_opt.experts' has no attribute {name!r}")


__all__ = ["DEFAULT_PLACEMENT_BACKEND", "METHODS", "ImbalanceModel", "imbalance_for", "place_experts", "solve_layer",
           "LoadBound", "best_lower_bound", "lower_bounds", "greedy_placement", "EMPTY", "PlacementCertificate",
           "ExpertPlacement", "check_placement", "PlacementProblem", "make_problem", "PROFILE_KINDS",
           "synthetic_expert_loads"]
