"""Several data-parallel pipelines in one plan."""

from tangram_opt.planner.multi_pipeline.templates import *  # noqa: F403
from tangram_opt.planner.multi_pipeline.templates import __all__  # noqa: F401
