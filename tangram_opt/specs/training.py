"""What one training step looks like: batch, sequence, precision and optimizer state sizes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tangram_opt.errors import SpecError
from tangram_opt.specs import _check
from tangram_opt.specs._io import load_structured_file
from tangram_opt.specs.hardware import PRECISIONS

if TYPE_CHECKING:
    from tangram_opt.specs.cluster import Cluster


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingSpec:
    """One optimizer step over ``global_batch_size`` sequences of ``seq_len`` tokens.

    Bytes per parameter follow the mixed-precision Adam accounting of ZeRO (Rajbhandari et al.,
    SC'20, Sec. 3.1): 2 bytes of fp16/bf16 weights, 2 bytes of gradients, and K = 12 bytes of
    optimizer state (fp32 master weights, momentum and variance). For ``precision="fp32"`` the
    weights and gradients are 4 bytes and the state is 8 bytes (no separate master copy). For
    ``precision="fp8"`` (Transformer Engine's FP8 linear layers in a bf16 model) the accounting is
    bf16's; the cost model adds the FP8 weight copies of the linear layers (docs/cost_model.md §2.1).
    ``None`` picks those defaults from ``precision``.
    """

    global_batch_size: int
    seq_len: int
    precision: str = "bf16"
    weight_bytes_per_param: float | None = None
    grad_bytes_per_param: float | None = None
    optimizer_bytes_per_param: float | None = None

    def __post_init__(self) -> None:
        for fl in ("global_batch_size", "seq_len"):
            object.__setattr__(self, fl, _check.positive_int(f"training.{fl}", getattr(self, fl)))
        object.__setattr__(self, "precision", _check.one_of("training.precision", self.precision, PRECISIONS))
        for fl in ("weight_bytes_per_param", "grad_bytes_per_param", "optimizer_bytes_per_param"):
            v = getattr(self, fl)
            if v is not None:
                _check.positive_float(f"training.{fl}", v, allow_zero=(fl == "optimizer_bytes_per_param"))

    @property
    def activation_bytes(self) -> int:
        """Bytes of one activation element (2 for 16-bit training, 4 for fp32)."""
        return 4 if self.precision == "fp32" else 2

    @property
    def weight_bytes(self) -> float:
        return self.weight_bytes_per_param if self.weight_bytes_per_param is not None else self.activation_bytes

    @property
    def grad_bytes(self) -> float:
        return self.grad_bytes_per_param if self.grad_bytes_per_param is not None else self.activation_bytes

    @property
    def optimizer_bytes(self) -> float:
        if self.optimizer_bytes_per_param is not None:
            return self.optimizer_bytes_per_param
        return 8.0 if self.precision == "fp32" else 12.0

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch_size * self.seq_len

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


def training_from_dict(data: Any, *, source: str = "") -> TrainingSpec:
    """A :class:`TrainingSpec` from its file form (the fields of the dataclass); unknown keys are errors."""
    _check.mapping("training", data, source=source)
    _check.no_unknown_keys("training", data, [f.name for f in fields(TrainingSpec)], source=source)
    with _check.in_source(source):
        for key in ("global_batch_size", "seq_len"):
            _check.required("training", data, key, hint=f"add '{key}:' (an integer)")
        return TrainingSpec(**data)


def load_training(spec: str | Path | Mapping[str, Any] | TrainingSpec) -> TrainingSpec:
    """A training spec from a YAML/JSON file path, a dict, or a TrainingSpec (returned as is).

    A file may hold the fields at its top level or under a single ``training:`` key.
    """
    if isinstance(spec, TrainingSpec):
        return spec
    if isinstance(spec, Mapping):
        return training_from_dict(spec)
    if not isinstance(spec, (str, Path)):
        raise SpecError("training", spec, f"cannot be read from a {type(spec).__name__}",
                        "give a YAML/JSON path, a dict or a TrainingSpec")
    data = load_structured_file(spec)
    if isinstance(data, Mapping) and list(data) == ["training"]:
        data = data["training"]
    return training_from_dict(data, source=str(spec))


def check_precision(training: TrainingSpec, cluster: Cluster) -> None:
    """Raise if a GPU type of ``cluster`` cannot train in ``training.precision`` (bf16 on V100 and
    Turing; fp8 before Hopper and Ada)."""
    for group in cluster.node_groups:
        if not group.gpu.supports(training.precision):
            fp8 = training.precision == "fp8" and group.gpu.bf16_flops_per_s is not None
            raise SpecError("training.precision", training.precision,
                            f"node group {group.name!r} has {group.gpu.name} GPUs, which have "
                            f"{group.gpu.missing_for(training.precision)}",
                            f"train in {'bf16 (precision: bf16)' if fp8 else 'fp16 (precision: fp16)'} or leave "
                            "those nodes out of the cluster")


__all__ = ["TrainingSpec", "check_precision", "load_training", "training_from_dict"]
