"""tangram_opt: provably good training parallelization plans for heterogeneous GPU clusters.

The layers run one way: specs (hardware, cluster, model, training) -> cost model -> islands and
candidates -> formulations (over solver backends) -> search -> plan -> simulate / export / show
(docs/design.md; tests/test_layers.py checks every import).

Quick use::

    import tangram_opt as to
    plan = to.solve("a100-v100", "llama-3-8b", to.TrainingSpec(global_batch_size=256, seq_len=4096,
                    precision="fp16"), time_limit_s=60)
    print(plan.summary())            # stages, memory, tokens/s, MFU and the certified gap
    result = to.simulate(plan, to.load_cluster("a100-v100"), to.load_model("llama-3-8b"), ...)

Heavy parts (planner, simulator, expert placement) are imported on first use.

Layer: this root module sits with the specs (it imports the errors and the specs and names
everything else lazily, by string); the package's layers are listed in docs/design.md.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

from tangram_opt.errors import (FormatError, InfeasibleError, NoSolutionError, SolverUnavailableError, SpecError,
                                TangramError)
from tangram_opt.specs import (Cluster, GPUType, MLASpec, ModelSpec, MoESpec, NodeGroup, NodeSpec, TrainingSpec,
                               ZoneLink, example_clusters, get_gpu_type, list_presets, load_cluster, load_model,
                               load_training, make_cluster, model_from_hf_config, register_gpu_type)

__version__ = "0.1.0"

#: public name -> module that defines it (imported lazily by __getattr__)
_LAZY = {
    "solve": "tangram_opt.planner.search",
    "SearchEvent": "tangram_opt.planner.search",
    "SearchOptions": "tangram_opt.planner.search",
    "Objective": "tangram_opt.planner.search",
    "launch_price": "tangram_opt.planner.search",
    "LaunchPrice": "tangram_opt.planner.search",
    "MultiPipelineOptions": "tangram_opt.planner.multi_pipeline",
    "SearchSpace": "tangram_opt.planner.space",
    "Plan": "tangram_opt.planner.plan",
    "PipelinePlan": "tangram_opt.planner.plan",
    "StagePlan": "tangram_opt.planner.plan",
    "Certificate": "tangram_opt.planner.plan",
    "CertificateStatus": "tangram_opt.planner.plan",
    "find_islands": "tangram_opt.planner.islands",
    "islands_report": "tangram_opt.planner.islands",
    "simulate": "tangram_opt.sim",
    "validate": "tangram_opt.sim",
    "place_experts": "tangram_opt.experts",
    "synthetic_expert_loads": "tangram_opt.experts",
    "CostModel": "tangram_opt.cost",
    "Calibration": "tangram_opt.cost",
    "StageConfig": "tangram_opt.cost",
    "available_backends": "tangram_opt.solvers",
    "plan_cost": "tangram_opt.costing",
    "sweep": "tangram_opt.sweeps",
    "load_sweep": "tangram_opt.sweeps",
}

#: old public name -> (module, new name); still works, with a DeprecationWarning
_RENAMED = {"load_profile": ("tangram_opt.experts", "synthetic_expert_loads")}


def __getattr__(name: str) -> Any:
    if name in _RENAMED:
        module, new = _RENAMED[name]
        warnings.warn(f"tangram_opt.{name} is now tangram_opt.{new} (synthetic tokens per expert, {module}); the old "
                      "name will be removed", DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(module), new)
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'tangram_opt' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "TangramError", "SpecError", "FormatError", "InfeasibleError", "NoSolutionError", "SolverUnavailableError",
    "Cluster", "GPUType", "MLASpec", "ModelSpec", "MoESpec", "NodeGroup", "NodeSpec", "TrainingSpec", "ZoneLink",
    "example_clusters", "get_gpu_type", "load_cluster", "make_cluster", "register_gpu_type", "__version__",
    "list_presets", "load_model", "load_training", "model_from_hf_config", *_LAZY,
]
