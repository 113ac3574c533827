"""Per-stage work and memory recomputed from the specs (the simulator's and validator's only inputs).

Nothing here reads the times or bytes a :class:`~tangram_opt.planner.plan.StagePlan` stores: a
stage's forward / backward / tail durations and its memory terms are priced again by the cost
model from the island's node shape, the stage's configuration and the kinds of the layers it
holds. Nothing here imports the planner's candidate tables, formulation or closed form either.
"""

from __future__ import annotations

from dataclasses import dataclass

from tangram_opt.cost import CostModel, LayerCost, StageConfig
from tangram_opt.planner.islands import Island, find_islands, island_link
from tangram_opt.planner.plan import PipelinePlan, StagePlan
from tangram_opt.specs.cluster import Cluster

SCHEDULES = ("1f1b", "gpipe")


@dataclass(frozen=True, slots=True, kw_only=True)
class StageWork:
    """What one pipeline stage does per micro-batch and holds per GPU, in seconds and bytes.

    This is the whole interface of the replay (:func:`tangram_opt.sim.simulate.replay`): tests can
    build it by hand for closed-form checks, :func:`stage_work` builds it from a plan and the specs.

    - ``fwd_time_s`` / ``bwd_time_s``: one forward / backward (incl. recomputation) of one micro-batch;
    - ``tail_time_s``: work after the stage's last backward (exposed gradient sync + optimizer);
    - ``static_bytes``: weights, gradients and optimizer states (after ZeRO sharding), always resident;
    - ``activation_bytes``: kept from a micro-batch's forward start until its backward ends;
    - ``transient_bytes``: scratch while a forward or backward runs (largest single piece: a layer's
      backward working set incl. a ZeRO-3 gathered copy of its weights, or the LM head's logits);
    - ``capacity_bytes``: usable memory per GPU.
    """

    fwd_time_s: float
    bwd_time_s: float
    tail_time_s: float = 0.0
    static_bytes: float = 0.0
    activation_bytes: float = 0.0
    transient_bytes: float = 0.0
    capacity_bytes: float = float("inf")
    gpus: int = 1
    label: str = ""

    @property
    def time_s(self) -> float:
        return self.fwd_time_s + self.bwd_time_s


def island_by_name(cluster: Cluster) -> dict[str, Island]:
    return {isl.name: isl for isl in find_islands(cluster)}


def stage_layer_kinds(stage: StagePlan) -> dict[str, int]:
    return {"dense": stage.num_dense_layers, "moe": stage.num_moe_layers}


def stage_components(cost: CostModel, island: Island, stage: StagePlan) -> list[tuple[LayerCost, int]]:
    """(cost of one piece, how many) for every piece a stage runs: its blocks, embedding, head."""
    cfg = stage_config(stage)
    parts: list[tuple[LayerCost, int]] = []
    for kind, n in stage_layer_kinds(stage).items():
        if n > 0:
            parts.append((cost.layer(island.node, cfg, kind), n))  # type: ignore[arg-type]
    if stage.has_embedding:
        parts.append((cost.embedding(island.node, cfg), 1))
    if stage.has_head:
        parts.append((cost.head(island.node, cfg), 1))
    return parts


def stage_config(stage: StagePlan) -> StageConfig:
    return StageConfig(tp=stage.tp, cp=stage.cp, dp=stage.dp, ep=stage.ep, zero=stage.zero,
                       recompute=stage.recompute, micro_batch_size=stage.micro_batch_size)


def stage_work(cost: CostModel, island: Island, stage: StagePlan, label: str = "") -> StageWork:
    """Price one stage from the specs.

    Sums over the stage's pieces: forward and backward times, ``step_tail_time_s`` (the cost model's
    non-overlapped gradient sync plus optimizer update), static and activation bytes. The transient
    term is the largest single piece's ``transient_bytes``: pieces run one after another inside a
    forward or backward, so their scratch buffers are not live at the same time.
    """
    parts = stage_components(cost, island, stage)
    return StageWork(
        fwd_time_s=sum(c.fwd_time_s * n for c, n in parts),
        bwd_time_s=sum(c.bwd_time_s * n for c, n in parts),
        tail_time_s=sum((c.grad_sync_time_s + c.optimizer_time_s) * n for c, n in parts),
        static_bytes=sum(c.static_bytes * n for c, n in parts),
        activation_bytes=sum(c.activation_bytes * n for c, n in parts),
        transient_bytes=max((c.transient_bytes for c, _ in parts), default=0.0),
        capacity_bytes=cost.usable_memory_bytes(island.node),
        gpus=stage.gpus,
        label=label or f"{island.name} layers {stage.first_layer}-{stage.first_layer + stage.num_layers - 1}",
    )


def stage_tail_parts(cost: CostModel, island: Island, stage: StagePlan) -> tuple[float, float]:
    """(exposed gradient sync, optimizer update) of a stage per step; their sum is its tail."""
    parts = stage_components(cost, island, stage)
    return (sum(c.grad_sync_time_s * n for c, n in parts), sum(c.optimizer_time_s * n for c, n in parts))


def p2p_times(cost: CostModel, cluster: Cluster, islands: dict[str, Island], pipe: PipelinePlan) -> list[float]:
    """Seconds to send one micro-batch's activation (or its gradient) across each stage boundary:
    each side's GPUs send their shares through their NICs (or the scale-up link inside one node),
    over the path between the two stages' islands (:meth:`CostModel.p2p_time_s`)."""
    out = []
    for a, b in zip(pipe.stages, pipe.stages[1:]):
        src, dst = islands[a.island], islands[b.island]
        link = island_link(cluster, src, dst)
        out.append(cost.p2p_time_s((src.node, stage_config(a)), (dst.node, stage_config(b)), link))
    return out


def inflight_at_peak(position: int, num_stages: int, num_micro_batches: int, schedule: str) -> int:
    """Micro-batches whose activations stage ``position`` holds at its peak (Narayanan et al. 2021):
    1F1B keeps ``min(P - k, m)`` (its warm-up forwards plus the one whose backward comes next),
    GPipe keeps all ``m``."""
    if schedule == "gpipe":
        return num_micro_batches
    return min(num_stages - position, num_micro_batches)


def peak_memory_bytes(work: StageWork, inflight: int) -> float:
    """Peak bytes per GPU of a stage holding ``inflight`` micro-batches' activations while one of
    its forwards or backwards runs."""
    return work.static_bytes + work.activation_bytes * inflight + work.transient_bytes
