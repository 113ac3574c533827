"""Input specifications: hardware, clusters, models and training runs.

Layer: specs, the lowest above units and errors; imports nothing else of the package.
"""

from tangram_opt.specs.cluster import (Cluster, NodeGroup, NodeSpec, ZoneLink, cluster_from_dict, example_clusters,
                                       load_cluster, make_cluster)
from tangram_opt.specs.hardware import GPUType, LinkType, builtin_gpu_types, get_gpu_type, register_gpu_type
from tangram_opt.specs.hf_config import SUPPORTED_ARCHITECTURES, model_from_hf_config
from tangram_opt.specs.model import LAYER_KINDS, LayerKind, MLASpec, ModelSpec, MoESpec, model_from_dict
from tangram_opt.specs.presets import list_presets, load_model
from tangram_opt.specs.training import TrainingSpec, check_precision, load_training, training_from_dict

__all__ = [
    "Cluster", "NodeGroup", "NodeSpec", "ZoneLink", "cluster_from_dict", "example_clusters", "load_cluster",
    "make_cluster",
    "GPUType", "LinkType", "builtin_gpu_types", "get_gpu_type", "register_gpu_type",
    "LAYER_KINDS", "LayerKind", "MLASpec", "ModelSpec", "MoESpec", "model_from_dict",
    "SUPPORTED_ARCHITECTURES", "list_presets", "load_model", "model_from_hf_config",
    "TrainingSpec", "check_precision", "load_training", "training_from_dict",
]
