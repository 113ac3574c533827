"""Homogeneous parts of a plan: the unit one framework launch configuration can describe.

Every framework we export to (Megatron-LM, DeepSpeed, torchtitan) takes *one* tensor/context/data
parallel size, ZeRO stage, recomputation mode and micro-batch size for the whole job. A tangram_opt
plan may give each stage its own. A *part* is a maximal run of consecutive stages of one pipeline
that share all of those (the GPU type may differ: the frameworks do not look at it). A plan with one
pipeline made of one part can be launched as one job; anything else needs what docs/exports.md,
"What a heterogeneous plan needs", lists. Several *identical* pipelines (same stages, layers and
micro-batches; :func:`~tangram_opt.export.ranks.identical_pipelines`) are one pipeline to a framework:
their parts are merged into one with dp x pipelines.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tangram_opt.export.ranks import StageRanks, assign_ranks, identical_pipelines
from tangram_opt.planner.plan import Plan, StagePlan
from tangram_opt.specs.cluster import Cluster


@dataclass(frozen=True, slots=True, kw_only=True)
class Part:
    """Consecutive stages ``stage_indices`` of pipeline ``pipeline`` with one parallel configuration."""

    pipeline: int
    stage_indices: tuple[int, ...]
    stages: tuple[StagePlan, ...]
    ranks: tuple[StageRanks, ...]
    num_micro_batches: int
    pipeline_micro_batch: int
    schedule: str
    pipeline_stages: int
    num_pipelines: int
    #: identical pipelines merged into this part (1: none); its stages then hold dp x replicas ranks
    replicas: int = 1

    # the shared configuration (short names inside, long names at the framework boundary)
    @property
    def tp(self) -> int:
        return self.stages[0].tp

    @property
    def cp(self) -> int:
        return self.stages[0].cp

    @property
    def dp(self) -> int:
        return self.stages[0].dp

    @property
    def ep(self) -> int:
        return self.stages[0].ep

    @property
    def zero(self) -> int:
        return self.stages[0].zero

    @property
    def recompute(self) -> str:
        return self.stages[0].recompute

    @property
    def micro_batch_size(self) -> int:
        return self.stages[0].micro_batch_size

    @property
    def pp(self) -> int:
        return len(self.stages)

    @property
    def world_size(self) -> int:
        return sum(s.gpus for s in self.stages)

    @property
    def first_rank(self) -> int:
        return self.ranks[0].first_rank

    @property
    def rank_text(self) -> str:
        last = self.ranks[-1].first_rank + self.ranks[-1].num_ranks - 1
        return f"{self.first_rank}-{last}" if last > self.first_rank else str(self.first_rank)

    @property
    def whole_pipeline(self) -> bool:
        """Whether the part is its pipeline (first stage has the embedding, last the head)."""
        return self.pp == self.pipeline_stages

    @property
    def layer_counts(self) -> tuple[int, ...]:
        return tuple(s.num_layers for s in self.stages)

    @property
    def num_layers(self) -> int:
        return sum(self.layer_counts)

    @property
    def sequences_per_step(self) -> int:
        """Sequences this part's pipeline processes per step (its share of the global batch)."""
        return self.pipeline_micro_batch * self.num_micro_batches

    @property
    def label(self) -> str:
        ks = self.stage_indices
        st = f"stage {ks[0]}" if len(ks) == 1 else f"stages {ks[0]}-{ks[-1]}"
        return f"pipeline {self.pipeline}, {st}"

    @property
    def config_text(self) -> str:
        return (f"tp{self.tp} cp{self.cp} dp{self.dp} ep{self.ep} ZeRO-{self.zero} recompute={self.recompute} "
                f"micro-batch {self.micro_batch_size}")


def _key(s: StagePlan) -> tuple:
    return (s.tp, s.cp, s.dp, s.ep, s.zero, s.recompute, s.micro_batch_size)


def _joined(names: list[str]) -> str:
    return "+".join(dict.fromkeys(names))


