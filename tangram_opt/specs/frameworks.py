"""Facts about the training frameworks plans are launched with, shared by the planner's launch
targets (tangram_opt/planner/search/launch.py) and the exports (tangram_opt/export/).

Read from the frameworks' own code at the releases docs/exports.md names.
"""

from __future__ import annotations

#: the frameworks a plan is exported to and can be restricted to (``solve(..., launch=...)``)
FRAMEWORKS = ("megatron", "deepspeed", "torchtitan")

#: (torchtitan module, config function) of the presets torchtitan 0.3 defines a model and config for
#: (torchtitan/models/<module>/config_registry.py); other models have no torchtitan definition
TORCHTITAN_RECIPES: dict[str, tuple[str, str]] = {
    "llama-3-8b": ("llama3", "llama3_8b"), "llama-3-70b": ("llama3", "llama3_70b"),
    "llama-3-405b": ("llama3", "llama3_405b"), "qwen3-30b-a3b": ("qwen3", "qwen3_30b_a3b"),
    "deepseek-v3": ("deepseek_v3", "deepseek_v3_671b"), "deepseek-v2-lite": ("deepseek_v3", "deepseek_v3_16b"),
}

__all__ = ["FRAMEWORKS", "TORCHTITAN_RECIPES"]
