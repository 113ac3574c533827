"""The plan space the planner searches, stated explicitly so a certificate can name it."""

from __future__ import annotations

from dataclasses import dataclass

from tangram_opt.cost.config import RECOMPUTE_MODES, ZERO_STAGES
from tangram_opt.errors import SpecError

SCHEDULES = ("1f1b", "gpipe")
#: tuple fields where None means "every valid value"
_MAY_BE_NONE = ("tp", "ep", "pipeline_micro_batches")
#: a valid value of each tuple field, for the fix of an error message
_EXAMPLES = {"micro_batch_sizes": "(1, 2)", "tp": "(1, 2)", "cp": "(1, 2)", "ep": "(1, 2)", "zero": "(0, 1)",
             "recompute": "('none', 'full')", "pipeline_micro_batches": "(1, 2)"}
#: what each tuple field may hold, as the fix of an error message says it
_ALLOWED = {"zero": "ZeRO stages among " + ", ".join(map(str, ZERO_STAGES)),
            "recompute": "recomputation modes among " + ", ".join(RECOMPUTE_MODES)}


def _is_int(v: object) -> bool:
    """An integer count: ``int`` but not ``bool`` (``True`` is not a tensor-parallel degree)."""
    return isinstance(v, int) and not isinstance(v, bool)


def _allowed(name: str, v: object) -> bool:
    if name == "zero":
        return _is_int(v) and v in ZERO_STAGES
    if name == "recompute":
        return isinstance(v, str) and v in RECOMPUTE_MODES
    return _is_int(v) and v >= 1  # type: ignore[operator]


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
        if not isinstance(self.schedule, str) or self.schedule not in SCHEDULES:
            raise SpecError("space.schedule", self.schedule, "is not a supported schedule",
                            f"use one of {', '.join(SCHEDULES)}")
        for name in ("micro_batch_sizes", "tp", "cp", "ep", "zero", "recompute", "pipeline_micro_batches"):
            vals = getattr(self, name)
            if vals is None and name in _MAY_BE_NONE:
                continue
            example = _EXAMPLES[name] + (", or None for every valid value" if name in _MAY_BE_NONE else "")
            if not isinstance(vals, (tuple, list)):
                raise SpecError(f"space.{name}", vals, "must be a tuple of values", f"give a tuple such as {example}")
            if not vals:
                raise SpecError(f"space.{name}", vals, "is empty: it leaves nothing to search",
                                f"give at least one value, e.g. {example}")
            bad = [v for v in vals if not _allowed(name, v)]
            if bad:
                raise SpecError(f"space.{name}", vals, f"holds {bad[0]!r}, which is not allowed",
                                f"use {_ALLOWED.get(name, 'integers >= 1')}, e.g. {example}")
            object.__setattr__(self, name, tuple(vals))
        for name, problem in (("max_stages", "most pipeline stages"),
                              ("heuristic_keep", "candidates kept per island and size")):
            v = getattr(self, name)
            if v is not None and (not _is_int(v) or v < 1):
                raise SpecError(f"space.{name}", v, f"must be a whole number >= 1 of {problem}, or None",
                                f"e.g. space.{name}=2, or None for "
                                + ("min(layers, 32, GPUs)" if name == "max_stages" else "exact pruning"))

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
