"""How many micro-batches a pipeline stage holds in flight: the rule every memory check uses.

Under 1F1B (PipeDream-Flush, Narayanan et al., SC'21, Sec. 2.2) stage ``k`` of ``P`` runs
``P - k - 1`` warm-up forwards before its first backward, so at its peak it holds the activations of
``min(P - k, m)`` micro-batches; counted from the end of the pipeline (distance ``r = P - 1 - k``,
the last stage at ``r = 0``) that is ``min(r + 1, m)``, independent of the depth. GPipe runs every
forward first: every stage holds all ``m``. The simulator (tangram_opt/sim) derives the same count
from its own event replay.
"""

from __future__ import annotations


def inflight_micro_batches(position: int, num_stages: int, m: int, schedule: str = "1f1b") -> int:
    """Micro-batches whose activations stage ``position`` (0 = first) of ``num_stages`` holds at its peak."""
    return inflight_from_end(num_stages - 1 - position, m, schedule)


def inflight_from_end(distance: int, m: int, schedule: str = "1f1b") -> int:
    """The same count for the stage ``distance`` positions before the last one (0 = the last stage)."""
    if schedule == "gpipe":
        return m
    return min(distance + 1, m)


__all__ = ["inflight_from_end", "inflight_micro_batches"]
