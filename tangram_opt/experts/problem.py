"""The expert-placement problem: validated inputs, shared by the greedy, the bounds and the MIP.

Names (the same in :mod:`formulations/expert_placement.md`):

* ``E`` experts ``e`` with routed loads ``w[e]`` (tokens per step, e.g. from routing statistics);
* ``R`` EP ranks ``r`` in ``N`` nodes of ``R / N`` consecutive ranks (rank ``r`` is on node
  ``r // (R / N)``);
* ``S[r]`` slots on rank ``r``: at most ``S[r]`` expert replicas live there (every routed expert of
  a layer has the same shape, so a slot is one expert's weights and optimizer state);
* at most ``P = min(sum S, E + max_redundant)`` replicas in total (``max_redundant`` caps the
  redundant copies, e.g. DeepSeek-V3's 32);
* optional ``expert_bytes[e]`` and ``rank_memory_bytes[r]``: the replicas on a rank must also fit in
  that many bytes (for experts of different sizes);
* optional ``current`` placement (expert ids per rank) against which moved experts are counted.

Everything a user can get wrong raises :class:`~tangram_opt.errors.SpecError` naming the field.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tangram_opt.errors import InfeasibleError, SpecError


@dataclass(frozen=True, slots=True, kw_only=True)
class PlacementProblem:
    """One MoE layer's placement instance (validated; build it with :func:`make_problem`)."""

    loads: tuple[float, ...]
    """``w[e]``: tokens routed to expert ``e``."""
    ranks: int
    nodes: int
    slots_per_rank: tuple[int, ...]
    max_redundant: int
    """Cap on replicas beyond one per expert (``P - E``)."""
    expert_bytes: tuple[float, ...] | None = None
    rank_memory_bytes: tuple[float, ...] | None = None
    current: tuple[tuple[int, ...], ...] | None = None
    """Experts held by each rank before re-placement (for the moved-experts count)."""
    open_ranks: int = field(init=False, repr=False, compare=False)
    """Ranks with at least one slot (derived; makes :meth:`max_copies` O(1) without memory limits)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "open_ranks", sum(1 for s in self.slots_per_rank if s > 0))

    @property
    def experts(self) -> int:
        return len(self.loads)

    @property
    def ranks_per_node(self) -> int:
        return self.ranks // self.nodes

    def node_of(self, r: int) -> int:
        return r // self.ranks_per_node

    @property
    def total_load(self) -> float:
        return float(sum(self.loads))

    @property
    def mean_load(self) -> float:
        """Average rank load ``W / R`` (the load every rank would carry if perfectly balanced)."""
        return self.total_load / self.ranks

    @property
    def max_replicas(self) -> int:
        """``P``: the number of replicas (physical experts) that may exist in total."""
        return min(sum(self.slots_per_rank), self.experts + self.max_redundant)

    def fits(self, e: int, r: int) -> bool:
        """Could a replica of ``e`` live on rank ``r`` at all (slots and memory, ignoring others)?"""
        if self.slots_per_rank[r] < 1:
            return False
        if self.expert_bytes is None or self.rank_memory_bytes is None:
            return True
        return self.expert_bytes[e] <= self.rank_memory_bytes[r]

    def bytes_of(self, e: int) -> float:
        return 0.0 if self.expert_bytes is None else self.expert_bytes[e]

    def memory_of(self, r: int) -> float:
        return math.inf if self.rank_memory_bytes is None else self.rank_memory_bytes[r]

    def max_copies(self, e: int) -> int:
        """Upper bound on the replicas of ``e``: one per rank it fits on, and the replica budget."""
        if self.expert_bytes is None or self.rank_memory_bytes is None:
            return min(self.open_ranks, 1 + self.max_redundant)
        return min(sum(1 for r in range(self.ranks) if self.fits(e, r)), 1 + self.max_redundant)

    def with_loads(self, loads: Sequence[float]) -> PlacementProblem:
        """Same cluster and limits, another layer's loads."""
        return make_problem(loads, self.ranks, self.nodes, self.slots_per_rank, max_redundant=self.max_redundant,
                            expert_bytes=self.expert_bytes, rank_memory_bytes=self.rank_memory_bytes,
                            current=self.current)


