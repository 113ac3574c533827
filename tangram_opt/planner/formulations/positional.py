"""The positional pipeline MIP for one pipeline micro-batch size ``b`` (formulations/pipeline_mip.md §4).

This is the direct formulation of the design sketch (one binary per position and candidate). It is
exact but grows as positions x candidates and its LP relaxation is weak; the planner uses the
aggregated formulation (aggregated.py) by default and keeps this one for comparison and for small
instances.

Positions are counted from the end of the pipeline: ``r = 0`` is the last stage (it holds the LM
head), ``r = 1`` the one before, and so on, up to ``r = R - 1`` (``R = max_stages``). A stage at
position ``r`` keeps ``min(r + 1, m)`` micro-batches in flight under 1F1B (inflight.py), so counting from the end
makes every coefficient independent of the pipeline depth: one MIP covers every depth
``P = 1..R`` (active positions are ``0..P-1``, contiguous) and the bubble is priced by the
objective itself.

All time coefficients are integers in ``tick_s`` units, rounded so the MIP optimum is a valid lower
bound of the exact objective (ticks.py: ``fl`` / ``ce`` below); memory is in MiB,
rounded conservatively, so every MIP solution fits in real memory. The model is therefore
all-integer and every backend, CP-SAT included, solves exactly the same problem.

Names match the formulation document: x, w, v, z, u, T, Tmax (Fmax/Bmax for GPipe), Y.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from tangram_opt import units as u
from tangram_opt.planner.formulations.bounds import quick_lower_bound
from tangram_opt.planner.formulations.inflight import inflight_from_end
from tangram_opt.planner.formulations.problem import (FORMULATION_OBJECTIVES, FormulationOptions, PipelineProblem,
                                                      StageChoice, island_capacities)
from tangram_opt.planner.formulations.ticks import rounders, rounding_ticks
from tangram_opt.solvers.model import LinearModel, LinExpr, Var, lsum

MEM_UNIT_BYTES = u.MiB


@dataclass(slots=True)
class PositionalMIP:
    """The built model plus the maps needed to decode a solution or encode a hint."""

    problem: PipelineProblem
    options: FormulationOptions
    model: LinearModel = field(default_factory=LinearModel)
    x: dict[tuple[int, int], Var] = field(default_factory=dict)
    w: dict[tuple[int, int, str], Var] = field(default_factory=dict)
    v: dict[tuple[int, int], Var] = field(default_factory=dict)
    z: dict[tuple[int, int, int], Var] = field(default_factory=dict)
    u: dict[int, Var] = field(default_factory=dict)
    act: dict[int, Var] = field(default_factory=dict)
    aux: dict[str, Var] = field(default_factory=dict)
    #: §4b: USD/h per island, USD/h x step per island, and the products x[r,c] * step
    H: dict[int, Var] = field(default_factory=dict)
    Q: dict[int, Var] = field(default_factory=dict)
    zq: dict[tuple[int, int], Var] = field(default_factory=dict)

    # --- building ------------------------------------------------------------------------
    def build(self) -> PositionalMIP:
        p, o = self.problem, self.options
        md = self.model
        md.name = f"pipeline_b{p.pipeline_micro_batch}_m{p.num_micro_batches}"
        m, R, tick = p.num_micro_batches, p.max_stages, o.tick_s
        cands = p.candidates
        kinds = p.kinds
        fl, ce = rounders(tick)  # lower- and upper-bound rounding to ticks (ticks.py)
        gpipe = p.schedule == "gpipe"

        # an upper bound on any stage time of an improving plan (objective >= m * Tmax)
        tmax_cap = o.cutoff_s / m if o.cutoff_s else math.inf
        for r in range(R):
            inflight = inflight_from_end(r, m, p.schedule)
            last = r == 0
            for ci, c in enumerate(cands):
                caps = {}
                for k in kinds:
                    cap = min(p.layers[k], c.max_layers(k, inflight, first=False, last=last))
                    lt = c.layer[k].time_s if not gpipe else max(c.layer[k].fwd_time_s, c.layer[k].bwd_time_s)
                    if math.isfinite(tmax_cap) and lt > 0:
                        fixed = c.head.time_s if last else 0.0
                        cap = min(cap, int(max(0.0, (tmax_cap * (2 if gpipe else 1) - fixed)) // lt))
                    caps[k] = max(0, cap)
                if sum(caps.values()) < 1 or (last and c.fixed_bytes(inflight, first=False, last=True)
                                              > c.capacity_bytes):
                    continue
                self.x[r, ci] = md.add_binary(f"x[{r},{ci}]")
                for k in kinds:
                    if caps[k] > 0:
                        self.w[r, ci, k] = md.add_var(f"w[{r},{ci},{k}]", 0, caps[k], integer=True)
                self.v[r, ci] = md.add_var(f"v[{r},{ci}]", 0, 1, integer=True)

        by_r: dict[int, list[int]] = {r: [] for r in range(R)}
        for (r, ci) in self.x:
            by_r[r].append(ci)
        # position r is active (holds a stage): one variable per position, so the rows that read it
        # (first-stage flags, links, the tail's upstream sums) carry one term, not every candidate
        # of the position (quadratic in the candidates: 1.4e8 nonzeros on DeepSeek-V3 over 1,024
        # GPUs at b=4)
        act: dict[int, LinExpr] = {}
        for r in range(R):
            self.act[r] = md.add_var(f"act[{r}]", 0, 1, integer=True)
            md.add(self.act[r] == lsum(self.x[r, ci] for ci in by_r[r]), f"act_def[{r}]")
            act[r] = LinExpr.of(self.act[r])

        # one candidate per active position; active positions contiguous from the end
        for r in range(R):
            md.add(act[r] <= 1, f"one[{r}]")
            if r + 1 < R:
                md.add(act[r + 1] <= act[r], f"contig[{r}]")
        md.add(act[0] >= 1, "nonempty")
        if p.min_stages > 1:
            md.add(act[min(p.min_stages, R) - 1] >= 1, "min_stages")
        first = {r: act[r] - (act[r + 1] if r + 1 < R else 0) for r in range(R)}
        for (r, ci), vv in self.v.items():
            md.add(vv >= self.x[r, ci] + first[r] - 1, f"vdef[{r},{ci}]")
            md.add(vv <= self.x[r, ci], f"vx[{r},{ci}]")

        # layers: totals, per-candidate caps (as bounds), at least one layer per active stage
        for k in kinds:
            md.add(lsum(var for (r, ci, kk), var in self.w.items() if kk == k) == p.layers[k], f"layers[{k}]")
        w_at: dict[int, list[tuple[int, str, Var]]] = {r: [] for r in range(R)}
        for (r, ci, k), var in self.w.items():
            w_at[r].append((ci, k, var))
            md.add(var <= var.ub * self.x[r, ci], f"wcap[{r},{ci},{k}]")
        for r in range(R):
            md.add(lsum(var for _, _, var in w_at[r]) >= act[r], f"nonempty_stage[{r}]")

        # memory (MiB, conservative rounding): layers + embedding on the first stage + fixed terms
        for (r, ci), xv in self.x.items():
            c = cands[ci]
            inflight = inflight_from_end(r, m, p.schedule)
            last = r == 0
            free_units = math.floor((c.capacity_bytes - c.fixed_bytes(inflight, first=False, last=last))
                                    / MEM_UNIT_BYTES)
            e = c.embedding
            emb_units = math.ceil((e.static_bytes + e.activation_bytes * inflight) / MEM_UNIT_BYTES)
            terms = LinExpr()
            n_kinds = 0
            for k in kinds:
                if (r, ci, k) in self.w:
                    lc = c.layer[k]
                    terms.add_term(self.w[r, ci, k],
                                   math.ceil((lc.static_bytes + lc.activation_bytes * inflight) / MEM_UNIT_BYTES))
                    n_kinds += 1
            terms.add_term(self.v[r, ci], emb_units)
            md.add(terms <= free_units * xv, f"mem[{r},{ci}]")

        # dense-first order: u[r] = 1 iff every dense layer sits at positions >= r
        if len(kinds) == 2:
            dk, mk = kinds
            for r in range(R):
                self.u[r] = md.add_binary(f"u[{r}]")
            for r in range(R):
                dense_up = lsum(var for (rr, ci, k), var in self.w.items() if k == dk and rr >= r)
                moe_here = lsum(var for (rr, ci, k), var in self.w.items() if k == mk and rr == r)
                md.add(moe_here <= p.layers[mk] * self.u[r], f"order_moe[{r}]")
                md.add(dense_up >= p.layers[dk] * self.u[r], f"order_dense[{r}]")
                if r + 1 < R:
                    md.add(self.u[r] >= self.u[r + 1], f"order_mono[{r}]")

        # GPU budget per island: what the candidates' sizes can occupy of it (problem.largest_total)
        islands = sorted({c.island for c in cands})
        cap = island_capacities(p, range(len(cands)))
        for i in islands:
            md.add(lsum(cands[ci].gpus * xv for (r, ci), xv in self.x.items() if cands[ci].island == i)
                   <= cap[i], f"gpus[{i}]")

        # stage times (floor: lower bound) and the backward part (ceil: used with a minus sign)
        def stage_expr(r: int, part: str, rnd) -> LinExpr:  # type: ignore[no-untyped-def]
            e = LinExpr()
            for ci, k, var in w_at[r]:
                lc = cands[ci].layer[k]
                e.add_term(var, rnd(_part(lc, part)))
            for ci in by_r[r]:
                c = cands[ci]
                e.add_term(self.v[r, ci], rnd(_part(c.embedding, part)))
                if r == 0:
                    e.add_term(self.x[r, ci], rnd(_part(c.head, part)))
            return e

        # each position's time per micro-batch as one variable: the 1F1B block rows below sum it
        # over every block of consecutive positions (R^2 / 2 rows), which would otherwise repeat
        # each position's candidate terms in every block holding it (R^3 x candidates nonzeros)
        T: dict[int, LinExpr] = {}
        for r in range(R):
            tv = self.aux[f"T[{r}]"] = md.add_var(f"T[{r}]", 0, 2**40, integer=True)
            md.add(tv == stage_expr(r, "time", fl), f"T_def[{r}]")
            T[r] = LinExpr.of(tv)
        Bc = {r: stage_expr(r, "bwd", ce) for r in range(R)}
        tail = {r: stage_expr(r, "tail", fl) for r in range(R)}

        # p2p between position r (sender in the forward direction) and r - 1: at least the pair's
        # fastest link, and at least the path's latency plus either side's time (the receiver's only
        # when the boundary exists, act[r]). The step tail's upstream time counts the same variable
        # plus one tick (its rounding down): the objective prices it twice, so raising it never pays
        comm_fl: dict[int, LinExpr] = {}
        comm_ce: dict[int, LinExpr] = {}
        isl_of = {ci: cands[ci].island for ci in range(len(cands))}
        X = {(r, i): lsum(self.x[r, ci] for ci in by_r[r] if isl_of[ci] == i) for r in range(R) for i in islands}
        side_lo = {ci: fl(p.side_bounds_s(cands[ci])[0]) for ci in {ci for (_, ci) in self.x}}
        c_cap = ce(max(p.link_hi_s.values()))
        for r in range(1, R):
            lo, lat = LinExpr(), LinExpr()
            for i in islands:
                for j in islands:
                    zv = md.add_var(f"z[{r},{i},{j}]", 0, 1, integer=True)
                    self.z[r, i, j] = zv
                    md.add(zv >= X[r, i] + X[r - 1, j] - 1, f"zdef[{r},{i},{j}]")
                    md.add(zv <= X[r, i], f"zi[{r},{i},{j}]")
                    md.add(zv <= X[r - 1, j], f"zj[{r},{i},{j}]")
                    lo.add_term(zv, fl(p.link_lo_s[i, j]))
                    lat.add_term(zv, fl(p.links[i, j].latency_s))
            send = lsum(side_lo[ci] * self.x[r, ci] for ci in by_r[r])
            recv = lsum(side_lo[ci] * self.x[r - 1, ci] for ci in by_r[r - 1])
            recv_max = max((side_lo[ci] for ci in by_r[r - 1]), default=0)
            cv = self.aux[f"c[{r}]"] = md.add_var(f"c[{r}]", 0, c_cap, integer=True)
            md.add(cv >= lo, f"c_pair[{r}]")
            md.add(cv >= lat + send, f"c_send[{r}]")
            md.add(cv >= lat + recv - recv_max * (1 - act[r]), f"c_recv[{r}]")
            comm_fl[r], comm_ce[r] = LinExpr.of(cv), cv + act[r]

        big_t = 2**40
        if gpipe:
            Fmax = self.aux["Fmax"] = md.add_var("Fmax", 0, big_t, integer=True)
            Bmax = self.aux["Bmax"] = md.add_var("Bmax", 0, big_t, integer=True)
            F = {r: stage_expr(r, "fwd", fl) for r in range(R)}
            Bf = {r: stage_expr(r, "bwd", fl) for r in range(R)}
            for r in range(R):
                md.add(Fmax >= F[r], f"Fmax[{r}]")
                md.add(Bmax >= Bf[r], f"Bmax[{r}]")
            bottleneck = Fmax + Bmax
        else:
            Tmax = self.aux["Tmax"] = md.add_var("Tmax", 0, big_t, integer=True)
            for r in range(R):
                md.add(Tmax >= T[r], f"Tmax[{r}]")
            bottleneck = LinExpr.of(Tmax)
        Cmax = self.aux["Cmax"] = md.add_var("Cmax", 0, big_t, integer=True)
        for r in comm_fl:
            md.add(Cmax >= comm_fl[r], f"Cmax[{r}]")
        if gpipe:  # GPipe period: max(Fmax, c) + max(Bmax, c)
            md.add(self.aux["Fmax"] >= Cmax, "Fmax_c")
            md.add(self.aux["Bmax"] >= Cmax, "Bmax_c")
        Smax = self.aux["Smax"] = md.add_var("Smax", 0, big_t, integer=True)  # the steady period
        md.add(Smax >= bottleneck, "Smax_t")
        md.add(Smax >= Cmax, "Smax_c")
        if not gpipe:
            # 1F1B in-flight limit of every block of consecutive positions lo..hi (pipeline_model.py)
            for lo in range(R):
                for hi in range(lo + 1, R):
                    length = hi - lo + 1
                    if length >= m:
                        break
                    block = lsum(T[r] for r in range(lo, hi + 1)) + 2 * lsum(
                        comm_fl[r] for r in range(lo + 1, hi + 1) if r in comm_fl)
                    md.add(length * Smax >= block, f"block[{lo},{hi}]")

        if o.fluid_cuts:
            # each GPU of a stage is busy at most Smax per micro-batch: sum g * t * w <= N_i * Smax
            for i in islands:
                e = LinExpr()
                for (r, ci, k), var in self.w.items():
                    c = cands[ci]
                    if c.island == i:
                        e.add_term(var, c.gpus * fl(c.layer[k].time_s))
                md.add(e <= cap[i] * Smax, f"fluid[{i}]")

        Y = self.aux["Y"] = md.add_var("Y", 0, big_t, integer=True)
        for r in range(R):
            upstream = LinExpr()
            for rr in range(r + 1, R):
                upstream = upstream + Bc[rr]
                if rr in comm_ce:
                    upstream = upstream + comm_ce[rr]
            md.add(Y >= tail[r] - upstream, f"tail[{r}]")

        obj = (m - 1) * Smax + lsum(T[r] for r in range(R)) + 2 * lsum(comm_fl.values()) + Y
        md.minimize(self._priced(obj, islands))
        return self

    def _priced(self, step: LinExpr, islands: list[int]) -> LinExpr:
        """The limits and the objective of formulations/pipeline_mip.md §4b on the step time
        ``step`` (ticks): the step cap, the USD/h of each island ``H[i]`` (its convex price curve,
        one row per step), the budget, and the objective (the step time, ``sum H``, or
        ``sum Q`` with ``Q[i] = H[i] x step`` made exact by ``zq[r,c] = x[r,c] x step``)."""
        p, o, md = self.problem, self.options, self.model
        if o.objective not in FORMULATION_OBJECTIVES:
            raise ValueError(f"unknown objective {o.objective!r}")
        fl, ce = rounders(o.tick_s)
        slack = rounding_ticks(p.num_micro_batches)
        cap = None
        if o.max_step_s is not None:
            cap = math.floor(o.max_step_s / o.tick_s + 1e-9) + slack
            md.add(step <= cap, "max_step")
        if o.objective == "step_time" and o.budget_usd_per_h is None:
            return step
        if not p.island_prices:
            raise ValueError("a price objective or budget needs PipelineProblem.island_prices")
        cands = p.candidates
        unit = o.price_unit_usd_h
        G = {i: lsum(cands[ci].gpus * xv for (r, ci), xv in self.x.items() if cands[ci].island == i) for i in islands}
        pieces: dict[int, list[tuple[int, int]]] = {}  # island -> (a, q): H >= a + q G (price units)
        for i in islands:
            start, f, rows = 0, 0, []
            for n, price in p.island_prices[i]:
                q = math.floor(price / unit + 1e-9)  # rounded down: the model never overprices
                rows.append((f - q * start, q))
                start, f = start + n, f + q * n
            pieces[i] = rows
            self.H[i] = md.add_var(f"H[{i}]", 0, f, integer=True)
            for j, (a, q) in enumerate(rows):
                md.add(self.H[i] >= a + q * G[i], f"price[{i},{j}]")
        # the work rows below: USD/h x step >= m x work (see _work); with the step capped (a throughput
        # floor) that bounds the USD/h, with the USD/h capped (a budget) it bounds the step
        if o.budget_usd_per_h is not None:
            budget = math.floor(o.budget_usd_per_h / unit + 1e-9)
            md.add(lsum(self.H.values()) <= budget, "budget")
            md.add(budget * step >= p.num_micro_batches * self._work(pieces, fl), "budget_work")
        if o.objective == "step_time":
            return step
        if o.objective == "usd_per_hour":
            if cap is not None:
                md.add(cap * lsum(self.H.values()) >= p.num_micro_batches * self._work(pieces, fl), "cap_work")
            return lsum(self.H.values())
        # usd_per_step: Q[i] >= a_j step + q_j sum_c g_c zq[r,c], zq[r,c] = x[r,c] * step (big-M, exact)
        big = cap if cap is not None else self._step_cap_ticks(ce) + slack
        # the step as one variable: ``step`` sums every stage's terms, and each of the rows below
        # that reads it would otherwise repeat all of them (positions x candidates rows x as many
        # terms: ~10^8 nonzeros on a 96-GPU, 2-island instance)
        whole = float(step.const).is_integer() and all(float(c).is_integer() for c in step.coefs.values())
        S = self.aux["S"] = md.add_var("S", 0, big, integer=whole)
        md.add(S == step, "S_def")
        step = LinExpr.of(S)
        low = min(fl(quick_lower_bound(p)), big)  # every plan's step is at least this: zq >= low x
        for (r, ci), xv in self.x.items():
            zv = self.zq[r, ci] = md.add_var(f"zq[{r},{ci}]", 0, big, integer=True)
            md.add(zv - step - big * xv >= -big, f"zq_def[{r},{ci}]")
            md.add(zv >= low * xv, f"zq_low[{r},{ci}]")
            md.add(zv <= big * xv, f"zq_x[{r},{ci}]")
        # one candidate per active position: sum_c zq[r,c] = step x act[r] (= step at r = 0, the
        # last stage, always active), and active positions are contiguous from the end
        Z = {r: lsum(zv for (rr, _), zv in self.zq.items() if rr == r) for r in range(p.max_stages)}
        for r, zr in Z.items():
            md.add(zr == step if r == 0 else zr <= step, f"zq_pos[{r}]")
            if r > 0:
                md.add(zr <= Z[r - 1], f"zq_contig[{r}]")
        for i in islands:
            gz = lsum(cands[ci].gpus * zv for (r, ci), zv in self.zq.items() if cands[ci].island == i)
            top = sum(n * q for (n, _), (_, q) in zip(p.island_prices[i], pieces[i]))  # f(all GPUs)
            self.Q[i] = md.add_var(f"Q[{i}]", 0, top * big, integer=True)
            for j, (a, q) in enumerate(pieces[i]):
                md.add(self.Q[i] >= a * step + q * gz, f"price_step[{i},{j}]")
        # McCormick rows at the lower corner of (USD/h, step): every plan has a stage (USD/h at
        # least the cheapest candidate's) and a step of at least ``low``
        cheapest = min(min(a + q * cands[ci].gpus for a, q in pieces[cands[ci].island]) for (_, ci) in self.x)
        md.add(lsum(self.Q.values()) >= cheapest * step, "price_step_low_h")
        md.add(lsum(self.Q.values()) >= low * lsum(self.H.values()), "price_step_low_s")
        md.add(lsum(self.Q.values()) >= p.num_micro_batches * self._work(pieces, fl), "price_work")
        # cross-zone transfer, USD per step: m x each boundary's price, in the objective's units
        # (price units x ticks), rounded down (a relaxation); z[r,i,j] = 1 exactly where the
        # boundary exists, and a positive cost holds it at its lower bound
        per_usd = u.HOUR / (unit * o.tick_s)
        egress = LinExpr()
        for (r, i, j), zv in self.z.items():
            usd = p.link_egress_usd.get((i, j), 0.0)
            if usd:
                egress.add_term(zv, math.floor(p.num_micro_batches * usd * per_usd))
        return lsum(self.Q.values()) + egress

    def _work(self, pieces: dict[int, list[tuple[int, int]]], fl) -> LinExpr:  # type: ignore[no-untyped-def]
        """The GPU work of one micro-batch priced at each island's cheapest GPU-hour (price units x
        ticks): sum over stages of (cheapest price of its island) x GPUs x stage time. The step is at
        least m x every stage's time (S >= (m-1) Smax + T[r]) and a stage's USD/h is at least its
        GPUs at that price, so USD/h x step >= m x this (rows ``price_work``, ``cap_work``,
        ``budget_work``)."""
        cands = self.problem.candidates
        qmin = {i: min(q for _, q in rows) for i, rows in pieces.items()}
        work = LinExpr()
        for (r, ci, k), var in self.w.items():
            c = cands[ci]
            work.add_term(var, qmin[c.island] * c.gpus * (fl(c.layer[k].fwd_time_s) + fl(c.layer[k].bwd_time_s)))
        for (r, ci), var in self.v.items():
            c = cands[ci]
            work.add_term(var, qmin[c.island] * c.gpus * (fl(c.embedding.fwd_time_s) + fl(c.embedding.bwd_time_s)))
            if r == 0:
                work.add_term(self.x[r, ci], qmin[c.island] * c.gpus * (fl(c.head.fwd_time_s)
                                                                        + fl(c.head.bwd_time_s)))
        return work

    def _step_cap_ticks(self, ce) -> int:  # type: ignore[no-untyped-def]
        """An upper bound (ticks) of the model's step time of every plan: every layer at its
        slowest candidate on one stage, every link at its slowest, every tail at its largest."""
        p = self.problem
        cands = p.candidates
        R, m = p.max_stages, p.num_micro_batches
        work = sum(n * max(ce(c.layer[k].time_s) for c in cands) for k, n in p.layers.items())
        work += max(ce(c.embedding.time_s) for c in cands) + max(ce(c.head.time_s) for c in cands)
        comm = 2 * R * ce(max(p.link_hi_s.values(), default=0.0))
        tails = sum(n * max(ce(c.layer[k].step_tail_time_s) for c in cands) for k, n in p.layers.items())
        tails += max(ce(c.embedding.step_tail_time_s) for c in cands) + max(ce(c.head.step_tail_time_s)
                                                                           for c in cands)
        period = 2 * (work + comm)  # GPipe: Fmax + Bmax, each at most the work plus the links
        return m * (period + work + comm) + tails

    # --- solutions -----------------------------------------------------------------------
    def decode(self, values: Sequence[float]) -> list[StageChoice]:
        """Stages in pipeline order (first stage first)."""
        chosen: dict[int, int] = {}
        for (r, ci), var in self.x.items():
            if values[var.index] > 0.5:
                chosen[r] = ci
        stages = []
        for r in sorted(chosen, reverse=True):
            ci = chosen[r]
            layers = {k: int(round(values[self.w[r, ci, k].index])) if (r, ci, k) in self.w else 0
                      for k in self.problem.kinds}
            stages.append(StageChoice(candidate=ci, layers=layers))
        return stages

    def hint_from(self, stages: Sequence[StageChoice]) -> dict[Var, float] | None:
        """Variable values encoding ``stages`` (pipeline order), or None if not representable."""
        P = len(stages)
        if P > self.problem.max_stages:
            return None
        vals: dict[Var, float] = {var: 0.0 for var in self.model.vars}
        for k, st in enumerate(stages):
            r = P - 1 - k
            if (r, st.candidate) not in self.x:
                return None
            vals[self.x[r, st.candidate]] = 1.0
            if k == 0:
                vals[self.v[r, st.candidate]] = 1.0
            for kind, n in st.layers.items():
                if n:
                    if (r, st.candidate, kind) not in self.w or n > self.w[r, st.candidate, kind].ub:
                        return None
                    vals[self.w[r, st.candidate, kind]] = float(n)
        for r, av in self.act.items():
            vals[av] = 1.0 if r < P else 0.0
        # derived variables: evaluate their defining expressions at this point
        x_of = {var.index: val for var, val in vals.items()}
        def ev(e: LinExpr) -> float:
            return e.const + sum(c * x_of.get(i, 0.0) for i, c in e.coefs.items())
        for (r, i, j), zv in self.z.items():
            a = sum(x_of[self.x[r, ci].index] for (rr, ci) in self.x
                    if rr == r and self.problem.candidates[ci].island == i)
            b = sum(x_of[self.x[r - 1, ci].index] for (rr, ci) in self.x if rr == r - 1
                    and self.problem.candidates[ci].island == j)
            vals[zv] = 1.0 if a > 0.5 and b > 0.5 else 0.0
            x_of[zv.index] = vals[zv]
        if self.u:
            dk = self.problem.kinds[0]
            for r, uv in self.u.items():
                dense_up = sum(st.layers.get(dk, 0) for k, st in enumerate(stages) if P - 1 - k >= r)
                vals[uv] = 1.0 if dense_up >= self.problem.layers[dk] else 0.0
                x_of[uv.index] = vals[uv]
        # auxiliary variables at the smallest values their rows allow (link times first: the
        # maxima's rows read them)
        names = [k for k in self.aux if k.startswith("T[")] + [k for k in self.aux if k.startswith("c[")] + [
            k for k in ("Cmax", "Tmax", "Fmax", "Bmax", "Smax", "Y", "S") if k in self.aux]
        for name in names:
            var = self.aux[name]
            link = name.startswith("c[")
            lo = 0.0
            for con in self.model.constraints:
                a = con.coefs.get(var.index, 0.0)
                if not a or (link and not con.name.startswith("c_")):
                    continue  # a link time from its own rows only: the tail rows hold it as a credit
                rest = sum(c * x_of.get(i, 0.0) for i, c in con.coefs.items() if i != var.index)
                if a > 0 and not math.isinf(con.lb):
                    lo = max(lo, (con.lb - rest) / a)
                elif a < 0 and not math.isinf(con.ub):
                    lo = max(lo, (con.ub - rest) / a)
            vals[var] = float(math.ceil(lo - 1e-9))
            x_of[var.index] = vals[var]
        return vals


def _part(lc, part: str) -> float:  # type: ignore[no-untyped-def]
    if part == "time":
        return lc.time_s
    if part == "fwd":
        return lc.fwd_time_s
    if part == "bwd":
        return lc.bwd_time_s
    return lc.step_tail_time_s


__all__ = ["MEM_UNIT_BYTES", "PositionalMIP"]
