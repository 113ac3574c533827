"""The candidate tables."""

from tangram_opt.planner.candidates.table import *  # noqa: F403
