"""Neighbour classes: which stages can sit next to which inside a period window, counted by class.

The aggregated model (aggregated.py) counts stages per type and relaxes their order. Inside a
window (period ``lambda <= hi``) two neighbours ``a, b`` form a block of two, so
``T_a + T_b + 2 c_ab <= 2 hi``, and a middle stage ``s`` with neighbours ``u, v`` a block of three,
``T_u + T_s + T_v + 2 c_us + 2 c_sv <= 3 hi`` (§1: blocks of fewer than ``m`` stages bound the
period). The ``neighbours`` rows of the model count edges between a heavy and a light set of
types; these rows follow the path itself, at the level of *classes* of stage types (island, slack
below the window's ``hi`` and side times, in geometric steps), each priced at its fastest member:

```
class_degree[u]:  sum_v E[u,v] (twice for v = u) = 2 n_u + e_u + h_u
class_centre[s]:  sum_u I[s,u] = 2 n_s                         (the middle stages of class s)
class_incid[s,u]: I[s,u] <= E[s,u]  (u != s),   I[s,s] <= 2 E[s,s]
class_pairs[s|v]: sum_{u: r_s(u) >= v} I[s,u] <= sum_{u: r_s(u) <= B_s - v} I[s,u]   (2 v > B_s)
```

``E[u,v]`` (``u <= v``) counts the pipeline boundaries between a stage of class ``u`` and one of
class ``v`` and exists only where the block of two fits; ``I[s,u]`` counts the neighbours in class
``u`` of the middle stages of class ``s``. A middle stage of ``s`` has two neighbours whose
*reaches* ``r_s(u) = T_u + 2 c_us`` add up to at most ``B_s = 3 hi - T_s``; so at most one of them
reaches ``v > B_s / 2`` or more, and the other one then reaches at most ``B_s - v``: the row
``class_pairs``. Validity and what the rows measured: formulations/pipeline_mip.md §3,
"Neighbour classes".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from tangram_opt.planner.formulations.ticks import rounders
from tangram_opt.solvers.model import ArrayConstraint, Constraint, Var

if TYPE_CHECKING:
    from tangram_opt.planner.formulations.aggregated import AggregatedMIP
    from tangram_opt.planner.formulations.problem import PipelineProblem

#: a class holds the types of one island whose slack below the window's upper edge ``hi`` lies in
#: one geometric step of this factor (fine near ``hi``, where blocks are tight) ...
CLASS_SLACK_FACTOR = 2**0.5
#: ... and whose side times (NIC, scale-up) lie in one step of this factor
CLASS_SIDE_FACTOR = 2.0
#: the factors are squared until a window has at most this many edge columns
CLASS_MAX_EDGES = 3000


@dataclass(slots=True)
class NeighbourClasses:
    """The classes of one window's model and their columns (for encoding plans: :meth:`encode`)."""

    #: (role, type index) -> class
    of: dict[tuple[str, int], int] = field(default_factory=dict)
    #: (u, v), u <= v -> E[u, v]
    edge: dict[tuple[int, int], Var] = field(default_factory=dict)
    #: (s, u) -> I[s, u]
    incid: dict[tuple[int, int], Var] = field(default_factory=dict)

    def encode(self, keys: Sequence[tuple[str, int]], vals: dict[Var, float]) -> bool:
        """Add a plan's edge and neighbour counts (``keys``: its stages' (role, type) in pipeline
        order) to ``vals``; False when one of its boundaries has no column (the plan is not in the
        window)."""
        cl = [self.of[k] for k in keys]
        for a, b in zip(cl, cl[1:]):
            var = self.edge.get((min(a, b), max(a, b)))
            if var is None:
                return False
            vals[var] += 1.0
        for k in range(1, len(cl) - 1):
            for u in (cl[k - 1], cl[k + 1]):
                var = self.incid.get((cl[k], u))
                if var is not None:
                    vals[var] += 1.0
        return True