def _merged_parts(plan: Plan, ranks: tuple[StageRanks, ...]) -> tuple[Part, ...]:
    """Identical pipelines as one: stage k of every pipeline becomes one stage with dp x pipelines."""
    P = len(plan.pipelines)
    pipe = plan.pipelines[0]
    by_stage: dict[int, list[StageRanks]] = {}
    for r in sorted(ranks, key=lambda r: r.first_rank):
        by_stage.setdefault(r.stage, []).append(r)
    stages, merged_ranks = [], []
    for k, st in enumerate(pipe.stages):
        rs = by_stage[k]
        island = _joined([r.island for r in rs])
        gpu = _joined([r.gpu for r in rs])
        stages.append(replace(st, gpus=st.gpus * P, dp=st.dp * P, island=island, gpu=gpu))
        merged_ranks.append(StageRanks(pipeline=0, stage=k, island=island, gpu=gpu, first_rank=rs[0].first_rank,
                                       num_ranks=sum(r.num_ranks for r in rs),
                                       slices=tuple(sl for r in rs for sl in r.slices)))
    one = replace(pipe, stages=tuple(stages), pipeline_micro_batch=pipe.pipeline_micro_batch * P)
    return _split(one, 0, merged_ranks, num_pipelines=1, replicas=P)


def _split(pipe, pi: int, ranks: list[StageRanks], *, num_pipelines: int, replicas: int = 1) -> tuple[Part, ...]:
    runs: list[list[int]] = []
    for k, st in enumerate(pipe.stages):
        if runs and _key(pipe.stages[runs[-1][-1]]) == _key(st):
            runs[-1].append(k)
        else:
            runs.append([k])
    return tuple(Part(pipeline=pi, stage_indices=tuple(run), stages=tuple(pipe.stages[k] for k in run),
                      ranks=tuple(ranks[k] for k in run), num_micro_batches=pipe.num_micro_batches,
                      pipeline_micro_batch=pipe.pipeline_micro_batch, schedule=pipe.schedule,
                      pipeline_stages=pipe.num_stages, num_pipelines=num_pipelines, replicas=replicas)
                 for run in runs)


def homogeneous_parts(plan: Plan, cluster: Cluster | None = None) -> tuple[Part, ...]:
    """The plan's parts, pipeline by pipeline, in stage order (identical pipelines merged into one)."""
    ranks = assign_ranks(plan, cluster)
    if identical_pipelines(plan):
        return _merged_parts(plan, ranks)
    by_stage = {(r.pipeline, r.stage): r for r in ranks}
    out: list[Part] = []
    for pi, pipe in enumerate(plan.pipelines):
        out += _split(pipe, pi, [by_stage[(pi, k)] for k in range(pipe.num_stages)], num_pipelines=len(plan.pipelines))
    return tuple(out)


@dataclass(frozen=True, slots=True, kw_only=True)
class SyncGroup:
    """Pieces of the model held by the same stage in every pipeline: one cross-pipeline all-reduce.

    ``layers`` are the transformer blocks, ``embedding`` / ``head`` whether the group holds them;
    ``members`` the (pipeline, stage) pairs and ``ranks`` their global ranks, one entry per pipeline.
    """

    index: int
    layers: tuple[int, ...]
    embedding: bool
    head: bool
    members: tuple[tuple[int, int], ...]
    ranks: tuple[StageRanks, ...]

    @property
    def label(self) -> str:
        lay = (f"layers {self.layers[0]}-{self.layers[-1]}" if len(self.layers) > 1
               else f"layer {self.layers[0]}" if self.layers else "")
        extra = [x for x, on in (("embedding", self.embedding), ("LM head", self.head)) if on]
        return " + ".join(([lay] if lay else []) + extra)


