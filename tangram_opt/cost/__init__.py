"""Cost model: time and memory of one homogeneous stage configuration (see docs/cost_model.md)."""

from tangram_opt.cost.config import RECOMPUTE_MODES, ZERO_STAGES, LayerCost, StageConfig
from tangram_opt.cost.model import Calibration, CostModel, pipeline_link

__all__ = ["RECOMPUTE_MODES", "ZERO_STAGES", "LayerCost", "StageConfig", "Calibration", "CostModel", "pipeline_link"]
