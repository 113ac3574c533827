"""The sequence model: one period window and one stage count, exact in the order of the stages
(formulations/pipeline_mip.md §3b).

The aggregated model (aggregated.py) chooses a multiset of stage types and relaxes their order:
blocks of neighbouring stages, the step tail (a stage's gradient sync hides behind the backward
passes *upstream* of it) and memory by position are only bounded by counting rows. Near the
optimum that relaxation can be several percent loose, and cutting off one multiset at a time
does not close it (near-identical multisets follow). This model places a stage type at each of
the ``P`` positions instead (``x[k, j]``: position ``k`` holds type ``j`` of its list), so every
term of the closed form of pipeline_model.py is linear and exact:

- memory: position ``k`` lists only types that fit with ``min(P - k, m)`` micro-batches in flight;
- links: ``y[k, i, j]`` (stage ``k`` on island ``i``, stage ``k + 1`` on ``j``) with transport rows
  between the island indicators of neighbouring positions; the link time ``c_k`` is at least the
  path's latency plus either side's time and at least the fastest link of the island pair, which
  at integer points is its exact value (latency + the slowest of both sides and the shared link);
- the period: every block of fewer than ``m`` consecutive stages, ``len * lam >= sum T + 2 sum c``;
- the step tail: ``Y >= tail_k - sum_{j<k} (B_j + c_j + 1 tick)`` at every position. The links
  enter the upstream time with the same variables ``c_j`` the objective prices twice, so raising
  one above its value never pays (it saves at most once what it costs twice) and the one tick
  covers their rounding down.

It is solved inside narrow period windows ``[lo, hi]`` of the search, where only a few hundred
types survive the window and reduced-cost fixing, one model per stage count. Coefficients are
integer ticks rounded in the bound's favour, as in the aggregated model, so the model's optimum
is a valid lower bound (up to ``ticks.rounding_ticks``) and every backend, CP-SAT included,
solves the same problem.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from tangram_opt.planner.candidates.table import sends_no_slower
from tangram_opt.planner.formulations.aggregated import AggregatedMIP
from tangram_opt.planner.formulations.inflight import inflight_micro_batches
from tangram_opt.planner.formulations.problem import FormulationOptions, PipelineProblem, StageChoice, island_capacities
from tangram_opt.planner.formulations.stage_types import StageType
from tangram_opt.planner.formulations.ticks import rounders, rounding_ticks
from tangram_opt.solvers.model import Constraint, LinearModel, LinExpr, Var


def role_at(k: int, stages: int) -> str:
    """Role of position ``k`` (0 = first stage) in a pipeline of ``stages`` >= 2 stages."""
    return "first" if k == 0 else "last" if k == stages - 1 else "mid"


def position_types(problem: PipelineProblem, types: Sequence[StageType], need: int, hi: float) -> list[StageType]:
    """The types that can stand at a position holding ``need`` micro-batches in flight, no slower
    than ``hi``, Pareto-pruned per (island, layers).

    A type is dropped when another of the same island and layers uses no more GPUs and is no
    worse in forward+backward time, forward time, step tail and either side of a stage boundary.
    Swapping it in keeps the plan feasible (its tolerance already covers this position) and never
    lengthens the closed form: no block gets longer, the sum of stage times drops by ``T_t - T_s``,
    and the backward can shrink by at most that much (``F_s <= F_t``), which is all a downstream
    stage's exposed tail can grow by (a link that gets shorter by d shortens the fill by 2 d and
    exposes at most d). Tolerance beyond ``need`` buys nothing here, so unlike ``enumerate_types`` it is
    not a criterion."""
    cands = problem.candidates
    groups: dict[tuple, list[StageType]] = {}
    for t in types:
        if t.tolerance >= need and t.time_s <= hi * (1 + 1e-12):
            groups.setdefault((cands[t.candidate].island, t.layers), []).append(t)
    kept: list[StageType] = []
    for group in groups.values():
        group.sort(key=lambda t: (t.time_s, cands[t.candidate].gpus, t.fwd_s, t.tail_s))
        front: list[StageType] = []
        for t in group:
            g = cands[t.candidate].gpus
            if not any(f.time_s <= t.time_s and f.fwd_s <= t.fwd_s and f.tail_s <= t.tail_s
                       and cands[f.candidate].gpus <= g and sends_no_slower(cands[f.candidate], cands[t.candidate])
                       for f in front):
                front.append(t)
        kept.extend(front)
    return kept


@dataclass(slots=True)
class SequenceMIP:
    """The built model of one window and stage count, plus the maps to decode and encode plans."""

    problem: PipelineProblem
    options: FormulationOptions
    #: the window's stage types by role (types slower than ``upper_s`` are left out here)
    types: dict[str, list[StageType]]
    stages: int
    lower_s: float
    upper_s: float
    #: integer auxiliary variables (times, links, period, tail): needed by backends that solve
    #: all-integer models only (CP-SAT); elsewhere they are continuous, which the binaries already
    #: make integral except the period and the tail, whose rounding the search's margin covers
    integral: bool = False
    #: the lower edge of the node's window on the largest step tail: only plans with some stage's
    #: tail above it (row ``tail_window``); None: no lower edge
    lower_tail_s: float | None = None
    #: the island of each position, when the model is restricted to one island order (the primal
    #: search of search/patterns.py); None: any island anywhere
    islands: Sequence[int] | None = None
    #: the aggregated model (aggregated.py) of the same window and stage count, built: its rows
    #: join this model, its counts tied to the positions' binaries and its objective a floor under
    #: this one's (``_join``), so the relaxation is at least the aggregated one and stays exact
    relaxation: AggregatedMIP | None = None
    model: LinearModel = field(default_factory=LinearModel)
    #: per position, its types; ``x[k][j]`` is the binary of ``at[k][j]``
    at: list[list[StageType]] = field(default_factory=list)
    x: list[list[Var]] = field(default_factory=list)
    y: dict[tuple[int, int, int], Var] = field(default_factory=dict)
    aux: dict[str, Var] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return any(not ts for ts in self.at) or (
            self.lower_tail_s is not None and not any(t.tail_s > self.lower_tail_s for ts in self.at for t in ts))

    @property
    def columns(self) -> int:
        return sum(len(ts) for ts in self.at)

    def build(self) -> SequenceMIP:
        p, o, P = self.problem, self.options, self.stages
        assert p.schedule == "1f1b" and P >= 2, "sequence models are for 1F1B pipelines of two or more stages"
        m, tick = p.num_micro_batches, o.tick_s
        fl, ce = rounders(tick)  # lower- and upper-bound rounding to ticks (ticks.py)
        assert self.islands is None or len(self.islands) == P, "one island per position"
        self.at = [position_types(p, self._allowed(k), inflight_micro_batches(k, P, m), self.upper_s) for k in range(P)]
        if self.empty:
            return self
        if self.relaxation is not None:
            self.model = self.relaxation.model.fork()
        md = self.model
        floor = md.objective if self.relaxation is not None else None  # the aggregated objective
        md.name = f"sequence_b{p.pipeline_micro_batch}_P{P}"
        cands = p.candidates
        islands = sorted(p.island_gpus)
        self.x = [[md.add_binary(f"x[{k},{j}]") for j in range(len(ts))] for k, ts in enumerate(self.at)]

        def row(name: str, coefs: dict[int, float], lb: float, ub: float) -> None:
            md.add(Constraint(coefs, lb, ub), name)

        def per_position(k: int, value) -> dict[int, float]:  # type: ignore[no-untyped-def]
            return {v.index: float(value(t)) for v, t in zip(self.x[k], self.at[k]) if value(t)}

        for k in range(P):
            row(f"one[{k}]", {v.index: 1.0 for v in self.x[k]}, 1.0, 1.0)
        for kind in p.kinds:
            coefs: dict[int, float] = {}
            for k in range(P):
                coefs.update(per_position(k, lambda t: t.layer_dict.get(kind, 0)))
            row(f"layers[{kind}]", coefs, p.layers[kind], p.layers[kind])
        cap = island_capacities(p, (t.candidate for ts in self.at for t in ts))  # problem.largest_total
        for i in islands:
            coefs = {}
            for k in range(P):
                coefs.update(per_position(
                    k, lambda t: cands[t.candidate].gpus if cands[t.candidate].island == i else 0))
            row(f"gpus[{i}]", coefs, -math.inf, cap[i])

        # stage times, backward and tail per position as integer variables: the block rows then
        # stay sparse (every block references its positions' time variables, not their types)
        def defined(name: str, k: int, value) -> Var:  # type: ignore[no-untyped-def]
            coefs = {i: -a for i, a in per_position(k, value).items()}
            var = md.add_var(f"{name}[{k}]", 0, -min(coefs.values(), default=0.0), integer=self.integral)
            coefs[var.index] = 1.0
            row(f"{name}_def[{k}]", coefs, 0.0, 0.0)
            return var

        T = [defined("T", k, lambda t: fl(t.time_s)) for k in range(P)]
        B = [defined("B", k, lambda t: ce(t.bwd_s)) for k in range(P)]

        # links: island indicators of neighbouring positions, joined by a transport (at integer
        # points y is the product of the two indicators: one pair of islands per boundary)
        def island_of(k: int, i: int) -> dict[int, float]:
            return {v.index: 1.0 for v, t in zip(self.x[k], self.at[k]) if cands[t.candidate].island == i}

        # side times of every type at each position, per kind of path (through the NICs, or over the
        # scale-up link inside one node), rounded down
        def sides(k: int, value) -> dict[int, float]:  # type: ignore[no-untyped-def]
            return {v.index: float(value(cands[t.candidate])) for v, t in zip(self.x[k], self.at[k])}

        side_kind = {up: [sides(k, lambda c, up=up: fl(c.p2p_scale_up_s if up else c.p2p_nic_s)) for k in range(P)]
                     for up in (False, True)}
        kinds_used = {lk.scale_up for lk in p.links.values()}
        c_cap = ce(max(p.link_hi_s.values()))
        c_lo: list[Var] = []  # link time, at least latency + the slowest of the sides and the shared link
        for k in range(P - 1):
            for i in islands:
                for j in islands:
                    self.y[k, i, j] = md.add_var(f"y[{k},{i},{j}]", 0, 1, integer=self.integral)
            for i in islands:
                coefs = {self.y[k, i, j].index: 1.0 for j in islands}
                coefs.update({ix: -1.0 for ix in island_of(k, i)})
                row(f"link_out[{k},{i}]", coefs, 0.0, 0.0)
                coefs = {self.y[k, j, i].index: 1.0 for j in islands}
                coefs.update({ix: -1.0 for ix in island_of(k + 1, i)})
                row(f"link_in[{k},{i}]", coefs, 0.0, 0.0)
            pairs = [(i, j) for i in islands for j in islands]
            c = md.add_var(f"c[{k}]", 0, c_cap, integer=self.integral)
            row(f"c_pair[{k}]", {c.index: 1.0, **{self.y[k, i, j].index: -float(fl(p.link_lo_s[i, j]))
                                                  for i, j in pairs}}, 0.0, math.inf)
            latency = {self.y[k, i, j].index: -float(fl(p.links[i, j].latency_s)) for i, j in pairs}
            # c >= latency + the sender's (receiver's) side on the kind of path the boundary takes:
            # one row per kind, switched off on the pairs of the other kind by the side's largest value
            for up in kinds_used:
                for name, pos in (("c_send", k), ("c_recv", k + 1)):
                    side = side_kind[up][pos]
                    coefs = {c.index: 1.0, **latency, **{i: -a for i, a in side.items()}}
                    off = max(side.values(), default=0.0)
                    for i, j in pairs:
                        if p.links[i, j].scale_up != up and off:
                            coefs[self.y[k, i, j].index] += off
                    row(f"{name}[{k},{'up' if up else 'nic'}]", coefs, 0.0, math.inf)
            c_lo.append(c)

        # the period: every link, and every block of fewer than m consecutive stages
        # without a finite window the period is at most the slowest block of one stage or link
        hi_t = ce(self.upper_s) if math.isfinite(self.upper_s) else max(
            [fl(t.time_s) for ts in self.at for t in ts] + [c_cap])
        lam = self.aux["lam"] = md.add_var("lam", min(fl(self.lower_s), hi_t), hi_t, integer=self.integral)
        lo_t = self.model.vars[lam.index].lb
        for k in range(P):
            # lam >= max(lo, T_k): the convex hull of the position's choice. The block row of one
            # stage, lam >= sum_j T_j x[k, j], lets a light type pull the average below lo; this
            # one counts only the types above lo, which is what makes the LP respect the window
            coefs = {v.index: -float(fl(t.time_s) - lo_t) for v, t in zip(self.x[k], self.at[k])
                     if fl(t.time_s) > lo_t}
            if coefs:
                coefs[lam.index] = 1.0
                row(f"period[{k}]", coefs, lo_t, math.inf)
        for k in range(P - 1):
            row(f"link[{k}]", {lam.index: 1.0, c_lo[k].index: -1.0}, 0.0, math.inf)
        # two stages too slow to neighbour each other within the window: w = T + (cheapest link
        # touching the island) above hi makes any two of them a block slower than hi, so of two
        # neighbouring positions at most one holds such a type (a clique; it keeps the LP from
        # spreading heavy types over neighbouring positions a fraction at a time). Blocks of two
        # stages bound the period only when m > 2 micro-batches circulate.
        if math.isfinite(self.upper_s) and m > 2:
            cpair = {(i, j): min(p.link_lo_s[i, j], p.link_lo_s[j, i]) for i in islands for j in islands}
            cmin = {i: min(cpair[i, j] for j in islands) for i in islands}

            def link_floor(t: StageType) -> float:  # every link of a stage of type t takes at least this
                c = cands[t.candidate]
                return max(cmin[c.island], p.latency_lo_s(c.island) + p.side_bounds_s(c)[0])

            heavy = [{v.index for v, t in zip(self.x[k], self.at[k])
                      if t.time_s + link_floor(t) > self.upper_s * (1 + 1e-9)} for k in range(P)]
            for k in range(P - 1):
                if heavy[k] and heavy[k + 1]:
                    row(f"clique[{k}]", {i: 1.0 for i in heavy[k] | heavy[k + 1]}, -math.inf, 1.0)
        for a in range(P):
            for b in range(a, min(P, a + m - 1)):
                coefs = {lam.index: float(b - a + 1)}
                for k in range(a, b + 1):
                    coefs[T[k].index] = -1.0
                for k in range(a, b):
                    coefs[c_lo[k].index] = -2.0
                row(f"block[{a},{b}]", coefs, 0.0, math.inf)

        # the step tail: Y >= tail_k - (backward and links upstream of k)
        max_tail = max((fl(t.tail_s) for ts in self.at for t in ts), default=0)
        Y = self.aux["Y"] = md.add_var("Y", 0, max_tail, integer=self.integral)
        for k in range(P):
            coefs = {i: -a for i, a in per_position(k, lambda t: fl(t.tail_s)).items()}
            if not coefs:
                continue
            coefs[Y.index] = 1.0
            for j in range(k):
                coefs[B[j].index] = 1.0
                coefs[c_lo[j].index] = 1.0
            row(f"tail[{k}]", coefs, -float(k), math.inf)  # + 1 tick per upstream link
        if self.lower_tail_s is not None:
            # the node's lower edge on the largest tail: some position holds a type above it
            heavy = {x.index: 1.0 for k in range(P) for x, t in zip(self.x[k], self.at[k])
                     if t.tail_s > self.lower_tail_s}
            row("tail_window", heavy, 1.0, math.inf)

        obj: dict[int, float] = {lam.index: float(m - 1), Y.index: 1.0}
        for var in T:
            obj[var.index] = 1.0
        for var in c_lo:
            obj[var.index] = 2.0
        md.minimize(LinExpr(obj))
        if floor is not None:
            self._join(floor)
        self.aux.update({f"T[{k}]": v for k, v in enumerate(T)})
        self.aux.update({f"B[{k}]": v for k, v in enumerate(B)})
        self.aux.update({f"c[{k}]": v for k, v in enumerate(c_lo)})
        # one type per position: its island is a choice group (solvers/group_branching.py)
        md.choice_groups = [list(self.island_columns(k).values()) for k in range(P)]
        return self

    def _join(self, floor: LinExpr) -> None:
        """Tie the aggregated model's stage counts to the positions and its objective ``floor``
        under this model's. Every plan of the window and stage count maps to a point of the
        aggregated model with its own counts and an objective at most its step time (§3), and this
        model prices it at least its step time less ``rounding_ticks``: so both rows hold for every
        plan. A position type the aggregated model left out (no plan better than its cutoff uses
        it: §3 "Stage types", reduced costs) is fixed to 0; an aggregated type no position lists
        (dominated at every position: ``position_types``) to 0 too."""
        md, agg, P = self.model, self.relaxation, self.stages
        assert agg is not None
        counts: dict[tuple, Var] = {}
        for role, var_of in (("first", agg.e), ("last", agg.h), ("mid", agg.n)):
            for si, var in var_of.items():
                t = agg.types[role][si]
                counts[(role, t.candidate, t.layers)] = var
        at_positions: dict[tuple, list[int]] = {}
        for k in range(P):
            role = role_at(k, P)
            for x, t in zip(self.x[k], self.at[k]):
                at_positions.setdefault((role, t.candidate, t.layers), []).append(x.index)
        for key, var in counts.items():
            coefs = {i: -1.0 for i in at_positions.get(key, [])}
            coefs[var.index] = 1.0
            md.add(Constraint(coefs, 0.0, 0.0), "join_count")
        for key, xs in at_positions.items():
            if key not in counts:
                for i in xs:
                    md.set_upper_bound(i, 0.0)
        slack = rounding_ticks(self.problem.num_micro_batches)
        coefs = dict(md.objective.coefs)
        for i, a in floor.coefs.items():
            coefs[i] = coefs.get(i, 0.0) - a
        md.add(Constraint(coefs, floor.const - md.objective.const - slack, math.inf), "join_objective")

    def _allowed(self, k: int) -> list[StageType]:
        """The types of position ``k``'s role, on its island when the order of islands is given."""
        types = self.types.get(role_at(k, self.stages), [])
        if self.islands is None:
            return list(types)
        cands, island = self.problem.candidates, self.islands[k]
        return [t for t in types if cands[t.candidate].island == island]

    def island_columns(self, k: int) -> dict[int, list[int]]:
        """Position ``k``'s columns not fixed to 0, by island (the column indices in the model)."""
        cands, md = self.problem.candidates, self.model
        out: dict[int, list[int]] = {}
        for v, t in zip(self.x[k], self.at[k]):
            if md.vars[v.index].ub > 0:
                out.setdefault(cands[t.candidate].island, []).append(v.index)
        return out

    # --- solutions -----------------------------------------------------------------------
    def decode(self, values: Sequence[float]) -> list[StageChoice]:
        """The plan of a solution, in pipeline order."""
        out = []
        for k in range(self.stages):
            j = max(range(len(self.x[k])), key=lambda j: values[self.x[k][j].index])
            t = self.at[k][j]
            out.append(StageChoice(candidate=t.candidate, layers=t.layer_dict))
        return out

    def hint_from(self, stages: Sequence[StageChoice]) -> dict[Var, float] | None:
        """Variable values encoding a plan (pipeline order) of this stage count, or None when the
        plan is not in this model: one of its stages is not among its position's types (pruned as
        dominated, fixed by reduced costs, or too slow for the window) or its period is above it,
        and for a model joined with the aggregated rows (whose variables it does not set)."""
        if len(stages) != self.stages or self.empty or self.relaxation is not None:
            return None  # joined: the aggregated variables are not encoded
        p, tick = self.problem, self.options.tick_s
        m, cands, kinds = p.num_micro_batches, p.candidates, p.kinds
        fl, ce = rounders(tick)
        vals: dict[Var, float] = {v: 0.0 for v in self.model.vars}
        chosen: list[StageType] = []
        for k, st in enumerate(stages):
            key = (st.candidate, tuple(sorted((kd, st.layers.get(kd, 0)) for kd in kinds)))
            j = next((j for j, t in enumerate(self.at[k]) if (t.candidate, t.layers) == key), None)
            if j is None:
                return None
            vals[self.x[k][j]] = 1.0
            chosen.append(self.at[k][j])
        isl = [cands[t.candidate].island for t in chosen]
        T = [fl(t.time_s) for t in chosen]
        c = [fl(p.boundary_s(cands[a.candidate], cands[b.candidate])) for a, b in zip(chosen, chosen[1:])]
        for k in range(self.stages):
            vals[self.aux[f"T[{k}]"]] = float(T[k])
            vals[self.aux[f"B[{k}]"]] = float(ce(chosen[k].bwd_s))
        for k in range(self.stages - 1):
            vals[self.y[k, isl[k], isl[k + 1]]] = 1.0
            vals[self.aux[f"c[{k}]"]] = float(c[k])
        lam = max([self.model.vars[self.aux["lam"].index].lb, *c] + [
            math.ceil((sum(T[a:b + 1]) + 2 * sum(c[a:b])) / (b - a + 1) - 1e-9)
            for a in range(self.stages) for b in range(a, min(self.stages, a + m - 1))])
        if lam > self.model.vars[self.aux["lam"].index].ub:
            return None
        upstream, y = 0, 0
        for k, t in enumerate(chosen):
            y = max(y, fl(t.tail_s) - upstream)
            upstream += ce(t.bwd_s) + (c[k] + 1 if k < self.stages - 1 else 0)
        vals[self.aux["lam"]] = float(lam)
        vals[self.aux["Y"]] = float(y)
        return vals


__all__ = ["SequenceMIP", "position_types", "role_at"]
