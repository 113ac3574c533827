"""The aggregated model's rows for what its relaxation of the stage order leaves out.

The aggregated model (aggregated.py) knows how many stages of each type a pipeline has, not their
order; these row families bound the order-dependent terms of the closed form from below
(formulations/pipeline_mip.md §3): the whole-pipeline block with McCormick over-estimators of
``Smax * P`` (``_cycle_rows``), the runs of consecutive stages on a set of islands, each a block
(``_island_block_rows``), the whole pipeline again with each boundary priced by both its
stages' sides (``_island_side_rows``), the boundaries of one island's stages priced by their sides
(``_island_link_rows``), which stages are too slow to neighbour each other inside a period window
(``_neighbour_row``), the stages' tails averaged over an island's GPUs (``_tail_average_rows``),
and, inside a window on the largest step tail, the cover a large-tail stage must have upstream
(``_tail_window_rows``, ``_successor_term``). :class:`OrderRows` holds them
as methods of the model class, which builds them from its own variables.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tangram_opt.planner.formulations.ticks import rounders
from tangram_opt.solvers.model import ArrayConstraint, Constraint, LinearModel, LinExpr, Var

#: rows Y >= (least tail above theta) - (cover upstream) per tail window (``_tail_window_rows``)
TAIL_WINDOW_ROWS = 16
#: island-block rows (``_island_block_rows``) for every set of at most this many islands
ISLAND_BLOCK_SETS = 3
#: the whole-pipeline block with every boundary priced by both of its stages' sides
#: (``_island_side_rows``, ``FormulationOptions.island_sides``): at most this many side caps per
#: island, and every combination of the islands' caps while there are at most ISLAND_SIDE_COMBOS
ISLAND_SIDE_CAPS = 4
ISLAND_SIDE_COMBOS = 36


def _spread(values: list[float], k: int) -> list[float]:
    """At most ``k`` of the sorted ``values``, evenly spaced, the smallest and the largest among them."""
    if len(values) <= k:
        return values
    return [values[round(q * (len(values) - 1) / (k - 1))] for q in range(k)]


@dataclass(frozen=True, slots=True)
class StageArrays:
    """A window's columns as the neighbour rows read them, one array entry per column (middle types,
    then first, then last): ``w`` (time plus the cheapest link it can have), ``t`` (time), ``island``,
    ``ends`` (1 for an end stage, which has one neighbour), ``col`` (the column's index) and ``floor``
    (the least time of any link of the stage, ``PipelineProblem.link_floor_s``). The rows
    split the columns by thresholds once per (theta, island); boolean masks over these arrays do it
    in one pass each, and keep the columns in order."""

    w: np.ndarray
    t: np.ndarray
    island: np.ndarray
    ends: np.ndarray
    col: np.ndarray
    floor: np.ndarray
    #: island -> mask of its columns
    on: dict[int, np.ndarray]

    @staticmethod
    def of(islands: Sequence[int], w: list[float], t: list[float], island: list[int], ends: list[int],
           col: list[int], floor: list[float]) -> StageArrays:
        isl = np.array(island, dtype=np.int64)
        return StageArrays(w=np.array(w, dtype=float), t=np.array(t, dtype=float), island=isl,
                           ends=np.array(ends, dtype=np.int64), col=np.array(col, dtype=np.int64),
                           floor=np.array(floor, dtype=float), on={i: isl == i for i in islands})


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
        mid_cols = [var.index for var in self.n.values()]

        def at_least(t: int, stages: int, k: int, rhs: LinExpr, name: str) -> None:
            """The row ``t (stages + n_mid) + k Smax - k t + relax >= rhs`` (McCormick's over-estimator
            of ``Smax * P`` on the left; ``rhs`` holds stage columns and Cm) as one coefficient dict:
            both sides have a column per stage type, which operators would copy at every step."""
            row = {i: t - rhs.coefs.get(i, 0.0) for i in mid_cols}
            row[Smax.index] = float(k)
            for i, c in relax.coefs.items():
                row[i] = row.get(i, 0.0) + c
            row.update({i: 0.0 - c for i, c in rhs.coefs.items() if i not in row})
            md.add(Constraint(row, rhs.const - t * (stages - k) - relax.const, math.inf), name)

        round_trip = total_T_expr(self, fl) + 2 * Cm
        at_least(hi_t, 2, first, round_trip, f"cycle_hi{tag}")
        at_least(lo_t, 2, last, round_trip, f"cycle_lo{tag}")
        c_out = {i: ce(max(p.link_hi_s[i, j] for j in islands)) for i in islands}
        c_in = {i: ce(max(p.link_hi_s[j, i] for j in islands)) for i in islands}
        for end, group, tys, link in (("first", self.e, self.types["first"], c_out),
                                      ("last", self.h, self.types["last"], c_in)):
            trimmed = round_trip - LinExpr.terms((var, ce(tys[si].time_s) + 2 * link[cands[tys[si].candidate].island])
                                                 for si, var in group.items())
            at_least(hi_t, 1, first - 1, trimmed, f"cycle_{end}_hi{tag}")
            at_least(lo_t, 1, last - 1, trimmed, f"cycle_{end}_lo{tag}")

    def _island_block_rows(self, relax: LinExpr) -> None:
        """The stages of a set of islands G, block by block.

        A maximal run of r consecutive stages on G is a block: r Smax >= sum T + 2 sum c over
        its r - 1 inner boundaries (when r < m, as every run is when P < m: ``relax`` switches
        the rows off otherwise). An inner boundary takes c_uv >= lat + max(s_u, s_v), lat the
        smallest latency of a link inside G and s a stage's own side of such a link (at least its
        shared time); along a run the sum of those maxima is at least every side but the run's
        largest, and for any sigma that largest is at most sigma plus the excess of its stage
        over sigma. Summed over G's runs, of which there are n_G - a_G (a_G: the boundaries
        inside G, sum of a[i, j] over i, j in G):
        Smax n_G >= sum_{s on G} (T_s + 2 min(s_s, sigma) + 2 lat) - 2 (lat + sigma)(n_G - a_G),
        with McCormick's over-estimators of Smax n_G on Smax in [lo, hi] and n_G in [0, U_G]:
        hi n_G, and lo n_G + U_G (Smax - lo); one sigma per distinct side on G, G every set of
        up to ISLAND_BLOCK_SETS islands used by the window. With every island this is the
        whole-pipeline block seen through the stages' sides; with one, it sees an island whose
        stages each fit the window but whose links do not: a run of near-bottleneck stages joined
        by a slow NIC, which the whole-pipeline rows average away over faster islands."""
        p, tick = self.problem, self.options.tick_s
        fl, ce = rounders(tick)
        lo_t, hi_t = max(fl(self.lower_tmax_s), fl(min(p.link_lo_s.values()))), ce(self.upper_tmax_s)
        cands = p.candidates
        cols: dict[int, list[tuple[int, int, float, float]]] = {}  # island -> (column, candidate, T, count's bound)
        degree: dict[int, float] = {}  # column -> boundaries of its stage: 2 in the middle, 1 at an end
        for group, tys in ((self.n, self.types["mid"]), (self.e, self.types["first"]), (self.h, self.types["last"])):
            for si, var in group.items():
                t = tys[si]
                cols.setdefault(cands[t.candidate].island, []).append((var.index, t.candidate, t.time_s, var.ub))
                degree[var.index] = 2.0 if group is self.n else 1.0
        used = sorted(cols)
        for size in range(1, min(len(used), ISLAND_BLOCK_SETS) + 1):
            for G in itertools.combinations(used, size):
                lat = min(p.links[i, j].latency_s for i in G for j in G)
                members = [m for i in G for m in cols[i]]
                # a stage's side of G's links: per candidate (many columns share one), on the
                # links touching its island inside G
                side_of: dict[int, float] = {}
                for i in G:
                    on_i = [p.links[i, j] for j in G] + [p.links[j, i] for j in G]
                    # a side is the NIC or the scale-up time by the link's kind: the least of
                    # max(side, shared) over each kind's links, once per island and G
                    least = {up: min((lk.shared_s for lk in on_i if lk.scale_up == up), default=None)
                             for up in (False, True)}
                    for ci in {ci for _, ci, _, _ in cols[i]}:
                        c = cands[ci]
                        side_of[ci] = min(max(c.p2p_scale_up_s if up else c.p2p_nic_s, shared)
                                          for up, shared in least.items() if shared is not None)
                col = np.array([vi for vi, _, _, _ in members], dtype=np.int64)
                t = np.array([tm for _, _, tm, _ in members])
                side = np.array([side_of[ci] for _, ci, _, _ in members])
                u_g = min(float(p.max_stages), sum(ub for *_, ub in members))
                inside = [self.a[i, j].index for i in G for j in G]
                tag = ",".join(map(str, G))
                for q, sigma in enumerate(np.unique(side).tolist()):
                    run = ce(2 * (lat + sigma))  # what each run takes back
                    # each stage's time, side up to sigma and latency, in ticks rounded down (``fl``)
                    priced = np.floor((t + 2 * np.minimum(side, sigma) + 2 * lat) / tick + 1e-9)
                    self._block_pair(col, priced - run, dict.fromkeys(inside, -float(run)), u_g, relax,
                                     (lo_t, hi_t), f"island_block_{{}}[{tag}|{q}]")
                if self.options.island_sides and size == len(used) > 1:
                    island_of = [cands[ci].island for _, ci, _, _ in members]
                    self._island_side_rows(G, col, t, side, island_of, [degree[vi] for vi, *_ in members], lat,
                                           u_g, relax, (lo_t, hi_t))

    def _block_pair(self, col: np.ndarray, priced: np.ndarray, links: dict[int, float], u_g: float,
                    relax: LinExpr, bounds: tuple[int, int], label: str) -> None:
        """The rows ``hi n >= priced . x - links . a`` and ``lo n + u_g (Smax - lo) >=`` the same
        (McCormick's over-estimators of ``Smax n`` on Smax in [lo, hi] and n in [0, u_g]), ``n`` the
        stages of the columns ``col`` and ``links`` the coefficients of boundary columns, in ticks;
        ``relax`` switches them off, ``label`` names them with "hi" or "lo" in its braces. Array
        rows: ``col`` (stage types), ``links`` (boundaries), Smax and ``relax`` (the binary "short")
        are distinct columns."""
        md, Smax = self.model, self.aux["Smax"]
        lo_t, hi_t = bounds
        for name, per, k in (("hi", hi_t, 0.0), ("lo", lo_t, u_g)):
            extra = {**links, Smax.index: k, **relax.coefs} if k else {**links, **relax.coefs}
            md.add(ArrayConstraint(np.concatenate((col, np.fromiter(extra, np.int64, len(extra)))),
                                   np.concatenate((per - priced, np.fromiter(extra.values(), float, len(extra)))),
                                   k * lo_t - relax.const, math.inf), label.format(name))

    def _island_side_rows(self, G: tuple[int, ...], col: np.ndarray, t: np.ndarray, side: np.ndarray,
                          island_of: list[int], degree: list[float], lat: float, u_g: float,
                          relax: LinExpr, bounds: tuple[int, int]) -> None:
        """The whole-pipeline block with every boundary priced by the sides of both its stages.

        G holds every island the window uses. Each boundary takes ``c_uv >= lat + max(s_u, s_v)``
        (``_island_block_rows``). Cap each stage's side at a value ``sigma_i`` of its island
        (``s' = min(s, sigma_i)``): then ``max(s'_u, s'_v) >= s'_u + s'_v - min(sigma_i, sigma_j)``
        for stages on islands i and j. Summed over the boundaries, every stage counts its side once
        per boundary it has (two in the middle, one at an end), and the boundaries between islands
        i and j (``a[i, j]``) take back ``min(sigma_i, sigma_j)`` each:
        ``sum_b c_b >= lat (P - 1) + sum_s deg_s s'_s x_s - sum_{i, j} min(sigma_i, sigma_j) a[i, j]``.
        With ``P Smax >= sum T + 2 sum c`` (P < m; ``relax`` switches the rows off otherwise) and
        McCormick's over-estimators of ``Smax P`` as in ``_island_block_rows``: one pair of rows per
        combination of caps. The island-block rows give back the largest side once per run of
        stages; these charge a slow-NIC stage on every boundary it has, also where its neighbours
        lie on another island (a V100 stage between two A10G stages pays its 25 Gb/s side twice),
        which ``comm_island`` prices for one island at a time through ``Cm``, averaged with the
        other islands' cheaper links in the cycle rows."""
        tick = self.options.tick_s
        fl, ce = rounders(tick)
        on = np.array(island_of)
        deg = np.array(degree)
        two_lat = fl(2 * lat)
        caps = [_spread(np.unique(side[on == i]).tolist(), ISLAND_SIDE_CAPS) for i in G]
        if math.prod(len(c) for c in caps) <= ISLAND_SIDE_COMBOS:
            combos = list(itertools.product(*caps))
        else:  # each island's caps in turn, every other island's stages at their smallest side
            combos = [tuple(c if n == k else caps[n][0] for n in range(len(G))) for k in range(len(G)) for c in caps[k]]
        tag = ",".join(map(str, G))
        for q, sigma in enumerate(combos):
            cap_of = dict(zip(G, sigma))
            capped = np.minimum(side, np.array([cap_of[i] for i in island_of]))
            # each stage's time and its capped side per boundary, in ticks rounded down
            priced = np.floor((t + 2 * deg * capped) / tick + 1e-9)
            back = {self.a[i, j].index: float(ce(2 * min(cap_of[i], cap_of[j])) - two_lat) for i in G for j in G}
            self._block_pair(col, priced, back, u_g, relax, bounds, f"island_sides_{{}}[{tag}|{q}]")

    def _island_link_rows(self, Cm: Var, columns, side_lo: dict[int, int], fl) -> None:  # type: ignore[no-untyped-def]
        """The boundaries that touch one island i, priced by the sides of its stages.

        A boundary takes ``c = L + max(S_a, S_b, Z)`` (§1). One from a stage s on island i to a
        stage on another island takes at least ``L + S_s``; one between two stages a, b on i at
        least ``L + S_a + S_b - sigma`` with both sides capped at sigma (``min(S, sigma)``), for any
        sigma; any other at least ``link_lo``. A middle stage has two boundaries and an end stage
        one, so summed over the boundaries, with a[j, k] counting them by islands:
        Cm >= sum_{s on i} deg(s) min(S_s, sigma) - sigma a[i, i] + sum_{j, k} L_jk a[j, k]
        + sum_{j, k != i} (link_lo[j, k] - L_jk) a[j, k], one row per island and per distinct
        side sigma of its stages (in ticks, rounded down). ``comm_send`` and ``comm_recv`` count
        each boundary by one of its two sides; these rows count a slow-NIC island's stages by all
        of their boundaries, which its neighbours on a faster island cannot make cheaper."""
        p, md = self.problem, self.model
        cands = p.candidates
        per_island: dict[int, list[tuple[int, float, int]]] = {}  # island -> (column, degree, side)
        for role, group in columns:
            for si, var in group.items():
                ci = self.types[role][si].candidate
                per_island.setdefault(cands[ci].island, []).append(
                    (var.index, 2.0 if role == "mid" else 1.0, side_lo[ci]))
        latency = {key: fl(p.links[key].latency_s) for key in self.a}
        for i, cols in sorted(per_island.items()):
            others = {}
            for (j, k), av in self.a.items():
                coef = fl(p.link_lo_s[j, k]) if i not in (j, k) else latency[j, k]
                if coef:
                    others[av.index] = -float(coef)
            inner = self.a[i, i].index
            for q, sigma in enumerate(sorted({side for _, _, side in cols})):
                row = dict(others)
                for vi, deg, side in cols:
                    if (capped := min(side, sigma)):
                        row[vi] = -deg * capped
                row[inner] = row.get(inner, 0.0) + sigma
                row[Cm.index] = 1.0
                md.add(Constraint(row, 0.0, math.inf), f"comm_island[{i}|{q}]")

    def _link_minima(self) -> tuple[dict[int, float], dict[tuple[int, int], float]]:
        """``cmin[i]``: the cheapest link touching island i (either direction); ``cpair[i, j]``: the
        cheaper direction of the link between islands i and j."""
        p = self.problem
        islands = sorted(p.island_gpus)
        cpair = {(i, j): min(p.link_lo_s[i, j], p.link_lo_s[j, i]) for i in islands for j in islands}
        return {i: min(cpair[i, j] for j in islands) for i in islands}, cpair

    def _compatible_limits(self, heavy: dict[int, tuple[float, float]], cpair: dict[tuple[int, int], float],
                           island: np.ndarray, floor: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """For a pairwise incompatible set H with fastest member time and least link floor
        ``heavy[i] = (t_min, f_min)`` per island, and stages on ``island`` with link floors ``floor``
        (arrays): a stage of time t can neighbour some member of H only if ``t <= limit``; a middle
        stage between two members forms a block of three with them, so it can have two neighbours
        in H only if ``t <= sandwich`` (None when m <= 3: that block does not count).

        A link between a member h on island i and the stage s takes at least
        ``max(cpair[i, j], floor_s, floor_h)``, so with ``x_i = t_min + 2 max(cpair[i, j], floor_s, f_min)``
        the pair fits under hi only if ``t + x_i <= 2 hi`` and the block of three only if
        ``t + x_i1 + x_i2 <= 3 hi``: ``limit = 2 hi - min_i x_i``, ``sandwich = 3 hi - 2 min_i x_i``."""
        hi = self.upper_tmax_s
        slack = 2 * hi * 1e-9
        islands = sorted(self.problem.island_gpus)
        pos = np.searchsorted(np.array(islands, dtype=np.int64), island)
        x = np.full(len(island), math.inf)
        for i, (tm, fm) in heavy.items():
            link = np.array([cpair[i, j] for j in islands], dtype=float)[pos]
            x = np.minimum(x, tm + 2 * np.maximum(np.maximum(link, floor), fm))
        limit = 2 * hi + slack - x
        if self.problem.num_micro_batches <= 3:
            return limit, None
        return limit, 3 * hi + slack - 2 * x

    def _neighbour_row(self, md: LinearModel, st: StageArrays, heavy: np.ndarray, light: np.ndarray,
                       medium: np.ndarray | None, sandwich: np.ndarray | None, name: str,
                       cpair: dict[tuple[int, int], float], hi: float) -> None:
        """Edges between H and L(H) (masks over the columns ``st``) counted from both sides:
        2 n_H + e_H + h_H <= sum over L of (2 n + e + h), a middle stage of L counting once only
        when its time is above its ``sandwich`` entry (it cannot sit between two heavy stages).

        The other stages (set M, ``medium``: neither in H nor compatible with any of it; None
        without ``order_rows``) have all their
        neighbours outside H. A maximal run of M stages on the path that does not hold an end of
        the path has two boundary edges, both into L (one if it holds an end). So when some M
        stage exists (binary ``medium``), L's edges feed H and at least one run. An end stage of M
        that no other stage of M can neighbour is a run alone, with one edge into L:
        2 n_H + e_H + h_H + 2 medium + (isolated ends of M) - (other ends of M) <= sum over L of (2 n + e + h),
        ``medium`` counting middle stages of M only."""
        # dense rows (every type of the window) as arrays; H, L and M are disjoint masks
        light_ends = st.ends[light] == 1
        cols = np.concatenate((st.col[heavy], st.col[light]))
        edges = np.where(light_ends, -1.0, -2.0)  # an end has one neighbour
        full = np.concatenate((2.0 - st.ends[heavy], edges))
        if sandwich is not None:  # and so has a middle stage too slow to sit between two heavy ones
            edges = np.where(light_ends | (st.t[light] > sandwich[light]), -1.0, -2.0)
        md.add(ArrayConstraint(cols, np.concatenate((2.0 - st.ends[heavy], edges)), -math.inf, 0.0), name)
        if medium is None or not heavy.any() or not medium.any():
            return
        medium_stages = list(zip(st.t[medium].tolist(), st.island[medium].tolist(), st.ends[medium].tolist(),
                                 st.col[medium].tolist()))
        tag = name[len("neighbours"):]
        # an end stage of M compatible with no other stage of M (no middle one, not the other
        # end) is a run of its own, with one boundary edge into L
        first_cols = {v.index for v in self.e.values()}
        role = lambda ci, ends: "mid" if not ends else "first" if ci in first_cols else "last"  # noqa: E731
        fastest: dict[tuple[str, int], float] = {}  # (role, island) -> fastest time in M
        for t, j, ends, ci in medium_stages:
            key = (role(ci, ends), j)
            fastest[key] = min(t, fastest.get(key, math.inf))
        partner = {"first": ("mid", "last"), "last": ("mid", "first")}
        mids_m: dict[int, float] = {}
        ends_m: dict[int, float] = {}
        reach: dict[tuple[str, int], list[tuple[float, float]]] = {}  # (role, island) -> its partners' (time, 2 c)
        for t, j, ends, ci in medium_stages:
            if not ends:
                mids_m[ci] = 1.0
                continue
            key = (role(ci, ends), j)
            pairs = reach.get(key)
            if pairs is None:
                pairs = reach[key] = [(tm, 2 * cpair[j, i]) for (r, i), tm in fastest.items() if r in partner[key[0]]]
            ends_m[ci] = 1.0 if all(t + tm + c2 > 2 * hi for tm, c2 in pairs) else -1.0
        if mids_m:
            # u = 1 as soon as a middle stage of M is used (integrality does the rest): one row
            # instead of one per type of M
            u = md.add_binary(f"medium{tag}")
            md.add(Constraint({**mids_m, u.index: -float(self.problem.max_stages)}, -math.inf, 0.0), f"medium_def{tag}")
            ends_m[u.index] = 2.0
            self.medium.append((u, frozenset(mids_m)))
        md.add(ArrayConstraint(np.concatenate((cols, np.fromiter(ends_m, np.int64, len(ends_m)))),
                               np.concatenate((full, np.fromiter(ends_m.values(), float, len(ends_m)))),
                               -math.inf, 0.0), f"neighbours_medium{tag}")

    def _tail_average_rows(self, md: LinearModel, Y: Var, U: Var,  # type: ignore[no-untyped-def]
                           columns, island, gpus, fl, ce, out_lo: dict[int, float]) -> None:
        """``Y + U`` is at least every stage's *reach* ``v_s`` (its tail, plus its own backward
        and out-link when it is not the last stage: U counts them, but they are not upstream of
        it), hence at least any average of the reaches with weights summing to at most 1, such as
        GPUs over what the window's stages can occupy of the island (``capacity``; ``tail_gpus[i]``).
        Unlike ``tail_mid``, the row reads no "type used" binary, so spreading a slow-NIC island's
        stages over many fractional types does not hide their tails (formulations/pipeline_mip.md §3).
        In a tail window some stage's tail exceeds ``lower_tail_s``, so the largest reach is at
        least ``theta`` (that edge in ticks) and only the reaches' excess over ``theta`` is averaged:
        ``Y + U >= theta + sum w_s (v_s - theta)^+ x_s``."""
        p = self.problem
        theta = fl(self.lower_tail_s) if self.lower_tail_s is not None else 0
        reach = {role: [max(0, fl(t.tail_s) + (0 if role == "last" else ce(t.bwd_s) + out_lo[t.candidate]) - theta)
                        for t in self.types[role]] for role in self.types}
        for i in sorted(p.island_gpus):
            row = {var.index: -float(gpus[role][si] * reach[role][si])
                   for role, group in columns for si, var in group.items()
                   if island[role][si] == i and reach[role][si] > 0}
            if row:
                row[Y.index] = row[U.index] = float(self.capacity[i])
                md.add(Constraint(row, float(self.capacity[i] * theta), math.inf), f"tail_gpus[{i}]")

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
        # every column but the last stage's, with its coefficient as cover (tail at most theta) and
        # as downstream of k (or k itself, a tail above theta), whose out-link is not cover; one
        # array pass per theta picks between the two
        not_last = [(tail, bwd, var.index, -out_lo[t.candidate] if self.options.order_rows else 0.0)
                    for tail, bwd, role, var, t, _ in entries if role != "last"]
        cols = [vi for _, _, vi, _ in not_last]
        tail_of, cover, downstream = (np.array([e_[k] for e_ in not_last], dtype=float) for k in (0, 1, 3))
        tails = sorted(e_[0] for e_ in entries)
        for q, theta in enumerate(thetas):
            least = tails[bisect.bisect_right(tails, theta)]  # the least tail above theta
            row = dict(base)
            # successors take their backward and out-link off the cover: only those counted as
            # cover in this row (tail <= theta; below theta_min some successor types are not)
            for i, c in succ_term.coefs.items():
                if succ_tail[i] <= theta:
                    row[i] = row.get(i, 0.0) - c
            row.update(zip(cols, np.where(tail_of <= theta, cover, downstream).tolist()))
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
        floor = [p.link_floor_s(t.candidate) for *_, t, _ in entries]
        in_s = [tail > lower and t.time_s + max(cmin[isl(t)], f) > hi * (1 + 1e-9)
                for (tail, _, _, _, t, _), f in zip(entries, floor)]
        if not any(s and role == "mid" for s, (_, _, role, *_) in zip(in_s, entries)):
            return LinExpr()
        heavy: dict[int, tuple[float, float]] = {}  # fastest member of S and least link floor, per island
        for s, (_, _, _, _, t, _), f in zip(in_s, entries, floor):
            if s:
                tm, fm = heavy.get(isl(t), (math.inf, math.inf))
                heavy[isl(t)] = (min(t.time_s, tm), min(f, fm))
        limit, sandwich = self._compatible_limits(
            heavy, cpair, np.array([isl(t) for *_, t, _ in entries], dtype=np.int64), np.array(floor, dtype=float))
        need = LinExpr()  # members of S in the middle, less the successors that need no variable
        edges = LinExpr()  # edges of S beyond the first member's left one, less those of free neighbours
        edges.const = -1.0
        term = LinExpr()
        for k, (s, (tail, _, role, var, t, si)) in enumerate(zip(in_s, entries)):
            if s:
                self.succ_heavy.add((role, si))
                edges.add_term(var, 2 if role == "mid" else 1)
            compatible = t.time_s <= limit[k]
            two = 1 if sandwich is not None and t.time_s > sandwich[k] else 2
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
    return LinExpr({var.index: float(t) for group, tys in ((mip.n, mip.types["mid"]), (mip.e, mip.types["first"]),
                                                          (mip.h, mip.types["last"]))
                    for si, var in group.items() if (t := fl(tys[si].time_s))})


__all__ = ["ISLAND_BLOCK_SETS", "OrderRows", "StageArrays", "TAIL_WINDOW_ROWS", "total_T_expr"]
