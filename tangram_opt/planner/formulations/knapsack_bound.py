"""A combinatorial lower bound on the bottleneck stage time: the layer-covering knapsack.

For a cap ``lam`` on every stage's time, a pipeline exists only if the stage types no slower than
``lam`` can cover all ``L`` blocks within every island's GPU budget, with one first and one last
stage. Dropping everything else the aggregated model knows (memory order, stage-count limit, p2p,
tails) leaves a knapsack per island that dynamic programming solves exactly over the layer count:

    M_i[l]   = fewest GPUs of island i whose middle stages (types with T_s <= lam) hold >= l blocks
    F_i, H_i = the same with one first (resp. last) stage among them, FH_i with both

and ``lam`` is feasible iff for some placement of the first and last stage,
``sum_i max{l : X_i[l] <= N_i} >= L`` (X_i the array matching island i's roles). Every plan of
the sub-problem with ``P >= 2`` and bottleneck ``Tmax`` makes ``Tmax`` feasible, so the smallest
feasible cap (found by bisection over the types' times) is a valid lower bound on ``Tmax`` and
hence on the steady period. Unlike the fluid bound it sees that blocks are indivisible and that
stage sizes come in the candidates' GPU counts: on Llama-3-70B over 256 H100 + 256 A100 it lifts
the bottleneck bound from 112.9 ms (fluid) to 119.0 ms, against 119.9 ms in the best plan known.

Only the main layer kind is counted (kinds[-1]); with dense-first models every first-stage type
already carries all dense blocks, so the dense kind is covered by the first stage.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence

import numpy as np

from tangram_opt.planner.formulations.problem import PipelineProblem
from tangram_opt.planner.formulations.stage_types import ROLES, StageType, stage_type

_INF = np.iinfo(np.int64).max // 4


class LayerKnapsack:
    """The per-island covering knapsacks of one sub-problem's stage types, queried by cap."""

    def __init__(self, problem: PipelineProblem, types: Mapping[str, Sequence[StageType]]):
        self.problem = problem
        self.main = problem.kinds[-1]
        self.L = problem.layers[self.main]
        cands = problem.candidates
        # per (island, role): the types, and arrays of their time, main-kind blocks and GPUs
        self._types: dict[tuple[int, str], list[StageType]] = {}
        self._rows: dict[tuple[int, str], tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}
        for role in ROLES:
            for t in types.get(role, ()):
                self._types.setdefault((cands[t.candidate].island, role), []).append(t)
        for key, tys in self._types.items():
            self._rows[key] = (np.array([t.time_s for t in tys]),
                               np.array([min(self.L, t.layer_dict.get(self.main, 0)) for t in tys], dtype=np.int64),
                               np.array([cands[t.candidate].gpus for t in tys], dtype=np.int64),
                               np.array([t.tolerance for t in tys], dtype=np.int64))
        self.times = np.unique(np.concatenate([r[0] for r in self._rows.values()])) if self._rows else np.empty(0)
        # _fewest_gpus by (island, role, cap, min_tol): cover() reads it again for every stage it picks
        self._fewest: dict[tuple[int, str, float, int], tuple[np.ndarray, np.ndarray]] = {}
        # _tables by (island, cap, min_tol): the primal sweep asks for the same caps many times
        self._table_cache: dict[tuple[int, float, int], dict] = {}

    def _fewest_gpus(self, i: int, role: str, lam: float, min_tol: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """g[l] = fewest GPUs of one stage of ``role`` on island i holding >= l blocks within ``lam``
        (and tolerating >= ``min_tol`` micro-batches in flight), arg[l] the index of that type."""
        key = (i, role, lam, min_tol)
        if key not in self._fewest:
            self._fewest[key] = self._compute_fewest(i, role, lam, min_tol)
        return self._fewest[key]

    def _compute_fewest(self, i: int, role: str, lam: float, min_tol: int) -> tuple[np.ndarray, np.ndarray]:
        g = np.full(self.L + 1, _INF, dtype=np.int64)
        arg = np.full(self.L + 1, -1, dtype=np.int64)
        rows = self._rows.get((i, role))
        if rows is not None:
            t, lay, gp, tol = rows
            for k in np.nonzero((t <= lam * (1 + 1e-12)) & (tol >= min_tol))[0]:
                if gp[k] < g[lay[k]]:
                    g[lay[k]], arg[lay[k]] = gp[k], k
        for ell in range(self.L - 1, -1, -1):  # >= l blocks: suffix minimum
            if g[ell + 1] < g[ell]:
                g[ell], arg[ell] = g[ell + 1], arg[ell + 1]
        return g, arg

    def _tables(self, i: int, lam: float, min_tol: int = 0
                ) -> dict[tuple[bool, bool], tuple[np.ndarray, np.ndarray, str | None]]:
        """Per (has the first stage, has the last): fewest GPUs holding >= ell blocks on island i,
        the block count of the stage added last at ell (for backtracking) and that stage's role."""
        key = (i, lam, min_tol)
        if key not in self._table_cache:
            self._table_cache[key] = self._compute_tables(i, lam, min_tol)
        return self._table_cache[key]

    def _compute_tables(self, i: int, lam: float, min_tol: int
                        ) -> dict[tuple[bool, bool], tuple[np.ndarray, np.ndarray, str | None]]:
        L = self.L
        mid, _ = self._fewest_gpus(i, "mid", lam, min_tol)
        M = np.full(L + 1, _INF, dtype=np.int64)
        M[0] = 0
        M_pick = np.zeros(L + 1, dtype=np.int64)
        for ell in range(1, L + 1):  # unbounded covering knapsack over the block count
            vals = M[ell - 1::-1] + mid[1:ell + 1]  # vals[l - 1]: a last middle stage holding >= l
            k = ell - 1 - int(np.argmin(vals[::-1]))  # ties: the largest stage (fewer stages)
            M[ell], M_pick[ell] = min(_INF, int(vals[k])), k + 1
        idx = np.arange(L + 1)
        prev = np.clip(idx[:, None] - idx[None, :], 0, None)  # prev[ell, l] = max(0, ell - l)

        def with_one(base: np.ndarray, single: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            # min over l of base[max(0, ell - l)] + single[l]  (one more stage holding >= l blocks)
            vals = base[prev] + single[None, :]
            pick = L - np.argmin(vals[:, ::-1], axis=1)  # ties: the largest stage
            return np.minimum(vals[idx, pick], _INF), pick

        first, _ = self._fewest_gpus(i, "first", lam, min_tol)
        last, _ = self._fewest_gpus(i, "last", lam, min_tol)
        F, F_pick = with_one(M, first)
        H, H_pick = with_one(M, last)
        FH, FH_pick = with_one(F, last)
        return {(False, False): (M, M_pick, None), (True, False): (F, F_pick, "first"),
                (False, True): (H, H_pick, "last"), (True, True): (FH, FH_pick, "last")}

    @staticmethod
    def _reach(arr: np.ndarray, gpus: int) -> int:
        ok = np.nonzero(arr <= gpus)[0]
        return int(ok[-1]) if len(ok) else -1  # -1: this role combination does not fit at all

    def _best_placement(self, lam: float, min_tol: int = 0, caps: Mapping[int, float] | None = None,
                        budget: Mapping[int, int] | None = None, need: int | None = None,
                        ends: tuple[int, int] | None = None
                        ) -> tuple[dict[int, tuple[bool, bool]], dict[int, int], dict] | None:
        """Islands of the first and last stage that let stages within ``lam`` (``caps[i]`` on
        island i where given) hold the most blocks, with each island's reach; None if no placement
        holds ``need`` blocks (default all ``L``) within ``budget`` GPUs per island (default the
        islands' sizes)."""
        islands = sorted(self.problem.island_gpus)
        budget = self.problem.island_gpus if budget is None else budget
        need = self.L if need is None else need
        tables = {i: self._tables(i, (caps or {}).get(i, lam), min_tol) for i in islands}
        best = None
        for fi, la in [ends] if ends is not None else itertools.product(islands, islands):
            roles = {i: (i == fi, i == la) for i in islands}
            reach = {i: self._reach(tables[i][roles[i]][0], budget[i]) for i in islands}
            if min(reach.values()) < 0:
                continue
            total = sum(reach.values())
            if total >= need and (best is None or total > best[0]):
                best = (total, roles, reach)
        return None if best is None else (best[1], best[2], tables)

    def feasible(self, lam: float) -> bool:
        """Can stages no slower than ``lam`` hold every block (first and last stage included)?"""
        return self._best_placement(lam) is not None

    def bottleneck_bound_s(self) -> float:
        """Smallest stage-time cap that passes :meth:`feasible` (inf when none does)."""
        times = self.times
        if len(times) == 0 or not self.feasible(float(times[-1])):
            return math.inf
        lo, hi = 0, len(times) - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if self.feasible(float(times[mid])):
                hi = mid
            else:
                lo = mid + 1
        return float(times[lo])

    def cover(self, lam: float, min_tol: int = 0, caps: Mapping[int, float] | None = None,
              separators: tuple[int, int, float] | None = None, ends: tuple[int, int] | None = None
              ) -> tuple[StageType, list[StageType], StageType] | None:
        """A multiset of stages no slower than ``lam`` holding every block (first, middles, last),
        or None; a primal heuristic. Each island holds a share of the blocks proportional to its
        reach; stages come from the knapsack's backtracking (types tolerating >= ``min_tol``
        micro-batches in flight: with ``min_tol`` >= the stage count every order fits memory) and
        are then trimmed to exactly ``L`` blocks (a stage's candidate with fewer blocks is no
        slower). Memory order is not checked here. ``caps[i]``, where given, replaces ``lam`` on
        island i: a lower cap there yields small stages that can sit between large ones.
        ``separators = (j, k, c)`` sets aside ``k`` middle stages on island j within ``c`` first (the
        type with the fewest GPUs, most blocks among those) and covers the rest within ``lam``: the
        small stages then separate up to ``k + 1`` stages at the full cap, the rest of island j
        included."""
        need, budget, seps = self.L, dict(self.problem.island_gpus), []
        if separators is not None:
            j, k, sep_cap = separators
            g, _ = self._fewest_gpus(j, "mid", sep_cap, min_tol)
            if g[1] >= _INF:
                return None
            blocks = int(np.nonzero(g == g[1])[0][-1])
            need, budget[j] = need - k * blocks, budget[j] - k * int(g[1])
            if need < 2 or budget[j] < 0:
                return None
            seps = [self._stage(j, "mid", blocks, sep_cap, min_tol)] * k
        placed = self._best_placement(lam, min_tol, caps, budget, need, ends)
        if placed is None:
            return None
        roles, reach, tables = placed
        cap = lambda i: (caps or {}).get(i, lam)  # noqa: E731
        total = sum(reach.values())
        share = {i: reach[i] * need // total if total else 0 for i in reach}
        for i in sorted(reach, key=lambda i: reach[i] - share[i], reverse=True):  # hand out what rounding left
            if sum(share.values()) >= need:
                break
            share[i] += min(reach[i] - share[i], need - sum(share.values()))
        first = last = None
        mids: list[StageType] = []
        for i, ell in share.items():
            key = roles[i]
            while True:
                arr, pick, role = tables[i][key]
                if role is None:  # middle stages only
                    if ell <= 0:
                        break
                    l = int(pick[ell])
                    mids.append(self._stage(i, "mid", l, cap(i), min_tol))
                    ell -= l
                    continue
                l = int(pick[ell])
                st = self._stage(i, role, l, cap(i), min_tol)
                if role == "first":
                    first = st
                else:
                    last = st
                ell = max(0, ell - l)
                key = (key[0], False) if role == "last" else (False, False)
        assert first is not None and last is not None
        return self._trim(first, mids + seps, last)

    def _stage(self, i: int, role: str, blocks: int, lam: float, min_tol: int) -> StageType:
        _, arg = self._fewest_gpus(i, role, lam, min_tol)
        return self._types[i, role][int(arg[blocks])]

    def _trim(self, first: StageType, mids: list[StageType],
              last: StageType) -> tuple[StageType, list[StageType], StageType] | None:
        """Take blocks off the slowest stages until exactly ``L`` remain (each keeps >= 1)."""
        stages = [first, *mids, last]
        roles = ["first"] + ["mid"] * len(mids) + ["last"]
        main = self.main
        excess = sum(t.layer_dict.get(main, 0) for t in stages) - self.L
        while excess > 0:
            floor = [0 if (r == "first" and sum(t.layer_dict.values()) - t.layer_dict.get(main, 0) > 0) else 1
                     for t, r in zip(stages, roles)]
            k = max((k for k, t in enumerate(stages) if t.layer_dict.get(main, 0) > floor[k]),
                    key=lambda k: stages[k].time_s, default=None)
            if k is None:
                return None
            layers = stages[k].layer_dict
            layers[main] -= 1
            t = stage_type(self.problem, stages[k].candidate, roles[k], layers)
            if t is None:
                return None
            stages[k] = t
            excess -= 1
        return stages[0], stages[1:-1], stages[-1]


def knapsack_bottleneck_s(problem: PipelineProblem, types: Mapping[str, Sequence[StageType]]) -> float:
    """Lower bound on the slowest stage's time of any pipeline of >= 2 stages built from ``types``."""
    return LayerKnapsack(problem, types).bottleneck_bound_s()


__all__ = ["LayerKnapsack", "knapsack_bottleneck_s"]
