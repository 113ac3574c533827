"""The aggregated model's rows for what its relaxation of the stage order leaves out.

The aggregated model (aggregated.py) knows how many stages of each type a pipeline has, not their
order; these row families bound the order-dependent terms of the closed form from below
(formulations/pipeline_mip.md §3): the whole-pipeline block with McCormick over-estimators of
``Smax * P`` (``_cycle_rows``), which stages are too slow to neighbour each other inside a period
window (``_neighbour_row``), and, inside a window on the largest step tail, the cover a large-tail
stage must have upstream (``_tail_window_rows``, ``_successor_term``). :class:`OrderRows` holds them
as methods of the model class, which builds them from its own variables.
"""

from __future__ import annotations

import math

from tangram_opt.planner.formulations.stage_types import StageType
from tangram_opt.planner.formulations.ticks import rounders
from tangram_opt.solvers.model import Constraint, LinearModel, LinExpr, Var, lsum

#: rows Y >= (least tail above theta) - (cover upstream) per tail window (``_tail_window_rows``)
TAIL_WINDOW_ROWS = 16


class OrderRows:
    """The order rows of :class:`~tangram_opt.planner.formulations.aggregated.AggregatedMIP` (a mixin:
    it reads the model's ``problem``, ``options``, ``model``, ``types``, columns ``n``/``o``/``e``/``h``,
    ``aux`` and window bounds, and adds rows and the ``succ``/``medium`` bookkeeping)."""

    __slots__ = ()

    def _cycle_rows(self, first: int, last: int, relax: LinExpr, tag: str) -> None:
        """The whole-pipeline block ``Smax * P >= sum T + 2 sum c`` for P = 2 + n_mid in
        [first, last], with McCormick's over-estimators of ``Smax * P`` on Smax in [lo, hi]:
        (P - first)(hi - Smax) >= 0 and (last - P)(Smax - lo) >= 0 (``relax`` switches the rows
        off where they do not hold); and the same block without the first (or the last) stage,
        P - 1 stages, which matters when that end stage is much faster than the rest (a small
        first stage is common). The end stage's time is taken out rounded up, and so is its
        link, at the slowest link leaving (entering) its island."""
        p, md, tick = self.problem, self.model, self.options.tick_s
        fl, ce = rounders(tick)
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


def total_T_expr(mip, fl) -> LinExpr:  # type: ignore[no-untyped-def]
    """Sum over the chosen stages of their forward+backward time (rounded down to ticks)."""
    e = LinExpr()
    for group, tys in ((mip.n, mip.types["mid"]), (mip.e, mip.types["first"]), (mip.h, mip.types["last"])):
        for si, var in group.items():
            e.add_term(var, fl(tys[si].time_s))
    return e


__all__ = ["OrderRows", "TAIL_WINDOW_ROWS", "total_T_expr"]
