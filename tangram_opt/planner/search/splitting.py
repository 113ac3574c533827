"""Splitting a node of the branch and bound: on the period, the stage count or the largest step tail.

:meth:`WindowSplits.split` halves a window on the bottleneck time (geometric midpoint) while it is
wider than the leaf ratio, then on the stage count (sequence leaves) or on the largest step tail
(aggregated leaves); where the step tail spans more seconds of step than the period window
(slow NICs: exposed gradient sync), on the tail first (:meth:`WindowSplits.wide_tail_split_point`,
formulations/pipeline_mip.md §5). Every split covers its node: children are bounded by
:meth:`BranchAndBound.evaluate_then` (in a worker process when one is idle) and pushed, pruned or
closed.
"""

from __future__ import annotations

import heapq
import math

from tangram_opt.planner.formulations.aggregated import AggregatedMIP
from tangram_opt.planner.search import tuning
from tangram_opt.planner.search.nodes import Node
from tangram_opt.planner.search.window_bounds import Window


class WindowSplits:
    """The node splits of :class:`~tangram_opt.planner.search.branch_and_bound.BranchAndBound` (a mixin:
    it uses the search's subs, queue, incumbent, :meth:`evaluate`, :meth:`close` and the leaves)."""

    __slots__ = ()

    def leaf_ratio_of(self, b: int) -> float:
        """The widest period window (hi / lo) of a leaf of pipeline micro-batch size ``b``:
        ``leaf_ratio``, or with sequence leaves ``tuning.SEQUENCE_NARROW_RATIO`` once
        ``tuning.SEQUENCE_NARROW_AFTER`` of its leaves came back unfinished (their proofs take
        more than a first try's time there, and narrower windows shorten them)."""
        if self.sequence and self.subs[b].info.get("sequence_unfinished", 0) >= tuning.SEQUENCE_NARROW_AFTER:
            return min(self.leaf_ratio, tuning.SEQUENCE_NARROW_RATIO)
        return self.leaf_ratio

    def splittable(self, node: Node) -> bool:
        """Wider than a leaf: on the period, then on the stage count (sequence leaves) or on the
        largest step tail (aggregated leaves)."""
        if node.hi_s / max(node.lo_s, 1e-30) > self.leaf_ratio_of(node.b):
            return True
        if self.sequence:
            return node.stages is None or node.stages[0] < node.stages[1]
        return self.tail_split_point(node) is not None

    def stage_range(self, node: Node) -> tuple[int, int]:
        """Stage counts of the plans in ``node`` (pipelines of one stage are enumerated apart)."""
        if node.stages is not None:
            return node.stages
        p = self.subs[node.b].problem
        return max(2, p.min_stages), p.max_stages

    def tail_window(self, node: Node) -> tuple[float, float] | None:
        """The node's window on the largest step tail, cut to its stage types' largest tail, or
        None when it is narrow (``tuning.TAIL_LEAF_FRACTION`` of the incumbent's step) or cannot be
        split (no aggregated model bounded it, no incumbent)."""
        if node.max_tail_s is None or not math.isfinite(self.inc_s):
            return None
        lo = 0.0 if node.tail_lo_s is None else node.tail_lo_s
        hi = min(node.tail_hi_s, node.max_tail_s)
        if hi - lo <= tuning.TAIL_LEAF_FRACTION * self.inc_s:
            return None
        return lo, hi

    def tail_split_point(self, node: Node) -> float | None:
        """Midpoint of the node's window on the largest step tail, or None when it is narrow (or
        when narrow windows go to sequence leaves, which price the tail exactly)."""
        window = None if self.sequence else self.tail_window(node)
        return None if window is None else 0.5 * (window[0] + window[1])

    def wide_tail_split_point(self, node: Node, hi: float) -> float | None:
        """Midpoint of the node's window on the largest step tail when that window is wider, in
        seconds of step, than its window on the period (``(m - 1) (hi - lo)``) while the period
        window is still split (``tuning.WIDE_TAIL_SPLITS``): where exposed gradient sync is a
        large part of the step (slow NICs), the LP prices it only through fractional "type used"
        variables, and a tail window's lower edge forces it (formulations/pipeline_mip.md §5)."""
        if not tuning.WIDE_TAIL_SPLITS or hi / max(node.lo_s, 1e-30) <= self.leaf_ratio_of(node.b):
            return None  # narrow on the period: the leaves (or the stage-count splits) take over
        window = self.tail_window(node)
        if window is None:
            return None
        lo_t, hi_t = window
        if hi_t - lo_t <= tuning.WIDE_TAIL_FACTOR * (self.subs[node.b].problem.num_micro_batches - 1) * (hi - node.lo_s):
            return None
        return 0.5 * (lo_t + hi_t)

    def split(self, node: Node) -> None:
        """Split a node in two: on the bottleneck time (geometric midpoint) while that window is
        wider than ``leaf_ratio_of(b)``, then either on the stage count (halves of its range; with
        sequence leaves, the default) or on the largest step tail (arithmetic midpoint; with
        aggregated leaves). A stage range is bounded by the aggregated LP of pipelines of that many
        stages, which is often much tighter than the window's (the cycle and Hall rows know P).
        Restricting the tail helps the aggregated LP for the same reason restricting the time
        does: a type outside the window cannot be used "a little", and the window's lower edge
        forces a stage whose tail needs cover upstream (``AggregatedMIP._tail_window_rows``).
        Time first: the period term dominates the objective."""
        sub = self.subs[node.b]
        hi = min(node.hi_s, self.inc_s / sub.problem.num_micro_batches)
        if hi <= node.lo_s:  # the incumbent improved past this window: nothing in it can beat it
            self.close(node, self.inc_s)
            return
        stages = node.stages
        wide_tail = self.wide_tail_split_point(node, hi)
        if wide_tail is not None:
            windows = [(node.lo_s, hi, node.tail_lo_s, wide_tail, stages),
                       (node.lo_s, hi, wide_tail, node.tail_hi_s, stages)]
        elif hi / max(node.lo_s, 1e-30) > self.leaf_ratio_of(node.b):
            mid = math.sqrt(node.lo_s * hi)
            windows = [(node.lo_s, mid, node.tail_lo_s, node.tail_hi_s, stages),
                       (mid, hi, node.tail_lo_s, node.tail_hi_s, stages)]
        elif self.sequence:
            first, last = self.stage_range(node)
            if first == last:  # one stage count left (the only one, or the incumbent capped the window)
                node.hi_s, node.stages = hi, (first, last)
                self.solve_sequence(node)
                return
            half = (first + last) // 2
            windows = [(node.lo_s, hi, node.tail_lo_s, node.tail_hi_s, (first, half)),
                       (node.lo_s, hi, node.tail_lo_s, node.tail_hi_s, (half + 1, last))]
        else:
            theta = self.tail_split_point(node)
            if theta is None:  # narrow in both once the incumbent capped the time window
                node.hi_s = hi
                self.solve_leaf(node)
                return
            windows = [(node.lo_s, hi, node.tail_lo_s, theta, stages), (node.lo_s, hi, theta, node.tail_hi_s, stages)]
        same_window = self.sequence and hi == node.hi_s and isinstance(node.mip, AggregatedMIP)
        for lo_c, hi_c, tail_lo, tail_hi, stages_c in windows:
            parent = node.mip if (same_window and stages_c is not None and lo_c == node.lo_s
                                  and hi_c == node.hi_s) else None
            window = Window(lo_c, hi_c, tail_lo, tail_hi, node.excluded_types, stages_c)
            self.evaluate_then(sub, window, node.bound_s, lambda child: self.child_bounded(node, child),
                               parent=parent)  # type: ignore[arg-type]
        self.emit(f"{self.tag(node.b)}: split {node.describe()}")

    def child_bounded(self, node: Node, child: Node | None) -> None:
        """A child window of ``node`` came back bounded: queued, or closed when nothing in it
        beats the target (it is no better than its parent's bound either way)."""
        if child is None:
            self.close(node, self.target_s())  # nothing in this half beats the target
            return
        child.bound_s = max(child.bound_s, node.bound_s)
        if self.pruned(child.bound_s):
            self.close(child, child.bound_s)
        else:
            heapq.heappush(self.open, child)


__all__ = ["WindowSplits"]
