"""Public entry points: :func:`place_experts` and :func:`imbalance_for`.

The MIP method runs, in order (each step's result is kept only if it is better):

1. the combinatorial lower bounds (:mod:`.bounds`);
2. the EPLB-style greedy (:mod:`.greedy`), hierarchical, plus its global variant;
3. local search from both (:mod:`.improve`) and the optimal shares of the best replica set (:mod:`.split`);
4. if the gap of that incumbent is above ``rel_gap``: the MIP (:mod:`.mip`) warm-started from it, with
   the remaining time. The MIP's dual bound and the combinatorial bound together certify the result.

The returned placement is never worse (in the weighted objective) than the greedy it started from.
"""

from __future__ import annotations

import math
import numbers
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from tangram_opt.errors import InfeasibleError, NoSolutionError, SpecError
from tangram_opt.experts.bounds import best_lower_bound
from tangram_opt.experts.cases import case_starts
from tangram_opt.experts.differencing import differencing_placement
from tangram_opt.experts.greedy import greedy_placement
from tangram_opt.experts.improve import iterated_local_search, local_search
from tangram_opt.experts.mip import build_and_solve
from tangram_opt.experts.placement import (ExpertPlacement, PlacementCertificate, build_placement, cross_node_tokens,
                                           moved_experts)
from tangram_opt.experts.problem import PlacementProblem, check_real, make_problem
from tangram_opt.experts.split import optimal_split
from tangram_opt.solvers import SolveOptions, SolveStatus, get_backend

METHODS = ("mip", "greedy")
DEFAULT_PLACEMENT_BACKEND = "highs"
DEFAULT_REL_GAP = 1e-3
#: share of time_limit_s kept back from the heuristics and the MIP backend for polishing the answer and
#: building the result
POST_SOLVE_MARGIN = 0.1
#: seconds the MIP gets even past the time limit when no heuristic found a placement (it is the only way to one)
MIN_MIP_S = 0.5


def _max_load(served: Sequence[dict[int, float]]) -> float:
    return max(sum(d.values()) for d in served)


def _objective(p: PlacementProblem, served: Sequence[dict[int, float]], alpha: float, beta: float) -> float:
    t = max(sum(d.values()) for d in served)
    out = t
    if alpha:
        out += alpha * cross_node_tokens(p, served)
    if beta:
        out += beta * moved_experts(p, [list(d) for d in served])
    return out


def _polish(p: PlacementProblem, served: Sequence[dict[int, float]], alpha: float, beta: float, deadline: float
            ) -> list[dict[int, float]]:
    """Lexicographically best shares (max load, then cross-node tokens) for the same replicas, kept unless
    the weighted objective gets worse (LP tolerances can make it a hair worse than exact arithmetic).
    The shares are kept as they are when the split LP is not solved before ``deadline`` (``perf_counter``)."""
    served = _conserve(p, served)
    holders = [list(d) for d in served]
    left = deadline - time.perf_counter()
    if left <= 0:
        return served
    try:
        _, best = optimal_split(p, holders, locality=True, time_limit_s=left)
    except NoSolutionError:  # out of time: the shares in hand are valid
        return served
    if _objective(p, best, alpha, beta) <= _objective(p, served, alpha, beta) * (1 + 1e-12):
        return best
    return served


def _conserve(p: PlacementProblem, served: Sequence[dict[int, float]]) -> list[dict[int, float]]:
    """Rescale each expert's shares to sum to its load exactly (solver output satisfies rows to ~1e-6)."""
    tot = [0.0] * p.experts
    for d in served:
        for e, t in d.items():
            tot[e] += max(0.0, t)
    out = []
    for d in served:
        out.append({e: (max(0.0, t) * p.loads[e] / tot[e] if tot[e] > 0 else 0.0) for e, t in d.items()})
    for e in range(p.experts):  # experts whose replicas all got 0 (only when w[e] == 0)
        if tot[e] <= 0 and p.loads[e] > 0:
            r = next(r for r, d in enumerate(out) if e in d)
            out[r][e] = p.loads[e]
    return out


def _certificate(p: PlacementProblem, served, *, status: str, alpha: float, beta: float, bound_obj: float,
                 load_bound: float, bound_source: str, backend: str = "", solve_time_s: float = 0.0,
                 note: str = "") -> PlacementCertificate:
    return PlacementCertificate(status=status, objective=_objective(p, served, alpha, beta), bound=bound_obj,
                       max_load_bound=load_bound, backend=backend, solve_time_s=solve_time_s,
                       bound_source=bound_source, note=note)


