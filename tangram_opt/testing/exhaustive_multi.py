"""Exhaustive enumeration of the multi-pipeline template space, for tiny instances.

The tests use it to check the level-2 MIP (tangram_opt/planner/multi_pipeline/level2.py): over the same declared
template set, every multiset of 2..R_max (template, micro-batch count) pairs whose shares sum to the
global batch and whose GPUs fit every island is priced with the exact model objective
(``max CF' + cross-pipeline all-reduce + optimizer``, the same terms as :meth:`~tangram_opt.planner.multi_pipeline.TemplatePricer.objective`,
no lower-bound rounding), and the best one is returned. No pruning by bounds: only the batch and GPU budgets cut
the enumeration.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tangram_opt.planner.context import PlanningContext
from tangram_opt.planner.multi_pipeline.templates import Template, TemplatePricer


@dataclass(frozen=True, slots=True)
class BruteMultiResult:
    objective_s: float
    pipes: tuple[tuple[Template, int], ...]
    plans_evaluated: int


def brute_force_multi(ctx: PlanningContext, templates: Sequence[Template], pricer: TemplatePricer, *,
                      max_pipelines: int) -> BruteMultiResult | None:
    """Best plan of 2..``max_pipelines`` pipelines drawn from ``templates`` (None if none exists)."""
    B = ctx.training.global_batch_size
    budget = {i.index: i.num_gpus for i in ctx.islands}
    pairs = [(t, m) for t in templates for m in range(1, min(t.m_cap, B // t.b) + 1)]
    best: list = [None]
    count = [0]
    chosen: list[tuple[Template, int]] = []
    # the all-reduce and the optimizer depend on which templates run, not on their micro-batch counts
    after: dict[tuple[int, ...], float] = {}

    def objective() -> float:
        key = tuple(t.index for t, _ in chosen)
        if key not in after:
            after[key] = pricer.sync(chosen).total_s + max(t.optimizer_s for t, _ in chosen)
        return max(pricer.cf(t, m) for t, m in chosen) + after[key]

    def rec(start: int, left: int, used: dict[int, int]) -> None:
        if left == 0:
            if len(chosen) >= 2:
                obj = objective()
                count[0] += 1
                if best[0] is None or obj < best[0][0] - 1e-15:
                    best[0] = (obj, tuple(chosen))
            return
        if len(chosen) == max_pipelines:
            return
        for j in range(start, len(pairs)):  # multisets: pairs in non-decreasing order
            t, m = pairs[j]
            if t.b * m > left or any(used.get(i, 0) + g > budget[i] for i, g in t.gpus.items()):
                continue
            for i, g in t.gpus.items():
                used[i] = used.get(i, 0) + g
            chosen.append((t, m))
            rec(j, left - t.b * m, used)
            chosen.pop()
            for i, g in t.gpus.items():
                used[i] -= g

    rec(0, B, {})
    if best[0] is None:
        return None
    return BruteMultiResult(objective_s=best[0][0], pipes=best[0][1], plans_evaluated=count[0])


__all__ = ["BruteMultiResult", "brute_force_multi"]
