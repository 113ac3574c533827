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

from tangram_opt.planner.formulations.ticks import rounders
from tangram_opt.solvers.model import Constraint, Var

if TYPE_CHECKING:
    from tangram_opt.planner.formulations.aggregated import AggregatedMIP

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
    classes fits the window: the rows would cut nothing then."""
    p, md = mip.problem, mip.model
    fl, ce = rounders(mip.options.tick_s)
    hi_t = ce(hi)
    cands = p.candidates
    slack_f, side_f = CLASS_SLACK_FACTOR, CLASS_SIDE_FACTOR
    while True:
        of, t_min, side = _classes(mip, columns, hi, slack_f, side_f)
        n_cls = len(t_min)
        if n_cls * (n_cls + 1) // 2 <= CLASS_MAX_EDGES or slack_f > 1e3:
            break
        slack_f, side_f = slack_f**2, side_f**2
    island_of = {u: cands[mip.types[role][si].candidate].island for (role, si), u in of.items()}

    def link(u: int, v: int) -> int:
        i, j = island_of[u], island_of[v]
        best = math.inf
        for d in {(i, j), (j, i)}:
            lk = p.links[d]
            best = min(best, lk.latency_s + max(side[u][d], side[v][d], lk.shared_s))
        return fl(best)

    cls = range(n_cls)
    c = {(u, v): link(u, v) for u in cls for v in cls if u <= v}
    c.update({(v, u): w for (u, v), w in list(c.items())})
    pair_ok = {(u, v) for u in cls for v in cls if u <= v and t_min[u] + t_min[v] + 2 * c[u, v] <= 2 * hi_t}
    m = p.num_micro_batches
    middle = {u for (role, _), u in of.items() if role == "mid"}

    def partners(s: int) -> list[int]:
        return [u for u in cls if (min(u, s), max(u, s)) in pair_ok]

    reach: dict[int, dict[int, int]] = {}
    if m > 3:
        for s in sorted(middle):
            nb = partners(s)
            r = {u: t_min[u] + 2 * c[u, s] for u in nb}
            budget = 3 * hi_t - t_min[s]
            if nb and 2 * max(r.values()) > budget:  # two of the farthest neighbours do not fit
                reach[s] = r
    if len(pair_ok) == n_cls * (n_cls + 1) // 2 and not reach:
        return None
    out = NeighbourClasses(of=of)
    R = p.max_stages
    for u, v in sorted(pair_ok):
        out.edge[u, v] = md.add_var(f"E[{u},{v}]", 0, R, integer=True)
    members: dict[int, dict[int, float]] = {u: {} for u in cls}  # class -> {column: degree}
    for role, group in columns:
        for si, var in group.items():
            members[of[role, si]][var.index] = 2.0 if role == "mid" else 1.0
    for u in cls:
        row = {var.index: (2.0 if v == u else 1.0)
               for v in cls if (var := out.edge.get((min(u, v), max(u, v)))) is not None}
        for col, deg in members[u].items():
            row[col] = row.get(col, 0.0) - deg
        md.add(Constraint(row, 0.0, 0.0), f"class_degree[{u}]")
    mid_cols = {u: [col for col, deg in members[u].items() if deg == 2.0] for u in cls}
    for s, r in reach.items():
        inc = {u: md.add_var(f"I[{s},{u}]", 0, 2 * R, integer=True) for u in r}
        out.incid.update({(s, u): var for u, var in inc.items()})
        row = {var.index: 1.0 for var in inc.values()}
        row.update({col: -2.0 for col in mid_cols[s]})
        md.add(Constraint(row, 0.0, 0.0), f"class_centre[{s}]")
        for u, var in inc.items():
            e = out.edge[min(u, s), max(u, s)]
            md.add(Constraint({var.index: 1.0, e.index: -(2.0 if u == s else 1.0)}, -math.inf, 0.0),
                   f"class_incid[{s},{u}]")
        budget = 3 * hi_t - t_min[s]
        for q, v in enumerate(sorted({x for x in r.values() if 2 * x > budget})):
            row = {inc[u].index: 1.0 for u, x in r.items() if x >= v}
            row.update({inc[u].index: -1.0 for u, x in r.items() if x <= budget - v})
            md.add(Constraint(row, -math.inf, 0.0), f"class_pairs[{s}|{q}]")
    return out


def _classes(mip: AggregatedMIP, columns: Sequence[tuple[str, dict[int, Var]]], hi: float, slack_factor: float,
             side_factor: float) -> tuple[dict[tuple[str, int], int], list[int], list[dict[tuple[int, int], float]]]:
    """Group the window's stage types (every role) by island, time step and side-time steps:
    (role, type) -> class, each class's fastest time (ticks, rounded down) and, per link touching
    its island (both directions), its smallest side time on that link (seconds)."""
    p = mip.problem
    fl, _ = rounders(mip.options.tick_s)
    cands = p.candidates
    islands = sorted(p.island_gpus)
    number: dict[tuple[int, int, int, int], int] = {}
    of: dict[tuple[str, int], int] = {}
    t_min: list[int] = []
    side: list[dict[tuple[int, int], float]] = []
    of_cand: dict[int, dict[tuple[int, int], float]] = {}  # candidate -> its side on each link of its island
    merged: set[tuple[int, int]] = set()  # (class, candidate) whose sides the class holds
    for role, group in columns:
        for si in group:
            t = mip.types[role][si]
            cd = cands[t.candidate]
            key = (cd.island, _step(hi - t.time_s, hi, slack_factor), _step(cd.p2p_nic_s, hi, side_factor),
                   _step(cd.p2p_scale_up_s, hi, side_factor))
            u = number.get(key)
            if u is None:
                u = number[key] = len(t_min)
                t_min.append(fl(t.time_s))
                side.append({})
            of[role, si] = u
            t_min[u] = min(t_min[u], fl(t.time_s))
            if (u, t.candidate) in merged:  # many types share a candidate
                continue
            merged.add((u, t.candidate))
            sides = of_cand.get(t.candidate)
            if sides is None:
                sides = of_cand[t.candidate] = {d: p.links[d].side_s(cd) for j in islands
                                                for d in ((cd.island, j), (j, cd.island))}
            for d, s in sides.items():
                side[u][d] = min(side[u].get(d, math.inf), s)
    return of, t_min, side


def _step(x: float, hi: float, factor: float) -> int:
    """The geometric step of ``x`` (a slack below ``hi`` or a side time): steps of ``factor``
    upwards from ``hi / 1000``, all smaller values in one."""
    floor = hi * 1e-3
    return 0 if x <= floor else 1 + int(math.log(x / floor) / math.log(factor))


__all__ = ["CLASS_MAX_EDGES", "CLASS_SIDE_FACTOR", "CLASS_SLACK_FACTOR", "NeighbourClasses", "add_neighbour_classes"]