def solve_layer(p: PlacementProblem, *, method: str = "mip", backend: str = DEFAULT_PLACEMENT_BACKEND,
                time_limit_s: float = 10.0, rel_gap: float = DEFAULT_REL_GAP, cross_node_weight: float = 0.0,
                move_weight: float = 0.0, num_groups: int | None = None, threads: int = 1, seed: int = 0,
                local_search_s: float | None = None, heuristics: bool = True) -> ExpertPlacement:
    """Place one layer (see :func:`place_experts` for the arguments).

    ``heuristics=False`` skips the greedy warm start, local search and the early stop on the
    combinatorial bound: the MIP runs cold (used to test the formulation on every backend).

    Time: every step checks the deadline ``time_limit_s`` after the start and stops with what it has (the
    bounds keep what they proved, the searches their best placement, the split LP and the MIP are skipped or
    cut short). Two parts always run to completion, so very large instances can exceed a tiny limit by
    their cost: the first greedy placement (the fallback answer, ``O(E log E + P log R)``), the cheap bounds
    (``mean``, ``replica-count``, ``top-j``, ``pigeonhole``: ``O(E log E + P log E)``), and the LP backend's
    own model check after a solve. When no heuristic found a placement (``heuristics=False``, or memory
    limits the greedy could not meet), the MIP gets at least ``MIN_MIP_S`` seconds: it is the only way to
    an answer."""
    _check_options(time_limit_s=time_limit_s, rel_gap=rel_gap, threads=threads, seed=seed,
                   cross_node_weight=cross_node_weight, move_weight=move_weight)
    t0 = time.perf_counter()
    # the searches, bounds and LPs stop at ``deadline``; what is left is for the MIP's answer and the result
    deadline = t0 + (1 - POST_SOLVE_MARGIN) * time_limit_s

    def time_left() -> float:
        return deadline - time.perf_counter()

    alpha, beta = float(cross_node_weight), float(move_weight)
    if method == "greedy":
        holders, served = greedy_placement(p, num_groups=num_groups)
        lb = best_lower_bound(p, upper=max(sum(d.values()) for d in served), deadline=deadline)
        cert = _certificate(p, served, status="heuristic", alpha=alpha, beta=beta, bound_obj=lb.value,
                            load_bound=lb.value, bound_source=lb.source, solve_time_s=time.perf_counter() - t0,
                            note="EPLB-style hierarchical greedy; bound from combinatorial arguments")
        return build_placement(p, served, method="greedy", certificate=cert, holders=holders)
    # --- incumbents: greedy (hierarchical and global), local search, optimal shares -------------------------
    starts: list[list[dict[int, float]]] = []
    if heuristics:
        try:
            starts.append(greedy_placement(p, num_groups=num_groups)[1])
        except InfeasibleError:
            pass
        if p.nodes > 1 and time_left() > 0:  # EPLB's global policy (all ranks as one node) is a second start
            try:
                flat = make_problem(p.loads, p.ranks, 1, p.slots_per_rank, max_redundant=p.max_redundant,
                                    expert_bytes=p.expert_bytes, rank_memory_bytes=p.rank_memory_bytes)
                starts.append(greedy_placement(flat)[1])
            except InfeasibleError:
                pass
        diff = differencing_placement(p) if time_left() > 0 else None  # every rank at exactly S items
        if diff is not None:
            starts.append(diff)
    ls_budget = min(0.25 * time_limit_s, 2.0) if local_search_s is None else local_search_s
    t_ls = time.perf_counter()
    # the bound first (cheap): the searches stop once the hottest rank is within rel_gap of it
    upper = min((_max_load(s) for s in starts), default=None)
    target = None
    first_lb = None
    if starts and alpha == 0 and beta == 0:
        # at most half of the time left: the searches need the rest
        first_lb = best_lower_bound(p, upper=upper, deadline=time.perf_counter() + 0.5 * max(0.0, time_left()))
        target = first_lb.value * (1 + 0.5 * rel_gap)
    ls_end = min(t_ls + ls_budget, deadline)
    candidates = list(starts)
    for s in starts:
        share = max(0.0, min(ls_budget, ls_end - time.perf_counter())) / (len(starts) + 1)
        candidates.append(local_search(p, s, time_limit_s=share, target=target))
    best: list[dict[int, float]] | None = None
    if candidates:
        best = min(candidates, key=lambda s: _objective(p, s, alpha, beta))
        if target is None or _max_load(best) > target:
            left = max(0.0, ls_end - time.perf_counter())
            kicked = iterated_local_search(p, best, time_limit_s=left, target=target, seed=seed)
            if _objective(p, kicked, alpha, beta) < _objective(p, best, alpha, beta):
                best = kicked
        best = _polish(p, best, alpha, beta, deadline)
    if first_lb is not None and time_left() <= 0:
        lb = first_lb  # the same bounds again, cut shorter
    else:
        lb = best_lower_bound(p, upper=_max_load(best) if best is not None else None, deadline=deadline)
        if first_lb is not None and first_lb.value > lb.value:  # both are valid; the first may have had more time
            lb = first_lb
    bound_obj, load_bound, source = lb.value, lb.value, lb.source
    status, used_backend, note = "feasible", "", ""
    inc = _objective(p, best, alpha, beta) if best is not None else math.inf
    if (best is not None and heuristics and alpha == 0 and beta == 0 and inc - bound_obj > rel_gap * inc
            and time_left() > 0):
        # few free replicas: the counts of the replica cases not refuted near the bound are other starts
        alt = case_starts(p, lb.value, inc, time_limit_s=min(ls_budget, 0.2 * time_limit_s, time_left()),
                          target=lb.value * (1 + 0.5 * rel_gap))
        if alt is not None:
            alt = _polish(p, alt, alpha, beta, deadline)
            if _objective(p, alt, alpha, beta) < inc:
                best, inc = alt, _objective(p, alt, alpha, beta)
    # the solver gets what is left of the limit, less a margin for polishing its answer, so that the whole
    # call stays within time_limit_s
    remaining = (1 - POST_SOLVE_MARGIN) * time_limit_s - (time.perf_counter() - t0)
    if best is None:
        remaining = max(MIN_MIP_S, remaining)  # nothing to return without the MIP
    if best is not None and heuristics and inc - bound_obj <= rel_gap * inc:
        status, note = "optimal", "incumbent meets the combinatorial bound; no MIP needed"
    elif remaining <= 0:
        note = f"time limit ({time_limit_s:g} s) reached before the MIP; the gap is from the combinatorial bounds"
    else:
        be = get_backend(backend)
        opts = SolveOptions(time_limit_s=remaining, threads=threads, seed=seed, rel_gap=rel_gap)
        out = build_and_solve(p, backend=be.name, options=opts, incumbent_objective=inc,
                              lower_bound=lb.value, hint_holders=[list(d) for d in best] if best else None,
                              hint_served=best, cross_node_weight=alpha, move_weight=beta,
                              deadline=time.perf_counter() + remaining)
        used_backend = be.name
        if out.served is not None:
            cand = _polish(p, out.served, alpha, beta, t0 + time_limit_s)
            if best is None or _objective(p, cand, alpha, beta) < inc:
                best, inc = cand, _objective(p, cand, alpha, beta)
        if out.bound is not None:
            bound_obj = max(bound_obj, out.bound)
            if alpha == 0 and beta == 0 and out.bound > load_bound:
                load_bound, source = out.bound, "mip"
        if out.result.status == SolveStatus.INFEASIBLE and best is None:
            raise InfeasibleError("no placement satisfies slots, memory and the replica budget "
                                  f"({p.experts} experts, {sum(p.slots_per_rank)} slots, {p.max_replicas} replicas)")
        if best is None:
            raise InfeasibleError(f"{be.name} found no placement in {remaining:.1f} s and the greedy could not "
                                  "place every expert; raise time_limit_s or relax memory limits")
        bound_obj = min(bound_obj, inc)
        # a solver that stops at rel_gap may report its bound exactly that far below: allow rounding
        if inc - bound_obj <= rel_gap * inc * (1 + 1e-9):
            status = "optimal"
        note = f"MIP {out.result.status.value}"
    cert = _certificate(p, best, status=status, alpha=alpha, beta=beta, bound_obj=min(bound_obj, inc),
                        load_bound=load_bound, bound_source=source, backend=used_backend,
                        solve_time_s=time.perf_counter() - t0, note=note)
    return build_placement(p, best, method="mip", certificate=cert)