def _int(field: str, value: Any, *, lowest: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            isinstance(value, float) and not value.is_integer()):
        raise SpecError(field, value, "must be a whole number", f"write an integer >= {lowest}")
    if int(value) < lowest:
        raise SpecError(field, value, f"must be >= {lowest}", f"use a count of at least {lowest}")
    return int(value)


def check_real(field: str, values: Any) -> None:
    """Refuse strings and booleans anywhere in (nested) lists of numbers: numpy and ``float`` would
    coerce them silently (``"1"`` is a typo in a loads file)."""
    if isinstance(values, np.ndarray):
        if values.dtype.kind not in "iuf":
            raise SpecError(field, f"array of {values.dtype}", "must hold numbers", "pass numbers")
        return
    for i, v in enumerate(values):
        if isinstance(v, (list, tuple, np.ndarray)):
            check_real(f"{field}[{i}]", v)
        elif isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real):
            raise SpecError(f"{field}[{i}]", v, f"must be a number, not {type(v).__name__}",
                            "write the number without quotes" if isinstance(v, str) else "give a number per entry")


def _numbers(field: str, values: Any, n: int | None, *, positive: bool = False) -> tuple[float, ...]:
    """Numbers as floats; strings and booleans are refused, not coerced (``"1"`` is a typo in a loads file)."""
    if isinstance(values, (str, bytes)):
        raise SpecError(field, values, "must be a sequence of numbers, not a string", "pass a list or 1-D array")
    try:
        items = list(values)
    except TypeError:
        raise SpecError(field, values, "must be a sequence of numbers", "pass a list or 1-D array") from None
    for i, v in enumerate(items):  # one number per entry: nested lists are check_real's other use
        if isinstance(v, (list, tuple, np.ndarray)):
            raise SpecError(f"{field}[{i}]", v, f"must be a number, not {type(v).__name__}", "give a number per entry")
    check_real(field, items)
    out = tuple(float(v) for v in items)
    if n is not None and len(out) != n:
        raise SpecError(field, f"{len(out)} values", f"needs exactly {n} values", f"give one value per item ({n})")
    for i, v in enumerate(out):
        if not math.isfinite(v) or v < 0 or (positive and v == 0):
            bound = "> 0" if positive else ">= 0"
            raise SpecError(f"{field}[{i}]", v, f"must be finite and {bound}", "fix or drop the bad entry")
    return out


def make_problem(loads: Sequence[float], ranks: int, nodes: int, slots: int | Sequence[int], *,
                 max_redundant: int | None = None, expert_bytes: Sequence[float] | None = None,
                 rank_memory_bytes: float | Sequence[float] | None = None,
                 current: Sequence[Sequence[int]] | None = None) -> PlacementProblem:
    """Validate user inputs into a :class:`PlacementProblem` (raises ``SpecError`` / ``InfeasibleError``)."""
    w = _numbers("loads", loads, None)
    if not w:
        raise SpecError("loads", list(loads), "is empty", "give one load (tokens) per expert")
    E = len(w)
    R = _int("ranks", ranks, lowest=1)
    N = _int("nodes", nodes, lowest=1)
    if R % N:
        raise SpecError("ranks", R, f"is not divisible by nodes ({N})",
                        f"use a rank count that is a multiple of {N} (ranks are grouped into equal nodes)")
    if isinstance(slots, (int, float)) and not isinstance(slots, bool):
        S = (_int("slots", slots, lowest=0),) * R
    else:
        try:
            S = tuple(_int(f"slots[{r}]", s, lowest=0) for r, s in enumerate(slots))
        except TypeError:
            raise SpecError("slots", slots, "must be an integer or one integer per rank", "write e.g. 4") from None
        if len(S) != R:
            raise SpecError("slots", f"{len(S)} values", f"needs one value per rank ({R})", "or pass one integer")
    if sum(S) < E:
        raise SpecError("slots", slots if isinstance(slots, int) else sum(S),
                        f"slots x ranks = {sum(S)} < experts ({E}): some expert could not be placed",
                        f"use at least {math.ceil(E / R)} slots per rank")
    K = sum(S) - E if max_redundant is None else _int("max_redundant", max_redundant, lowest=0)
    eb = mem = None
    if (expert_bytes is None) != (rank_memory_bytes is None):
        raise SpecError("expert_bytes" if rank_memory_bytes is None else "rank_memory_bytes", None,
                        "memory limits need both expert_bytes and rank_memory_bytes", "give both or neither")
    if expert_bytes is not None:
        eb = _numbers("expert_bytes", expert_bytes, E)
        if isinstance(rank_memory_bytes, (int, float)):
            mem = _numbers("rank_memory_bytes", [rank_memory_bytes], 1) * R
        else:
            mem = _numbers("rank_memory_bytes", rank_memory_bytes, R)
    cur = None if current is None else _current(current, E, S)
    p = PlacementProblem(loads=w, ranks=R, nodes=N, slots_per_rank=S, max_redundant=K, expert_bytes=eb,
                         rank_memory_bytes=mem, current=cur)
    _check_feasible(p)
    return p


