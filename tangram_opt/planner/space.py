"""The plan space the planner searches, stated explicitly so a certificate can name it."""

from __future__ import annotations

from dataclasses import dataclass

from tangram_opt.cost.config import RECOMPUTE_MODES, ZERO_STAGES
from tangram_opt.errors import SpecError

SCHEDULES = ("1f1b", "gpipe")


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchSpace:
    """Which configurations the planner may use.

    ``None`` means "every valid value": tp over divisors of the node size that divide the heads;
    ep over divisors of the expert count that divide dp x cp; pipeline micro-batches over divisors
    of the global batch; stages from 1 to ``max_stages`` (default: min(layers, 32, GPUs)).
    """

    micro_batch_sizes: tuple[int, ...] = (1, 2, 4, 8)
    tp: tuple[int, ...] | None = None
    cp: tuple[int, ...] = (1, 2, 4, 8)
    ep: tuple[int, ...] | None = None
    zero: tuple[int, ...] = ZERO_STAGES
    recompute: tuple[str, ...] = RECOMPUTE_MODES
    pipeline_micro_batches: tuple[int, ...] | None = None
    max_stages: int | None = None
    schedule: str = "1f1b"
    #: heuristic (inexact) pruning: keep only this many fastest candidates per (island, GPU count),
    #: plus the most memory-frugal one. Off (None) for certified runs; the certificate says so.
    heuristic_keep: int | None = None

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise SpecError("space.schedule", self.schedule, "is not a supported schedule",
                            f"use one of {', '.join(SCHEDULES)}")
        for z in self.zero:
            if z not in ZERO_STAGES:
                raise SpecError("space.zero", z, "is not a ZeRO stage", "use values among 0, 1, 2, 3")
        for r in self.recompute:
            if r not in RECOMPUTE_MODES:
                raise SpecError("space.recompute", r, "is not a recomputation mode",
                                f"use values among {', '.join(RECOMPUTE_MODES)}")
        for name in ("micro_batch_sizes", "cp"):
            vals = getattr(self, name)
            if not vals or any((not isinstance(v, int)) or v < 1 for v in vals):
                raise SpecError(f"space.{name}", vals, "must be a non-empty tuple of integers >= 1",
                                "e.g. (1, 2, 4, 8)")
        if self.heuristic_keep is not None and self.heuristic_keep < 1:
            raise SpecError("space.heuristic_keep", self.heuristic_keep, "must be >= 1 or None",
                            "keep at least one candidate per island and size, or None for exact pruning")
        if self.max_stages is not None and self.max_stages < 1:
            raise SpecError("space.max_stages", self.max_stages, "must be >= 1", "allow at least one stage")

    def describe(self) -> str:
        tp = "valid divisors of the node size" if self.tp is None else str(list(self.tp))
        ep = "valid divisors of the expert count" if self.ep is None else str(list(self.ep))
        b = "divisors of the global batch" if self.pipeline_micro_batches is None else str(
            list(self.pipeline_micro_batches))
        return (f"single {self.schedule} pipeline, up to {self.max_stages or 'min(layers, 32, GPUs)'} stages, "
                f"each stage one island; tp {tp}; cp {list(self.cp)}; ep {ep}; ZeRO {list(self.zero)}; "
                f"recompute {list(self.recompute)}; per-rank micro-batch {list(self.micro_batch_sizes)}; "
                f"pipeline micro-batch {b}; stage sizes divide a node or are whole nodes"
                + (f"; HEURISTIC pruning: only the {self.heuristic_keep} fastest candidates per island and "
                   "size (the gap is valid for that reduced space only)" if self.heuristic_keep else ""))
