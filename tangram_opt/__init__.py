"""tangram_opt: provably good training parallelization plans for heterogeneous GPU clusters.

The layers run one way: specs (hardware, cluster, model, training) -> cost model -> islands and
candidates -> formulation -> solver backends -> plan -> simulate / export / show.
"""

from tangram_opt.errors import (FormatError, InfeasibleError, NoSolutionError, SolverUnavailableError, SpecError,
                                TangramError)
from tangram_opt.specs import (Cluster, GPUType, MLASpec, ModelSpec, MoESpec, NodeGroup, NodeSpec, TrainingSpec,
                               ZoneLink, example_clusters, get_gpu_type, list_presets, load_cluster, load_model,
                               load_training, make_cluster, model_from_hf_config, register_gpu_type)

__version__ = "0.1.0"

__all__ = [
    "TangramError", "SpecError", "FormatError", "InfeasibleError", "NoSolutionError", "SolverUnavailableError",
    "Cluster", "GPUType", "MLASpec", "ModelSpec", "MoESpec", "NodeGroup", "NodeSpec", "TrainingSpec", "ZoneLink",
    "example_clusters", "get_gpu_type", "load_cluster", "make_cluster", "register_gpu_type", "__version__",
    "list_presets", "load_model", "load_training", "model_from_hf_config",
]
