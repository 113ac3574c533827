"""Integer time: how every MIP of the planner turns seconds into ticks, and back.

Every model is all-integer, so all five backends (CP-SAT included) solve the same problem
(docs/design.md, "Everything is an integer in the MIP"). A model's coefficients are seconds
divided by one tick and rounded *in the bound's favour*: a term that lowers the objective or sits on
the small side of a ``>=`` row is rounded down (:func:`rounders`' first function), a term taken away
(a backward time used as upstream cover, an end stage cut out of a block) is rounded up. A model's
optimum is then a lower bound of the real-valued closed form up to :func:`rounding_ticks`.

The tick is a power of ten chosen from a reference time (an incumbent, a cutoff) so that the
objective is about :data:`PIPELINE_TICKS` ticks (:func:`tick_for`): fine enough that rounding
costs < 1e-5 relative. The multi-pipeline level-2 MIP uses the coarser :data:`LEVEL2_TICKS`, which
keeps its GPUs x ticks coefficients easy for LP-based solvers.
"""

from __future__ import annotations

import math
from collections.abc import Callable

#: pipeline models (aggregated, sequence, positional): the objective is about 1e8 ticks
PIPELINE_TICKS = 1e8
#: the multi-pipeline level-2 MIP: about 1e6 ticks (rounding costs ~1e-6 relative there)
LEVEL2_TICKS = 1e6


def tick_for(reference_s: float, ticks: float = PIPELINE_TICKS) -> float:
    """The power of ten (seconds) that makes ``reference_s`` about ``ticks`` ticks."""
    return 10.0 ** math.floor(math.log10(max(reference_s, 1e-9) / ticks))


def rounders(tick_s: float) -> tuple[Callable[[float], int], Callable[[float], int]]:
    """``(floor, ceil)``: seconds to whole ticks of ``tick_s``, rounded down (terms of a lower
    bound) and up (terms it subtracts). The 1e-9 keeps a time that is a whole number of ticks up to
    floating-point noise on its own tick."""

    def floor(t_s: float) -> int:
        return math.floor(t_s / tick_s + 1e-9)

    def ceil(t_s: float) -> int:
        return math.ceil(t_s / tick_s - 1e-9)

    return floor, ceil


def rounding_ticks(num_micro_batches: int) -> int:
    """Ticks by which a pipeline model's optimum may exceed the real-valued closed form: time
    coefficients round in the bound's favour, but the integer period ``Smax`` rounds up by less than
    one tick, which ``m - 1`` multiplies (plus one tick each for the integer Y and Cm). Every bound
    read from a model is lowered by this much (about 1e-6 of the objective at the ~1e8-tick scale)."""
    return num_micro_batches + 2


__all__ = ["LEVEL2_TICKS", "PIPELINE_TICKS", "rounders", "rounding_ticks", "tick_for"]
