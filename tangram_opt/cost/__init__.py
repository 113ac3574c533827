"""Cost model: time and memory of one homogeneous stage configuration (see docs/cost_model.md).

Layer: cost model and solver backends, right above the specs. The planner's candidate tables are
priced with it; the formulations never import it (tests/test_layers.py).
"""

from tangram_opt.cost.calibration import DEFAULT_CALIBRATION, Calibration, fit_calibration
from tangram_opt.cost.comm import PipelineLink, collective_time_s, pipeline_link
from tangram_opt.cost.config import RECOMPUTE_MODES, ZERO_STAGES, LayerCost, StageConfig
from tangram_opt.cost.flops import ATTENTION_KERNELS, model_flops_per_token
from tangram_opt.cost.memory import FRAMEWORKS, stage_peak_bytes
from tangram_opt.cost.model import FP32_MATMUL_MODES, CostModel
from tangram_opt.cost.calibration import load_calibration, save_calibration
from tangram_opt.cost.profiles import (SAILOR_MODELS, LayerProfile, ProfileEntry, ProfileSet, check_profiles,
                                       load_profile, load_profiles, load_sailor_profile, model_shape, sailor_profiles,
                                       save_profile)

__all__ = [
    "RECOMPUTE_MODES", "ZERO_STAGES", "LayerCost", "StageConfig", "Calibration", "CostModel", "pipeline_link",
    "PipelineLink",
    "DEFAULT_CALIBRATION", "fit_calibration", "collective_time_s", "ATTENTION_KERNELS", "FP32_MATMUL_MODES",
    "model_flops_per_token", "SAILOR_MODELS", "LayerProfile", "ProfileEntry", "ProfileSet", "load_profile",
    "load_sailor_profile", "sailor_profiles", "save_profile", "load_profiles", "check_profiles", "model_shape",
    "load_calibration", "save_calibration", "FRAMEWORKS", "stage_peak_bytes",
]
