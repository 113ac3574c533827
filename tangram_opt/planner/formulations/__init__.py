"""The pipeline formulations: models and bounds over candidate tables (formulations/pipeline_mip.md).

Everything here reads :class:`~tangram_opt.planner.formulations.problem.PipelineProblem` (numbers
only) and never the cost model.

- :mod:`.problem`: the problem, a decoded stage, the build options; :mod:`.ticks` and
  :mod:`.inflight`: the integer time unit and the in-flight count, one rule each;
- :mod:`.pipeline_model`: the closed-form step time the models minimize, and the exact schedule;
- :mod:`.stage_types`: a candidate holding a fixed layer count in one role;
- :mod:`.aggregated` (+ :mod:`.aggregated_rows`): the aggregated MIP, the planner's default (§3);
- :mod:`.stage_sequence`: the sequence model, exact in the order, per stage count (§3b);
- :mod:`.positional`: the positional MIP of the design sketch (§4);
- :mod:`.ordering`: from a multiset of stage types to a real, ordered, polished plan;
- :mod:`.bounds`, :mod:`.knapsack_bound`: bounds that need no solver (§5).

Layer: formulations, above the candidate tables (and the solver backends) and below the planning
context.
"""