def _current(current: Any, E: int, S: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """The expert ids each rank holds now (``-1`` entries are empty slots and dropped), checked against the
    expert count and each rank's slots."""
    R = len(S)
    fix = "pass e.g. [[0, 1], [2, 3]] (use -1 for an empty slot)"
    if isinstance(current, (str, bytes)) or not isinstance(current, (Sequence, np.ndarray)):
        raise SpecError("current", current, "must list the expert ids held by each rank", fix)
    if len(current) != R:
        raise SpecError("current", f"{len(current)} ranks", f"needs one row per rank ({R})", "one list per rank")
    out = []
    for r, row in enumerate(current):
        if isinstance(row, (str, bytes)) or not isinstance(row, (Sequence, np.ndarray)):
            raise SpecError(f"current[{r}]", row, f"must list the expert ids held by rank {r}", fix)
        ids = []
        for e in row:
            if isinstance(e, (bool, np.bool_)) or not isinstance(e, numbers.Integral):
                raise SpecError(f"current[{r}]", list(row), f"holds {e!r}, not an expert id", fix)
            if not -1 <= e < E:
                problem = f"names expert {e} but there are only {E}" if e >= E else f"holds {e}, not an expert id"
                raise SpecError(f"current[{r}]", list(row), problem,
                                f"use expert ids 0..{E - 1}, or -1 for an empty slot")
            if e >= 0:
                ids.append(int(e))
        if len(ids) > S[r]:
            raise SpecError(f"current[{r}]", ids, f"lists {len(ids)} experts but rank {r} has {S[r]} slots",
                            "give the placement the ranks hold now, at most slots experts per rank")
        out.append(tuple(ids))
    return tuple(out)


def _check_feasible(p: PlacementProblem) -> None:
    """Necessary conditions for any placement; each failure is diagnosed for the user."""
    if p.expert_bytes is None:
        return  # slots x ranks >= experts was checked: every expert fits on some rank
    for e in range(p.experts):
        if not any(p.fits(e, r) for r in range(p.ranks)):
            raise InfeasibleError(
                f"expert {e} needs {p.bytes_of(e):.0f} bytes but the largest rank memory is "
                f"{max(p.rank_memory_bytes or [0]):.0f} bytes: it fits on no rank",
                closest={"expert": e, "expert_bytes": p.bytes_of(e)})
    if p.expert_bytes is not None:
        # Each expert needs one replica; even ignoring slots, the smallest experts must fit in total.
        need = sum(p.expert_bytes)
        have = sum(p.rank_memory_bytes or ())
        if need > have:
            raise InfeasibleError(f"one replica of every expert needs {need:.0f} bytes but the ranks have "
                                  f"{have:.0f} bytes for experts in total", closest={"short_bytes": need - have})