def _check_options(*, time_limit_s: Any, rel_gap: Any, threads: Any, seed: Any, cross_node_weight: Any,
                   move_weight: Any) -> None:
    """The solver knobs of :func:`place_experts` and :func:`solve_layer`, each named in the error."""
    for name, v in (("cross_node_weight", cross_node_weight), ("move_weight", move_weight),
                    ("time_limit_s", time_limit_s), ("rel_gap", rel_gap)):
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v) or v < 0:
            raise SpecError(name, v, "must be a finite number >= 0", "use 0 to switch the term off")
    if time_limit_s <= 0:
        raise SpecError("time_limit_s", time_limit_s, "must be > 0", "give the solver some seconds, e.g. 10")
    if rel_gap >= 1:
        raise SpecError("rel_gap", rel_gap, "must be a relative gap in [0, 1)",
                        f"use e.g. {DEFAULT_REL_GAP:g} (0.1%); 0 asks for a proof of optimality")
    for name, v, lo, fix in (("threads", threads, 1, "use 1 or more solver threads"),
                             ("seed", seed, 0, "use 0 or another non-negative integer")):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < lo:
            raise SpecError(name, v, f"must be an integer >= {lo}", fix)


def _as_layers(loads: Any) -> tuple[np.ndarray, bool]:
    if isinstance(loads, (list, tuple, np.ndarray)):
        check_real("loads", loads)
    try:
        arr = np.asarray(loads, dtype=float)
    except (TypeError, ValueError):
        raise SpecError("loads", loads, "must be numbers (one layer) or rows of numbers (several layers)",
                        "pass a 1-D or 2-D array of tokens per expert") from None
    if arr.ndim == 1:
        return arr[None, :], False
    if arr.ndim == 2:
        return arr, True
    raise SpecError("loads", f"shape {arr.shape}", "must be 1-D (experts) or 2-D (layers x experts)",
                    "pass one row of tokens per MoE layer")


