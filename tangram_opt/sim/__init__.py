"""Independent checks of a plan: a structural validator and a discrete-event step simulator.

Neither shares a code path with the planner's candidate tables, MIP formulation or closed-form
step time: both recompute every stage from the specs through the cost model. See docs/simulator.md.

Layer: consumers (beside export, show and analysis), above the search, which it never imports.
"""

from tangram_opt.sim._stages import StageWork
from tangram_opt.sim.cross_sync import CrossSyncResult, allreduce_hook, cross_pipeline_allreduce
from tangram_opt.sim.simulate import (EVENT_KINDS, NO_MICRO_BATCH, PipelineResult, PlanComparison, SimulationResult,
                                      StageDifference, StageResult, TraceEvent, op_order, replay, simulate)
from tangram_opt.sim.validate import PlanValidationError, Violation, validate, validate_or_raise

__all__ = ["CrossSyncResult", "allreduce_hook", "cross_pipeline_allreduce", "EVENT_KINDS", "NO_MICRO_BATCH",
           "PipelineResult", "PlanComparison", "SimulationResult", "StageDifference", "StageResult", "StageWork",
           "TraceEvent", "op_order", "replay", "simulate", "PlanValidationError", "Violation", "validate",
           "validate_or_raise"]
