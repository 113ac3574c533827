"""Expert placement for MoE layers: a certified MIP and the public greedy baseline.

``place_experts(loads, ranks, nodes, slots, ...)`` puts every routed expert (and redundant replicas of
the hot ones) on expert-parallel ranks so that the hottest rank's load, which sets the pace of the MoE
layer, is as low as possible; ``imbalance_for`` turns a load profile into the planner's max/mean ratio;
``load_profile`` makes reproducible skewed profiles. See docs/expert_placement.md and
formulations/expert_placement.md.
"""

from tangram_opt.experts.api import (DEFAULT_PLACEMENT_BACKEND, METHODS, ImbalanceModel, imbalance_for, place_experts,
                                     solve_layer)
from tangram_opt.experts.bounds import LoadBound, best_lower_bound, lower_bounds
from tangram_opt.experts.greedy import greedy_placement
from tangram_opt.experts.placement import EMPTY, Certificate, Placement, check_placement
from tangram_opt.experts.problem import PlacementProblem, make_problem
from tangram_opt.experts.profiles import PROFILE_KINDS, load_profile

__all__ = ["DEFAULT_PLACEMENT_BACKEND", "METHODS", "ImbalanceModel", "imbalance_for", "place_experts", "solve_layer", "LoadBound",
           "best_lower_bound", "lower_bounds", "greedy_placement", "EMPTY", "Certificate", "Placement",
           "check_placement", "PlacementProblem", "make_problem", "PROFILE_KINDS", "load_profile"]
