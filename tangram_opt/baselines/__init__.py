"""Baseline planners that return the same Plan type as the MIP (see docs/baselines.md)."""

from tangram_opt.baselines.greedy import GreedyResult, greedy, greedy_by_micro_batch

__all__ = ["GreedyResult", "greedy", "greedy_by_micro_batch"]