def place_experts(loads: Any, ranks: int, nodes: int, slots: int | Sequence[int], *, method: str = "mip",
                  backend: str = DEFAULT_PLACEMENT_BACKEND, time_limit_s: float = 10.0,
                  rel_gap: float = DEFAULT_REL_GAP,
                  current: Sequence[Sequence[int]] | Sequence[Sequence[Sequence[int]]] | None = None,
                  cross_node_weight: float = 0.0, move_weight: float = 0.0, max_redundant: int | None = None,
                  expert_bytes: Sequence[float] | None = None,
                  rank_memory_bytes: float | Sequence[float] | None = None, num_groups: int | None = None,
                  threads: int = 1, seed: int = 0) -> ExpertPlacement | list[ExpertPlacement]:
    """Place MoE experts (and redundant replicas) on EP ranks, minimizing the hottest rank's load.

    ``loads``: tokens per expert, 1-D (one layer -> one :class:`ExpertPlacement`) or 2-D (layers x experts ->
    a list, one placement per layer). ``ranks`` EP ranks in ``nodes`` equal nodes, ``slots`` replicas per
    rank (an int or one per rank; ``slots x ranks >= experts``), ``max_redundant`` caps the replicas beyond
    one per expert (default: every spare slot may hold one). ``method``: ``"mip"`` (certified) or
    ``"greedy"`` (EPLB-style baseline; ``num_groups`` expert groups, default one expert per group).

    Objective: ``max rank load + cross_node_weight * cross-node tokens + move_weight * moved experts``
    (moved = replicas on a rank that did not hold that expert in ``current``, expert ids per rank, one
    list per layer for 2-D loads). Optional memory: ``expert_bytes`` per expert and ``rank_memory_bytes``.
    ``time_limit_s`` and ``rel_gap`` apply per layer. Raises ``SpecError`` on bad input and
    ``InfeasibleError`` when nothing fits.
    """
    if method not in METHODS:
        raise SpecError("method", method, "is not a placement method", f"use one of {', '.join(METHODS)}")
    _check_options(time_limit_s=time_limit_s, rel_gap=rel_gap, threads=threads, seed=seed,
                   cross_node_weight=cross_node_weight, move_weight=move_weight)
    if method == "mip":
        get_backend(backend)  # unknown / missing backends fail before any work
    rows, many = _as_layers(loads)
    if current is not None and (isinstance(current, (str, bytes)) or not isinstance(current, (Sequence, np.ndarray))):
        raise SpecError("current", current, "must list the expert ids held by each rank",
                        "pass e.g. [[0, 1], [2, 3]], one such list per layer for 2-D loads")
    if many and current is not None and len(current) != len(rows):
        raise SpecError("current", f"{len(current)} layers", f"needs one placement per layer ({len(rows)})",
                        "pass a list of per-rank expert lists for each layer")
    out = []
    for i, row in enumerate(rows):
        cur = (current[i] if many else current) if current is not None else None
        p = make_problem(row, ranks, nodes, slots, max_redundant=max_redundant, expert_bytes=expert_bytes,
                         rank_memory_bytes=rank_memory_bytes, current=cur)
        out.append(solve_layer(p, method=method, backend=backend, time_limit_s=time_limit_s, rel_gap=rel_gap,
                               cross_node_weight=cross_node_weight, move_weight=move_weight, num_groups=num_groups,
                               threads=threads, seed=seed))
    return out if many else out[0]


