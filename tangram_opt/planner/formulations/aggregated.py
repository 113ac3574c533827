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

from tangram_opt.planner.candidates import Candidate, sends_no_slower
from tangram_opt.planner.formulations.positional import FormulationOptions, PipelineProblem, StageChoice
from tangram_opt.planner.formulations.pipeline_model import pipeline_timing
from tangram_opt.solvers.model import Constraint, LinearModel, LinExpr, Var, lsum

ROLES = ("first", "mid", "last")
#: at most this many thresholds (besides hi) for the ``neighbours`` rows of a window
NEIGHBOUR_THRESHOLDS = 8
#: also one neighbour row per island and threshold (the heavy stages of that island alone)
NEIGHBOUR_PER_ISLAND = True
#: rows Y >= (least tail above theta) - (cover upstream) per tail window (``_tail_window_rows``)
TAIL_WINDOW_ROWS = 16


@dataclass(frozen=True, slots=True)
class StageType:
    """A candidate with a fixed layer count in one role; ``tolerance`` = most micro-batches in
    flight that still fit in memory (capped at m)."""

    role: str
    candidate: int
    layers: tuple[tuple[str, int], ...]
    time_s: float
    fwd_s: float
    bwd_s: float
    tail_s: float
    tolerance: int

    @property
    def layer_dict(self) -> dict[str, int]:
        return dict(self.layers)

    @property
    def num_layers(self) -> int:
        return sum(n for _, n in self.layers)


