"""``solve(cluster, model, ...)``: branch and bound over pipeline micro-batch sizes and bottleneck windows.

The plan space splits into sub-problems by pipeline micro-batch size ``b`` (the number of
micro-batches ``m = B / b`` is a constant inside one, which keeps the step time linear). Each
sub-problem is searched by branch and bound on the bottleneck stage time ``Tmax``: a node is a
window ``[lo, hi]``; its LP relaxation (aggregated.py with only stage types no slower than ``hi``
and ``Tmax >= lo``) bounds every plan inside it. Nodes whose bound cannot beat the incumbent are
pruned, wide nodes are split in two, and narrow ones are handed to the MIP backend. Pipelines of
one stage are enumerated exactly. The global bound is the minimum over every open, pruned or
solved node, so the reported gap is valid for the whole plan space.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tangram_opt.baselines.greedy import greedy_by_micro_batch
from tangram_opt.cost import Calibration
from tangram_opt.errors import InfeasibleError, NoSolutionError, SpecError
from tangram_opt.planner.formulations.aggregated import (AggregatedMIP, StageType, enumerate_types, polish, reorder,
                                           support_class_best, try_order)
from tangram_opt.planner.assemble import choices_timing, make_plan, pipeline_plan
from tangram_opt.planner.formulations.knapsack_bound import LayerKnapsack
from tangram_opt.planner.candidates import Candidate, CandidateProvider
from tangram_opt.planner.context import PlanningContext
from tangram_opt.planner.formulations.positional import FormulationOptions, PipelineProblem, PositionalMIP, StageChoice
from tangram_opt.planner.islands import Island
from tangram_opt.planner.plan import Certificate, Plan
from tangram_opt.planner.formulations.stage_sequence import SequenceMIP
from tangram_opt.planner.space import SearchSpace
from tangram_opt.solvers import (DEFAULT_BACKEND, SolveOptions, SolveStatus, get_backend, lp_relaxation_bound,
                                 relative_gap, solve_model)
from tangram_opt.solvers.model import LinearModel, lsum
from tangram_opt.solvers.workers import SolverPool
from tangram_opt.specs.cluster import Cluster
from tangram_opt.specs.model import ModelSpec
from tangram_opt.specs.training import TrainingSpec

#: a node whose window is at most this wide (hi / lo) goes to the MIP backend instead of being split
LEAF_WINDOW_RATIO = 1.01
#: above this many candidates (summed over pipeline micro-batch sizes) a restricted search on the
#: fastest RESTRICTED_PRIMAL_KEEP candidates per island and size first finds a good incumbent,
#: using RESTRICTED_PRIMAL_SHARE of the time
RESTRICTED_PRIMAL_CANDIDATES = 3000
RESTRICTED_PRIMAL_KEEP = 2
RESTRICTED_PRIMAL_SHARE = 0.3
#: the restricted search looks for plans, not bounds: wider leaves reach leaf MIPs (plans) sooner
RESTRICTED_PRIMAL_LEAF_RATIO = 1.03
#: ... and stops once its best plan is proved within this gap on the restricted space (it looks
#: for plans; the main search's own first pass proves the same gap)
RESTRICTED_PRIMAL_GAP = 0.01
#: a node is also split on the largest step tail of its stages (``_BranchAndBound.split``) until
#: that window is at most this fraction of the incumbent wide
TAIL_LEAF_FRACTION = 0.0025
#: a window's model is rebuilt before its MIP solve when the incumbent improved by more than this
REBUILD_CUTOFF_GAIN = 1e-3
#: re-solves with no-good cuts when a window's MIP answer scores worse exactly than in the model
NOGOOD_ROUNDS = 3
#: rounds of support-class cuts per window (``_BranchAndBound.refine``; the window then closes at
#: its bound), and the most orders one class may have for its exact best to be enumerated
REFINE_ROUNDS = 8
REFINE_MAX_ORDERS = 5000
#: each re-solve of a cut window gets at most this many times the first solve's time (>= 1 s)
REFINE_SOLVE_FACTOR = 3.0
#: the knapsack primal heuristic (``_BranchAndBound.knapsack_plans``): caps in [bound, SPAN x bound],
#: at most CAPS of them, each with these minimum memory tolerances, for at most
#: max(MIN_S, SHARE x time_limit_s) seconds per pipeline micro-batch size
KNAPSACK_PLAN_SPAN = 1.1
KNAPSACK_PLAN_CAPS = 12
KNAPSACK_PLAN_TOLERANCES = (0, 4, 8, 16)
KNAPSACK_PLAN_MIN_S = 0.2
KNAPSACK_PLAN_SHARE = 0.02
#: node selection: primal turns (``_BranchAndBound.next_node``) back off after this many find nothing
PRIMAL_IDLE_TURNS = 8
PRIMAL_MAX_EVERY = 8
#: knapsack plans whose layer split is polished (the best orders by exact step time)
KNAPSACK_PLAN_POLISH = 8
#: with sequence leaves (the default), period windows at most this wide (hi / lo) are split on
#: the stage count and solved per stage count by the sequence model (sequence.py)
SEQUENCE_WINDOW_RATIO = 1.02
#: a sequence model with more stage-type columns than this goes to the aggregated leaf instead
SEQUENCE_MAX_COLUMNS = 40000
#: the search first proves this relative gap (when ``rel_gap`` is smaller), then starts again
#: from the roots with the requested one, keeping the first proof as a floor under the bound
FIRST_PASS_GAP = 0.01
#: the least time a sequence leaf gets (doubled each time it comes back unfinished)
SEQUENCE_FIRST_BUDGET_S = 5.0
#: a sequence leaf whose bound lies more than this fraction below the target is solved with
#: HiGHS's sub-MIP heuristics (it may hold much better plans: find them); nearer the target, where
#: nearly every leaf ends as a quick infeasibility proof, without (formulations/pipeline_mip.md §3b)
SEQUENCE_HEURISTICS_SLACK = 0.05
#: ``sequence_leaves=None`` (the default) turns them on when the single-pipeline search has at
#: least this long: below it the aggregated leaves reach a smaller gap, above it the sequence
#: leaves do (formulations/pipeline_mip.md §5, "Sequence leaves")
SEQUENCE_MIN_TIME_S = 50.0
#: leaf solves run in ``threads - 1`` solver processes beside the search (HiGHS's MIP is serial);
#: a worker's solve stops at its time limit, and the search waits this much longer for it
WORKER_GRACE_S = 2.0


@dataclass(frozen=True, slots=True)
class SearchEvent:
    """Progress of the whole search: global incumbent and bound after ``elapsed_s`` seconds."""

    elapsed_s: float
    incumbent_s: float | None
    bound_s: float | None
    message: str = ""

    @property
    def gap(self) -> float | None:
        if self.incumbent_s is None or self.bound_s is None:
            return None
        return relative_gap(self.incumbent_s, self.bound_s)


@dataclass(slots=True)
class _Sub:
    """One pipeline micro-batch size and what the search learned about it."""

    b: int
    problem: PipelineProblem
    lower_bound_s: float
    status: str = "open"
    single_s: float | None = None
    objective_s: float | None = None
    #: the best plan's slowest stage time: the bottleneck window it lies in
    best_t_max_s: float | None = None
    solve_time_s: float = 0.0
    types: dict[str, list[StageType]] | None = None
    info: dict[str, Any] = field(default_factory=lambda: {"windows": 0, "lp_solves": 0, "mip_solves": 0})


@dataclass(slots=True)
class _Flight:
    """A leaf whose MIP is being solved by a worker process; ``done`` takes its result."""

    future: Future
    node: _Node
    model: LinearModel
    options: SolveOptions
    done: Callable[[Any], None]
    started: float


@dataclass(order=True, slots=True)
class _Node:
    """A window [lo, hi] on the bottleneck time of sub-problem ``b`` with a lower bound."""

    bound_s: float
    b: int = field(compare=False)
    lo_s: float = field(compare=False)
    hi_s: float = field(compare=False)
    mip: AggregatedMIP | PositionalMIP | None = field(default=None, compare=False)
    tries: int = field(default=0, compare=False)
    #: lower bound of the support classes cut off this window's model (their exact best plans)
    excluded_s: float = field(default=math.inf, compare=False)
    #: window on the largest step tail of any stage: (tail_lo, tail_hi]; None: no lower edge
    tail_lo_s: float | None = field(default=None, compare=False)
    tail_hi_s: float = field(default=math.inf, compare=False)
    #: stage types no plan of this window better than the incumbent uses (``AggregatedMIP.fixed_types``)
    excluded_types: frozenset = field(default=frozenset(), compare=False)
    #: stage counts (first, last) of the plans this node holds; None: any
    stages: tuple[int, int] | None = field(default=None, compare=False)

    def describe(self) -> str:
        text = f"[{1e3 * self.lo_s:.2f}, {1e3 * self.hi_s:.2f}] ms"
        if self.stages is not None:
            a, z = self.stages
            text += f", {a} stages" if a == z else f", {a}-{z} stages"
        if self.tail_lo_s is not None or math.isfinite(self.tail_hi_s):
            lo = 0.0 if self.tail_lo_s is None else self.tail_lo_s
            hi = "inf" if not math.isfinite(self.tail_hi_s) else f"{1e3 * self.tail_hi_s:.0f}"
            text += f", tail ({1e3 * lo:.0f}, {hi}] ms"
        return text


def fluid_bottleneck_s(problem: PipelineProblem) -> float:
    """Lower bound on the bottleneck stage time: per layer kind, L_k / sum_i (N_i / min_{c in i} g_c t_c).

    Each island's GPUs deliver at most N_i GPU-seconds of work per second of bottleneck time, and a
    layer of kind k costs at least min g_c t_c GPU-seconds there.
    """
    cands = problem.candidates
    fluid = 0.0
    islands = {c.island for c in cands}
    for k, n in problem.layers.items():
        rate = sum(problem.island_gpus[i] / min(c.gpus * c.layer[k].time_s for c in cands if c.island == i)
                   for i in islands)
        fluid = max(fluid, n / rate)
    return fluid


def quick_lower_bound(problem: PipelineProblem) -> float:
    """A valid lower bound on the step time of any plan of ``problem`` (no solver).

    Sum of stage times >= every layer at its fastest candidate plus the fastest embedding and head;
    the bottleneck >= that sum spread over the deepest pipeline, and >= the fluid bound.
    """
    cands = problem.candidates
    if not cands:
        return math.inf
    m = problem.num_micro_batches
    total = sum(n * min(c.layer[k].time_s for c in cands) for k, n in problem.layers.items())
    total += min(c.embedding.time_s for c in cands) + min(c.head.time_s for c in cands)
    return (m - 1) * max(fluid_bottleneck_s(problem), total / problem.max_stages) + total


def best_single_stage(problem: PipelineProblem) -> tuple[float, list[StageChoice]] | None:
    """Exact best one-stage pipeline (every layer, embedding and head on one stage)."""
    best = None
    layers = dict(problem.layers)
    inflight = 1 if problem.schedule == "1f1b" else problem.num_micro_batches
    for ci, c in enumerate(problem.candidates):
        if c.memory_bytes(layers, inflight, first=True, last=True) > c.capacity_bytes:
            continue
        if c.gpus > problem.island_gpus[c.island]:
            continue
        choice = [StageChoice(candidate=ci, layers=dict(layers))]
        t = choices_timing(problem, choice).step_time_s
        if best is None or t < best[0]:
            best = (t, choice)
    return best


def _tick_for(reference_s: float) -> float:
    """Time unit making the objective ~1e8 ticks: fine enough that rounding costs < 1e-5 relative."""
    return 10.0 ** math.floor(math.log10(max(reference_s, 1e-9) / 1e8))


def rounding_ticks(num_micro_batches: int) -> int:
    """Ticks by which a model's optimum may exceed the real-valued closed form: time coefficients
    round in the bound's favour, but the integer period ``Smax`` rounds up by less than one tick,
    which ``m - 1`` multiplies (plus one tick each for the integer Y and Cm). Every bound read from a
    model is lowered by this much (about 1e-6 of the objective at the ~1e8-tick scale)."""
    return num_micro_batches + 2


FORMULATIONS = ("aggregated", "positional")
#: share of ``time_limit_s`` the single-pipeline search may use when the multi-pipeline level follows
MULTI_PIPELINE_SINGLE_SHARE = 0.7


def solve(cluster: Cluster | str, model: ModelSpec | str, training: TrainingSpec | dict | None = None, *,
          time_limit_s: float = 60.0, backend: str = DEFAULT_BACKEND, threads: int = 1, seed: int = 0,
          rel_gap: float = 1e-4, space: SearchSpace | None = None, warm_start: bool = True,
          calibration: Calibration | str | Path | None = None, profiles: Any = None,
          provider: CandidateProvider | None = None,
          moe_load_imbalance: float | Callable[[int, int], float] = 1.0, expert_loads: Any = None,
          formulation: str = "aggregated", windows: bool = True,
          fluid_cuts: bool = True, knapsack: bool = True, sequence_leaves: bool | None = None,
          on_progress: Callable[[SearchEvent], None] | None = None,
          multi_pipeline: bool | Any = True) -> Plan:
    """Plan ``model`` on ``cluster`` and certify how close the plan is to the best one in the model.

    Returns the best plan found with a :class:`Certificate` (incumbent, dual bound, gap). On a time
    limit without proof the best plan is returned with its gap. Raises :class:`InfeasibleError`
    (with what came closest) when nothing fits, and :class:`NoSolutionError` when the time ran out
    before any plan was found.

    MoE routing skew: ``expert_loads`` (tokens per expert, one row per MoE layer, e.g. routing
    statistics) prices every MoE layer at the hottest EP rank of the best expert placement for each
    EP degree (``tangram_opt.experts.ImbalanceModel``; the plan's ``expert_placement`` reports them);
    ``moe_load_imbalance`` sets that ratio directly (a number, or a function of ``(ep, gpus_per_node)``).

    Measured inputs (docs/user_guide/profiling.md): ``calibration`` is a :class:`Calibration` or the
    path of a calibration file (``tangram-opt calibrate`` writes one); ``profiles`` is a
    :class:`~tangram_opt.cost.ProfileSet`, a :class:`~tangram_opt.cost.LayerProfile`, a list of them,
    or the path of a profile file or directory (``tangram-opt profile`` writes them). Measured layer
    times replace the computed compute time of the GPU types they cover; a profile of another model
    shape, sequence length or precision is refused (:func:`tangram_opt.cost.check_profiles`).

    ``formulation`` ("aggregated" or "positional"), ``windows`` (branch on the bottleneck time),
    ``fluid_cuts`` and ``knapsack`` (the layer-covering bound on the bottleneck, bottleneck.py)
    switch the modelling choices compared in docs/notebooks/solver_gaps.ipynb. ``sequence_leaves``:
    narrow windows are solved per stage count by the order-exact sequence model (sequence.py)
    instead of the aggregated model split on step tails; None (default) when the single-pipeline
    search has at least ``SEQUENCE_MIN_TIME_S`` (formulations/pipeline_mip.md §5).

    ``rel_gap``: the search stops once the plan is proved within this relative gap of the best
    plan in the model (0.01: within 1%, which is reached much sooner than the default's 0.01%).

    ``threads``: with HiGHS, ``threads - 1`` solver processes solve leaf MIPs beside the search
    (solvers/workers.py; HiGHS's branch and bound is serial); other backends get the threads.

    ``multi_pipeline`` (True, or a :class:`~tangram_opt.planner.multi_pipeline.MultiPipelineOptions`): after
    the single-pipeline search (given at most 70% of ``time_limit_s``), search plans of several
    data-parallel pipelines with uneven batch shares (docs/multi_pipeline.md) and return the better
    plan; the certificate then covers both spaces. False keeps the single-pipeline search alone.
    """
    from tangram_opt.specs import load_cluster

    t0 = time.perf_counter()
    cluster = load_cluster(cluster) if not isinstance(cluster, Cluster) else cluster
    model = _load_model(model)
    training = _load_training(training)
    get_backend(backend)  # fail fast on an unknown or missing backend
    _check_knobs(time_limit_s=time_limit_s, threads=threads, seed=seed)
    calibration = _load_calibration_arg(calibration)
    profiles = _load_profiles_arg(profiles, model, training)
    if formulation not in FORMULATIONS:
        raise SpecError("formulation", formulation, "is not a known formulation",
                        f"use one of {', '.join(FORMULATIONS)}")
    if not (isinstance(rel_gap, (int, float)) and 0.0 <= rel_gap < 1.0):
        raise SpecError("rel_gap", rel_gap, "is not a relative gap in [0, 1)", "use e.g. 0.01 for within 1%")
    space = space or SearchSpace()
    if expert_loads is not None:
        from tangram_opt.experts import ImbalanceModel

        moe_load_imbalance = ImbalanceModel(expert_loads, time_limit_s=max(1.0, min(10.0, time_limit_s / 20)))
    ctx = PlanningContext(cluster, model, training, space=space, calibration=calibration, provider=provider,
                          moe_load_imbalance=moe_load_imbalance, profiles=profiles)
    single_limit_s = time_limit_s * (MULTI_PIPELINE_SINGLE_SHARE if multi_pipeline else 1.0)
    if sequence_leaves is None:
        sequence_leaves = single_limit_s >= SEQUENCE_MIN_TIME_S
    search = _BranchAndBound(ctx, backend=backend, time_limit_s=single_limit_s, threads=threads, seed=seed,
                             rel_gap=rel_gap, formulation=formulation, windows=windows, fluid_cuts=fluid_cuts,
                             knapsack=knapsack, sequence=sequence_leaves,
                             warm_start=warm_start, on_progress=on_progress, t0=t0)
    plan = search.run()
    if not multi_pipeline:
        return _attach_expert_placement(plan, moe_load_imbalance)
    from tangram_opt.planner.multi_pipeline import MultiPipelineOptions, with_multi_pipeline

    plan = with_multi_pipeline(ctx, plan, backend=backend, time_limit_s=time_limit_s, t0=t0, threads=threads,
                               seed=seed, rel_gap=rel_gap,
                               options=multi_pipeline if isinstance(multi_pipeline, MultiPipelineOptions) else None)
    return _attach_expert_placement(plan, moe_load_imbalance)


def _check_knobs(*, time_limit_s: Any, threads: Any, seed: Any) -> None:
    """Refuse numeric options no search can honour, naming the argument (the CLI checks the same)."""
    if isinstance(time_limit_s, bool) or not isinstance(time_limit_s, (int, float)) \
            or not math.isfinite(time_limit_s) or time_limit_s < 0:
        raise SpecError("time_limit_s", time_limit_s, "must be a finite number of seconds >= 0",
                        "give the wall-clock budget, e.g. time_limit_s=60 (0: heuristic plan and bound only)")
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise SpecError("threads", threads, "must be an integer >= 1", "e.g. threads=2 (this machine's cores)")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise SpecError("seed", seed, "must be an integer >= 0", "e.g. seed=0")


def _load_calibration_arg(calibration: Any) -> Calibration | None:
    if calibration is None or isinstance(calibration, Calibration):
        return calibration
    if isinstance(calibration, (str, Path)):
        from tangram_opt.cost import load_calibration

        return load_calibration(calibration)
    raise SpecError("calibration", type(calibration).__name__, "is not a Calibration or a calibration file path",
                    "pass tangram_opt.cost.Calibration(...) or the file 'tangram-opt calibrate' wrote")


def _load_profiles_arg(profiles: Any, model: ModelSpec, training: TrainingSpec) -> Any:
    """``profiles`` as a checked ProfileSet (None stays None)."""
    if profiles is None:
        return None
    from tangram_opt.cost import LayerProfile, ProfileSet, check_profiles, load_profiles

    if isinstance(profiles, (str, Path)):
        profiles = load_profiles(profiles)
    elif isinstance(profiles, LayerProfile):
        profiles = ProfileSet([profiles])
    elif not isinstance(profiles, ProfileSet):
        try:
            items = list(profiles)
        except TypeError:
            items = None
        if items is None or not all(isinstance(p, LayerProfile) for p in items):
            raise SpecError("profiles", type(profiles).__name__, "is not a profile set, a layer profile, a list of "
                            "them, or a path", "pass tangram_opt.cost.load_profiles(DIR) or the directory")
        profiles = ProfileSet(items)
    check_profiles(profiles, model, training.seq_len, training.precision)
    return profiles


def _attach_expert_placement(plan: Plan, imbalance: Any) -> Plan:
    """Record the expert placements behind the MoE layer times of the chosen plan's EP degrees."""
    summary = getattr(imbalance, "summary", None)
    if summary is None:
        return plan
    used = {s.ep for s in plan.stages if s.ep > 1 and s.num_moe_layers}
    info = summary()
    info["ep_degrees"] = [d for d in info["ep_degrees"] if d["ep"] in used]
    return replace(plan, expert_placement=info)


class _ContextTables:
    """A context's candidate tables (computed once per pipeline micro-batch size) as a provider."""

    def __init__(self, ctx: PlanningContext):
        self.ctx = ctx

    def candidates(self, island: Island, pipeline_micro_batch: int) -> list[Candidate]:
        return [c for c in self.ctx.candidates(pipeline_micro_batch) if c.island == island.index]


class _BranchAndBound:
    def __init__(self, ctx: PlanningContext, *, backend: str, time_limit_s: float, threads: int, seed: int,
                 rel_gap: float, formulation: str, windows: bool, fluid_cuts: bool, warm_start: bool,
                 knapsack: bool = True, order_rows: bool = True, leaf_ratio: float | None = None,
                 primal_backoff: bool = True, sequence: bool = True, first_pass: bool = True,
                 pool: SolverPool | None = None,
                 on_progress: Callable[[SearchEvent], None] | None, t0: float):
        self.ctx = ctx
        self.backend, self.time_limit_s, self.threads, self.seed = backend, time_limit_s, threads, seed
        self.rel_gap, self.formulation, self.fluid_cuts = rel_gap, formulation, fluid_cuts
        self.knapsack, self.order_rows, self.primal_backoff = knapsack, order_rows, primal_backoff
        self.windows = windows and formulation == "aggregated" and ctx.space.schedule == "1f1b"
        #: narrow windows are split on the stage count and solved by the sequence model
        self.sequence = sequence and self.windows
        self.leaf_ratio = leaf_ratio if leaf_ratio is not None else (
            SEQUENCE_WINDOW_RATIO if self.sequence else LEAF_WINDOW_RATIO)
        self.warm_start, self.on_progress, self.t0 = warm_start, on_progress, t0
        self.events: list[SearchEvent] = []
        self.subs: dict[int, _Sub] = {}
        self.open: list[_Node] = []  # heap by bound
        self.closed_bounds: dict[int, list[float]] = {}  # per b: bounds of pruned/solved nodes
        #: the relative gap of this pass (``FIRST_PASS_GAP`` first, then ``rel_gap``)
        self.gap = max(rel_gap, FIRST_PASS_GAP) if first_pass else rel_gap
        self.floor: dict[int, float] = {}  # per b: the bound an earlier pass proved
        self.inc_s = math.inf
        self.inc: tuple[int, list[StageChoice]] | None = None
        self.seeds: dict[int, tuple[float, list[StageChoice]]] = {}
        self.trajectories: list[list[tuple[float, float | None, float | None]]] = []
        self.spent: dict[int, float] = {}  # per b: seconds spent on its nodes (splits and leaves)
        #: solver processes for leaf MIPs (``run`` starts them with ``threads >= 2`` and HiGHS,
        #: whose branch and bound is serial); every solve then runs single-threaded
        self.pool = pool
        self.inflight: list[_Flight] = []

    # --- bookkeeping -----------------------------------------------------------------------
    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def remaining(self) -> float:
        return self.time_limit_s - self.elapsed()

    def offer(self, b: int, choices: list[StageChoice], t: float) -> None:
        sub = self.subs[b]
        if sub.objective_s is None or t < sub.objective_s:
            sub.objective_s = t
            sub.best_t_max_s = max(st.time_s for st in choices_timing(sub.problem, choices).stages)
        if t < self.inc_s:
            self.inc_s, self.inc = t, (b, choices)

    def sub_bound(self, sub: _Sub) -> float:
        """Lower bound of everything in sub-problem ``sub`` (its one-stage optimum included)."""
        parts = [n.bound_s for n in self.pending() if n.b == sub.b] + self.closed_bounds.get(sub.b, [])
        multi = min(parts) if parts else (math.inf if sub.status != "open" else sub.lower_bound_s)
        single = sub.single_s if sub.single_s is not None else math.inf
        return max(self.floor.get(sub.b, -math.inf), min(multi, single))

    def pending(self) -> list[_Node]:
        """Nodes not closed: open ones and leaves being solved by a worker."""
        return self.open + [f.node for f in self.inflight]

    @property
    def solve_threads(self) -> int:
        """Threads per MIP solve: one when leaves run in worker processes beside the search."""
        return 1 if self.pool is not None else self.threads

    def global_bound(self) -> float:
        return min([self.inc_s] + [self.sub_bound(s) for s in self.subs.values()])

    def emit(self, message: str) -> None:
        inc = self.inc_s if math.isfinite(self.inc_s) else None
        bnd = self.global_bound()
        ev = SearchEvent(self.elapsed(), inc, bnd if math.isfinite(bnd) else None, message)
        self.events.append(ev)
        if self.on_progress is not None:
            self.on_progress(ev)

    def target_s(self) -> float:
        """Plans at or above this are of no interest: the incumbent less the relative gap of this
        pass. A node with nothing below it closes at it, so the gap is at most that once every
        node is closed."""
        return self.inc_s * (1 - self.gap)

    def cutoff_ticks(self, mip: Any) -> float | None:
        """The target in the ticks of ``mip``'s objective, plus the rounding margin: a plan better
        than the target has a model objective below it."""
        if not math.isfinite(self.inc_s):
            return None
        return self.target_s() / mip.options.tick_s + rounding_ticks(mip.problem.num_micro_batches)

    def close(self, node: _Node, bound_s: float) -> None:
        self.closed_bounds.setdefault(node.b, []).append(bound_s)

    def pruned(self, bound_s: float) -> bool:
        return bound_s >= self.target_s()

    # --- phases ----------------------------------------------------------------------------
    def run(self) -> Plan:
        owned = None
        if self.pool is None and self.threads >= 2 and self.backend == "highs" and self.windows:
            self.pool = owned = SolverPool(self.threads - 1)
        try:
            return self._run()
        finally:
            self.pool = None
            if owned is not None:
                owned.close()

    def _run(self) -> Plan:
        ctx = self.ctx
        for b in ctx.pipeline_micro_batches():
            prob = ctx.problem(b)
            self.subs[b] = _Sub(b=b, problem=prob, lower_bound_s=quick_lower_bound(prob))
        live = [s for s in self.subs.values() if s.problem.candidates]
        for s in self.subs.values():
            if not s.problem.candidates:
                s.status = "no candidate fits"
        if not live:
            raise _nothing_fits(ctx)
        if self.warm_start:
            # the greedy across islands, and the same construction on each island alone (so the
            # search starts no worse than a homogeneous plan of any island)
            self.seeds = greedy_by_micro_batch(ctx, thorough=True)
            for b, (t, ch) in self.seeds.items():
                self.offer(b, ch, t)
        for sub in live:  # exact one-stage pipelines: cheap, and they tighten the cutoff
            one = best_single_stage(sub.problem)
            if one is not None:
                sub.single_s = one[0]
                self.offer(sub.b, one[1], one[0])
        self.emit("start")
        if self.warm_start and sum(len(s.problem.candidates) for s in live) > RESTRICTED_PRIMAL_CANDIDATES:
            self.restricted_primal(live)
        for sub in sorted(live, key=lambda s: s.lower_bound_s):
            self.root(sub)
        self.emit("root bounds")
        self.branch_and_bound()
        while not self.open and self.gap > self.rel_gap and self.remaining() > 1.0:
            self.next_pass(live)
            self.branch_and_bound()
        still_open = [n for n in self.open if not self.pruned(n.bound_s)]
        for n in self.open:
            if self.pruned(n.bound_s):
                self.close(n, n.bound_s)
        self.open = still_open
        heapq.heapify(self.open)
        for sub in live:
            if sub.status == "open":
                sub.status = "closed" if not any(n.b == sub.b for n in self.open) else "not finished (time limit)"
        return self.finish()

    def branch_and_bound(self) -> None:
        """Nodes by best bound (with primal turns) until none is open or the time is up."""
        turn, every, idle = 0, 2, 0  # a primal turn every ``every`` nodes (backs off while they find nothing)
        while self.open or self.inflight:
            if not self.collect(block=not self.open):
                break  # a worker overran the time limit
            if not self.open:
                continue
            primal = turn % every == every - 1
            node = self.next_node(primal)
            turn += 1
            started, before = time.perf_counter(), self.inc_s
            if self.pruned(node.bound_s):
                self.close(node, node.bound_s)
                continue
            if self.remaining() <= 0.05:
                heapq.heappush(self.open, node)
                break
            splits = self.windows and math.isfinite(node.hi_s) and self.splittable(node)
            if not splits and self.pool is not None and self.pool.idle_worker() is None:
                # the workers are busy: bound a window rather than solve this leaf here, so the
                # workers find leaves waiting when they are done
                other = self.next_split()
                if other is not None:
                    heapq.heappush(self.open, node)
                    node, splits = other, True
            if splits:
                self.split(node)
            elif self.sequence and node.stages is not None and node.stages[0] == node.stages[1]:
                self.solve_sequence(node)
            else:
                self.solve_leaf(node)
            self.spent[node.b] = self.spent.get(node.b, 0.0) + time.perf_counter() - started
            if self.inc_s < before:
                every, idle = 2, 0
            elif primal and self.primal_backoff:
                idle += 1
                if idle >= PRIMAL_IDLE_TURNS:
                    every, idle = min(2 * every, PRIMAL_MAX_EVERY), 0
        while self.inflight and self.collect(block=True):
            pass

    def dispatch(self, node: _Node, model: LinearModel, options: SolveOptions, done: Callable[[Any], None]) -> None:
        """Solve a leaf's model and hand the result to ``done``: in an idle worker process while
        the search goes on with other nodes (the node counts as open until then), else here."""
        worker = self.pool.idle_worker() if self.pool is not None else None
        if worker is None:
            done(solve_model(model, self.backend, options))
            return
        self.inflight.append(_Flight(worker.submit(model, self.backend, options), node, model, options, done,
                                     time.perf_counter()))

    def collect(self, block: bool) -> bool:
        """Finish the leaves whose worker has answered (with ``block``, after waiting for the first
        of them). A worker that failed has its model solved here instead. False when a worker
        is still busy ``WORKER_GRACE_S`` after the time limit: its leaf goes back to the open
        nodes with the bound it had."""
        if not self.inflight:
            return True
        if block:
            _, busy = wait([f.future for f in self.inflight], timeout=max(0.0, self.remaining()) + WORKER_GRACE_S,
                           return_when=FIRST_COMPLETED)
            if len(busy) == len(self.inflight):
                for f in self.inflight:
                    heapq.heappush(self.open, f.node)
                self.inflight = []
                return False
        for f in [f for f in self.inflight if f.future.done()]:
            self.inflight.remove(f)
            try:
                res = f.future.result()
            except Exception:  # noqa: BLE001 (the worker died: solve it here, in what time is left)
                res = SolverPool.solve_here(f.model, self.backend, replace(
                    f.options, time_limit_s=max(0.1, min(f.options.time_limit_s, self.remaining()))))
            f.done(res)
            self.spent[f.node.b] = self.spent.get(f.node.b, 0.0) + time.perf_counter() - f.started
        return True

    def next_pass(self, live: list[_Sub]) -> None:
        """Every node of the first pass is closed: keep each sub-problem's bound as a floor and
        search again from the roots against ``rel_gap``. The first pass closes nodes at a target
        1% below the incumbent, so it fixes more stage types and proves far sooner; the floor
        keeps its proof if the second pass runs out of time. (Aggregated leaves may close below
        the target when their support-class cuts run out, so the first pass ends within 1% only
        when they do not.)"""
        for sub in self.subs.values():
            self.floor[sub.b] = self.sub_bound(sub)
        self.gap, self.closed_bounds = self.rel_gap, {}
        self.emit(f"first pass ({100 * FIRST_PASS_GAP:g}% below the incumbent) closed every node; "
                  f"searching again for {100 * self.rel_gap:g}%")
        for sub in sorted(live, key=lambda s: self.floor[s.b]):
            if self.pruned(self.floor[sub.b]):
                self.closed_bounds[sub.b] = [self.floor[sub.b]]
            else:
                sub.status = "open"
                self.root(sub)
        self.emit("root bounds (second pass)")

    def next_node(self, primal: bool) -> _Node:
        """Best-bound (raises the global bound) or, on a primal turn, the pipeline
        micro-batch size that has had the least search time so far (finds plans in every
        sub-problem, not only the one with the lowest relaxation; a size whose windows are cheap
        gets more of them), and there the best-bound window on the slowest stage time of that
        size's best plan while one is open (a dive: that neighbourhood is split down to leaves and
        solved, every step-tail window of it, so a heuristic plan is improved by the MIP early),
        else the best-bound window. Primal turns start at every second node; after
        PRIMAL_IDLE_TURNS of them find no better plan they come half as often (down to one in
        PRIMAL_MAX_EVERY), and a better plan from any turn resets them; not in the restricted
        search (``primal_backoff=False``), whose bounds are not used."""
        if not primal or len(self.open) < 2:
            return heapq.heappop(self.open)
        b = min({n.b for n in self.open}, key=lambda b: (self.spent.get(b, 0.0), b))
        mine = [n for n in self.open if n.b == b]
        t_max = self.subs[b].best_t_max_s
        if t_max is not None:
            mine = [n for n in mine if n.lo_s * (1 - 1e-9) <= t_max <= n.hi_s * (1 + 1e-9)] or mine
        best = min(mine, key=lambda n: n.bound_s)
        self.open.remove(best)
        heapq.heapify(self.open)
        return best

    def next_split(self) -> _Node | None:
        """The best-bound open node that is split rather than solved (taken off the queue), if any."""
        for node in sorted(self.open):
            if self.pruned(node.bound_s):
                break
            if math.isfinite(node.hi_s) and self.splittable(node):
                self.open.remove(node)
                heapq.heapify(self.open)
                return node
        return None

    def restricted_primal(self, live: list[_Sub]) -> None:
        """Primal heuristic for large instances: the same search on a heuristically pruned candidate
        set (the fastest candidates per island and size) with a share of the time. Its plans are
        real plans of the full space (their candidates are full-space candidates), so they become
        incumbents and sharpen the cutoff; its bounds are not used."""
        from tangram_opt.planner.candidates import HeuristicallyPruned

        ctx = self.ctx
        # the full context's candidate tables, cut: nothing is priced twice, and the rows are the
        # very objects of the full tables (whatever the provider returns on a second call)
        small_space = replace(ctx.space, heuristic_keep=RESTRICTED_PRIMAL_KEEP)
        small = PlanningContext(ctx.cluster, ctx.model, ctx.training, space=small_space, cost=ctx.cost,
                                provider=HeuristicallyPruned(_ContextTables(ctx), ctx.kinds, RESTRICTED_PRIMAL_KEEP))
        inner = _BranchAndBound(small, backend=self.backend, time_limit_s=self.remaining() * RESTRICTED_PRIMAL_SHARE,
                                threads=self.threads, seed=self.seed, rel_gap=RESTRICTED_PRIMAL_GAP,
                                formulation=self.formulation,
                                windows=self.windows, fluid_cuts=self.fluid_cuts, knapsack=self.knapsack,
                                warm_start=False, order_rows=False, leaf_ratio=RESTRICTED_PRIMAL_LEAF_RATIO,
                                primal_backoff=False, sequence=False, first_pass=False, pool=self.pool,
                                on_progress=None,
                                t0=time.perf_counter())
        try:
            inner.run()
        except (InfeasibleError, NoSolutionError):
            return
        if inner.inc is None:
            return
        b, choices = inner.inc
        full = {id(c): i for i, c in enumerate(self.subs[b].problem.candidates)}
        small_cands = inner.subs[b].problem.candidates
        mapped = [StageChoice(candidate=full[id(small_cands[ch.candidate])], layers=dict(ch.layers))
                  for ch in choices]
        t = choices_timing(self.subs[b].problem, mapped).step_time_s
        self.offer(b, mapped, t)
        self.emit(f"restricted search (fastest {RESTRICTED_PRIMAL_KEEP} candidates per island and size): "
                  f"{t:.4f} s")

    def knapsack_plans(self, sub: _Sub, sack: LayerKnapsack, knap: float, hi: float) -> None:
        """Primal heuristic: the knapsack's own covers for caps a little above its bound.

        For a few caps between ``knap`` and 1.1 ``knap`` (or the incumbent's period) and a few
        minimum memory tolerances, take the stages the covering knapsack picks, order them for
        memory and neighbours (``try_order``) and score them exactly; the best
        KNAPSACK_PLAN_POLISH also get their layer split polished. Balanced by construction, these
        plans are often better than what the window MIPs find in their time. Each cap is tried as
        is, with one island capped lower (separator covers), and with k small stages set aside on
        one island for each placement of the first and last stage (reserved separators: large
        stages of every island, that island's included, alternate with them).
        """
        budget = min(self.remaining(), max(KNAPSACK_PLAN_MIN_S, KNAPSACK_PLAN_SHARE * self.time_limit_s))
        if budget <= 0:
            return
        deadline = time.perf_counter() + budget
        times = sack.times[(sack.times >= knap) & (sack.times <= min(hi, knap * KNAPSACK_PLAN_SPAN))]
        caps = times[::max(1, len(times) // KNAPSACK_PLAN_CAPS)]
        seen: set[tuple] = set()
        p2p = sub.problem.link_lo_s
        islands = sorted(sub.problem.island_gpus)
        # separators: island j capped so that its stages may neighbour a stage at the full cap
        # across j's cheapest link to another island (T_a + T_b + 2 c <= 2 lam), so large stages elsewhere
        # need not neighbour each other and pay their link
        link_in = {j: min(min(p2p[i, j], p2p[j, i]) for i in islands if i != j) for j in islands} \
            if len(islands) > 1 else {}
        ordered: list[tuple[float, list[StageChoice]]] = []

        def order(cover: tuple[StageType, list[StageType], StageType] | None) -> None:
            if cover is None:
                return
            first, mids, last = cover
            key = (first.candidate, first.layers, tuple(sorted((t.candidate, t.layers) for t in mids)),
                   last.candidate, last.layers)
            if key in seen:
                return
            seen.add(key)
            choices = try_order(sub.problem, first, mids, last, polish_split=False)
            if choices is not None:
                ordered.append((choices_timing(sub.problem, choices).step_time_s, choices))

        for lam in caps:
            if time.perf_counter() > deadline:
                break
            for tol, sep in itertools.product(KNAPSACK_PLAN_TOLERANCES, [None, *link_in]):
                order(sack.cover(float(lam), tol, None if sep is None else {sep: float(lam) - 2 * link_in[sep]}))
            # reserved separators: k small stages on island j, the rest covered at the full cap, for
            # every island pair holding the first and last stage; k follows the count of full-cap
            # stages the cover needs separated (#full <= #small + 1 lets them alternate)
            for j, ends in itertools.product(link_in, itertools.product(islands, islands)):
                sep_cap = float(lam) - 2 * link_in[j]
                k, tried = 1, set()
                while k not in tried:
                    tried.add(k)
                    cover = sack.cover(float(lam), 0, None, (j, k, sep_cap), ends)
                    if cover is None:
                        break
                    order(cover)
                    stages = [cover[0], *cover[1], cover[2]]
                    full = sum(t.time_s > sep_cap * (1 + 1e-12) for t in stages)
                    k = max(1, k + full - 1 - (len(stages) - full))
        # the layer split is polished (the costly part) on the best few orders only
        ordered.sort(key=lambda q: q[0])
        for rank, (t, choices) in enumerate(ordered):
            if rank < KNAPSACK_PLAN_POLISH:
                choices = polish(sub.problem, choices)
                t = choices_timing(sub.problem, choices).step_time_s
            self.offer(sub.b, choices, t)
        sub.info["knapsack_plans"] = len(ordered)

    def formulation_options(self, sub: _Sub) -> FormulationOptions:
        cutoff = self.inc_s if math.isfinite(self.inc_s) else None
        ref = self.inc_s if math.isfinite(self.inc_s) else sub.lower_bound_s * 2
        return FormulationOptions(fluid_cuts=self.fluid_cuts, cutoff_s=cutoff, tick_s=_tick_for(ref),
                                  order_rows=self.order_rows)

    @staticmethod
    def with_stages(problem: PipelineProblem, stages: tuple[int, int] | None) -> PipelineProblem:
        """``problem`` restricted to pipelines of ``stages[0] .. stages[1]`` stages."""
        if stages is None:
            return problem
        return replace(problem, min_stages=max(problem.min_stages, stages[0]),
                       max_stages=min(problem.max_stages, stages[1]))

    def build(self, sub: _Sub, lo: float, hi: float, tail_lo: float | None = None, tail_hi: float = math.inf,
              excluded: frozenset = frozenset(), stages: tuple[int, int] | None = None
              ) -> AggregatedMIP | PositionalMIP | None:
        fopts = self.formulation_options(sub)
        if self.formulation == "positional":
            return PositionalMIP(sub.problem, fopts).build()
        if sub.types is None:
            sub.types = enumerate_types(sub.problem, fopts.cutoff_s)
            sub.info["stage_types"] = {r: len(v) for r, v in sub.types.items()}
        mip = AggregatedMIP(self.with_stages(sub.problem, stages), fopts, all_types=sub.types, lower_tmax_s=lo,
                            upper_tmax_s=hi, lower_tail_s=tail_lo, upper_tail_s=tail_hi, excluded_types=excluded)
        mip.build()
        return None if mip.empty else mip

    def evaluate(self, sub: _Sub, lo: float, hi: float, tail_lo: float | None = None, tail_hi: float = math.inf,
                 excluded: frozenset = frozenset(), stages: tuple[int, int] | None = None,
                 parent: AggregatedMIP | None = None) -> _Node | None:
        """Build the window's model and bound it by its LP relaxation (None: nothing in it).
        ``excluded``: stage types an enclosing window's LP fixed to 0 (reduced costs); ``stages``:
        only pipelines of that many stages; ``parent``: the model of the same window (all stage
        counts), restricted instead of built again."""
        if parent is not None and stages is not None:
            mip: AggregatedMIP | PositionalMIP | None = parent.with_stage_range(*stages)
            if mip.empty:  # type: ignore[union-attr]
                mip = None
        else:
            mip = self.build(sub, lo, hi, tail_lo, tail_hi, excluded, stages)
        sub.info["windows"] += 1
        if mip is None:
            return None
        st = mip.model.stats()
        sub.info.setdefault("rows", st.rows)
        sub.info.setdefault("columns", st.columns)
        sub.info.setdefault("integers", st.integer_columns)
        # reduced-cost fixing: columns that cannot be in a plan better than the incumbent go
        cutoff = self.target_s() / mip.options.tick_s if math.isfinite(self.inc_s) else None
        lp = lp_relaxation_bound(mip.model, time_limit_s=max(1.0, self.time_limit_s / 10), cutoff=cutoff)
        sub.info["lp_solves"] += 1
        slack = rounding_ticks(sub.problem.num_micro_batches) * mip.options.tick_s
        bound = sub.lower_bound_s if lp is None else max(sub.lower_bound_s if lo <= 0 else 0.0,
                                                          lp * mip.options.tick_s - slack)
        if lp is not None and math.isinf(lp):
            return None
        fixed = mip.fixed_types() if isinstance(mip, AggregatedMIP) else frozenset()
        return _Node(bound_s=bound, b=sub.b, lo_s=lo, hi_s=hi, mip=mip, tail_lo_s=tail_lo, tail_hi_s=tail_hi,
                     excluded_types=fixed, stages=stages)

    def root(self, sub: _Sub) -> None:
        if self.pruned(sub.lower_bound_s):
            sub.status = "pruned by bound"
            self.closed_bounds.setdefault(sub.b, []).append(sub.lower_bound_s)
            return
        if self.ctx.max_stages < 2:
            sub.status = "optimal (one stage)"
            return
        m = sub.problem.num_micro_batches
        lo = fluid_bottleneck_s(sub.problem) if self.windows else 0.0
        hi = self.inc_s / m if (self.windows and math.isfinite(self.inc_s)) else math.inf
        if self.formulation == "aggregated":
            sub.types = enumerate_types(sub.problem, self.inc_s if math.isfinite(self.inc_s) else None)
            sub.info["stage_types"] = {r: len(v) for r, v in sub.types.items()}
            if self.knapsack and sub.problem.schedule == "1f1b":
                # blocks are indivisible and stages come in the candidates' sizes: the covering
                # knapsack bounds the bottleneck of every pipeline of >= 2 stages (bottleneck.py)
                sack = LayerKnapsack(sub.problem, sub.types)
                knap = sack.bottleneck_bound_s()
                sub.info["knapsack_bottleneck_s"] = knap
                if not math.isfinite(knap) or knap > hi * (1 + 1e-12):
                    sub.status = "no multi-stage plan better than incumbent" if math.isfinite(self.inc_s) \
                        else "infeasible"
                    self.closed_bounds.setdefault(sub.b, []).append(self.inc_s)
                    return
                lo = max(lo, knap)
                self.knapsack_plans(sub, sack, knap, hi)
        if self.windows and not math.isfinite(hi):  # no incumbent yet: the slowest stage type caps Tmax
            hi = max((t.time_s for ts in sub.types.values() for t in ts), default=lo)  # type: ignore[union-attr]
            hi = max(hi, max(sub.problem.link_hi_s.values()), lo)
        node = self.evaluate(sub, lo, hi)
        if node is None:  # nothing in the root window beats the target
            sub.status = "no multi-stage plan better than incumbent" if math.isfinite(self.inc_s) else "infeasible"
            self.closed_bounds.setdefault(sub.b, []).append(self.target_s())
            return
        sub.info["lp_bound_s"] = node.bound_s
        heapq.heappush(self.open, node)

    def splittable(self, node: _Node) -> bool:
        """Wider than a leaf: on the period, then on the stage count (sequence leaves) or on the
        largest step tail (aggregated leaves)."""
        if node.hi_s / max(node.lo_s, 1e-30) > self.leaf_ratio:
            return True
        if self.sequence:
            return node.stages is None or node.stages[0] < node.stages[1]
        return self.tail_split_point(node) is not None

    def stage_range(self, node: _Node) -> tuple[int, int]:
        """Stage counts of the plans in ``node`` (pipelines of one stage are enumerated apart)."""
        if node.stages is not None:
            return node.stages
        p = self.subs[node.b].problem
        return max(2, p.min_stages), p.max_stages

    def tail_split_point(self, node: _Node) -> float | None:
        """Midpoint of the node's window on the largest step tail, or None when it is narrow (or
        when narrow windows go to sequence leaves, which price the tail exactly)."""
        if self.sequence or not isinstance(node.mip, AggregatedMIP) or not math.isfinite(self.inc_s):
            return None
        tails = [t.tail_s for ts in node.mip.types.values() for t in ts]
        if not tails:
            return None
        lo = 0.0 if node.tail_lo_s is None else node.tail_lo_s
        hi = min(node.tail_hi_s, max(tails))
        if hi - lo <= TAIL_LEAF_FRACTION * self.inc_s:
            return None
        return 0.5 * (lo + hi)

    def split(self, node: _Node) -> None:
        """Split a node in two: on the bottleneck time (geometric midpoint) while that window is
        wider than ``leaf_ratio``, then either on the stage count (halves of its range; with
        sequence leaves, the default) or on the largest step tail (arithmetic midpoint; with
        aggregated leaves). A stage range is bounded by the aggregated LP of pipelines of that many
        stages, which is often much tighter than the window's (the cycle and Hall rows know P).
        Restricting the tail helps the aggregated LP for the same reason restricting the time
        does: a type outside the window cannot be used "a little", and the window's lower edge
        forces a stage whose tail needs cover upstream (``AggregatedMIP._tail_window_rows``).
        Time first: the period term dominates the objective."""
        sub = self.subs[node.b]
        hi = min(node.hi_s, self.inc_s / sub.problem.num_micro_batches)
        if hi <= node.lo_s:  # the incumbent improved past this window: nothing in it can beat it
            self.close(node, self.inc_s)
            return
        stages = node.stages
        if hi / max(node.lo_s, 1e-30) > self.leaf_ratio:
            mid = math.sqrt(node.lo_s * hi)
            windows = [(node.lo_s, mid, node.tail_lo_s, node.tail_hi_s, stages),
                       (mid, hi, node.tail_lo_s, node.tail_hi_s, stages)]
        elif self.sequence:
            first, last = self.stage_range(node)
            if first == last:  # one stage count left (the only one, or the incumbent capped the window)
                node.hi_s, node.stages = hi, (first, last)
                self.solve_sequence(node)
                return
            half = (first + last) // 2
            windows = [(node.lo_s, hi, None, math.inf, (first, half)),
                       (node.lo_s, hi, None, math.inf, (half + 1, last))]
        else:
            theta = self.tail_split_point(node)
            if theta is None:  # narrow in both once the incumbent capped the time window
                node.hi_s = hi
                self.solve_leaf(node)
                return
            windows = [(node.lo_s, hi, node.tail_lo_s, theta, stages), (node.lo_s, hi, theta, node.tail_hi_s, stages)]
        same_window = self.sequence and hi == node.hi_s and isinstance(node.mip, AggregatedMIP)
        for lo_c, hi_c, tail_lo, tail_hi, stages_c in windows:
            parent = node.mip if (same_window and stages_c is not None and lo_c == node.lo_s
                                  and hi_c == node.hi_s) else None
            child = self.evaluate(sub, lo_c, hi_c, tail_lo, tail_hi, excluded=node.excluded_types, stages=stages_c,
                                  parent=parent)
            if child is None:
                self.close(node, self.target_s())  # nothing in this half beats the target
                continue
            child.bound_s = max(child.bound_s, node.bound_s)
            if self.pruned(child.bound_s):
                self.close(child, child.bound_s)
            else:
                heapq.heappush(self.open, child)
        self.emit(f"b={node.b}: split {node.describe()}")

    def solve_leaf(self, node: _Node) -> None:
        sub = self.subs[node.b]
        mip = node.mip
        assert mip is not None
        cutoff = mip.options.cutoff_s
        if isinstance(mip, AggregatedMIP) and cutoff is not None and self.inc_s < cutoff * (1 - REBUILD_CUTOFF_GAIN):
            # the incumbent improved since this window's model was built: rebuild it with the new
            # cutoff (tighter time bounds, more columns fixed by reduced costs); MIP time dwarfs this
            hi = min(node.hi_s, self.inc_s / sub.problem.num_micro_batches)
            fresh = self.evaluate(sub, node.lo_s, hi, node.tail_lo_s, node.tail_hi_s,
                                  excluded=node.excluded_types) if hi > node.lo_s else None
            if fresh is None or self.pruned(fresh.bound_s):
                self.close(node, self.target_s() if fresh is None else max(node.bound_s, fresh.bound_s))
                return
            node.mip, node.hi_s, node.bound_s = fresh.mip, hi, max(node.bound_s, fresh.bound_s)
            mip = fresh.mip
            assert mip is not None
        n_open = 1 + len(self.open)
        budget = min(self.remaining(), max(2.0, self.remaining() / n_open) * 2 ** node.tries)
        for cand in ([self.inc[1]] if self.inc and self.inc[0] == sub.b else []) + (
                [self.seeds[sub.b][1]] if sub.b in self.seeds else []):
            hint = mip.hint_from(cand)
            # reduced-cost fixing may have excluded the hinted plan (it cannot beat the cutoff)
            if hint is not None and all(v.lb - 1e-9 <= val <= v.ub + 1e-9 for v, val in
                                        ((mip.model.vars[var.index], val) for var, val in hint.items())):
                mip.model.set_hint(hint)
                break
        options = SolveOptions(time_limit_s=budget, threads=self.solve_threads, seed=self.seed, rel_gap=self.rel_gap,
                               cutoff=self.cutoff_ticks(mip))
        base = self.elapsed()
        self.dispatch(node, mip.model, options, lambda res: self.leaf_solved(node, mip, budget, base, res))

    def leaf_solved(self, node: _Node, mip: AggregatedMIP | PositionalMIP, budget: float, base: float,
                    res: Any) -> None:
        """An aggregated (or positional) leaf's solve came back: offer its plans, cut support
        classes off or explore alternatives, and close the window or queue it with more time."""
        sub = self.subs[node.b]
        tick = mip.options.tick_s
        sub.info["mip_solves"] += 1
        sub.solve_time_s += res.solve_time_s
        self.trajectories.append([(base + q.elapsed_s, None if q.incumbent is None else q.incumbent * tick,
                                   None if q.bound is None else q.bound * tick) for q in res.trajectory])
        if res.status == SolveStatus.ERROR:
            self.close(node, node.bound_s)
            sub.info["last_status"] = f"error: {res.message}"
            self.emit(f"b={node.b}: window {node.describe()} {res.status.value}")
            return
        if res.values is not None:
            # the aggregated model relaxes p2p and tail terms: evaluate every reported solution exactly
            best: tuple[float, list[StageChoice]] | None = None
            for vals in [res.values] + [v for _, v in sorted(res.pool, key=lambda q: q[0])[:25]]:
                ch = mip.decode(vals)  # type: ignore[arg-type]
                t = choices_timing(sub.problem, ch).step_time_s
                if best is None or t < best[0]:
                    best = (t, ch)
            assert best is not None
            if isinstance(mip, AggregatedMIP) and len(best[1]) > 3:
                better = polish(sub.problem, reorder(sub.problem, best[1]))
                best = min(best, (choices_timing(sub.problem, better).step_time_s, better), key=lambda q: q[0])
            self.offer(sub.b, best[1], best[0])
            if isinstance(mip, AggregatedMIP) and res.objective is not None and res.status == SolveStatus.OPTIMAL \
                    and not self.pruned(res.objective * tick):
                # the model's optimum is below the incumbent but (often) no real plan is: cut off
                # its support class once the class's exact best is known, and re-solve
                res = self.refine(node, mip, res, budget)
            elif isinstance(mip, AggregatedMIP) and res.objective is not None and \
                    best[0] > res.objective * tick * (1 + 1e-3):
                self.explore_alternatives(node, mip, res.values, budget)
        if res.status == SolveStatus.INFEASIBLE:
            # nothing left in this window beats the cutoff but the support classes cut off it
            self.close(node, min(node.excluded_s, self.target_s()))
        elif res.status in (SolveStatus.OPTIMAL, SolveStatus.FEASIBLE, SolveStatus.NO_SOLUTION):
            slack = rounding_ticks(sub.problem.num_micro_batches) * tick
            model_b = res.bound * tick - slack if res.bound is not None else -math.inf
            # both the window's first LP bound and min(classes cut off, the cut model's bound)
            # hold for the whole window
            b = max(node.bound_s, min(model_b, node.excluded_s))
            if res.status == SolveStatus.OPTIMAL or self.pruned(b):
                self.close(node, min(b, self.inc_s))
            else:
                # time ran out: keep the window open with its better bound and more time next turn
                node.bound_s, node.tries = b, node.tries + 1
                heapq.heappush(self.open, node)
        self.emit(f"b={node.b}: window {node.describe()} {res.status.value}")

    def solve_sequence(self, node: _Node) -> None:
        """Solve a leaf of one window and one stage count with the sequence model (exact in the
        order of the stages; formulations/pipeline_mip.md §3b) against the target as cutoff.
        Optimal: the leaf closes at its optimum, whose plan is offered; infeasible: nothing in it
        beats the target; time limit: back to the queue with the model's dual bound and twice
        the time."""
        sub = self.subs[node.b]
        assert node.stages is not None and node.stages[0] == node.stages[1] and sub.types is not None
        P = node.stages[0]
        hi = min(node.hi_s, self.inc_s / sub.problem.num_micro_batches)
        if hi <= node.lo_s:
            self.close(node, self.inc_s)
            return
        built = node.mip.options.cutoff_s if node.mip is not None else None
        if built is not None and self.inc_s < built * (1 - REBUILD_CUTOFF_GAIN):
            # the incumbent improved since this node's LP: re-bound it, fixing more stage types
            fresh = self.evaluate(sub, node.lo_s, hi, excluded=node.excluded_types, stages=node.stages)
            if fresh is None or self.pruned(fresh.bound_s):
                self.close(node, self.target_s() if fresh is None else max(node.bound_s, fresh.bound_s))
                return
            node.mip, node.excluded_types = fresh.mip, fresh.excluded_types
            node.bound_s = max(node.bound_s, fresh.bound_s)
        skip = node.excluded_types
        types = {role: [t for t in ts if (role, t.candidate, t.layers) not in skip] for role, ts in sub.types.items()}
        seq = SequenceMIP(self.with_stages(sub.problem, node.stages), self.formulation_options(sub), types, P,
                          node.lo_s, hi, integral=self.backend != "highs").build()
        if seq.empty:  # some position has no stage type left: no plan of this size beats the target
            self.close(node, self.target_s())
            return
        if seq.columns > SEQUENCE_MAX_COLUMNS:
            sub.info["sequence_too_large"] = sub.info.get("sequence_too_large", 0) + 1
            self.solve_leaf(node)
            return
        for cand in ([self.inc[1]] if self.inc and self.inc[0] == sub.b else []) + (
                [self.seeds[sub.b][1]] if sub.b in self.seeds else []):
            hint = seq.hint_from(cand)
            if hint is not None:
                seq.model.set_hint(hint)
                break
        n_open = 1 + len(self.open)
        budget = min(self.remaining(), max(SEQUENCE_FIRST_BUDGET_S, self.remaining() / n_open) * 2 ** node.tries)
        options = SolveOptions(time_limit_s=budget, threads=self.solve_threads, seed=self.seed, rel_gap=self.rel_gap,
                               cutoff=self.cutoff_ticks(seq), presolve=False,
                               heuristics=node.bound_s < self.target_s() * (1 - SEQUENCE_HEURISTICS_SLACK))
        base = self.elapsed()
        self.dispatch(node, seq.model, options, lambda res: self.sequence_solved(node, seq, base, res))

    def sequence_solved(self, node: _Node, seq: SequenceMIP, base: float, res: Any) -> None:
        """A sequence leaf's solve came back: offer its plan and close the leaf at its bound, or
        queue it with twice the time."""
        sub = self.subs[node.b]
        tick = seq.options.tick_s
        sub.info["sequence_solves"] = sub.info.get("sequence_solves", 0) + 1
        sub.solve_time_s += res.solve_time_s
        self.trajectories.append([(base + q.elapsed_s, None if q.incumbent is None else q.incumbent * tick,
                                   None if q.bound is None else q.bound * tick) for q in res.trajectory])
        slack = rounding_ticks(sub.problem.num_micro_batches) * tick
        if res.values is not None:
            choices = seq.decode(res.values)
            self.offer(sub.b, choices, choices_timing(sub.problem, choices).step_time_s)
        if res.status == SolveStatus.INFEASIBLE:
            self.close(node, self.target_s())
        elif res.status == SolveStatus.OPTIMAL and res.objective is not None:
            # optimal within the solver's relative gap (rel_gap): its dual bound, not the objective
            proved = res.bound if res.bound is not None else res.objective
            self.close(node, min(self.inc_s, max(node.bound_s, proved * tick - slack)))
        elif res.status in (SolveStatus.FEASIBLE, SolveStatus.NO_SOLUTION):
            bound = max(node.bound_s, res.bound * tick - slack if res.bound is not None else -math.inf)
            if self.pruned(bound):
                self.close(node, bound)
            else:
                node.bound_s, node.tries = bound, node.tries + 1
                heapq.heappush(self.open, node)
        else:
            self.close(node, node.bound_s)
            sub.info["last_status"] = f"error: {res.message}"
        self.emit(f"b={node.b}: sequence {node.describe()} {res.status.value}")

    def refine(self, node: _Node, mip: AggregatedMIP, res: Any, budget: float) -> Any:
        """Tighten a window whose model optimum lies below the incumbent.

        The aggregated model relaxes the order of the stages, so its optimum may price a multiset
        below every real plan made of it. Each round takes the optimum's *support class* (its
        first and last type and its set of middle types, any counts and orders), finds the class's
        exact best plan by enumeration (aggregated.support_class_best; offered as an incumbent),
        records it in ``node.excluded_s`` and cuts the class off the window's model; the re-solved
        model bounds everything else. The window's bound is min(excluded_s, the model's bound),
        valid for the whole window. Stops when the model's optimum reaches the incumbent, the
        window is exhausted (INFEASIBLE), a class is too large to enumerate, after REFINE_ROUNDS
        cuts, or when a re-solve runs out of time; returns the last optimal (or infeasible)
        result, so the window closes at that bound: no-good cuts make later solves slow, and a
        window left open with many of them would absorb the search's time."""
        sub = self.subs[node.b]
        tick = mip.options.tick_s
        deadline = time.perf_counter() + min(budget, self.remaining())
        # re-solves with more cuts get harder: each may take a few times the first solve
        per_solve = max(1.0, REFINE_SOLVE_FACTOR * res.solve_time_s)
        for _ in range(REFINE_ROUNDS):
            best = support_class_best(sub.problem, mip, res.values, max_orders=REFINE_MAX_ORDERS)
            if best is None:
                sub.info["refine_too_large"] = sub.info.get("refine_too_large", 0) + 1
                return res
            if best[1] is not None:
                self.offer(sub.b, best[1], best[0])
            node.excluded_s = min(node.excluded_s, best[0])
            mip.cut_support(res.values)
            sub.info["support_cuts"] = sub.info.get("support_cuts", 0) + 1
            left = min(deadline - time.perf_counter(), per_solve)
            if left < 0.2:
                return res  # its optimum still bounds everything the earlier cuts left
            mip.model.hint = {}
            nxt = solve_model(mip.model, self.backend, SolveOptions(time_limit_s=left, threads=self.solve_threads,
                                                                    seed=self.seed, rel_gap=self.rel_gap,
                                                                    cutoff=self.cutoff_ticks(mip)))
            sub.info["mip_solves"] += 1
            sub.solve_time_s += nxt.solve_time_s
            if nxt.values is not None:
                ch = mip.decode(nxt.values)
                self.offer(sub.b, ch, choices_timing(sub.problem, ch).step_time_s)
            if nxt.status == SolveStatus.INFEASIBLE:
                return nxt
            if nxt.status != SolveStatus.OPTIMAL or nxt.objective is None:
                return res  # out of time: the previous optimum still bounds the rest
            res = nxt
            if self.pruned(res.objective * tick):
                return res
        return res

    def explore_alternatives(self, node: _Node, mip: AggregatedMIP, values: list[float], budget: float) -> None:
        """Primal search when the relaxation flattered the MIP's answer (its exact step time is
        worse than the MIP objective): on a copy of the window's model, cut off the used stage-type
        pattern (no-good on the binaries) and re-solve a few times, scoring each answer exactly.
        Only incumbents come out of this; the node's bound is the original model's."""
        import copy

        sub = self.subs[node.b]
        model = copy.deepcopy(mip.model)
        binaries = [v for group in (mip.e, mip.h, mip.o) for v in group.values()]
        vals = values
        for _ in range(NOGOOD_ROUNDS):
            left = min(budget / 2, self.remaining())
            if left < 0.5:
                return
            ones = [v for v in binaries if vals[v.index] > 0.5]
            zeros = [v for v in binaries if vals[v.index] <= 0.5]
            model.add(lsum(1 - v for v in ones) + lsum(zeros) >= 1, f"nogood{len(model.constraints)}")
            model.hint = {}
            res = solve_model(model, self.backend, SolveOptions(time_limit_s=left, threads=self.solve_threads,
                                                                 seed=self.seed, rel_gap=self.rel_gap,
                                                                 cutoff=self.cutoff_ticks(mip)))
            sub.info["mip_solves"] += 1
            sub.solve_time_s += res.solve_time_s
            if res.values is None:
                return
            vals = res.values
            ch = mip.decode(vals)
            self.offer(sub.b, ch, choices_timing(sub.problem, ch).step_time_s)

    def finish(self) -> Plan:
        ctx = self.ctx
        if self.inc is None:
            # nothing found: infeasible unless some sub-problem was cut short by the time limit
            if not self.open and not any(s.status.startswith("not finished") for s in self.subs.values()):
                raise _nothing_fits(ctx)
            raise NoSolutionError(f"no plan found within {self.time_limit_s:.0f} s with backend "
                                  f"{self.backend!r}; raise time_limit_s or try another backend")
        bound = self.global_bound()
        gap = relative_gap(self.inc_s, bound) if math.isfinite(bound) else None
        # nodes close at the target, incumbent * (1 - rel_gap): allow its floating-point rounding
        status = "optimal" if gap is not None and gap <= max(self.rel_gap, 1e-6) * (1 + 1e-9) else "feasible"
        b, choices = self.inc
        pipe = pipeline_plan(ctx, self.subs[b].problem, choices)
        self.emit("done")
        space_text = ctx.space.describe() + f"; at most {ctx.max_stages} stages"
        if len(ctx.kinds) == 2 and self.formulation == "aggregated":
            space_text += "; dense-first layers all on the first stage"
        rows = []
        for s in self.subs.values():
            rows.append({"pipeline_micro_batch": s.b, "micro_batches": s.problem.num_micro_batches,
                         "status": s.status, "quick_bound_s": s.lower_bound_s, "bound_s": self.sub_bound(s),
                         "objective_s": s.objective_s, "one_stage_s": s.single_s, "solve_time_s": s.solve_time_s,
                         "candidates": len(s.problem.candidates), **s.info})
        greedy_best = min((t for t, _ in self.seeds.values()), default=None)
        cert = Certificate(
            status=status, backend=self.backend, objective_s=self.inc_s, bound_s=bound, gap=gap,
            solve_time_s=self.elapsed(), plan_space=space_text, subproblems=tuple(rows),
            trajectory=tuple((e.elapsed_s, e.incumbent_s, e.bound_s) for e in self.events),
            notes=(f"formulation: {self.formulation}" + (" with bottleneck windows" if self.windows else "")
                   + (" and sequence leaves" if self.sequence else ""),
                   f"greedy warm start {greedy_best:.6f} s" if greedy_best is not None else "no warm start",
                   f"candidates kept after exact Pareto pruning: {_pruning_note(ctx)}"))
        return make_plan(ctx, [pipe], method="mip", certificate=cert)


def _pruning_note(ctx: PlanningContext) -> str:
    st = getattr(ctx.provider, "stats", None)
    if st is None:
        return "provided externally"
    return (f"{st.kept} of {st.enumerated} enumerated ({st.invalid} invalid, {st.no_fit} cannot hold a layer, "
            f"{st.dominated} dominated" + (f", {st.heuristic} dropped heuristically" if st.heuristic else "") + ")")


def _nothing_fits(ctx: PlanningContext) -> InfeasibleError:
    """Diagnose why no plan exists: the smallest footprint of one layer, per island."""
    from tangram_opt.planner.diagnose import diagnose_infeasible

    return diagnose_infeasible(ctx)


def _load_model(model: ModelSpec | str) -> ModelSpec:
    if isinstance(model, ModelSpec):
        return model
    try:
        from tangram_opt.specs.presets import load_model
    except ImportError:  # pragma: no cover - presets land with issue 2
        raise TypeError("pass a ModelSpec") from None
    return load_model(model)


def _load_training(training: TrainingSpec | dict | None) -> TrainingSpec:
    if training is None:
        return TrainingSpec(global_batch_size=512, seq_len=4096)
    if isinstance(training, TrainingSpec):
        return training
    from tangram_opt.specs.training import training_from_dict

    return training_from_dict(training)


__all__ = ["solve", "SearchEvent", "quick_lower_bound", "rounding_ticks", "FORMULATIONS"]