def add_neighbour_classes(mip: AggregatedMIP, columns: Sequence[tuple[str, dict[int, Var]]],
                          hi: float) -> NeighbourClasses | None:
    """Add the class rows to ``mip``'s model for the window ``lambda <= hi`` (1F1B, ``m > 2``; the
    centre rows need ``m > 3``). None, and nothing added, when every block of two and of three
    classes fits the window: the rows would cut nothing then. The classes' pairs are priced as
    matrices: a window has 50 to 130 classes, and the pairs, the degree rows and the centre rows
    went over every pair in Python."""
    p, md = mip.problem, mip.model
    _, ce = rounders(mip.options.tick_s)
    hi_t = ce(hi)
    slack_f, side_f = CLASS_SLACK_FACTOR, CLASS_SIDE_FACTOR
    while True:
        cl = _classes(mip, columns, hi, slack_f, side_f)
        n_cls = len(cl.t_min)
        if n_cls * (n_cls + 1) // 2 <= CLASS_MAX_EDGES or slack_f > 1e3:
            break
        slack_f, side_f = slack_f**2, side_f**2
    c = _class_links(p, cl, mip.options.tick_s)
    t_min = cl.t_min
    fits = t_min[:, None] + t_min[None, :] + 2 * c <= 2 * hi_t  # the block of two fits (symmetric)
    upper = np.triu(fits)
    m = p.num_micro_batches
    reach: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # s -> (partners, their reaches)
    if m > 3:
        for s in sorted(set(cl.cls[cl.mid].tolist())):
            nb = np.flatnonzero(fits[s])
            r = t_min[nb] + 2 * c[nb, s]
            if len(nb) and 2 * r.max() > 3 * hi_t - t_min[s]:  # two of the farthest neighbours do not fit
                reach[s] = (nb, r)
    if fits.all() and not reach:
        return None
    out = NeighbourClasses(of=dict(zip(cl.keys, cl.cls.tolist())))
    R = p.max_stages
    edge_index = np.full((n_cls, n_cls), -1, dtype=np.int64)
    for u, v in zip(*np.nonzero(upper)):  # sorted (u, v), u <= v
        var = out.edge[int(u), int(v)] = md.add_var(f"E[{u},{v}]", 0, R, integer=True)
        edge_index[u, v] = edge_index[v, u] = var.index
    order = np.argsort(cl.cls, kind="stable")  # the columns grouped by class, in column order
    bounds = np.searchsorted(cl.cls[order], np.arange(n_cls + 1))
    for u in range(n_cls):
        mine = order[bounds[u]:bounds[u + 1]]
        nb = np.flatnonzero(fits[u])
        md.add(ArrayConstraint(np.concatenate((edge_index[u, nb], cl.col[mine])),
                               np.concatenate((np.where(nb == u, 2.0, 1.0), -cl.degree[mine])), 0.0, 0.0),
               f"class_degree[{u}]")
    for s, (nb, r) in reach.items():
        mine = order[bounds[s]:bounds[s + 1]]
        inc = {int(u): md.add_var(f"I[{s},{u}]", 0, 2 * R, integer=True) for u in nb.tolist()}
        out.incid.update({(s, u): var for u, var in inc.items()})
        mids = cl.col[mine][cl.mid[mine]]
        md.add(ArrayConstraint(np.concatenate((np.fromiter((v.index for v in inc.values()), np.int64, len(inc)), mids)),
                               np.concatenate((np.ones(len(inc)), np.full(len(mids), -2.0))), 0.0, 0.0),
               f"class_centre[{s}]")
        for u, var in inc.items():
            md.add(Constraint({var.index: 1.0, int(edge_index[u, s]): -(2.0 if u == s else 1.0)}, -math.inf, 0.0),
                   f"class_incid[{s},{u}]")
        budget = 3 * hi_t - t_min[s]
        reaches = dict(zip(inc, r.tolist()))
        for q, v in enumerate(sorted({x for x in reaches.values() if 2 * x > budget})):
            row = {inc[u].index: 1.0 for u, x in reaches.items() if x >= v}
            row.update({inc[u].index: -1.0 for u, x in reaches.items() if x <= budget - v})
            md.add(Constraint(row, -math.inf, 0.0), f"class_pairs[{s}|{q}]")
    return out


