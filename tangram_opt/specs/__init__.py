"""Input specifications: hardware, clusters, models and training runs."""

from tangram_opt.specs.cluster import Cluster, NodeGroup, NodeSpec, ZoneLink, example_clusters, load_cluster, make_cluster
from tangram_opt.specs.hardware import GPUType, LinkType, builtin_gpu_types, get_gpu_type, register_gpu_type
from tangram_opt.specs.model import LAYER_KINDS, LayerKind, MLASpec, ModelSpec, MoESpec
from tangram_opt.specs.training import TrainingSpec

__all__ = [
    "Cluster", "NodeGroup", "NodeSpec", "ZoneLink", "example_clusters", "load_cluster", "make_cluster",
    "GPUType", "LinkType", "builtin_gpu_types", "get_gpu_type", "register_gpu_type",
    "LAYER_KINDS", "LayerKind", "MLASpec", "ModelSpec", "MoESpec", "TrainingSpec",
]
