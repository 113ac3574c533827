"""The fill bound of a sequence leaf: a dynamic program over its positions (formulations/pipeline_mip.md
§3b, "Fill bound").

A leaf of the search (one period window ``[lo, hi]``, one stage count ``P``; stage_sequence.py)
is empty when no choice of one stage type per position meets, *together*, the layer counts,
each island's GPUs, the links between neighbours and the whole pipeline's block row
``P lam >= sum_k T_k + 2 sum_k c_k``. The sequence model's LP meets each of them alone by mixing
islands at every position (§5, twenty-fifth round), and island branching needs hundreds of LPs to
see it. This program sees them together, exactly, without an LP:

    state after position k:  (island and side times of stage k, layers used per kind,
                              GPUs used per island in units of the island's stage-size gcd,
                              whether some stage so far has its tail above the leaf's lower edge)
    value:                   the least fill  sum_{j<=k} T_j + 2 sum_{j<k} c_j

``c`` is the exact boundary time of the two stages' islands and sides (``boundary_s``), and a
boundary slower than ``hi`` is no transition (the period is at least every link). The least
fill ``S`` of a complete pipeline bounds every plan of the leaf (P < m: the whole pipeline is a
block of fewer than ``m`` stages), and the leaf is empty when no pipeline is complete or
``S > P hi``. With a lower edge on the largest tail, a second program (the *tail program*) adds
``tail_k - U_k`` of one stage ``k`` above the edge, which it picks: upstream of ``k`` a stage adds
``F + c`` instead of ``T + 2 c`` (its backward and link are ``k``'s cover ``U_k``). Its least
value ``G`` bounds ``S + Y``:

    step >= (m - 1) max(lo, S / P) + max(S + min_{t at position 0} tail_t, G)

What it leaves out: blocks of 2 to ``P - 1`` stages, and the tail is the one the program picks,
the least over the stages above the edge, where the step takes the largest.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import reduce

import numpy as np

from tangram_opt.planner.formulations.inflight import inflight_from_end
from tangram_opt.planner.formulations.problem import PipelineProblem, island_capacities
from tangram_opt.planner.formulations.stage_sequence import SequenceMIP, position_types
from tangram_opt.planner.formulations.stage_types import StageType

#: largest state space (values per position) the program takes on; above it: no answer
MAX_STATES = 3_000_000
#: the values are single precision (half the memory traffic of double); every fill read from them
#: is lowered by this share, far more than the rounding of a few dozen sums can add
DTYPE = np.float32
FLOAT_MARGIN = 1e-5


def fill_bounds_s(problem: PipelineProblem, types: dict[str, list[StageType]], lower_s: float, upper_s: float,
                  stages: tuple[int, int], *, tick_s: float, lower_tail_s: float | None = None,
                  max_states: int = MAX_STATES, tails: bool = True) -> dict[int, float] | None:
    """Per stage count ``P`` of ``stages``: a lower bound (seconds) on the step time of every plan
    of the window ``[lower_s, upper_s]`` with ``P`` stages, built from ``types`` (by role; the
    sequence model's lists, before ``position_types``) and, with ``lower_tail_s``, some stage's
    tail above it; ``math.inf`` when there is none. None when the state space exceeds
    ``max_states``. One pass from the last stage serves every count: a position's types depend on
    its distance from the end (the micro-batches it holds in flight) and its role only."""
    first, last = max(2, stages[0]), stages[1]
    m, cands = problem.num_micro_batches, problem.candidates
    out = {P: math.inf for P in range(first, last + 1)}
    if last < first:
        return out

    def listed(role: str, d: int) -> list[StageType]:
        return position_types(problem, types.get(role, []), inflight_from_end(d, m), upper_s)

    lists = {("last", 0): listed("last", 0)}
    for d in range(1, last):
        lists["mid", d] = listed("mid", d) if d < last - 1 else []
        if d + 1 >= first:
            lists["first", d] = listed("first", d)
    listed_types = [t for ts in lists.values() for t in ts]
    spaces = [_Space(problem, listed_types, upper_s + tick_s, lower_tail_s)]
    if lower_tail_s is not None and tails:
        spaces.append(_Space(problem, listed_types, upper_s + tick_s, lower_tail_s, tails=True))
    if sum(space.size for space in spaces) > max_states:
        return None
    values: list[np.ndarray | None] = [space.step(None, lists["last", 0]) for space in spaces]
    for P in range(2, last + 1):
        if values[0] is None:
            break  # no stages at this distance from the end: none farther either
        if P >= first:
            ends = [math.inf if v is None else space.finish(v, lists["first", P - 1]) * (1 - FLOAT_MARGIN)
                    for space, v in zip(spaces, values)]
            fill = ends[0]
            if P < m:  # the whole pipeline is a block of fewer than m stages
                fill = math.inf if fill > P * (upper_s + tick_s) else fill
                period = max(lower_s, fill / P)
            else:
                period = lower_s
            if math.isfinite(fill):
                # the fill and the step tail: the first stage's tail, or a stage's above the edge
                # less its cover (the tail program), whichever is more
                tail = max([fill + min(t.tail_s for t in lists["first", P - 1]), *ends[1:]])
                out[P] = (m - 1) * period + tail
        if P < last:
            for i, (space, v) in enumerate(zip(spaces, values)):
                v = None if v is None else space.step(v, lists["mid", P - 1])
                if v is not None:  # P stages placed; at most last - P to come
                    space.prune(v, [(last - P) * most for most in space.most_layers])
                values[i] = v
    return out


def fill_bound_s(seq: SequenceMIP, max_states: int = MAX_STATES) -> float | None:
    """:func:`fill_bounds_s` of a built sequence model's window and stage count."""
    if seq.empty:
        return math.inf
    bounds = fill_bounds_s(seq.problem, seq.types, seq.lower_s, seq.upper_s, (seq.stages, seq.stages),
                           tick_s=seq.options.tick_s, lower_tail_s=seq.lower_tail_s, max_states=max_states)
    return None if bounds is None else bounds[seq.stages]


class _Space:
    """The states of one program: stage class x layers used per kind x GPU units used per island x
    flag, as one array per step; stages are placed from the last one upstream.

    ``tails`` False (the fill program): the value is the fill, and the flag says that some stage
    placed has its tail above ``lower_tail_s``. ``tails`` True (the tail program, with a lower
    edge): the value is the fill plus ``tail_k - U_k`` of one stage ``k`` above the edge, chosen
    by the program; the flag says it is placed. Upstream of it a stage adds ``F + c`` instead of
    ``T + 2 c`` (its backward and its link are ``k``'s cover ``U_k``)."""

    def __init__(self, problem: PipelineProblem, types: list[StageType], link_max_s: float,
                 lower_tail_s: float | None, tails: bool = False) -> None:
        cands = problem.candidates
        assert not tails or lower_tail_s is not None, "the tail program needs a lower edge"
        self.problem, self.lower_tail_s, self.tails = problem, lower_tail_s, tails
        self.islands = sorted(problem.island_gpus)
        used = [t.candidate for t in types]
        cap = island_capacities(problem, used)
        self.unit = {i: reduce(math.gcd, (cands[c].gpus for c in used if cands[c].island == i), 0) or 1
                     for i in self.islands}
        self.kinds = problem.kinds
        self.ldim = [problem.layers[k] + 1 for k in self.kinds]
        self.cell = (*self.ldim, *(cap[i] // self.unit[i] + 1 for i in self.islands))
        self.flags = 2 if lower_tail_s is not None else 1
        #: the weight of the link into the stages of each flag (the tail program's cover takes one)
        self.weights = (2.0, 1.0) if tails else (2.0,) * self.flags
        #: the most layers of each kind one stage holds
        self.most_layers = [max((t.layer_dict.get(k, 0) for t in types), default=0) for k in self.kinds]
        # classes of stages that price a boundary alike: island and both side times
        self.classes: dict[tuple, int] = {}
        rep = []
        for t in types:
            key = self._class_key(t)
            if key not in self.classes:
                self.classes[key] = len(self.classes)
                rep.append(cands[t.candidate])
        C = len(self.classes)
        self.size = self.flags * C * math.prod(self.cell)
        # the boundary from a stage of class a to the next, of class b (inf: slower than the period)
        self.link = np.full((C, C), np.inf)
        for a in range(C):
            for b in range(C):
                v = problem.boundary_s(rep[a], rep[b])
                if v <= link_max_s:
                    self.link[a, b] = v

    def _class_key(self, t: StageType) -> tuple:
        c = self.problem.candidates[t.candidate]
        return c.island, c.p2p_nic_s, c.p2p_scale_up_s

    def _moves(self, types: list[StageType]) -> dict[tuple, float]:
        """The types collapsed to what the program tells apart: (class, shift, kind) -> least cost.
        Kinds (from flag -> to flag): ``same`` (f -> f, cost T), ``up`` (either -> 1, cost T: a
        stage above the edge), and in the tail program ``stay`` (0 -> 0, T), ``pick`` (0 -> 1,
        T + tail: the stage whose tail is priced) and ``cover`` (1 -> 1, F)."""
        cands, moves = self.problem.candidates, {}
        edge = self.lower_tail_s

        def put(key: tuple, cost: float) -> None:
            if cost < moves.get(key, math.inf):
                moves[key] = cost

        for t in types:
            c = cands[t.candidate]
            above = edge is not None and t.tail_s > edge
            ii = self.islands.index(c.island)
            shift = (*(t.layer_dict.get(k, 0) for k in self.kinds),
                     *(c.gpus // self.unit[c.island] if d == ii else 0 for d in range(len(self.islands))))
            if any(s >= n for s, n in zip(shift, self.cell)):
                continue
            q = self.classes[self._class_key(t)]
            if not self.tails:
                put((q, shift, "up" if above else "same"), t.time_s)
                continue
            put((q, shift, "stay"), t.time_s)
            put((q, shift, "cover"), t.time_s - t.bwd_s)
            if above:
                put((q, shift, "pick"), t.time_s + t.tail_s)
        return moves

    def _source(self, src: np.ndarray, kind: str, index: tuple) -> np.ndarray:
        """The values a move of ``kind`` starts from: every flag (``same``), their least (``up``),
        or one flag."""
        if kind == "same":
            return src[(slice(None), *index)]
        if kind == "up":
            return src[(slice(None), *index)].min(axis=0)
        return src[(0 if kind in ("stay", "pick") else 1, *index)]

    @staticmethod
    def _target(kind: str) -> int | slice:
        return slice(None) if kind == "same" else 0 if kind == "stay" else -1

    def _feeds(self, value: np.ndarray, box: tuple[slice, ...]) -> Callable[[int], np.ndarray | None]:
        """For a new stage of class ``q``: the value of the stages in ``value`` (inside ``box``)
        plus the link from the new stage to the first of them at each flag's weight, [flag, *box].
        Classes whose link from ``q`` is the same are taken together; their minimum is shared
        between the ``q`` that group them alike (a link grows with the slower side only)."""
        C = len(self.classes)
        alive = [a for a in range(C) if np.isfinite(value[(slice(None), a, *box)]).any()]
        weights = np.array(self.weights, dtype=DTYPE).reshape((self.flags,) + (1,) * len(box))
        groups: dict[frozenset, np.ndarray] = {}

        def after(q: int) -> np.ndarray | None:
            by_link: dict[float, list[int]] = {}
            for a in alive:
                if math.isfinite(self.link[q, a]):
                    by_link.setdefault(float(self.link[q, a]), []).append(a)
            best = None
            for cost, members in by_link.items():
                key = frozenset(members)
                if key not in groups:
                    groups[key] = np.minimum.reduce([value[(slice(None), a, *box)] for a in members]) \
                        if len(members) > 1 else value[(slice(None), members[0], *box)]
                part = groups[key] + weights * cost
                best = part if best is None else np.minimum(best, part, out=best)
            return best

        return after

    def _box(self, value: np.ndarray) -> tuple[slice, ...]:
        """The smallest box of the cell space that holds every finite state of ``value``."""
        finite = np.isfinite(value).any(axis=(0, 1))
        out = []
        for d in range(finite.ndim):
            seen = np.flatnonzero(finite.any(axis=tuple(x for x in range(finite.ndim) if x != d)))
            out.append(slice(int(seen[0]), int(seen[-1]) + 1) if seen.size else slice(0, 0))
        return tuple(out)

    def prune(self, value: np.ndarray, layers_left: list[int]) -> None:
        """Drop the states that cannot be completed: fewer layers of a kind placed than its count
        less ``layers_left`` (the most the stages still to come can hold)."""
        for d, (n, left) in enumerate(zip(self.ldim, layers_left)):
            short = n - 1 - left
            if short > 0:
                index = [slice(None)] * value.ndim
                index[2 + d] = slice(0, short)
                value[tuple(index)] = np.inf

    def step(self, value: np.ndarray | None, types: list[StageType]) -> np.ndarray | None:
        """Place one stage of ``types`` upstream of the stages in ``value`` (None: it is the last)."""
        moves = self._moves(types)
        if not moves:
            return None
        new = np.full((self.flags, len(self.classes), *self.cell), np.inf, dtype=DTYPE)
        if value is None:  # the last stage: nothing after it
            origin = np.full((self.flags, *(1 for _ in self.cell)), np.inf, dtype=DTYPE)
            origin[(0,) * (1 + len(self.cell))] = 0.0
            box: tuple[slice, ...] = tuple(slice(0, 1) for _ in self.cell)
            after: Callable[[int], np.ndarray | None] = lambda q: origin
        else:
            box = self._box(value)
            after = self._feeds(value, box)
        cache: dict[int, np.ndarray | None] = {}
        for (q, shift, kind), cost in moves.items():
            if q not in cache:
                cache[q] = after(q)
            src = cache[q]
            if src is None:
                continue
            span = [min(z.stop - z.start, n - z.start - s) for s, n, z in zip(shift, self.cell, box)]
            if min(span) <= 0:
                continue
            take = tuple(slice(0, w) for w in span)
            put = tuple(slice(z.start + s, z.start + s + w) for s, w, z in zip(shift, span, box))
            out = new[(self._target(kind), q, *put)]
            np.minimum(out, self._source(src, kind, take) + cost, out=out)
        return new if np.isfinite(new).any() else None

    def finish(self, value: np.ndarray, types: list[StageType]) -> float:
        """The least value of a complete pipeline: a first stage of ``types`` before ``value``'s
        stages, every layer placed, within every island's GPUs, ending at the last flag."""
        nl = len(self.ldim)
        moves = {key: cost for key, cost in self._moves(types).items() if key[2] != "stay"}
        if not moves:
            return math.inf
        # only the layer counts a first stage completes are read: the feeds on those alone
        need = sorted({tuple(n - 1 - s for s, n in zip(shift[:nl], self.ldim)) for _, shift, _ in moves})
        rows = {lv: r for r, lv in enumerate(need)}
        index = tuple(np.array([lv[d] for lv in need]) for d in range(nl))
        part = value[(slice(None), slice(None), *index)]  # [flag, class, row, *gpus]
        after = self._feeds(part, tuple(slice(None) for _ in range(1 + len(self.cell) - nl)))
        best = math.inf
        cache: dict[int, np.ndarray | None] = {}
        for (q, shift, kind), cost in moves.items():
            if q not in cache:
                cache[q] = after(q)
            src = cache[q]
            if src is None:
                continue
            row = rows[tuple(n - 1 - s for s, n in zip(shift[:nl], self.ldim))]
            at = (row, *(slice(0, n - s) for s, n in zip(shift[nl:], self.cell[nl:])))
            rest = self._source(src, kind, at)
            if kind == "same":
                rest = rest[-1]
            if rest.size:
                best = min(best, float(rest.min()) + cost)
        return best


__all__ = ["MAX_STATES", "fill_bound_s", "fill_bounds_s"]