@dataclass(frozen=True, slots=True)
class _Classes:
    """A window's stage types (every role, in column order) grouped into classes: per column its
    (role, type) ``keys``, class ``cls``, index ``col``, boundaries ``degree`` (2 in the middle, 1 at
    an end) and whether it is a middle type (``mid``); per class (numbered by first column) its
    ``island``, fastest time ``t_min`` (ticks, rounded down) and smallest NIC and scale-up sides
    (seconds): a stage's side of a link is one or the other, by the link's kind."""

    keys: list[tuple[str, int]]
    cls: np.ndarray
    col: np.ndarray
    degree: np.ndarray
    mid: np.ndarray
    island: np.ndarray
    t_min: np.ndarray
    nic: np.ndarray
    scale_up: np.ndarray


def _classes(mip: AggregatedMIP, columns: Sequence[tuple[str, dict[int, Var]]], hi: float, slack_factor: float,
             side_factor: float) -> _Classes:
    """Group the window's stage types (every role) by island, time step and side-time steps."""
    cands = mip.problem.candidates
    keys = [(role, si) for role, group in columns for si in group]
    types = [mip.types[role][si] for role, si in keys]
    n = len(keys)
    cand = np.fromiter((t.candidate for t in types), np.int64, n)
    time_s = np.fromiter((t.time_s for t in types), float, n)
    used, at = np.unique(cand, return_inverse=True)
    island = np.array([cands[ci].island for ci in used.tolist()], dtype=np.int64)[at]
    nic = np.array([cands[ci].p2p_nic_s for ci in used.tolist()], dtype=float)[at]
    scale_up = np.array([cands[ci].p2p_scale_up_s for ci in used.tolist()], dtype=float)[at]
    key = np.stack((island, _steps(hi - time_s, hi, slack_factor), _steps(nic, hi, side_factor),
                    _steps(scale_up, hi, side_factor)), axis=1)
    _, first, cls = np.unique(key, axis=0, return_index=True, return_inverse=True)
    cls = cls.reshape(-1)
    rank = np.empty(len(first), dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(first))  # classes numbered by first column
    cls, first = rank[cls], np.sort(first)
    k = len(first)
    per_class = lambda values: _least(k, cls, values)  # noqa: E731
    mid = np.fromiter((role == "mid" for role, _ in keys), bool, n)
    col = np.fromiter((var.index for _, group in columns for var in group.values()), np.int64, n)
    t_fl = np.floor(time_s / mip.options.tick_s + 1e-9)  # ticks.rounders' floor, on arrays
    return _Classes(keys=keys, cls=cls, col=col, degree=np.where(mid, 2.0, 1.0), mid=mid,
                    island=island[first], t_min=per_class(t_fl),
                    nic=per_class(nic), scale_up=per_class(scale_up))


def _least(k: int, cls: np.ndarray, values: np.ndarray) -> np.ndarray:
    out = np.full(k, np.inf)
    np.minimum.at(out, cls, values)
    return out


def _class_links(p: PipelineProblem, cl: _Classes, tick_s: float) -> np.ndarray:
    """The least link (ticks, rounded down) between a stage of class u and one of class v, either
    way round: ``min over both directions d of latency_d + max(side_u(d), side_v(d), shared_d)``."""
    k = len(cl.t_min)
    c = np.full((k, k), np.inf)
    on = {i: np.flatnonzero(cl.island == i) for i in set(cl.island.tolist())}
    for i, ui in on.items():
        for j, vj in on.items():
            best = np.full((len(ui), len(vj)), np.inf)
            for d in {(i, j), (j, i)}:
                lk = p.links[d]
                side = cl.scale_up if lk.scale_up else cl.nic
                best = np.minimum(best, lk.latency_s + np.maximum(np.maximum(side[ui][:, None], side[vj][None, :]),
                                                                  lk.shared_s))
            c[np.ix_(ui, vj)] = best
    return np.floor(c / tick_s + 1e-9)  # ticks.rounders' floor, on arrays


def _steps(x: np.ndarray, hi: float, factor: float) -> np.ndarray:
    """The geometric step of each ``x`` (a slack below ``hi`` or a side time): steps of ``factor``
    upwards from ``hi / 1000``, all smaller values in one."""
    floor = hi * 1e-3
    ratio = np.maximum(x, floor) / floor
    return np.where(x <= floor, 0, 1 + np.floor(np.log(ratio) / math.log(factor))).astype(np.int64)


__all__ = ["CLASS_MAX_EDGES", "CLASS_SIDE_FACTOR", "CLASS_SLACK_FACTOR", "NeighbourClasses", "add_neighbour_classes"]