def _tolerance(c: Candidate, layers: dict[str, int], *, first: bool, last: bool, q_min: int, m: int) -> int:
    """Largest in-flight count q in [q_min, m] at which the stage fits (q_min - 1 if none)."""
    def fits(q: int) -> bool:
        return c.memory_bytes(layers, q, first=first, last=last) <= c.capacity_bytes

    if not fits(q_min):
        return q_min - 1
    # memory is affine and non-decreasing in q: start from the closed form, then step to the
    # exact boundary of the same predicate (floating-point rounding may put it one off)
    base = c.memory_bytes(layers, 0, first=first, last=last)
    per_q = c.memory_bytes(layers, 1, first=first, last=last) - base
    q = m if per_q <= 0 else max(q_min, min(m, int((c.capacity_bytes - base) // per_q)))
    while q > q_min and not fits(q):
        q -= 1
    while q < m and fits(q + 1):
        q += 1
    return q


def stage_type(problem: PipelineProblem, ci: int, role: str, layers: dict[str, int]) -> StageType | None:
    """Candidate ``ci`` holding ``layers`` in ``role``, priced as :func:`enumerate_types` does (None
    if it does not fit even with the fewest micro-batches in flight its role can have)."""
    m = problem.num_micro_batches
    gpipe = problem.schedule == "gpipe"
    q = m if gpipe else (1 if role == "last" else min(2, m))
    c = problem.candidates[ci]
    tol = _tolerance(c, layers, first=role == "first", last=role == "last", q_min=q, m=m)
    return None if tol < q else _type_of(c, ci, role, layers, m, tol)


def _type_of(c: Candidate, ci: int, role: str, layers: dict[str, int], m: int, tolerance: int) -> StageType:
    first, last = role == "first", role == "last"
    fwd = sum(n * c.layer[k].fwd_time_s for k, n in layers.items() if n)
    bwd = sum(n * c.layer[k].bwd_time_s for k, n in layers.items() if n)
    tail = sum(n * c.layer[k].step_tail_time_s for k, n in layers.items() if n)
    for use, lc in ((first, c.embedding), (last, c.head)):
        if use:
            fwd += lc.fwd_time_s
            bwd += lc.bwd_time_s
            tail += lc.step_tail_time_s
    return StageType(role=role, candidate=ci, layers=tuple(sorted(layers.items())), time_s=fwd + bwd, fwd_s=fwd,
                     bwd_s=bwd, tail_s=tail, tolerance=tolerance)


def enumerate_types(problem: PipelineProblem, cutoff_s: float | None = None) -> dict[str, list[StageType]]:
    """Every (candidate, layer count) that fits in its role, Pareto-pruned per (island, layers).

    Pruning is exact: a type is dropped only if another type of the same island and layers uses no
    more GPUs, is no slower (forward and forward+backward; GPipe: forward and backward), no worse
    in tail, no slower on either side of a stage boundary, and tolerates at least as many
    micro-batches in flight. Swapping it in keeps a plan feasible and never lengthens its
    closed-form step: the sum of stage times (and twice that of the links) drops by at least as
    much as a smaller backward (or link) can expose of downstream tails
    (formulations/pipeline_mip.md §3).
    """
    m = problem.num_micro_batches
    gpipe = problem.schedule == "gpipe"
    q_mid = m if gpipe else min(2, m)
    kinds = problem.kinds
    two_kinds = len(kinds) == 2
    tmax_cap = cutoff_s / m if cutoff_s else math.inf
    out: dict[str, list[StageType]] = {r: [] for r in ROLES}
    for ci, c in enumerate(problem.candidates):
        for role in ROLES:
            first, last = role == "first", role == "last"
            q = 1 if (last and not gpipe) else q_mid
            main = kinds[-1]  # MoE layers on two-kind models, the only kind otherwise
            fixed = {kinds[0]: problem.layers[kinds[0]]} if (two_kinds and first) else {}
            lo = 0 if fixed else 1
            for n in range(lo, problem.layers[main] + 1):
                layers = dict(fixed)
                layers[main] = layers.get(main, 0) + n
                if sum(layers.values()) < 1:
                    continue
                tol = _tolerance(c, layers, first=first, last=last, q_min=q, m=m)
                if tol < q:
                    break  # more layers only need more memory
                t = _type_of(c, ci, role, layers, m, tol)
                bottleneck = max(t.fwd_s, t.bwd_s) if gpipe else t.time_s
                if bottleneck > tmax_cap * (2 if gpipe else 1):
                    break
                if gpipe and tol < m:
                    continue
                out[role].append(t)
    cands = problem.candidates
    for role in ROLES:
        groups: dict[tuple, list[StageType]] = {}
        for t in out[role]:
            c = cands[t.candidate]
            groups.setdefault((c.island, t.layers), []).append(t)
        kept = []
        for group in groups.values():
            group.sort(key=lambda t: (t.time_s, cands[t.candidate].gpus, t.fwd_s, t.tail_s, -t.tolerance))
            front: list[StageType] = []
            for t in group:
                g = cands[t.candidate].gpus
                if not any(f.time_s <= t.time_s and f.fwd_s <= t.fwd_s and f.tail_s <= t.tail_s
                           and f.tolerance >= t.tolerance and cands[f.candidate].gpus <= g
                           and (not gpipe or f.bwd_s <= t.bwd_s)
                           and sends_no_slower(cands[f.candidate], cands[t.candidate]) for f in front):
                    front.append(t)
            kept.extend(front)
        out[role] = kept
    return out


@dataclass(slots=True)
class AggregatedMIP:
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
        self.types = {role: [t for t in ts if (max(t.fwd_s, t.bwd_s) if gpipe_ else t.time_s) <= hi * (1 + 1e-12)
                             and t.tail_s <= self.upper_tail_s and (role, t.candidate, t.layers) not in skip]
                      for role, ts in types.items()}
        if self.lower_tail_s is not None and not any(t.tail_s > self.lower_tail_s for ts in self.types.values()
                                                     for t in ts):
            self.types = {}  # no stage type has a tail in the window: nothing to plan
        if self.empty or p.max_stages < 2:
            return self
        m, R, tick = p.num_micro_batches, p.max_stages, o.tick_s
        gpipe = p.schedule == "gpipe"
        fl = lambda t: math.floor(t / tick + 1e-9)  # noqa: E731  lower-bound rounding
        ce = lambda t: math.ceil(t / tick - 1e-9)  # noqa: E731  upper-bound rounding
        cands = p.candidates
        mids, firsts, lasts = self.types["mid"], self.types["first"], self.types["last"]
        # upper bound on every time-valued auxiliary: the cutoff (objective of a known plan) when
        # there is one; tight bounds keep LP-based solvers out of numerical trouble
        big_t = ce(o.cutoff_s) + 1 if o.cutoff_s else 2**40
        tl = fl(self.lower_tmax_s)

        for si, t in enumerate(mids):
            c = cands[t.candidate]
            ub = min(p.island_gpus[c.island] // c.gpus, p.layers[p.kinds[-1]] // max(1, t.num_layers), R - 2)
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

        for k in p.kinds:
            expr = LinExpr()
            for si, var in self.n.items():
                expr.add_term(var, mids[si].layer_dict.get(k, 0))
            for si, var in self.e.items():
                expr.add_term(var, firsts[si].layer_dict.get(k, 0))
            for si, var in self.h.items():
                expr.add_term(var, lasts[si].layer_dict.get(k, 0))
            md.add(expr == p.layers[k], f"layers[{k}]")

        islands = sorted(p.island_gpus)
        for i in islands:
            expr = LinExpr()
            for group, tys in ((self.n, mids), (self.e, firsts), (self.h, lasts)):
                for si, var in group.items():
                    c = cands[tys[si].candidate]
                    if c.island == i:
                        expr.add_term(var, c.gpus)
            md.add(expr <= p.island_gpus[i], f"gpus[{i}]")

        # positions: P = 2 + n_mid <= R; memory by Hall's condition; first stage at distance P - 1
        md.add(n_mid <= R - 2, "max_stages")
        if p.min_stages > 2:
            md.add(n_mid >= p.min_stages - 2, "min_stages")
        if not gpipe:
            for q in range(2, min(m, R)):
                few = [var for si, var in self.n.items() if mids[si].tolerance <= q]
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
                if fl(mids[si].time_s) > tl:
                    md.add(Constraint({Tmax.index: 1.0, ov.index: -float(fl(mids[si].time_s))}, 0.0, math.inf),
                           f"Tmax[{si}]")  # Tmax >= T_s o_s
            for group, tys, nm in ((self.e, firsts, "first"), (self.h, lasts, "last")):
                md.add(Tmax >= lsum(fl(tys[si].time_s) * var for si, var in group.items()), f"Tmax_{nm}")
            bottleneck = LinExpr.of(Tmax)
        if not gpipe and o.mccormick_cuts:
            # per candidate c: every stage using c takes at most Tmax, so sum_stages T <= Tmax * N_c.
            # McCormick over Tmax in [tl, inf) and N_c in [0, U_c] linearizes the product:
            # sum_stages T <= tl * N_c + U_c * (Tmax - tl)
            per_cand: dict[int, LinExpr] = {}
            count: dict[int, LinExpr] = {}
            for group, tys in ((self.n, mids), (self.e, firsts), (self.h, lasts)):
                for si, var in group.items():
                    ci = tys[si].candidate
                    per_cand.setdefault(ci, LinExpr()).add_term(var, fl(tys[si].time_s))
                    count.setdefault(ci, LinExpr()).add_term(var, 1)
            for ci, expr in per_cand.items():
                c = cands[ci]
                u_c = min(p.island_gpus[c.island] // c.gpus, R)
                md.add(expr <= tl * count[ci] + u_c * (Tmax - tl), f"mccormick[{ci}]")
        c_min = fl(min(p.link_lo_s.values()))
        # Smax: the steady period per micro-batch; the window [lo, hi] applies to it (Tmax <= Smax)
        Smax = self.aux["Smax"] = md.add_var("Smax", max(tl, c_min) if not gpipe else c_min,
                                             ce(hi) if math.isfinite(hi) else big_t, integer=True)
        md.add(Smax >= bottleneck, "Smax")

        if o.fluid_cuts:
            for i in islands:
                expr = LinExpr()
                for group, tys in ((self.n, mids), (self.e, firsts), (self.h, lasts)):
                    for si, var in group.items():
                        t = tys[si]
                        c = cands[t.candidate]
                        if c.island == i:
                            expr.add_term(var, c.gpus * fl(t.time_s))
                md.add(expr <= p.island_gpus[i] * Smax, f"fluid[{i}]")

        # p2p: a[i, j] counts pipeline boundaries from a stage on island i to one on island j. Every
        # stage but the last sends once and every stage but the first receives once, so for any
        # order of the chosen stages the true counts satisfy these degree equations; total p2p time
        # is then exactly sum c_ij a_ij (a relaxation only in that the path itself is not enforced).
        isl_of = lambda tys, si: cands[tys[si].candidate].island  # noqa: E731
        on_island = {i: LinExpr() for i in islands}
        first_on = {i: LinExpr() for i in islands}
        last_on = {i: LinExpr() for i in islands}
        for group, tys in ((self.e, firsts), (self.n, mids), (self.h, lasts)):
            for si, var in group.items():
                i = isl_of(tys, si)
                on_island[i].add_term(var, 1)
                if group is self.e:
                    first_on[i].add_term(var, 1)
                if group is self.h:
                    last_on[i].add_term(var, 1)
        self.a = {(i, j): md.add_var(f"a[{i},{j}]", 0, R, integer=True) for i in islands for j in islands}
        for i in islands:
            md.add(lsum(self.a[i, j] for j in islands) == on_island[i] - last_on[i], f"out[{i}]")
            md.add(lsum(self.a[j, i] for j in islands) == on_island[i] - first_on[i], f"in[{i}]")
            # a path has at most n_i - 1 boundaries inside island i (no self-loop on a lone stage)
            yi = self.aux[f"on[{i}]"] = md.add_binary(f"on[{i}]")
            md.add(on_island[i] <= R * yi, f"on_def[{i}]")
            md.add(yi <= on_island[i], f"on_def2[{i}]")
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
        side_lo = lambda tys, si: fl(p.side_bounds_s(cands[tys[si].candidate])[0])  # noqa: E731
        mid_sides = lsum(side_lo(mids, si) * var for si, var in self.n.items())
        md.add(Cm >= latency + lsum(side_lo(firsts, si) * var for si, var in self.e.items()) + mid_sides, "comm_send")
        md.add(Cm >= latency + lsum(side_lo(lasts, si) * var for si, var in self.h.items()) + mid_sides, "comm_recv")
        sent_ub = Cm + n_mid + 1  # P - 1 boundaries
        # a link used at all bounds the period (each direction carries one transfer per micro-batch),
        # and so does the block of the two stages it joins: 2 Smax >= T_a + T_b + 2 c_ij, with
        # T_a, T_b at least the fastest stage used on their islands (tmin[i])
        tmin: dict[int, Var] = {}
        if not gpipe and m > 2 and math.isfinite(hi):
            big_s = ce(hi)
            for i in islands:
                tv = tmin[i] = self.aux[f"tmin[{i}]"] = md.add_var(f"tmin[{i}]", 0, big_s, integer=True)
                for role, group, tys in (("first", self.e, firsts), ("last", self.h, lasts), ("mid", self.o, mids)):
                    for si, var in group.items():
                        if isl_of(tys, si) == i:
                            # tmin[i] <= T_s + big (1 - used_s)
                            md.add(Constraint({tv.index: 1.0, var.index: float(big_s)}, -math.inf,
                                              float(fl(tys[si].time_s) + big_s)), f"tmin_def[{i},{role}{si}]")
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
        for role, group, tys in (("first", self.e, firsts), ("last", self.h, lasts), ("mid", self.o, mids)):
            for si, var in group.items():
                c_own = fl(self._link_floor_s(tys[si]))
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
        if not gpipe and m > 2 and math.isfinite(hi):
            # two neighbours a, b form a block: lambda >= (T_a + T_b) / 2 + c_ab. Inside the window
            # (lambda <= hi) they are compatible only if T_a + T_b + 2 c_ab <= 2 hi. A set H of
            # pairwise incompatible stages has every neighbour in L(H), the stages compatible with
            # some member of H; counting the edges between them (an end of the path has one
            # neighbour, any other stage two): 2 n_H + e_H + h_H <= 2 n_L + e_L + h_L. The sets H
            # are {w > theta} with w = T + cmin_i (cmin_i: the cheapest link touching the stage's
            # island) and theta >= hi, which makes them pairwise incompatible since c_ab >= cmin.
            cmin, cpair = self._link_minima()
            entries: list[tuple[float, float, int, int, Var]] = []  # (w, T, island, ends, var)
            for group, tys in ((self.n, mids), (self.e, firsts), (self.h, lasts)):
                ends = 0 if group is self.n else 1
                for si, var in group.items():
                    i = isl_of(tys, si)
                    entries.append((tys[si].time_s + max(cmin[i], self._link_floor_s(tys[si])), tys[si].time_s, i,
                                    ends, var))
            heavy_w = sorted({w for w, *_ in entries if w > hi * (1 + 1e-9)})
            thetas = [hi] + heavy_w[:-1][::max(1, len(heavy_w) // NEIGHBOUR_THRESHOLDS)]
            slack = 2 * hi * 1e-9
            for q, theta in enumerate(thetas):
                heavy = [e_ for e_ in entries if e_[0] > theta * (1 + 1e-9)]
                if not heavy:
                    continue
                t_min = {}  # fastest heavy stage per island: compatibility with H is compatibility with it
                for _, t, i, _, _ in heavy:
                    t_min[i] = min(t, t_min.get(i, math.inf))
                limit, sandwich = self._compatible_limits(t_min, cpair)
                light = [e_ for e_ in entries if e_[0] <= theta * (1 + 1e-9) and e_[1] <= limit[e_[2]]]
                self._neighbour_row(md, entries, heavy, light, sandwich, f"neighbours[{q}]", cpair, hi + slack / 2)
                if len(t_min) < 2 or not NEIGHBOUR_PER_ISLAND:
                    continue
                # any subset of H is pairwise incompatible too: the heavy stages of one island i
                # (w = T + c_ii there) and the stages compatible with its fastest one, which
                # leaves out the stages only some other island's heavy stages could neighbour
                for i in islands:
                    inside = [e_[2] == i and e_[1] + p.link_lo_s[i, i] > theta * (1 + 1e-9) for e_ in entries]
                    heavy_i = [e_ for e_, h in zip(entries, inside) if h]
                    if not heavy_i:
                        continue
                    tm = min(e_[1] for e_ in heavy_i)
                    light_i = [e_ for e_, h in zip(entries, inside)
                               if not h and tm + e_[1] + 2 * cpair[i, e_[2]] <= 2 * hi + slack]
                    sandwich_i = {j: 3 * hi + slack - 2 * tm - 4 * cpair[i, j] for j in islands}
                    self._neighbour_row(md, entries, heavy_i, light_i, sandwich_i if m > 3 else None,
                                        f"neighbours[{q},{i}]", cpair, hi + slack / 2)
        # a lower bound on the link out of a stage of each candidate used (ticks)
        out_min = {i: fl(min(p.link_lo_s[i, j] for j in islands)) for i in islands}
        out_lo = {t.candidate: max(out_min[cands[t.candidate].island], fl(self._link_floor_s(t)))
                  for ts in self.types.values() for t in ts}

        # step tail: Y >= tail_k - (backward + p2p time upstream of stage k). The first stage has
        # nothing upstream; for any other stage the upstream time is at most every stage's
        # backward except its own and the last stage's, plus every link at its slowest. Backward
        # and link times are rounded up, so each constraint is a valid lower bound on the exact Y.
        Y = self.aux["Y"] = md.add_var("Y", 0, big_t, integer=True)
        first_bwd = lsum(ce(firsts[si].bwd_s) * var for si, var in self.e.items())
        mid_bwd = lsum(ce(mids[si].bwd_s) * var for si, var in self.n.items())
        md.add(Y >= lsum(fl(firsts[si].tail_s) * var for si, var in self.e.items()), "tail_first")
        U = self.aux["U"] = md.add_var("U", 0, big_t, integer=True)  # upper bound on any upstream time
        md.add(U == first_bwd + mid_bwd + sent_ub, "upstream")
        md.add(Y >= lsum(fl(lasts[si].tail_s) * var for si, var in self.h.items()) - U, "tail_last")
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
        if self.lower_tail_s is not None:
            self._tail_window_rows(md, Y, sent_ub, fl, ce, out_lo,
                                   successors=o.order_rows and not gpipe and m > 2 and math.isfinite(hi))

        md.minimize((m - 1) * Smax + total_T_expr(self, fl) + 2 * Cm + Y)
        return self

    def _cycle_rows(self, first: int, last: int, relax: LinExpr, tag: str) -> None:
        """The whole-pipeline block ``Smax * P >= sum T + 2 sum c`` for P = 2 + n_mid in
        [first, last], with McCormick's over-estimators of ``Smax * P`` on Smax in [lo, hi]:
        (P - first)(hi - Smax) >= 0 and (last - P)(Smax - lo) >= 0 (``relax`` switches the rows
        off where they do not hold); and the same block without the first (or the last) stage,
        P - 1 stages, which matters when that end stage is much faster than the rest (a small
        first stage is common). The end stage's time is taken out rounded up, and so is its
        link, at the slowest link leaving (entering) its island."""
        p, md, tick = self.problem, self.model, self.options.tick_s
        fl = lambda t: math.floor(t / tick + 1e-9)  # noqa: E731
        ce = lambda t: math.ceil(t / tick - 1e-9)  # noqa: E731
        islands = sorted(p.island_gpus)
        cands = p.candidates
        Smax, Cm = self.aux["Smax"], self.aux["Cm"]
        lo_t, hi_t = max(fl(self.lower_tmax_s), fl(min(p.link_lo_s.values()))), ce(self.upper_tmax_s)
        n_mid = lsum(self.n.values())
        round_trip = total_T_expr(self, fl) + 2 * Cm
        md.add(hi_t * (2 + n_mid) + first * Smax - first * hi_t + relax >= round_trip, f"cycle_hi{tag}")
        md.add(lo_t * (2 + n_mid) + last * Smax - last * lo_t + relax >= round_trip, f"cycle_lo{tag}")
        c_out = {i: ce(max(p.link_hi_s[i, j] for j in islands)) for i in islands}
        c_in = {i: ce(max(p.link_hi_s[j, i] for j in islands)) for i in islands}
        for end, group, tys, link in (("first", self.e, self.types["first"], c_out),
                                      ("last", self.h, self.types["last"], c_in)):
            trimmed = round_trip - lsum((ce(tys[si].time_s) + 2 * link[cands[tys[si].candidate].island]) * var
                                        for si, var in group.items())
            md.add(hi_t * (1 + n_mid) + (first - 1) * Smax - (first - 1) * hi_t + relax >= trimmed,
                   f"cycle_{end}_hi{tag}")
            md.add(lo_t * (1 + n_mid) + (last - 1) * Smax - (last - 1) * lo_t + relax >= trimmed,
                   f"cycle_{end}_lo{tag}")

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

    def _link_minima(self) -> tuple[dict[int, float], dict[tuple[int, int], float]]:
        """``cmin[i]``: the cheapest link touching island i (either direction); ``cpair[i, j]``: the
        cheaper direction of the link between islands i and j."""
        p = self.problem
        islands = sorted(p.island_gpus)
        cpair = {(i, j): min(p.link_lo_s[i, j], p.link_lo_s[j, i]) for i in islands for j in islands}
        return {i: min(cpair[i, j] for j in islands) for i in islands}, cpair

    def _link_floor_s(self, t: StageType) -> float:
        """A lower bound on every link of a stage of type ``t``: its island's smallest latency plus
        its own side (a boundary takes at least either side's time)."""
        p = self.problem
        c = p.candidates[t.candidate]
        return p.latency_lo_s(c.island) + p.side_bounds_s(c)[0]

    def _compatible_limits(self, t_min: dict[int, float], cpair: dict[tuple[int, int], float]
                           ) -> tuple[dict[int, float], dict[int, float] | None]:
        """For a pairwise incompatible set H with fastest member ``t_min[i]`` per island: a stage on
        island j can neighbour some member of H iff its time is at most ``limit[j]``; a middle stage
        between two members forms a block of three with them, so it can have two neighbours in H only
        if its time is at most ``sandwich[j]`` (None when m <= 3: that block does not count)."""
        hi = self.upper_tmax_s
        slack = 2 * hi * 1e-9
        islands = sorted(self.problem.island_gpus)
        limit = {j: max(2 * hi + slack - tm - 2 * cpair[i, j] for i, tm in t_min.items()) for j in islands}
        if self.problem.num_micro_batches <= 3:
            return limit, None
        sandwich = {j: max(3 * hi + slack - t1 - t2 - 2 * cpair[i1, j] - 2 * cpair[i2, j]
                           for i1, t1 in t_min.items() for i2, t2 in t_min.items()) for j in islands}
        return limit, sandwich

    def _neighbour_row(self, md: LinearModel, entries: list, heavy: list, light: list,  # type: ignore[type-arg]
                       sandwich: dict[int, float] | None, name: str, cpair: dict[tuple[int, int], float],
                       hi: float) -> None:
        """Edges between H and L(H) counted from both sides over entries (w, T, island, ends, var):
        2 n_H + e_H + h_H <= sum over L of (2 n + e + h), a middle stage of L counting once only
        when its time is above ``sandwich[island]`` (it cannot sit between two heavy stages).

        The other stages (set M: neither in H nor compatible with any of it) have all their
        neighbours outside H. A maximal run of M stages on the path that does not hold an end of
        the path has two boundary edges, both into L (one if it holds an end). So when some M
        stage exists (binary ``medium``), L's edges feed H and at least one run. An end stage of M
        that no other stage of M can neighbour is a run alone, with one edge into L:
        2 n_H + e_H + h_H + 2 medium + (isolated ends of M) - (other ends of M) <= sum over L of (2 n + e + h),
        ``medium`` counting middle stages of M only."""
        # dense rows (every type of the window): coefficient dicts built directly, not through
        # LinExpr arithmetic, which copies them at every operation
        row = {var.index: 2.0 - ends for _, _, _, ends, var in heavy}
        full = dict(row)
        for _, t, j, ends, var in light:
            row[var.index] = -1.0 if ends or (sandwich is not None and t > sandwich[j]) else -2.0
            full[var.index] = -1.0 if ends else -2.0
        md.add(Constraint(row, -math.inf, 0.0), name)
        if not heavy:
            return
        taken = {id(e_) for e_ in heavy} | {id(e_) for e_ in light}
        medium = [e_ for e_ in entries if id(e_) not in taken]
        if not self.options.order_rows or not medium:
            return
        tag = name[len("neighbours"):]
        # an end stage of M compatible with no other stage of M (no middle one, not the other
        # end) is a run of its own, with one boundary edge into L
        first_cols = {v.index for v in self.e.values()}
        role = lambda var, ends: "mid" if not ends else "first" if var.index in first_cols else "last"  # noqa: E731
        fastest: dict[tuple[str, int], float] = {}  # (role, island) -> fastest time in M
        for _, t, j, ends, var in medium:
            key = (role(var, ends), j)
            fastest[key] = min(t, fastest.get(key, math.inf))
        partner = {"first": ("mid", "last"), "last": ("mid", "first")}
        mids_m: dict[int, float] = {}
        for _, t, j, ends, var in medium:
            if not ends:
                mids_m[var.index] = 1.0
                continue
            alone = all(t + tm + 2 * cpair[j, i] > 2 * hi for (r, i), tm in fastest.items()
                        if r in partner[role(var, ends)])
            full[var.index] = 1.0 if alone else -1.0
        if mids_m:
            # u = 1 as soon as a middle stage of M is used (integrality does the rest): one row
            # instead of one per type of M
            u = md.add_binary(f"medium{tag}")
            md.add(Constraint({**mids_m, u.index: -float(self.problem.max_stages)}, -math.inf, 0.0), f"medium_def{tag}")
            full[u.index] = 2.0
            self.medium.append((u, frozenset(mids_m)))
        md.add(Constraint(full, -math.inf, 0.0), f"neighbours_medium{tag}")

    def _tail_window_rows(self, md: LinearModel, Y: Var, sent_ub: LinExpr, fl, ce,  # type: ignore[no-untyped-def]
                          out_lo: dict[int, int], *, successors: bool) -> None:
        """Rows of a window that holds only plans with some stage's tail above ``lower_tail_s``.

        Then, for every theta <= lower_tail_s, some stage has a tail above theta; the most upstream
        such stage k has only stages with tails <= theta upstream of it (never the last stage), so
        Y >= tail_k - U_k >= (least tail above theta) - (backward of the stages with tails <= theta
        + every link), and every link leaving a stage with a tail above theta is downstream of k.
        Several theta are used, from lower_tail_s down to 0: with theta just below the window, a
        stage whose tail is a little smaller than the window's lower edge is not counted as
        upstream cover, and lower ones ask the same of the cover's cover.

        With ``successors`` (1F1B, m > 2, a finite window), the stages with a tail above the window
        that are also too slow to neighbour each other within the window (set S) each have a
        successor outside S, downstream of k as well: the last stage, a middle stage with a tail
        above theta_min (no credit taken for it: it may be cover in some rows), or a middle stage
        with a smaller tail compatible with S, which is cover in every row. Counting edges instead
        of successors: every edge of S but the left one of its most upstream member goes to a
        stage downstream of that member, at most two per middle stage (one for the last stage, or
        for a middle stage too slow to sit between two members of S). Continuous ``succ[s]`` (at
        most n[s]) count the middle stages of type s with small tails next to a member of S and
        downstream of the first one (rows ``successors`` and ``successor_edges``), and each takes
        its backward and out-link off the cover of every row."""
        entries = []  # (tail, backward ticks rounded up, role, var, type, type index)
        for role, group in (("first", self.e), ("mid", self.n), ("last", self.h)):
            for si, var in group.items():
                t = self.types[role][si]
                entries.append((t.tail_s, ce(t.bwd_s), role, var, t, si))
        lower = self.lower_tail_s
        assert lower is not None
        heavy = LinExpr()
        for tail, _, _, var, _, _ in entries:
            if tail > lower:
                heavy.add_term(var, 1)
        if not heavy.coefs:  # no stage type above the threshold can be used: nothing in the window
            md.add(LinExpr() >= 1, "tail_window")
            return
        md.add(heavy >= 1, "tail_window")
        # theta from lower down to 0 in even steps (a theta between two tails is as good
        # as the next tail below it)
        thetas = sorted({lower * (1 - q / TAIL_WINDOW_ROWS) for q in range(TAIL_WINDOW_ROWS + 1)}, reverse=True)
        theta_min = 0.5 * lower
        succ_term = self._successor_term(md, entries, theta_min, out_lo, fl) if successors else LinExpr()
        succ_tail = {z.index: self.types["mid"][si].tail_s for si, z in self.succ.items()}
        # Y + cover - (downstream links) >= least, as a coefficient dict
        base = {i: c for i, c in sent_ub.coefs.items()}
        base[Y.index] = base.get(Y.index, 0.0) + 1.0
        not_last = [(tail, bwd, var.index, out_lo[t.candidate]) for tail, bwd, role, var, t, _ in entries
                    if role != "last"]
        for q, theta in enumerate(thetas):
            least = min(e_[0] for e_ in entries if e_[0] > theta)
            row = dict(base)
            # successors take their backward and out-link off the cover: only those counted as
            # cover in this row (tail <= theta; below theta_min some successor types are not)
            for i, c in succ_term.coefs.items():
                if succ_tail[i] <= theta:
                    row[i] = row.get(i, 0.0) - c
            for tail, bwd, vi, out in not_last:
                # cover if its tail is at most theta; else downstream of k (or k itself), so its
                # out-link is not cover
                row[vi] = bwd if tail <= theta else (-out if self.options.order_rows else 0.0)
            md.add(Constraint(row, float(fl(least) - sent_ub.const + succ_term.const), math.inf), f"tail_window_Y[{q}]")

    def _successor_term(self, md: LinearModel, entries: list, theta_min: float,  # type: ignore[type-arg]
                        out_lo: dict[int, int], fl) -> LinExpr:  # type: ignore[no-untyped-def]
        """sum_s (B_s + out-link) succ[s] over the successors of the slow large-tail stages (see
        ``_tail_window_rows``); empty when no such middle stage can exist."""
        p = self.problem
        cands = p.candidates
        hi = self.upper_tmax_s
        lower = self.lower_tail_s
        isl = lambda t: cands[t.candidate].island  # noqa: E731
        cmin, cpair = self._link_minima()
        in_s = [tail > lower and t.time_s + max(cmin[isl(t)], self._link_floor_s(t)) > hi * (1 + 1e-9)
                for tail, _, _, _, t, _ in entries]
        if not any(s and role == "mid" for s, (_, _, role, *_) in zip(in_s, entries)):
            return LinExpr()
        t_min: dict[int, float] = {}  # fastest member of S per island
        for s, (_, _, _, _, t, _) in zip(in_s, entries):
            if s:
                t_min[isl(t)] = min(t.time_s, t_min.get(isl(t), math.inf))
        limit, sandwich = self._compatible_limits(t_min, cpair)
        need = LinExpr()  # members of S in the middle, less the successors that need no variable
        edges = LinExpr()  # edges of S beyond the first member's left one, less those of free neighbours
        edges.const = -1.0
        term = LinExpr()
        for s, (tail, _, role, var, t, si) in zip(in_s, entries):
            if s:
                self.succ_heavy.add((role, si))
                edges.add_term(var, 2 if role == "mid" else 1)
            compatible = t.time_s <= limit[isl(t)]
            two = 1 if sandwich is not None and t.time_s > sandwich[isl(t)] else 2
            if role == "mid" and s:
                need.add_term(var, 1)
            elif role == "last" and not s:
                need.add_term(var, -1)
                if compatible:
                    edges.add_term(var, -1)
            elif role == "mid" and tail > theta_min:
                need.add_term(var, -1)  # may be a successor, but earns no credit (no variable)
                if compatible:
                    edges.add_term(var, -two)
            elif role == "mid" and compatible:
                z = md.add_var(f"succ[{var.name}]", 0, var.ub)
                md.add(z <= var, f"succ_ub[{var.name}]")
                self.succ[si] = z
                need.add_term(z, -1)
                edges.add_term(z, -two)
                term.add_term(z, fl(t.bwd_s) + out_lo[t.candidate])
        md.add(need <= 0, "successors")
        md.add(edges <= 0, "successor_edges")
        return term

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


def total_T_expr(mip: AggregatedMIP, fl) -> LinExpr:  # type: ignore[no-untyped-def]
    """Sum over the chosen stages of their forward+backward time (rounded down to ticks)."""
    e = LinExpr()
    for group, tys in ((mip.n, mip.types["mid"]), (mip.e, mip.types["first"]), (mip.h, mip.types["last"])):
        for si, var in group.items():
            e.add_term(var, fl(tys[si].time_s))
    return e


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


def best_order(problem: PipelineProblem, first: StageType, mids: list[StageType], last: StageType) -> list[StageChoice]:
    """:func:`try_order` for a solution of the aggregated model, which always has a feasible order."""
    out = try_order(problem, first, mids, last)
    assert out is not None, "Hall's condition guarantees the memory order is feasible"
    return out


def try_order(problem: PipelineProblem, first: StageType, mids: list[StageType],
              last: StageType, *, polish_split: bool = True) -> list[StageChoice] | None:
    """Order the middle stages and polish the layer split on the exact objective (None if no
    order tried fits memory, the first stage's position included; ``polish_split=False``: the
    best order as is).

    Orders tried: island blocks in every island order (within a block, most memory-tolerant first,
    or largest step tail last), the pure memory order (always feasible by Hall's condition),
    increasing tail (repaired for memory) and two orders interleaving small and large stages.
    The best memory-feasible order is then improved by moving single layers between neighbouring
    stages while the exact step time drops (memory re-checked at every move).
    """
    cands = problem.candidates
    m = problem.num_micro_batches
    P = len(mids) + 2
    gpipe = problem.schedule == "gpipe"

    def feasible(order: list[StageType]) -> bool:
        if gpipe:
            return True
        for k, t in enumerate(order):
            r = P - 2 - k  # distance from the end of middle stage k (pipeline index k + 1)
            if t.tolerance < min(r + 1, m):
                return False
        return True

    keys = (lambda t: -t.tolerance, lambda t: (t.tail_s - t.bwd_s, -t.tolerance))
    orders: list[list[StageType]] = [sorted(mids, key=keys[0]), _tail_order(mids, m)] + [
        _interleaved_order(problem, first, mids, last, prefer_heavy=h) for h in (True, False)]
    islands = sorted({cands[t.candidate].island for t in mids})
    if len(islands) <= 5:
        for perm in itertools.permutations(islands):
            for key in keys:
                orders.append([t for i in perm for t in sorted(
                    (t for t in mids if cands[t.candidate].island == i), key=key)])
    best, best_t = None, math.inf
    for order in orders:
        if not feasible(order):
            continue
        stages = [StageChoice(candidate=t.candidate, layers=t.layer_dict) for t in [first, *order, last]]
        t = _exact(problem, stages)
        if t < best_t:
            best, best_t = stages, t
    if best is None or (not gpipe and first.tolerance < min(P, m)):
        return None
    return polish(problem, best) if polish_split else best


def _tail_order(mids: list[StageType], m: int) -> list[StageType]:
    """Middle stages by increasing step tail, repaired for memory.

    Without memory limits, increasing tail order minimizes the exposed tail
    ``max_k (tail_k - upstream_k)`` (exchange argument: of two neighbours, the one with the smaller
    tail goes first). Positions are filled from the end: at each distance the stage whose
    tolerance forces it there goes first, otherwise the largest remaining tail; this is feasible
    whenever Hall's condition holds.
    """
    left = sorted(mids, key=lambda t: (t.tail_s, t.tolerance))
    placed: list[StageType] = []  # from the end
    r = 1
    while left:
        need = min(r + 1, m)
        forced = [t for t in left if t.tolerance <= need]
        pick = max(forced, key=lambda t: t.tail_s) if forced else left[-1]
        left.remove(pick)
        placed.append(pick)
        r += 1
    return placed[::-1]


def _interleaved_order(problem: PipelineProblem, first: StageType, mids: list[StageType], last: StageType,
                       prefer_heavy: bool) -> list[StageType]:
    """Middle stages ordered so that neighbours fit the period: the two-stage block
    ``(T_a + T_b) / 2 + c_ab`` of each boundary stays within the slowest stage time if it can.

    Built from the end (memory: a stage whose tolerance forces it to the current distance goes
    there): next to the stage just placed, the heaviest (``prefer_heavy``) or the lightest remaining
    stage whose block with it fits; if none fits, the lightest. Heavy stages end up separated by
    light ones, which is what the ``neighbours`` rows of the model allow.
    """
    cands = problem.candidates
    m = problem.num_micro_batches
    target = max(t.time_s for t in [first, *mids, last])

    def block(a: StageType, b: StageType) -> float:
        return (a.time_s + b.time_s) / 2 + problem.boundary_s(cands[a.candidate], cands[b.candidate])

    left = list(mids)
    placed: list[StageType] = []  # from the end
    nxt = last
    r = 1
    while left:
        need = min(r + 1, m)
        pool = [t for t in left if t.tolerance <= need] or left
        fit = [t for t in pool if block(t, nxt) <= target * (1 + 1e-12)]
        if fit:
            pick = (max if prefer_heavy else min)(fit, key=lambda t: t.time_s)
        else:
            pick = min(pool, key=lambda t: block(t, nxt))
        left.remove(pick)
        placed.append(pick)
        nxt = pick
        r += 1
    return placed[::-1]


def _exact(problem: PipelineProblem, stages: Sequence[StageChoice]) -> float:
    cands = problem.candidates
    return pipeline_timing([(cands[s.candidate], s.layers) for s in stages], problem.boundaries_s(stages),
                           problem.num_micro_batches, problem.schedule).step_time_s


def _fits(problem: PipelineProblem, stages: Sequence[StageChoice]) -> bool:
    cands = problem.candidates
    P, m = len(stages), problem.num_micro_batches
    for k, st in enumerate(stages):
        if sum(st.layers.values()) < 1:
            return False
        inflight = m if problem.schedule == "gpipe" else min(P - k, m)
        c = cands[st.candidate]
        if c.memory_bytes(st.layers, inflight, first=k == 0, last=k == P - 1) > c.capacity_bytes:
            return False
    return True


def reorder(problem: PipelineProblem, stages: list[StageChoice], max_evals: int = 800) -> list[StageChoice]:
    """Local search over the order of the middle stages: swap two of them while the exact step
    time drops and memory still fits (first-improvement, at most ``max_evals`` evaluations).

    It complements the constructed orders of :func:`try_order` on a window's best solution, where
    blocks, links and tails interact in ways no single construction rule covers.
    """
    cur = list(stages)
    cur_t = _exact(problem, cur)
    evals = 0
    improved = True
    while improved and evals < max_evals:
        improved = False
        for a in range(1, len(cur) - 2):
            for b in range(a + 1, len(cur) - 1):
                if cur[a].candidate == cur[b].candidate and cur[a].layers == cur[b].layers:
                    continue
                trial = list(cur)
                trial[a], trial[b] = trial[b], trial[a]
                if not _fits(problem, trial):
                    continue
                evals += 1
                t = _exact(problem, trial)
                if t < cur_t * (1 - 1e-12):
                    cur, cur_t, improved = trial, t, True
                if evals >= max_evals:
                    return cur
    return cur


def polish(problem: PipelineProblem, stages: list[StageChoice], max_rounds: int = 200) -> list[StageChoice]:
    """Local search on the exact step time: move one layer across a stage boundary while it helps.

    Layers keep their model order (a layer moves from the end of one stage to the start of the
    next, or back), so dense-first order is preserved.
    """
    cur = [StageChoice(candidate=s.candidate, layers=dict(s.layers)) for s in stages]
    cur_t = _exact(problem, cur)
    kinds = problem.kinds
    for _ in range(max_rounds):
        improved = False
        for k in range(len(cur) - 1):
            for direction in (1, -1):
                src, dst = (k, k + 1) if direction == 1 else (k + 1, k)
                # the layer crossing the boundary: last layer of stage k, or first of stage k + 1
                kind = next((kd for kd in reversed(kinds) if cur[k].layers.get(kd, 0)), None) if direction == 1 \
                    else next((kd for kd in kinds if cur[k + 1].layers.get(kd, 0)), None)
                if kind is None or cur[src].layers.get(kind, 0) < 1:
                    continue
                trial = [StageChoice(candidate=s.candidate, layers=dict(s.layers)) for s in cur]
                trial[src].layers[kind] -= 1
                trial[dst].layers[kind] = trial[dst].layers.get(kind, 0) + 1
                if not _fits(problem, trial):
                    continue
                t = _exact(problem, trial)
                if t < cur_t * (1 - 1e-12):
                    cur, cur_t, improved = trial, t, True
        if not improved:
            break
    return cur


def support_class_best(problem: PipelineProblem, mip: AggregatedMIP, values: Sequence[float],
                       max_orders: int = 5000) -> tuple[float, list[StageChoice] | None] | None:
    """Exact best plan of the *support class* of a solution: the same first and last stage types
    and the same set of middle types, in any counts and any order (GPU budgets, stage limits and
    memory at every position checked exactly; the bottleneck window is not imposed, so the value
    is a lower bound over the class inside any window).

    Returns (step time, plan) — (inf, None) when no plan of the class fits — or None when the class
    has more than ``max_orders`` orders to evaluate. The search cuts off a class whose best is
    known (:meth:`AggregatedMIP.cut_support`), so the model's next optimum bounds the rest.
    """
    cands = problem.candidates
    first, _, last = mip.stage_multiset(values)
    support = [si for si, v in mip.n.items() if values[v.index] > 0.5]
    mids = [mip.types["mid"][si] for si in support]
    need = {k: problem.layers[k] - first.layer_dict.get(k, 0) - last.layer_dict.get(k, 0) for k in problem.kinds}
    used_gpus: dict[int, int] = {}
    for t in (first, last):
        c = cands[t.candidate]
        used_gpus[c.island] = used_gpus.get(c.island, 0) + c.gpus
    R = problem.max_stages
    counts: list[list[int]] = []

    def fill(k: int, left: dict[str, int], gpus: dict[int, int], stages: int, cur: list[int]) -> None:
        if len(counts) > max_orders:  # each count vector has at least one order: too large already
            return
        if k == len(mids):
            if all(v == 0 for v in left.values()) and 2 + stages >= problem.min_stages:
                counts.append(list(cur))
            return
        t = mids[k]
        c = cands[t.candidate]
        n = 1
        while True:
            rest = {kd: left[kd] - n * t.layer_dict.get(kd, 0) for kd in left}
            g = gpus.get(c.island, 0) + n * c.gpus
            if min(rest.values()) < 0 or g > problem.island_gpus[c.island] or 2 + stages + n > R:
                break
            fill(k + 1, rest, {**gpus, c.island: g}, stages + n, cur + [n])
            n += 1

    fill(0, need, used_gpus, 0, [])
    # distinct orders of each count vector: (sum n)! / prod n!; give up before evaluating any
    orders = 0
    for cnt in counts:
        orders += math.factorial(sum(cnt)) // math.prod(math.factorial(n) for n in cnt)
        if orders > max_orders:
            return None
    best: tuple[float, list[StageChoice] | None] = (math.inf, None)
    for cnt in counts:
        pool = [t for t, n in zip(mids, cnt) for _ in range(n)]
        for order in _distinct_orders(pool):
            stages = [StageChoice(candidate=t.candidate, layers=t.layer_dict) for t in [first, *order, last]]
            if not _fits(problem, stages):
                continue
            t_exact = _exact(problem, stages)
            if t_exact < best[0]:
                best = (t_exact, stages)
    return best


def _distinct_orders(pool: list[StageType]):  # type: ignore[no-untyped-def]
    """Every distinct order of a multiset of stage types (copies of one type are interchangeable)."""
    keys = sorted({id(t): t for t in pool}.values(), key=lambda t: (t.candidate, t.layers))
    left = [sum(1 for p in pool if p is t) for t in keys]
    cur: list[StageType] = []

    def rec():  # type: ignore[no-untyped-def]
        if len(cur) == len(pool):
            yield list(cur)
            return
        for i, t in enumerate(keys):
            if left[i]:
                left[i] -= 1
                cur.append(t)
                yield from rec()
                cur.pop()
                left[i] += 1

    yield from rec()