def cross_pipeline_groups(plan: Plan, cluster: Cluster | None = None) -> tuple[SyncGroup, ...]:
    """The all-reduce groups between the pipelines of a multi-pipeline plan (empty for one pipeline).

    Pipelines may split the layers differently, so the data-parallel gradient all-reduce of a stock
    framework (one group per stage) does not apply: each maximal run of layers held by the same
    stages of all pipelines needs its own group over those stages' ranks (docs/multi_pipeline.md).
    """
    if len(plan.pipelines) < 2:
        return ()
    ranks = {(r.pipeline, r.stage): r for r in assign_ranks(plan, cluster)}
    owner: dict[object, tuple[tuple[int, int], ...]] = {}
    num_layers = max(s.first_layer + s.num_layers for s in plan.pipelines[0].stages)
    for piece in ["E", *range(num_layers), "H"]:
        who = []
        for pi, pipe in enumerate(plan.pipelines):
            for k, st in enumerate(pipe.stages):
                if (piece == "E" and st.has_embedding) or (piece == "H" and st.has_head) or \
                        (isinstance(piece, int) and piece in st.layer_range):
                    who.append((pi, k))
        owner[piece] = tuple(who)
    groups: dict[tuple[tuple[int, int], ...], list[object]] = {}
    for piece, who in owner.items():
        groups.setdefault(who, []).append(piece)
    out = []
    for i, (who, pieces) in enumerate(groups.items()):
        out.append(SyncGroup(index=i, layers=tuple(p for p in pieces if isinstance(p, int)), embedding="E" in pieces,
                             head="H" in pieces, members=who, ranks=tuple(ranks[w] for w in who)))
    return tuple(out)


def replica_notes(plan: Plan, cluster: Cluster | None = None) -> list[str]:
    """What a launcher needs to run several pipelines with uneven batch shares (empty for one pipeline,
    and for identical pipelines, which one job runs as a larger data-parallel group)."""
    if len(plan.pipelines) < 2 or identical_pipelines(plan):
        return []
    B = sum(p.sequences_per_step for p in plan.pipelines)
    notes = [f"{len(plan.pipelines)} pipelines with batch shares "
             + ", ".join(f"pipeline {i}: {p.pipeline_micro_batch} x {p.num_micro_batches} = {p.sequences_per_step}"
                         for i, p in enumerate(plan.pipelines))
             + f" sequences (global batch {B})",
             "loss: each pipeline sums its per-token losses and divides by the global token count (not its own), "
             "so that the all-reduced SUM of gradients equals the gradient of the global mean loss",
             "gradients: after the intra-stage reduction, all-reduce (SUM) across pipelines in the groups below, "
             "before the optimizer step (the plan prices this as not overlapped with compute)"]
    for g in cross_pipeline_groups(plan, cluster):
        members = "; ".join(f"pipeline {p} stage {k} (ranks {r.rank_text})" for (p, k), r in zip(g.members, g.ranks))
        notes.append(f"all-reduce group {g.index}: {g.label}: {members}")
    return notes


def single_job(parts: tuple[Part, ...]) -> bool:
    """Whether the plan is one pipeline of one part (launchable as one stock framework job)."""
    return len(parts) == 1 and parts[0].whole_pipeline


def heterogeneity_notes(parts: tuple[Part, ...]) -> list[str]:
    """Plain-language reasons a plan is not one stock job (empty when it is)."""
    notes: list[str] = []
    pipes = {p.pipeline for p in parts}
    if len(pipes) > 1:
        shares = sorted({p.sequences_per_step for p in parts})
        notes.append(f"{len(pipes)} pipelines (data-parallel replicas) with their own stage layouts"
                     + (f" and uneven batch shares ({', '.join(map(str, shares))} sequences per step)"
                        if len(shares) > 1 else "")
                     + "; their gradients must be all-reduced across pipelines of different shapes")
    for pi in sorted(pipes):
        mine = [p for p in parts if p.pipeline == pi]
        if len(mine) > 1:
            notes.append(f"pipeline {pi}: stages use {len(mine)} different parallel configurations ("
                         + "; ".join(f"{p.label.split(', ')[1]}: {p.config_text}" for p in mine)
                         + "); activations crossing from a stage with one (tp, cp, dp) layout to another need "
                           "resharding point-to-point sends")
    return notes


__all__ = ["Part", "SyncGroup", "cross_pipeline_groups", "homogeneous_parts", "replica_notes", "single_job",
           "heterogeneity_notes"]
