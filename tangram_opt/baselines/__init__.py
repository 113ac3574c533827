"""Baseline planners that return the same Plan type as the MIP (see docs/baselines.md).

Layer: baselines and the multi-pipeline level, above the planning context and below the search (the
best-homogeneous baseline receives the search as a ``solver`` callable).
"""

from tangram_opt.baselines.cheapest import CheapestFirstResult, cheapest_first
from tangram_opt.baselines.greedy import GreedyResult, greedy, greedy_by_micro_batch
from tangram_opt.baselines.homogeneous import HomogeneousResult, best_homogeneous, reprice
from tangram_opt.baselines.unaware import UnawareResult, heterogeneity_unaware, virtual_cluster

__all__ = ["CheapestFirstResult", "GreedyResult", "HomogeneousResult", "UnawareResult", "best_homogeneous", "cheapest_first", "greedy",
           "greedy_by_micro_batch", "heterogeneity_unaware", "reprice", "virtual_cluster"]
