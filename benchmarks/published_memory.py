"""Peak memory per GPU of a published run's configuration, straight from the cost model.

``predict_peak_memory(run)`` prices the published stage configuration (tp, cp, dp, ep, ZeRO stage,
recomputation, micro-batch; ``pp`` stages with the layers split as evenly as they go, the extra
ones on the first stages) with :class:`tangram_opt.cost.CostModel` on the row's GPU and returns
the largest stage's peak. It does not plan, so a configuration that would not fit the catalog part
still gets its figure (the planner's "does not fit" never hides it). Under 1F1B, stage ``i`` of
``pp`` holds ``pp - i`` micro-batches' activations (one on a single-stage pipeline).

Which peak the source reports decides what is compared: torchtitan logs the CUDA caching
allocator's ``reserved_bytes.all.peak`` (``DeviceMemoryMonitor.get_peak_stats``,
torchtitan/metrics.py), so torchtitan rows are compared with the predicted reserved peak
(:func:`tangram_opt.cost.memory.stage_peak_bytes` with ``reserved=True``); other sources with the
allocated peak.
"""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks.published_runs import PublishedRun, build_cluster
from tangram_opt.cost import CostModel, StageConfig
from tangram_opt.cost.memory import stage_peak_bytes
from tangram_opt.specs import TrainingSpec

GIB = 2**30


@dataclass(frozen=True, slots=True)
class MemoryPrediction:
    run_id: str
    published_gib: float | None
    allocated_gib: float  # peak allocated bytes of the largest stage
    reserved_gib: float  # with the blocks the caching allocator keeps cached at that peak
    compared: str  # "reserved" or "allocated": what the source's figure is
    capacity_gib: float  # the part's memory (gpu_memory_gib or the catalog's)

    @property
    def predicted_gib(self) -> float:
        return self.reserved_gib if self.compared == "reserved" else self.allocated_gib

    @property
    def error(self) -> float | None:
        return self.predicted_gib / self.published_gib - 1 if self.published_gib else None


def stage_layers(num_layers: int, pp: int) -> list[int]:
    """Layers per pipeline stage, split as evenly as they go (the extra ones on the first stages)."""
    q, r = divmod(num_layers, pp)
    return [q + (1 if i < r else 0) for i in range(pp)]


def predict_peak_memory(run: PublishedRun) -> MemoryPrediction:
    """The published configuration's peak memory per GPU (largest stage), from the cost model."""
    cluster, _ = build_cluster(run)
    node = cluster.node_groups[0].node
    training = TrainingSpec(global_batch_size=run.global_batch_size, seq_len=run.seq_len, precision=run.precision)
    cost = CostModel(run.model, training, attention_kernel=run.attention_kernel or "auto",
                     framework=run.cost_framework)
    cfg = StageConfig(tp=run.tp, cp=run.cp, dp=run.dp, ep=run.ep if run.is_moe else 1,
                      zero=run.zero if run.zero is not None else 1, recompute=run.recompute or "selective",
                      micro_batch_size=run.micro_batch_size or 1)
    kinds = [k for k in ("dense", "moe") if run.model.layers_of_kind(k)]
    # layers of each kind per stage, in model order (dense first)
    order = [k for k in kinds for _ in range(run.model.layers_of_kind(k))]
    allocated = reserved = 0.0
    start = 0
    for i, n in enumerate(stage_layers(len(order), run.pp)):
        chunk = order[start:start + n]
        start += n
        layers = {k: (cost.layer(node, cfg, k), chunk.count(k)) for k in kinds}  # type: ignore[arg-type]
        args = dict(embedding=cost.embedding(node, cfg) if i == 0 else None,
                    head=cost.head(node, cfg) if i == run.pp - 1 else None)
        inflight = run.pp - i
        allocated = max(allocated, stage_peak_bytes(layers, inflight, **args))
        reserved = max(reserved, stage_peak_bytes(layers, inflight, reserved=True, **args))
    return MemoryPrediction(run_id=run.id, published_gib=run.measured.peak_memory_gib, allocated_gib=allocated / GIB,
                            reserved_gib=reserved / GIB,
                            compared="reserved" if run.cost_framework == "torchtitan" else "allocated",
                            capacity_gib=node.gpu.hbm_bytes / GIB)
