"""The aggregated pipeline MIP (the planner's default; formulations/pipeline_mip.md §3).

Instead of one binary per (position, candidate), a pipeline of P >= 2 stages is described by
*stage types*: a type is a candidate with a fixed number of layers, priced exactly (time, tail,
memory). The model chooses one first-stage type (it carries the embedding), one last-stage type
(the head), and how many middle stages of each middle type to use (integer counts).

Positions only matter through memory: under 1F1B a stage at distance r from the end keeps
``min(r + 1, m)`` micro-batches in flight. A middle type tolerates at most ``f_s`` in flight, so
it can sit at distances 1 .. f_s - 1. By Hall's theorem for these nested intervals, the chosen
middle stages can be ordered to fit memory iff, for every q < m, at most ``q - 1`` of them have
``f_s <= q`` — a handful of linear constraints replace the whole position dimension. The first
stage sits at distance P - 1, so ``P <= f_first``.

What the aggregated model relaxes (so its optimum is a valid lower bound): p2p traffic is bounded
below per boundary (the fastest path between its islands, and each stage's own side of it, not
the pair's exact maximum), and the step tail only by counting arguments on the stages upstream.
The decoded plan is ordered (island blocks, memory-feasible) and evaluated
exactly; the gap between that exact value and the bound is what the certificate reports.
Plan-space convention for models with dense-first layers (DeepSeek): all dense layers are on the
first stage.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from tangram_opt.planner.formulations.aggregated_rows import OrderRows, StageArrays, total_T_expr
from tangram_opt.planner.formulations.neighbour_classes import NeighbourClasses, add_neighbour_classes
from tangram_opt.planner.formulations.ordering import best_order
from tangram_opt.planner.formulations.problem import FormulationOptions, PipelineProblem, StageChoice, island_capacities
from tangram_opt.planner.formulations.stage_types import StageType, enumerate_types
from tangram_opt.planner.formulations.ticks import rounders
from tangram_opt.solvers.model import Constraint, LinearModel, LinExpr, Var, lsum

#: at most this many thresholds (besides hi) for the ``neighbours`` rows of a window
NEIGHBOUR_THRESHOLDS = 8
#: also one neighbour row per island and threshold (the heavy stages of that island alone)
NEIGHBOUR_PER_ISLAND = True


@dataclass(slots=True)
class AggregatedMIP(OrderRows):
    """One window's model: stage-type columns, their rows, and the maps to decode and hint plans."""

    problem: PipelineProblem
    options: FormulationOptions
    model: LinearModel = field(default_factory=LinearModel)
    types: dict[str, list[StageType]] = field(default_factory=dict)
    n: dict[int, Var] = field(default_factory=dict)
    o: dict[int, Var] = field(default_factory=dict)
    e: dict[int, Var] = field(default_factory=dict)
    h: dict[int, Var] = field(default_factory=dict)
    a: dict[tuple[int, int], Var] = field(default_factory=dict)
    aux: dict[str, Var] = field(default_factory=dict)
    #: window on the bottleneck stage time: plans with Tmax in [lower_tmax_s, upper_tmax_s]. The
    #: lower end must be a valid bound (e.g. the fluid bound) or the window's own lower edge.
    lower_tmax_s: float = 0.0
    upper_tmax_s: float = math.inf
    #: stage types computed once per sub-problem and reused by every window (None: enumerate)
    all_types: dict[str, list[StageType]] | None = None
    #: window on the largest step tail of any stage: plans whose every stage has tail <=
    #: upper_tail_s and, when lower_tail_s is set, some stage has tail > lower_tail_s
    lower_tail_s: float | None = None
    upper_tail_s: float = math.inf
    #: tail windows: successor counts succ[s] of middle types and the (role, type) of the set S
    #: whose successors they count (``_successor_term``)
    succ: dict[int, Var] = field(default_factory=dict)
    succ_heavy: set[tuple[str, int]] = field(default_factory=set)
    #: (role, candidate, layers) of stage types left out: an enclosing window's LP showed that no
    #: plan better than the cutoff uses them (reduced-cost fixing), and this window is a subset
    excluded_types: frozenset[tuple[str, int, tuple]] = frozenset()
    #: neighbour rows: binary "some stage of M is used" and the columns (n, e, h) of M
    medium: list[tuple[Var, frozenset[int]]] = field(default_factory=list)
    #: neighbour-class rows (neighbour_classes.py), None where the window has none
    classes: NeighbourClasses | None = None
    #: per island, the most GPUs the window's stage sizes can occupy (problem.largest_total)
    capacity: dict[int, int] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not (self.types.get("first") and self.types.get("last"))

    def build(self) -> AggregatedMIP:
        p, o = self.problem, self.options
        md = self.model
        md.name = f"aggregated_b{p.pipeline_micro_batch}_m{p.num_micro_batches}"
        types = self.all_types if self.all_types is not None else enumerate_types(p, o.cutoff_s)
        gpipe_ = p.schedule == "gpipe"
        hi = self.upper_tmax_s
        skip = self.excluded_types
        # (role, candidate) first: hashing the layer counts of every type is most of the filter's time
        skipped = {(role, ci) for role, ci, _ in skip}
        # a stage's own tail and its step at the window's period reach the cutoff: no plan better
        # than it uses the type here (step >= (m - 1) lambda + T_s + tail_s, §3 "Stage types")
        m_1, lo_t = p.num_micro_batches - 1, 0.0 if gpipe_ else self.lower_tmax_s
        cut = o.cutoff_s * (1 + 1e-12) if o.cutoff_s else math.inf
        self.types = {role: [t for t in ts if (max(t.fwd_s, t.bwd_s) if gpipe_ else t.time_s) <= hi * (1 + 1e-12)
                             and t.tail_s <= self.upper_tail_s
                             and m_1 * max(lo_t, t.time_s) + t.time_s + t.tail_s <= cut
                             and ((role, t.candidate) not in skipped or (role, t.candidate, t.layers) not in skip)]
                      for role, ts in types.items()}
        if self.lower_tail_s is not None and not any(t.tail_s > self.lower_tail_s for ts in self.types.values()
                                                     for t in ts):
            self.types = {}  # no stage type has a tail in the window: nothing to plan
        if self.empty or p.max_stages < 2:
            return self
        m, R, tick = p.num_micro_batches, p.max_stages, o.tick_s
        gpipe = p.schedule == "gpipe"
        fl, ce = rounders(tick)  # lower- and upper-bound rounding to ticks (ticks.py)
        cands = p.candidates
        mids, firsts, lasts = self.types["mid"], self.types["first"], self.types["last"]
        # upper bound on every time-valued auxiliary: the cutoff (objective of a known plan) when
        # there is one; tight bounds keep LP-based solvers out of numerical trouble
        big_t = ce(o.cutoff_s) + 1 if o.cutoff_s else 2**40
        tl = fl(self.lower_tmax_s)

        # what the rows read of each type, per role: most row families go over every column, so
        # these are looked up (and rounded) once, into lists of numbers rather than an object per
        # column, which the garbage collector would scan with the model
        island = {r: [cands[t.candidate].island for t in ts] for r, ts in self.types.items()}
        gpus = {r: [cands[t.candidate].gpus for t in ts] for r, ts in self.types.items()}
        time = {r: [fl(t.time_s) for t in ts] for r, ts in self.types.items()}  # forward + backward

        main_layers = p.layers[p.kinds[-1]]
        for si, t in enumerate(mids):
            ub = min(p.island_gpus[island["mid"][si]] // gpus["mid"][si], main_layers // max(1, t.num_layers), R - 2)
            if not gpipe and t.tolerance < m:
                ub = min(ub, t.tolerance - 1)
            if ub < 1:
                continue
            self.n[si] = md.add_var(f"n[{si}]", 0, ub, integer=True)
            self.o[si] = md.add_binary(f"o[{si}]")  # type s used at all
            # per-type rows are built as coefficient dicts: thousands of them per window, and
            # LinExpr arithmetic would copy expressions at every operator
            n_i, o_i = self.n[si].index, self.o[si].index
            md.add(Constraint({n_i: 1.0, o_i: -float(ub)}, -math.inf, 0.0), f"use[{si}]")  # n <= ub o
            md.add(Constraint({o_i: 1.0, n_i: -1.0}, -math.inf, 0.0), f"use_lb[{si}]")  # o <= n
        for si, t in enumerate(firsts):
            self.e[si] = md.add_binary(f"e[{si}]")
        for si, t in enumerate(lasts):
            self.h[si] = md.add_binary(f"h[{si}]")
        md.add(lsum(self.e.values()) == 1, "one_first")
        md.add(lsum(self.h.values()) == 1, "one_last")
        n_mid = lsum(self.n.values())

        columns = (("mid", self.n), ("first", self.e), ("last", self.h))  # the order of most rows
        by_use = (("first", self.e), ("last", self.h), ("mid", self.o))  # "type used" binaries, per-type rows

        per_kind = {k: LinExpr() for k in p.kinds}
        for role, group in columns:
            for si, var in group.items():
                for k, count in self.types[role][si].layers:
                    per_kind[k].add_term(var, count)
        for k in p.kinds:
            md.add(per_kind[k] == p.layers[k], f"layers[{k}]")

        islands = sorted(p.island_gpus)
        # what the window's stage sizes can occupy of each island (problem.largest_total)
        cap = self.capacity = island_capacities(p, (t.candidate for ts in self.types.values() for t in ts))
        gpus_on = {i: LinExpr() for i in islands}
        for role, group in columns:
            for si, var in group.items():
                gpus_on[island[role][si]].add_term(var, gpus[role][si])
        for i in islands:
            md.add(gpus_on[i] <= cap[i], f"gpus[{i}]")

        # positions: P = 2 + n_mid <= R; memory by Hall's condition; first stage at distance P - 1
        md.add(n_mid <= R - 2, "max_stages")
        if p.min_stages > 2:
            md.add(n_mid >= p.min_stages - 2, "min_stages")
        if not gpipe:
            tolerance = [(mids[si].tolerance, var) for si, var in self.n.items()]
            for q in range(2, min(m, R)):
                few = [var for tol, var in tolerance if tol <= q]
                if few:
                    md.add(lsum(few) <= q - 1, f"hall[{q}]")
            cap_first = LinExpr()
            for si, var in self.e.items():
                tol = firsts[si].tolerance
                cap_first.add_term(var, tol if tol < m else R)
            md.add(2 + n_mid <= cap_first, "first_position")

        # bottleneck and link terms
        if gpipe:
            Fmax = self.aux["Fmax"] = md.add_var("Fmax", fl(self.lower_tmax_s / 2), big_t, integer=True)
            Bmax = self.aux["Bmax"] = md.add_var("Bmax", 0, big_t, integer=True)
            for si, ov in self.o.items():
                if fl(mids[si].fwd_s) + fl(mids[si].bwd_s) > tl:
                    md.add(Fmax >= fl(mids[si].fwd_s) * ov, f"Fmax[{si}]")
                    md.add(Bmax >= fl(mids[si].bwd_s) * ov, f"Bmax[{si}]")
            for group, tys, nm in ((self.e, firsts, "first"), (self.h, lasts, "last")):
                md.add(Fmax >= lsum(fl(tys[si].fwd_s) * var for si, var in group.items()), f"Fmax_{nm}")
                md.add(Bmax >= lsum(fl(tys[si].bwd_s) * var for si, var in group.items()), f"Bmax_{nm}")
            bottleneck: LinExpr = Fmax + Bmax
        else:
            Tmax = self.aux["Tmax"] = md.add_var("Tmax", tl, ce(hi) if math.isfinite(hi) else big_t, integer=True)
            for si, ov in self.o.items():
                if time["mid"][si] > tl:
                    md.add(Constraint({Tmax.index: 1.0, ov.index: -float(time["mid"][si])}, 0.0, math.inf),
                           f"Tmax[{si}]")  # Tmax >= T_s o_s
            for role, group in columns[1:]:
                md.add(Tmax >= LinExpr.terms((var, time[role][si]) for si, var in group.items()), f"Tmax_{role}")
            bottleneck = LinExpr.of(Tmax)
        if not gpipe and o.mccormick_cuts:
            # per candidate c: every stage using c takes at most Tmax, so sum_stages T <= Tmax * N_c.
            # McCormick over Tmax in [tl, inf) and N_c in [0, U_c] linearizes the product:
            # sum_stages T <= tl * N_c + U_c * (Tmax - tl), i.e. sum_stages (T - tl) - U_c Tmax <= -U_c tl
            per_cand: dict[int, dict[int, float]] = {}
            for role, group in columns:
                for si, var in group.items():
                    per_cand.setdefault(self.types[role][si].candidate, {})[var.index] = float(time[role][si] - tl)
            for ci, row in per_cand.items():
                c = cands[ci]
                u_c = min(p.island_gpus[c.island] // c.gpus, R)
                row[Tmax.index] = float(-u_c)
                md.add(Constraint(row, -math.inf, float(-u_c * tl)), f"mccormick[{ci}]")
        c_min = fl(min(p.link_lo_s.values()))
        # Smax: the steady period per micro-batch; the window [lo, hi] applies to it (Tmax <= Smax)
        Smax = self.aux["Smax"] = md.add_var("Smax", max(tl, c_min) if not gpipe else c_min,
                                             ce(hi) if math.isfinite(hi) else big_t, integer=True)
        md.add(Smax >= bottleneck, "Smax")

        if o.fluid_cuts:
            work_on = {i: LinExpr() for i in islands}
            for role, group in columns:
                for si, var in group.items():
                    work_on[island[role][si]].add_term(var, gpus[role][si] * time[role][si])
            for i in islands:
                md.add(work_on[i] <= cap[i] * Smax, f"fluid[{i}]")

        # p2p: a[i, j] counts pipeline boundaries from a stage on island i to one on island j. Every
        # stage but the last sends once and every stage but the first receives once, so for any
        # order of the chosen stages the true counts satisfy these degree equations; total p2p time
        # is then exactly sum c_ij a_ij (a relaxation only in that the path itself is not enforced).
        on_island = {i: LinExpr() for i in islands}
        first_on = {i: LinExpr() for i in islands}
        last_on = {i: LinExpr() for i in islands}
        for role, group, end_on in (("first", self.e, first_on), ("mid", self.n, None), ("last", self.h, last_on)):
            for si, var in group.items():
                i = island[role][si]
                on_island[i].add_term(var, 1)
                if end_on is not None:
                    end_on[i].add_term(var, 1)
        self.a = {(i, j): md.add_var(f"a[{i},{j}]", 0, R, integer=True) for i in islands for j in islands}
        for i in islands:
            md.add(lsum(self.a[i, j] for j in islands) == on_island[i] - last_on[i], f"out[{i}]")
            md.add(lsum(self.a[j, i] for j in islands) == on_island[i] - first_on[i], f"in[{i}]")
            # a path has at most n_i - 1 boundaries inside island i (no self-loop on a lone stage)
            yi = self.aux[f"on[{i}]"] = md.add_binary(f"on[{i}]")
            md.add(on_island[i] <= R * yi, f"on_def[{i}]")
            md.add(yi <= on_island[i], f"on_def2[{i}]")
            # the island's GPUs in use say it is used: the stage count alone (on_def) lets the LP
            # hold on[i] near n_i / R on an island whose every GPU it uses, which leaves the
            # connectivity rows below empty (formulations/pipeline_mip.md §5, fourteenth round)
            md.add(gpus_on[i] <= cap[i] * yi, f"on_gpus[{i}]")
            md.add(self.a[i, i] <= on_island[i] - yi, f"inner[{i}]")
        # connectivity: the stages form one path, so every split of the used islands into two
        # groups is crossed by at least one boundary (subtour elimination at island level)
        if 1 < len(islands) <= 6:
            for size in range(1, len(islands) // 2 + 1):
                for group in itertools.combinations(islands, size):
                    rest = [j for j in islands if j not in group]
                    if size * 2 == len(islands) and group[0] != islands[0]:
                        continue  # each bipartition once
                    crossing = lsum(self.a[i, j] + self.a[j, i] for i in group for j in rest)
                    for i in group:
                        for j in rest:
                            md.add(crossing >= self.aux[f"on[{i}]"] + self.aux[f"on[{j}]"] - 1,
                                   f"connect[{','.join(map(str, group))}|{i},{j}]")
        # total p2p time Cm. A boundary takes its path's latency plus the slowest of its sending
        # side, its receiving side and the shared (zone) link: at least link_lo for its islands, and
        # at least latency + the sender's side (or the receiver's). Summed over boundaries, every
        # stage but the last sends once and every stage but the first receives once. The step
        # tail's upstream time counts the links as Cm plus one tick per boundary (their rounding
        # down): the objective prices Cm twice, so raising it to shrink an exposed tail never pays.
        Cm = self.aux["Cm"] = md.add_var("Cm", 0, big_t, integer=True)
        md.add(Cm >= lsum(fl(p.link_lo_s[i, j]) * self.a[i, j] for i in islands for j in islands), "comm")
        latency = lsum(fl(p.links[i, j].latency_s) * self.a[i, j] for i in islands for j in islands)
        used_cands = {self.types[role][si].candidate for role, group in columns for si in group}
        side_lo = {ci: fl(p.side_bounds_s(cands[ci])[0]) for ci in used_cands}
        sides = lambda role, group: LinExpr.terms((var, side_lo[self.types[role][si].candidate])  # noqa: E731
                                                  for si, var in group.items())
        mid_sides = sides(*columns[0])
        md.add(Cm >= latency + sides(*columns[1]) + mid_sides, "comm_send")
        md.add(Cm >= latency + sides(*columns[2]) + mid_sides, "comm_recv")
        if o.island_links:
            self._island_link_rows(Cm, columns, side_lo, fl)
        sent_ub = Cm + n_mid + 1  # P - 1 boundaries
        # a link used at all bounds the period (each direction carries one transfer per micro-batch),
        # and so does the block of the two stages it joins: 2 Smax >= T_a + T_b + 2 c_ij, with
        # T_a, T_b at least the fastest stage used on their islands (tmin[i])
        tmin: dict[int, Var] = {}
        if not gpipe and m > 2 and math.isfinite(hi):
            big_s = ce(hi)
            used_on: dict[tuple[int, str], list[int]] = {}  # (island, role) -> its types with a column
            for role, group in by_use:
                for si in group:
                    used_on.setdefault((island[role][si], role), []).append(si)
            for i in islands:
                tv = tmin[i] = self.aux[f"tmin[{i}]"] = md.add_var(f"tmin[{i}]", 0, big_s, integer=True)
                for role, group in by_use:
                    for si in used_on.get((i, role), ()):
                        # tmin[i] <= T_s + big (1 - used_s)
                        md.add(Constraint({tv.index: 1.0, group[si].index: float(big_s)}, -math.inf,
                                          float(time[role][si] + big_s)), f"tmin_def[{i},{role}{si}]")
        for (i, j), av in self.a.items():
            cij = fl(p.link_lo_s[i, j])
            pair = bool(tmin) and 2 * cij > tl
            if cij > (tl if not gpipe else 0) or pair:
                wv = self.aux[f"w[{i},{j}]"] = md.add_binary(f"w[{i},{j}]")
                md.add(av <= R * wv, f"link_used[{i},{j}]")
                if gpipe:
                    md.add(self.aux["Fmax"] >= cij * wv, f"link_F[{i},{j}]")
                    md.add(self.aux["Bmax"] >= cij * wv, f"link_B[{i},{j}]")
                else:
                    md.add(Smax >= cij * wv, f"link_S[{i},{j}]")
                    if pair:
                        md.add(2 * Smax >= tmin[i] + tmin[j] + 2 * cij - 3 * ce(hi) * (1 - wv), f"link_block[{i},{j}]")
        # every stage has a boundary, at least its island's smallest latency plus its own side: a
        # stage type whose link alone exceeds the period's lower end bounds the period when used
        own_floor = {ci: fl(p.link_floor_s(ci)) for ci in used_cands}
        for role, group in by_use:
            for si, var in group.items():
                c_own = own_floor[self.types[role][si].candidate]
                if c_own <= (tl if not gpipe else 0):
                    continue
                if gpipe:
                    md.add(self.aux["Fmax"] >= c_own * var, f"own_link_F[{role}{si}]")
                    md.add(self.aux["Bmax"] >= c_own * var, f"own_link_B[{role}{si}]")
                else:
                    md.add(Constraint({Smax.index: 1.0, var.index: -float(c_own)}, 0.0, math.inf),
                           f"own_link[{role}{si}]")
        if not gpipe and m > 2 and math.isfinite(hi):
            # 1F1B in-flight limit over the whole pipeline: Smax * P >= sum T + 2 * sum c when P < m;
            # the binary `short` says P <= m - 1 and switches the rows off otherwise
            relax = LinExpr()
            if R >= m:
                hi_t = ce(hi)
                big = R * hi_t + 2 * R * ce(max(p.link_hi_s.values()))
                short = self.aux["short"] = md.add_binary("short")
                md.add(2 + n_mid <= (m - 1) + (R - m + 1) * (1 - short), "short_def")
                md.add(2 + n_mid >= m * (1 - short), "short_def2")
                relax = big * (1 - short)
            self._cycle_rows(max(2, p.min_stages), R, relax, "")
            self._island_block_rows(relax)
        if not gpipe and m > 2 and math.isfinite(hi):
            # two neighbours a, b form a block: lambda >= (T_a + T_b) / 2 + c_ab. Inside the window
            # (lambda <= hi) they are compatible only if T_a + T_b + 2 c_ab <= 2 hi. A set H of
            # pairwise incompatible stages has every neighbour in L(H), the stages compatible with
            # some member of H; counting the edges between them (an end of the path has one
            # neighbour, any other stage two): 2 n_H + e_H + h_H <= 2 n_L + e_L + h_L. The sets H
            # are {w > theta} with w = T + cmin_i (cmin_i: the cheapest link touching the stage's
            # island) and theta >= hi, which makes them pairwise incompatible since c_ab >= cmin.
            cmin, cpair = self._link_minima()
            w, t_s, isl, ends, col, floor = [], [], [], [], [], []
            for role, group in columns:
                for si, var in group.items():
                    t, i = self.types[role][si], island[role][si]
                    floor.append(p.link_floor_s(t.candidate))
                    w.append(t.time_s + max(cmin[i], floor[-1]))
                    t_s.append(t.time_s)
                    isl.append(i)
                    ends.append(0 if role == "mid" else 1)
                    col.append(var.index)
            st = StageArrays.of(islands, w, t_s, isl, ends, col, floor)
            heavy_w = sorted(set(st.w[st.w > hi * (1 + 1e-9)].tolist()))
            thetas = [hi] + heavy_w[:-1][::max(1, len(heavy_w) // NEIGHBOUR_THRESHOLDS)]
            slack = 2 * hi * 1e-9

            def members(mask: np.ndarray) -> dict[int, tuple[float, float]]:
                # fastest time and least link floor of the heavy stages, per island
                return {i: (float(st.t[mask & on].min()), float(st.floor[mask & on].min()))
                        for i, on in st.on.items() if (mask & on).any()}

            for q, theta in enumerate(thetas):
                above = theta * (1 + 1e-9)
                heavy = st.w > above
                if not heavy.any():
                    continue
                limit, sandwich = self._compatible_limits(members(heavy), cpair, st.island, st.floor)
                near = ~heavy & (st.t <= limit)
                medium = ~heavy & ~near if o.order_rows else None
                self._neighbour_row(md, st, heavy, near, medium, sandwich, f"neighbours[{q}]", cpair, hi + slack / 2)
                if not NEIGHBOUR_PER_ISLAND:
                    continue
                # the stages of one island i whose time plus their least link there
                # (max(c_ii, floor)) is above theta are pairwise incompatible too; this row leaves
                # out the stages only some other island's heavy stages could neighbour
                for i in islands:
                    heavy_i = st.on[i] & (st.t + np.maximum(p.link_lo_s[i, i], st.floor) > above)
                    if not heavy_i.any() or (heavy_i == heavy).all():
                        continue
                    limit_i, sandwich_i = self._compatible_limits(members(heavy_i), cpair, st.island, st.floor)
                    near_i = ~heavy_i & (st.t <= limit_i)
                    medium_i = ~heavy_i & ~near_i if o.order_rows else None
                    self._neighbour_row(md, st, heavy_i, near_i, medium_i, sandwich_i, f"neighbours[{q},{i}]", cpair,
                                        hi + slack / 2)
            if o.order_rows and o.neighbour_classes:
                self.classes = add_neighbour_classes(self, columns, hi)
        # a lower bound on the link out of a stage of each candidate used (ticks)
        out_min = {i: fl(min(p.link_lo_s[i, j] for j in islands)) for i in islands}
        out_lo = {ci: max(out_min[cands[ci].island], fl(p.link_floor_s(ci)))
                  for ci in {t.candidate for ts in self.types.values() for t in ts}}

        # step tail: Y >= tail_k - (backward + p2p time upstream of stage k). The first stage has
        # nothing upstream; for any other stage the upstream time is at most every stage's
        # backward except its own and the last stage's, plus every link at its slowest. Backward
        # and link times are rounded up, so each constraint is a valid lower bound on the exact Y.
        Y = self.aux["Y"] = md.add_var("Y", 0, big_t, integer=True)
        first_bwd = LinExpr.terms((var, ce(firsts[si].bwd_s)) for si, var in self.e.items())
        mid_bwd = LinExpr.terms((var, ce(mids[si].bwd_s)) for si, var in self.n.items())
        md.add(Y >= LinExpr.terms((var, fl(firsts[si].tail_s)) for si, var in self.e.items()), "tail_first")
        U = self.aux["U"] = md.add_var("U", 0, big_t, integer=True)  # upper bound on any upstream time
        md.add(U == first_bwd + mid_bwd + sent_ub, "upstream")
        md.add(Y >= LinExpr.terms((var, fl(lasts[si].tail_s)) for si, var in self.h.items()) - U, "tail_last")
        for si, ov in self.o.items():
            t = mids[si]
            if fl(t.tail_s) > 0:
                # the most upstream copy of type s has its n_s - 1 siblings downstream of it
                sibling = fl(t.bwd_s) + out_lo[t.candidate]
                own = ce(t.bwd_s) + out_lo[t.candidate]  # its own backward and send, inside U
                # Y >= (tail + own - sibling) o + sibling n - U
                md.add(Constraint({Y.index: 1.0, ov.index: -float(fl(t.tail_s) + own - sibling),
                                   self.n[si].index: -float(sibling), U.index: 1.0}, 0.0, math.inf),
                       f"tail_mid[{si}]")
        if o.tail_averages:
            self._tail_average_rows(md, Y, U, columns, island, gpus, fl, ce, out_lo)
        if self.lower_tail_s is not None:
            self._tail_window_rows(md, Y, sent_ub, fl, ce, out_lo,
                                   successors=o.order_rows and not gpipe and m > 2 and math.isfinite(hi))

        md.minimize((m - 1) * Smax + total_T_expr(self, fl) + 2 * Cm + Y)
        return self

    def with_stage_range(self, first: int, last: int) -> AggregatedMIP:
        """This window's model restricted to pipelines of ``first`` .. ``last`` stages, without
        building it again: a copy sharing the rows built so far (the counts and links of a
        narrower range satisfy them all), plus the stage-count rows and, when every such pipeline
        has fewer stages than micro-batches, the whole-pipeline block on that range."""
        p = self.problem
        first, last = max(first, p.min_stages, 2), min(last, p.max_stages)
        child = replace(self, problem=replace(p, min_stages=first, max_stages=last), model=self.model.fork(),
                        aux=dict(self.aux), medium=list(self.medium))
        md = child.model
        if child.empty:
            return child
        n_mid = lsum(child.n.values())
        md.add(n_mid >= first - 2, f"stages_min[{first}]")
        md.add(n_mid <= last - 2, f"stages_max[{last}]")
        m = p.num_micro_batches
        if p.schedule == "1f1b" and m > 2 and math.isfinite(self.upper_tmax_s) and last < m:
            child._cycle_rows(first, last, LinExpr(), f"[{first},{last}]")
        return child

    def fixed_types(self) -> frozenset[tuple[str, int, tuple]]:
        """The excluded stage types plus those whose columns are fixed to 0 in the model (after
        reduced-cost fixing): valid exclusions for every window inside this one."""
        ub = lambda var: self.model.vars[var.index].ub  # noqa: E731
        fixed = set(self.excluded_types)
        for role, group in (("first", self.e), ("mid", self.n), ("last", self.h)):
            for si, var in group.items():
                if ub(var) == 0:
                    t = self.types[role][si]
                    fixed.add((role, t.candidate, t.layers))
        return frozenset(fixed)

    # --- solutions -----------------------------------------------------------------------
    def stage_multiset(self, values: Sequence[float]) -> tuple[StageType, list[StageType], StageType]:
        first = next(self.types["first"][si] for si, v in self.e.items() if values[v.index] > 0.5)
        last = next(self.types["last"][si] for si, v in self.h.items() if values[v.index] > 0.5)
        mids = [self.types["mid"][si] for si, v in self.n.items() for _ in range(int(round(values[v.index])))]
        return first, mids, last

    def decode(self, values: Sequence[float]) -> list[StageChoice]:
        """The best memory-feasible order of the chosen stages (exact evaluation)."""
        first, mids, last = self.stage_multiset(values)
        return best_order(self.problem, first, mids, last)

    def cut_support(self, values: Sequence[float]) -> None:
        """Cut off the support class of a solution (same first and last type, same set of middle
        types): sum_{s not used} o[s] + sum_{s used} (1 - o[s]) + (1 - e[first]) + (1 - h[last]) >= 1."""
        on = [v for group in (self.e, self.h, self.o) for v in group.values() if values[v.index] > 0.5]
        off = [v for group in (self.e, self.h, self.o) for v in group.values() if values[v.index] <= 0.5]
        self.model.add(lsum(off) - lsum(on) >= 1 - len(on), f"support_cut{len(self.model.constraints)}")

    def hint_from(self, stages: Sequence[StageChoice]) -> dict[Var, float] | None:
        """Encode a pipeline (pipeline order) as variable values, if it is in the aggregated space."""
        if len(stages) < 2:
            return None
        cands = self.problem.candidates
        vals: dict[Var, float] = {v: 0.0 for v in self.model.vars}

        def find(role: str, st: StageChoice) -> int | None:
            layers = tuple(sorted({k: st.layers.get(k, 0) for k in self.problem.kinds}.items()))
            c = cands[st.candidate]
            best = None
            for si, t in enumerate(self.types[role]):
                tc = cands[t.candidate]
                if t.layers == layers and tc.island == c.island and tc.gpus == c.gpus:
                    if t.candidate == st.candidate:
                        return si
                    best = si if best is None else best
            return best

        fi, la = find("first", stages[0]), find("last", stages[-1])
        if fi is None or la is None or fi not in self.e or la not in self.h:
            return None
        vals[self.e[fi]] = 1.0
        vals[self.h[la]] = 1.0
        keys = [("first", fi)]
        for st in stages[1:-1]:
            si = find("mid", st)
            if si is None or si not in self.n:
                return None
            vals[self.n[si]] += 1.0
            if si in self.o:
                vals[self.o[si]] = 1.0
            keys.append(("mid", si))
        keys.append(("last", la))
        if self.classes is not None and not self.classes.encode(keys, vals):
            return None
        for u, cols in self.medium:
            vals[u] = 1.0 if any(vals[self.model.vars[i]] > 0.5 for i in cols) else 0.0
        # succ[s]: the middle stages of type s next to a member of S, downstream of the first one
        first_s = next((k for k, key in enumerate(keys) if key in self.succ_heavy), len(keys))
        for k in range(first_s + 1, len(keys) - 1):
            _, si = keys[k]
            if si in self.succ and (keys[k - 1] in self.succ_heavy or keys[k + 1] in self.succ_heavy):
                vals[self.succ[si]] += 1.0
        for st_a, st_b in zip(stages, stages[1:]):
            key = (cands[st_a.candidate].island, cands[st_b.candidate].island)
            vals[self.a[key]] += 1.0
            if f"w[{key[0]},{key[1]}]" in self.aux:
                vals[self.aux[f"w[{key[0]},{key[1]}]"]] = 1.0
        for key, var in self.aux.items():
            if key.startswith("on["):
                i = int(key[3:-1])
                vals[var] = 1.0 if any(cands[st.candidate].island == i for st in stages) else 0.0
        if "short" in self.aux:
            vals[self.aux["short"]] = 1.0 if len(stages) <= self.problem.num_micro_batches - 1 else 0.0
        return _complete_aux(self.model, vals, self.aux)



def _complete_aux(model: LinearModel, vals: dict[Var, float], aux: dict[str, Var]) -> dict[Var, float]:
    """Fill auxiliary variables from the structural ones: the equality-defined one (U) from its
    row, min-type ones (tmin[i]) at the largest value their rows allow, max-type ones (Cm, Tmax,
    Smax, Y, ...) at the smallest. Two passes settle the dependencies between them."""
    x_of = {v.index: val for v, val in vals.items()}

    def rows_of(var: Var):  # type: ignore[no-untyped-def]
        for con in model.constraints:
            a = con.coefs.get(var.index, 0.0)
            if a:
                rest = sum(c * x_of.get(i, 0.0) for i, c in con.coefs.items() if i != var.index)
                yield con, a, rest

    order = [k for k in ("Cm", "U") if k in aux] + sorted(k for k in aux if k.startswith("tmin[")) + [
        k for k in ("Tmax", "Fmax", "Bmax", "Smax", "Y") if k in aux]
    for _ in range(2):
        for name in order:
            var = aux[name]
            if name == "U":
                con, a, rest = next((c, a, r) for c, a, r in rows_of(var) if c.lb == c.ub)
                val = (con.lb - rest) / a
            elif name == "Cm":  # only its own rows: the tail rows also hold it, as a credit
                val = max([0.0] + [(con.lb - rest) / a for con, a, rest in rows_of(var)
                                   if con.name.startswith("comm") and a > 0])
                val = math.ceil(val - 1e-9)
            elif name.startswith("tmin["):
                val = var.ub
                for con, a, rest in rows_of(var):
                    if a > 0 and not math.isinf(con.ub):
                        val = min(val, (con.ub - rest) / a)
                val = max(0.0, math.floor(val + 1e-9))
            else:
                val = var.lb
                for con, a, rest in rows_of(var):
                    if a > 0 and not math.isinf(con.lb):
                        val = max(val, (con.lb - rest) / a)
                    elif a < 0 and not math.isinf(con.ub):
                        val = max(val, (con.ub - rest) / a)
                val = math.ceil(val - 1e-9)
            vals[var] = float(round(val)) if name == "U" else float(val)
            x_of[var.index] = vals[var]
    return vals


__all__ = ["AggregatedMIP", "NEIGHBOUR_PER_ISLAND", "NEIGHBOUR_THRESHOLDS"]
