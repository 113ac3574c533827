"""The search: ``solve`` and the branch and bound behind it.

- :mod:`.api`: :func:`solve` (inputs, checks, context, the two levels) and its input helpers;
- :mod:`.options`: :class:`SearchOptions`, the research knobs, validated;
- :mod:`.tuning`: the search's constants, each with its reason;
- :mod:`.nodes`: what the tree holds (sub-problems, nodes, leaves in flight, progress events);
- :mod:`.branch_and_bound`: :class:`BranchAndBound`, the tree: roots, window bounds, splits, node
  selection, worker processes and the certificate;
- :mod:`.window_bounds`: a window's model and LP bound, built here or in a worker process;
- :mod:`.leaves`: leaf MIPs (aggregated, positional, sequence) and what is done with their answers;
- :mod:`.primal`: primal heuristics (neighbourhood search, knapsack covers, restricted search, off by default);
- :mod:`.objective`: :class:`Objective` (throughput, min_cost, cost_per_token; budget, floor);
- :mod:`.priced`: the search under a non-default objective (priced positional MIPs);
- :mod:`.launch`: the plan space of a launch target (plans one framework job runs) and its search.

Layer: search, the top of the planner: above the multi-pipeline level and the baselines, below the
consumers.
"""

from tangram_opt.planner.search.api import LaunchPrice, launch_price, solve, solve_single_pipeline
from tangram_opt.planner.search.nodes import SearchEvent
from tangram_opt.planner.search.objective import OBJECTIVES, Objective
from tangram_opt.planner.search.options import FORMULATIONS, SearchOptions

__all__ = ["FORMULATIONS", "OBJECTIVES", "LaunchPrice", "Objective", "SearchEvent", "SearchOptions", "launch_price", "solve",
           "solve_single_pipeline"]
