"""The candidate tables: every homogeneous stage configuration per island, priced once.

The only part of the planner that reads the cost model (tangram_opt.cost); what the formulations
see are these tables' numbers.

- :mod:`.table`: the row type (:class:`Candidate`), its pricing (:func:`price_candidate`), the
  provider protocol and the p2p path between two islands (:class:`BoundaryLink`);
- :mod:`.analytical`: the default provider (enumerate the search space, price, prune exactly);
- :mod:`.sync`: the prices of the gradient all-reduce across pipelines (multi-pipeline plans).

Layer: candidate tables, above the plan space, islands and plans and below the formulations.
"""

from tangram_opt.planner.candidates.analytical import (AnalyticalCandidates, HeuristicallyPruned, PruningStats,
                                                       coefficient_matrix, heuristic_prune, pareto_filter)
from tangram_opt.planner.candidates.sync import SyncPrices
from tangram_opt.planner.candidates.table import (BoundaryLink, Candidate, CandidateProvider, boundary_time_s,
                                                  price_candidate, sends_no_slower)

__all__ = ["AnalyticalCandidates", "BoundaryLink", "Candidate", "CandidateProvider", "HeuristicallyPruned",
           "PruningStats", "SyncPrices", "boundary_time_s", "coefficient_matrix", "heuristic_prune",
           "pareto_filter", "price_candidate", "sends_no_slower"]
