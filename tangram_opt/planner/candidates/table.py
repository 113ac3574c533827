"""The candidate table's rows: one homogeneous stage configuration on one island, priced once.

This is the "homogeneous parallelizer" behind a narrow protocol (:class:`CandidateProvider`): the
formulations only ever see :class:`Candidate` rows and :class:`BoundaryLink` paths (numbers),
never the cost model, so a user can plug in another homogeneous planner or measured profiles.
:func:`price_candidate` is where a configuration meets the cost model; :func:`boundary_time_s` is
how a stage boundary is priced from the two sides' rows and the path between their islands.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from tangram_opt.cost import CostModel, LayerCost, StageConfig
from tangram_opt.planner.islands import Island


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidate:
    """One stage configuration on one island for one pipeline micro-batch size.

    ``layer[kind]`` is the cost of one transformer block of that kind; ``embedding`` and ``head``
    are the extra costs of the first and last stage; ``capacity_bytes`` the usable memory per GPU.
    ``p2p_nic_s`` / ``p2p_scale_up_s``: seconds this stage's GPUs need to send (or receive) their
    shares of one micro-batch's activations through their NICs / over their node's scale-up link
    (one side of a stage boundary; :func:`boundary_time_s` combines both sides and the path).
    """

    island: int
    config: StageConfig
    layer: dict[str, LayerCost]
    embedding: LayerCost
    head: LayerCost
    capacity_bytes: float
    p2p_nic_s: float
    p2p_scale_up_s: float
    label: str = ""
    #: the largest transient of one layer (scratch of the layer being computed): read on every
    #: memory check, so computed once
    layer_transient_bytes: float = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "layer_transient_bytes",
                           max((c.transient_bytes for c in self.layer.values()), default=0.0))

    @property
    def gpus(self) -> int:
        return self.config.gpus

    def on_island(self, island: int) -> Candidate:
        """This candidate on island ``island`` (a sub-cluster's renumbering): a copy of its fields,
        without ``dataclasses.replace``'s re-initialisation, which cost 25 us a candidate."""
        if island == self.island:
            return self
        other = object.__new__(Candidate)
        for name in Candidate.__slots__:
            object.__setattr__(other, name, getattr(self, name))
        object.__setattr__(other, "island", island)
        return other

    def max_layers(self, kind: str, inflight: int, *, first: bool, last: bool) -> int:
        """Most layers of ``kind`` that fit in memory at a stage with ``inflight`` micro-batches."""
        free = self.capacity_bytes - self.fixed_bytes(inflight, first=first, last=last)
        c = self.layer[kind]
        per = c.static_bytes + c.activation_bytes * inflight
        if free < 0:
            return 0
        return int(free // per) if per > 0 else 10**9

    def fixed_bytes(self, inflight: int, *, first: bool, last: bool) -> float:
        """Memory that does not scale with the layer count: embedding, head, scratch. The scratch of
        the pieces a stage runs one after another (a layer's backward working set, the embedding's
        buffer, the head's logits) is never live at once: the largest counts, as in the simulator."""
        b = 0.0
        scratch = self.layer_transient_bytes
        if first:
            e = self.embedding
            b += e.static_bytes + e.activation_bytes * inflight
            scratch = max(scratch, e.transient_bytes)
        if last:
            h = self.head
            b += h.static_bytes + h.activation_bytes * inflight
            scratch = max(scratch, h.transient_bytes)
        return b + scratch

    def memory_bytes(self, layers: dict[str, int], inflight: int, *, first: bool, last: bool) -> float:
        """Peak bytes per GPU of a stage holding ``layers`` (kind -> count)."""
        total = self.fixed_bytes(inflight, first=first, last=last)
        for kind, n in layers.items():
            if n:
                c = self.layer[kind]
                total += n * (c.static_bytes + c.activation_bytes * inflight)
        return total


def price_candidate(cost: CostModel, island: Island, cfg: StageConfig, kinds: Sequence[str]) -> Candidate:
    """The candidate row of ``cfg`` on ``island``: every cost the formulation reads, priced once."""
    node = island.node
    return Candidate(island=island.index, config=cfg, layer={k: cost.layer(node, cfg, k) for k in kinds},  # type: ignore[misc]
                     embedding=cost.embedding(node, cfg), head=cost.head(node, cfg),
                     capacity_bytes=cost.usable_memory_bytes(node),
                     p2p_nic_s=cost.p2p_side_time_s(node, cfg, intra_node=False),
                     p2p_scale_up_s=cost.p2p_side_time_s(node, cfg, intra_node=True),
                     label=f"{island.name}:{cfg.label}")


def sends_no_slower(a: Candidate, b: Candidate) -> bool:
    """Whether ``a``'s side of any stage boundary is at most as slow as ``b``'s."""
    return a.p2p_nic_s <= b.p2p_nic_s and a.p2p_scale_up_s <= b.p2p_scale_up_s


class CandidateProvider(Protocol):
    """Supplies the candidate table for one island and one pipeline micro-batch size."""

    def candidates(self, island: Island, pipeline_micro_batch: int) -> list[Candidate]: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class BoundaryLink:
    """The numbers of the pipeline path from one island to another (from
    :class:`~tangram_opt.cost.comm.PipelineLink`, priced for one pipeline micro-batch size).

    - ``latency_s``: one message's latency;
    - ``shared_s``: seconds the whole micro-batch needs on a link both sides share (the zone link
      between two zones; 0 inside a zone);
    - ``scale_up``: both stages sit in one node, so each side sends at its candidate's
      ``p2p_scale_up_s`` instead of ``p2p_nic_s``.
    """

    latency_s: float
    shared_s: float = 0.0
    scale_up: bool = False

    def side_s(self, cand: Candidate) -> float:
        """How long ``cand``'s GPUs need to move their shares of a micro-batch over this path."""
        return cand.p2p_scale_up_s if self.scale_up else cand.p2p_nic_s


def boundary_time_s(link: BoundaryLink, src: Candidate, dst: Candidate) -> float:
    """Seconds to send one micro-batch's activations (or their gradients) from a stage of ``src`` to
    the next stage, of ``dst``: the latency plus the slowest of the sending side, the receiving
    side and the shared link (docs/cost_model.md §3.3)."""
    return link.latency_s + max(link.side_s(src), link.side_s(dst), link.shared_s)


__all__ = ["BoundaryLink", "Candidate", "CandidateProvider", "boundary_time_s", "price_candidate", "sends_no_slower"]