def imbalance_for(loads: Any, ep: int, gpus_per_node: int, slots_per_rank: int | None = None, *,
                  redundant_per_rank: int = 0, method: str = "mip", time_limit_s: float = 5.0,
                  backend: str = DEFAULT_PLACEMENT_BACKEND) -> float:
    """max/mean EP-rank load of the best placement of ``loads`` on ``ep`` ranks: the factor by which a
    skewed routing profile stretches the MoE layer time (1.0 for ``loads=None``: uniform routing).

    ``ep`` ranks fill nodes of ``gpus_per_node`` (one node when ``ep <= gpus_per_node``). The experts must
    divide over the ranks; ``slots_per_rank`` defaults to ``experts / ep + redundant_per_rank``. With
    several layers (2-D loads) the ratio is ``sum of max loads / sum of mean loads``: the MoE time of all
    layers together relative to perfectly balanced routing.
    """
    if loads is None:
        return 1.0
    rows, _ = _as_layers(loads)
    E = rows.shape[1]
    for name, v in (("ep", ep), ("gpus_per_node", gpus_per_node)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise SpecError(name, v, "must be an integer >= 1", "write e.g. 8")
    if E % ep:
        raise SpecError("ep", ep, f"does not divide the number of experts ({E})",
                        "choose an expert-parallel degree that divides the expert count")
    if ep > gpus_per_node and ep % gpus_per_node:
        raise SpecError("ep", ep, f"spans nodes but is not a multiple of gpus_per_node ({gpus_per_node})",
                        "use an EP degree that fills whole nodes")
    nodes = 1 if ep <= gpus_per_node else ep // gpus_per_node
    slots = E // ep + int(redundant_per_rank) if slots_per_rank is None else slots_per_rank
    if float(rows.sum()) <= 0:
        return 1.0
    res = place_experts(rows, ep, nodes, slots, method=method, backend=backend, time_limit_s=time_limit_s)
    total_max = sum(pl.max_load for pl in res)
    total_mean = sum(pl.mean_load for pl in res)
    return total_max / total_mean if total_mean > 0 else 1.0


class ImbalanceModel:
    """The planner's view of a routing profile: ``(ep, gpus_per_node) -> max/mean rank load``.

    Each EP degree is placed once (MIP with a certificate, or the greedy) and cached; pass the same
    object to ``solve(moe_load_imbalance=...)`` and ``simulate(moe_load_imbalance=...)`` so both
    price MoE layers with the placement's hottest rank. ``placements[(ep, gpus_per_node)]`` keeps
    the placements (one per layer) for reporting.
    """

    def __init__(self, loads: Any, *, redundant_per_rank: int = 0, method: str = "mip", time_limit_s: float = 5.0,
                 backend: str = DEFAULT_PLACEMENT_BACKEND):
        self.loads = loads
        self.redundant_per_rank = int(redundant_per_rank)
        self.method, self.time_limit_s, self.backend = method, time_limit_s, backend
        self.placements: dict[tuple[int, int], list[ExpertPlacement]] = {}
        self._ratio: dict[tuple[int, int], float] = {}

    def __call__(self, ep: int, gpus_per_node: int) -> float:
        key = (int(ep), int(gpus_per_node))
        if key not in self._ratio:
            rows, _ = _as_layers(self.loads)
            experts = rows.shape[1]
            if ep <= 1 or experts % ep or (ep > gpus_per_node and ep % gpus_per_node):
                self._ratio[key] = 1.0  # no expert parallelism (or a degree the planner never forms)
            else:
                nodes = 1 if ep <= gpus_per_node else ep // gpus_per_node
                res = place_experts(rows, ep, nodes, experts // ep + self.redundant_per_rank, method=self.method,
                                    backend=self.backend, time_limit_s=self.time_limit_s)
                self.placements[key] = list(res)
                total_max = sum(pl.max_load for pl in res)
                total_mean = sum(pl.mean_load for pl in res)
                self._ratio[key] = max(1.0, total_max / total_mean) if total_mean > 0 else 1.0
        return self._ratio[key]

    def summary(self) -> dict[str, Any]:
        """JSON-ready description of every placement made (for ``Plan.expert_placement``)."""
        out = []
        for (ep, gpn), pls in sorted(self.placements.items()):
            out.append({"ep": ep, "gpus_per_node": gpn, "imbalance": self._ratio[(ep, gpn)],
                        "layers": len(pls), "max_gap": max((p.certificate.gap or 0.0) for p in pls),
                        "statuses": sorted({p.certificate.status for p in pls})})
        return {"method": self.method, "redundant_per_rank": self.redundant_per_rank, "ep_degrees": out}
