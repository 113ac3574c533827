"""A homogeneous stage configuration and the per-layer costs the cost model returns for it.

These two dataclasses are the contract between the cost model and everything above it (candidates,
formulation, simulator). The formulation never calls the cost model: it only sees numbers copied
out of :class:`LayerCost`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from tangram_opt.errors import SpecError

#: Activation recomputation modes (Megatron-LM ``--recompute-granularity``): "none" stores every
#: activation; "selective" recomputes the attention core (softmax, dropout, scores x V);
#: "full" stores only each layer's input and recomputes the whole layer in backward.
RECOMPUTE_MODES = ("none", "selective", "full")
ZERO_STAGES = (0, 1, 2, 3)


@dataclass(frozen=True, slots=True, kw_only=True)
class StageConfig:
    """How one pipeline stage is parallelized on one island.

    ``tp * cp * dp`` GPUs run the stage. Expert parallelism carves ``ep`` expert groups out of the
    ``dp * cp`` ranks (Megatron-core), so ``ep`` divides ``dp * cp``. ``micro_batch_size`` is per
    data-parallel rank; the pipeline micro-batch that flows between stages is ``dp * micro_batch_size``
    sequences. ``sequence_parallel`` (Korthikanti et al. 2022) shards norms, dropout and residuals
    over the TP ranks and replaces each TP all-reduce by a reduce-scatter plus an all-gather; it
    only matters when ``tp > 1``.
    """

    tp: int = 1
    cp: int = 1
    dp: int = 1
    ep: int = 1
    zero: int = 0
    recompute: str = "none"
    micro_batch_size: int = 1
    sequence_parallel: bool = True

    def __post_init__(self) -> None:
        for name in ("tp", "cp", "dp", "ep", "micro_batch_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise SpecError(f"stage.{name}", v, "must be an integer >= 1", f"set {name} to 1 or more")
        if self.zero not in ZERO_STAGES:
            raise SpecError("stage.zero", self.zero, "is not a ZeRO stage", "use 0, 1, 2 or 3")
        if not isinstance(self.sequence_parallel, bool):
            raise SpecError("stage.sequence_parallel", self.sequence_parallel, "must be true or false",
                            "set sequence_parallel to True or False")
        if self.recompute not in RECOMPUTE_MODES:
            raise SpecError("stage.recompute", self.recompute, "is not a recomputation mode",
                            f"use one of {', '.join(RECOMPUTE_MODES)}")
        if (self.dp * self.cp) % self.ep:
            raise SpecError("stage.ep", self.ep, f"does not divide dp({self.dp}) x cp({self.cp}) = {self.dp * self.cp}",
                            "expert-parallel groups are carved from the data- and context-parallel ranks")

    @property
    def gpus(self) -> int:
        return self.tp * self.cp * self.dp

    @property
    def pipeline_micro_batch(self) -> int:
        """Sequences per pipeline micro-batch (summed over the data-parallel ranks)."""
        return self.dp * self.micro_batch_size

    @property
    def label(self) -> str:
        parts = [f"tp{self.tp}" + ("" if self.sequence_parallel or self.tp == 1 else "nosp")]
        if self.cp > 1:
            parts.append(f"cp{self.cp}")
        parts.append(f"dp{self.dp}")
        if self.ep > 1:
            parts.append(f"ep{self.ep}")
        parts.append(f"z{self.zero}")
        if self.recompute != "none":
            parts.append({"selective": "rs", "full": "rf"}[self.recompute])
        parts.append(f"mb{self.micro_batch_size}")
        return "-".join(parts)


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerCost:
    """Cost of one layer (or the embedding / head) on one GPU of a stage, per pipeline micro-batch.

    Times are seconds on the stage's critical path (communication that overlaps compute is not
    counted; see docs/cost_model.md). Bytes are per GPU.

    - ``fwd_time_s`` / ``bwd_time_s``: forward / backward (incl. recomputation) of one micro-batch.
    - ``weight_bytes`` / ``grad_bytes`` / ``optimizer_bytes``: static memory after ZeRO sharding.
    - ``activation_bytes``: memory kept per in-flight micro-batch until its backward.
    - ``transient_bytes``: peak scratch needed while this layer runs (e.g. logits, ZeRO-3 gathered
      weights), not multiplied by the in-flight count.
    - ``grad_sync_time_s``: data-parallel gradient synchronization per step not hidden by compute
      (the part of this layer's reduction that outlasts its own backward; additive over layers).
    - ``optimizer_time_s``: optimizer update per step of this layer's shard (additive over layers).
    - ``model_flops``: useful forward+backward FLOPs of one micro-batch (no recomputation), per GPU.
    """

    fwd_time_s: float
    bwd_time_s: float
    weight_bytes: float
    grad_bytes: float
    optimizer_bytes: float
    activation_bytes: float
    transient_bytes: float = 0.0
    grad_sync_time_s: float = 0.0
    optimizer_time_s: float = 0.0
    model_flops: float = 0.0
    breakdown: Mapping[str, float] = field(default_factory=dict, compare=False)

    @property
    def time_s(self) -> float:
        """Forward plus backward of one micro-batch."""
        return self.fwd_time_s + self.bwd_time_s

    @property
    def static_bytes(self) -> float:
        return self.weight_bytes + self.grad_bytes + self.optimizer_bytes

    @property
    def step_tail_time_s(self) -> float:
        """Work after the last backward: gradient sync not hidden plus the optimizer update."""
        return self.grad_sync_time_s + self.optimizer_time_s


ZERO_COST = LayerCost(fwd_time_s=0.0, bwd_time_s=0.0, weight_bytes=0.0, grad_bytes=0.0, optimizer_bytes=0.0,
                      activation_bytes=0.0)
