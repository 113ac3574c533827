"""``solve(cluster, model, training, ...)``: the planner's entry point.

It turns the user's inputs into checked specs and measured inputs (every invalid one refused with a
:class:`~tangram_opt.errors.SpecError` naming it), builds the planning context, runs the
single-pipeline branch and bound (branch_and_bound.py), then the multi-pipeline level
(tangram_opt/planner/multi_pipeline) unless the options switch it off, and returns the better plan
with its certificate. The research knobs are in :class:`~tangram_opt.planner.search.options.SearchOptions`.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tangram_opt.cost import (Calibration, LayerProfile, ProfileSet, check_profiles, load_calibration,
                              load_profiles)
from tangram_opt.errors import SpecError
from tangram_opt.planner.candidates import CandidateProvider
from tangram_opt.planner.context import PlanningContext
from tangram_opt.planner.islands import find_islands
from tangram_opt.planner.multi_pipeline import combine_levels, run_multi_pipeline
from tangram_opt.planner.multi_pipeline.options import MultiPipelineOptions
from tangram_opt.planner.plan import CertificateStatus, Plan
from tangram_opt.planner.search import tuning
from tangram_opt.planner.search.branch_and_bound import BranchAndBound, leaf_pool
from tangram_opt.planner.search.nodes import SearchEvent
from tangram_opt.planner.search.objective import Objective, objective_input
from tangram_opt.planner.search.options import SearchOptions
from tangram_opt.planner.search.priced import PricedSearch, plan_prices
from tangram_opt.planner.space import SearchSpace
from tangram_opt.solvers import DEFAULT_BACKEND, get_backend, relative_gap
from tangram_opt.solvers.workers import SolverPool
from tangram_opt.specs import load_cluster, load_model, load_training, training_from_dict
from tangram_opt.specs.cluster import Cluster
from tangram_opt.specs.model import ModelSpec
from tangram_opt.specs.training import TrainingSpec

#: the keywords ``solve`` took for the research knobs before they moved into :class:`SearchOptions`
#: (still accepted, with a DeprecationWarning)
LEGACY_KNOBS = ("formulation", "windows", "fluid_cuts", "knapsack", "sequence_leaves", "warm_start", "multi_pipeline")
#: ``training=None``: this global batch (sequences) and sequence length (tokens)
DEFAULT_GLOBAL_BATCH, DEFAULT_SEQ_LEN = 512, 4096


def solve(cluster: Cluster | str, model: ModelSpec | str, training: TrainingSpec | dict | str | Path | None = None,
          *, time_limit_s: float = 60.0, backend: str = DEFAULT_BACKEND, threads: int = 1, seed: int = 0,
          rel_gap: float = 1e-4, space: SearchSpace | None = None,
          on_progress: Callable[[SearchEvent], None] | None = None,
          calibration: Calibration | str | Path | None = None,
          profiles: ProfileSet | LayerProfile | Iterable[LayerProfile] | str | Path | None = None,
          expert_loads: Any = None, moe_load_imbalance: float | Callable[[int, int], float] = 1.0,
          provider: CandidateProvider | None = None, options: SearchOptions | None = None,
          launch: str | None = None, objective: Objective | str | None = None,
          budget_usd_per_h: float | None = None, min_tokens_per_s: float | None = None,
          max_nodes: dict[str, int] | None = None, start: Plan | None = None, **legacy_knobs: Any) -> Plan:
    """Plan ``model`` on ``cluster`` and certify how close the plan is to the best one in the model.

    Returns the best plan found with a :class:`~tangram_opt.planner.plan.Certificate` (incumbent,
    dual bound, gap). On a time limit without proof the best plan is returned with its gap. Raises
    :class:`InfeasibleError` (with what came closest) when nothing fits, :class:`NoSolutionError`
    when the time ran out before any plan was found, and :class:`SpecError` for an input no search
    can honour (each names the argument).

    - ``cluster``, ``model``: specs, or a built-in name / file (``load_cluster``, ``load_model``);
    - ``training``: a :class:`TrainingSpec`, a dict or a file. None: a global batch of 512 sequences
      of 4096 tokens in bf16, or in fp16 when some GPU of the cluster has no bf16 (V100, T4, ...) —
      the same default as ``tangram-opt plan``;
    - ``time_limit_s`` (>= 0), ``rel_gap`` (in [0, 1): stop once the plan is proved within it; 0.01
      is reached much sooner than the default 0.01%), ``backend``, ``seed`` (>= 0);
    - ``threads`` (>= 1): with HiGHS and 2 or more, ``threads`` solver processes (one per spare
      core and one more) solve leaf MIPs and bound windows beside the search, and on large searches
      price its candidate tables first (solvers/workers.py; HiGHS's branch and bound is serial);
      other backends get the threads;
    - ``space``: the plan space (:class:`SearchSpace`); ``on_progress``: called with a
      :class:`SearchEvent` after every step of the search;
    - measured inputs (docs/user_guide/profiling.md): ``calibration`` is a :class:`Calibration` or
      the path of a calibration file (YAML/JSON, ``tangram-opt calibrate`` writes one);
      ``profiles`` a :class:`~tangram_opt.cost.ProfileSet`, a :class:`~tangram_opt.cost.LayerProfile`,
      a list of them, or the path of a profile file or of a directory of ``*.json`` profiles.
      Measured layer times replace the computed compute time of the GPU types they cover; a profile
      of another model shape, sequence length or precision is refused (``check_profiles``);
    - MoE routing skew: ``expert_loads`` (tokens per expert, one row per MoE layer) prices every MoE
      layer at the hottest EP rank of the best expert placement for each EP degree
      (``tangram_opt.experts.ImbalanceModel``; the plan's ``expert_placement`` reports them);
      ``moe_load_imbalance`` sets that ratio directly (a number >= 1, or a function of
      ``(ep, gpus_per_node)``);
    - ``provider``: another source of candidate rows (another homogeneous planner, measured tables);
    - ``launch``: "megatron", "deepspeed" or "torchtitan": search only plans that framework runs
      as one job (every stage the same tp, cp, ep, dp, ZeRO stage, recomputation and micro-batch;
      one pipeline; the framework's limits and its gradient-reduction overlap; launch.py); the
      certificate is over that space. None: the whole plan space;
    - ``options``: the research knobs (:class:`SearchOptions`: formulation, windows, cuts, leaves,
      warm start, the multi-pipeline level). The keywords these had before (``formulation=``,
      ``multi_pipeline=``, ...) are still accepted, with a DeprecationWarning;
    - ``objective``: "throughput" (the default), "min_cost" (USD/h of the GPUs used) or
      "cost_per_token", or an :class:`~tangram_opt.planner.search.objective.Objective`; limits
      ``budget_usd_per_h`` (USD/h of the GPUs used), ``min_tokens_per_s`` (a throughput floor) and
      ``max_nodes`` (node group name -> most of its nodes the plan may use).
      Anything but throughput without limits runs the priced search (priced.py; formulations/
      pipeline_mip.md §4b): single pipelines, one priced positional MIP per pipeline micro-batch
      size, the certificate on that objective; ``launch=`` and explicit windows, knapsack or
      sequence leaves are refused there. Limits no plan meets raise :class:`InfeasibleError` with
      the figure that misses (the cheapest plan's USD/h, the fastest plan's tokens/s);
    - ``start``: a plan of this cluster, model and training run (an earlier ``solve``'s, or a plan
      file's) to start from. The search returns it when it finds nothing better (under the
      objective and limits), so the result is never worse than ``start``. A dollar objective's
      search offers a single-pipeline ``start`` as its first incumbent, and counts a multi-pipeline
      one into its certificate's bound. Not used with ``launch=``.
    """
    t0 = time.perf_counter()
    options = _options(options, legacy_knobs)
    cluster, model, training = planning_inputs(cluster, model, training)
    get_backend(backend)  # fail fast on an unknown or missing backend
    check_numbers(time_limit_s=time_limit_s, threads=threads, seed=seed, rel_gap=rel_gap,
                  moe_load_imbalance=moe_load_imbalance)
    check_model_inputs(model, training, expert_loads)
    calibration = calibration_input(calibration)
    if calibration is not None:
        for g in cluster.node_groups:
            calibration.check_reserve(g.gpu, where=f"node group {g.name!r}")
    profiles = profiles_input(profiles, model, training)
    space = space or SearchSpace()
    goal = objective_input(objective, budget_usd_per_h, min_tokens_per_s, max_nodes, cluster=cluster)
    check_start(start, cluster, model, training, launch)
    if not goal.is_default:
        if launch is not None:
            raise SpecError("launch", launch, f"cannot be combined with a non-default objective ({goal.describe()}): "
                            "launch targets are searched for throughput only",
                            "drop launch= or the objective and limits")
        return _solve_priced(cluster, model, training, goal, options=options, space=space, calibration=calibration,
                             profiles=profiles, provider=provider, moe_load_imbalance=moe_load_imbalance,
                             expert_loads=expert_loads, backend=backend, time_limit_s=time_limit_s, threads=threads,
                             seed=seed, rel_gap=rel_gap, on_progress=on_progress, t0=t0, start=start)
    if launch is not None:
        return _solve_launch(cluster, model, training, launch=launch, options=options, space=space,
                             calibration=calibration, profiles=profiles, provider=provider,
                             moe_load_imbalance=moe_load_imbalance, expert_loads=expert_loads, backend=backend,
                             time_limit_s=time_limit_s, threads=threads, seed=seed, rel_gap=rel_gap,
                             on_progress=on_progress, t0=t0)
    single_limit_s = time_limit_s * (tuning.MULTI_PIPELINE_SINGLE_SHARE if options.multi_pipeline else 1.0)
    # sequence leaves are chosen on the whole budget: the single-pipeline search usually closes
    # well before its share runs out on the cases that matter, and then the multi-pipeline level
    # gets the rest (formulations/pipeline_mip.md §5, "Sequence leaves")
    knobs = options.resolved(space.schedule, time_limit_s)
    if expert_loads is not None:
        from tangram_opt.experts import ImbalanceModel  # the placement MIPs load only when asked for

        moe_load_imbalance = ImbalanceModel(expert_loads, time_limit_s=max(1.0, min(10.0, time_limit_s / 20)))
    ctx = PlanningContext(cluster, model, training, space=space, calibration=calibration, provider=provider,
                          moe_load_imbalance=moe_load_imbalance, profiles=profiles)
    search = BranchAndBound(ctx, backend=backend, time_limit_s=single_limit_s, threads=threads, seed=seed,
                            rel_gap=rel_gap, formulation=knobs.formulation, windows=bool(knobs.windows),
                            fluid_cuts=knobs.fluid_cuts, knapsack=bool(knobs.knapsack),
                            sequence=bool(knobs.sequence_leaves), warm_start=knobs.warm_start,
                            on_progress=on_progress, t0=t0)
    with _workers_for_the_run(threads, backend):
        plan = search.run()
        if knobs.multi_pipeline:
            plan = _multi_pipeline_level(ctx, search, plan, knobs, backend=backend, time_limit_s=time_limit_s,
                                         t0=t0, threads=threads, seed=seed, rel_gap=rel_gap)
    if start is not None and start.step_time_s < plan.step_time_s:
        plan = _start_instead(plan, start, rel_gap)
    return _with_prices(_attach_expert_placement(plan, moe_load_imbalance), ctx)


@contextmanager
def _workers_for_the_run(threads: int, backend: str) -> Iterator[None]:
    """One pool of solver processes for every search of this ``solve`` (the single-pipeline search,
    its resumption and the multi-pipeline level's sub-cluster searches), unless an enclosing
    ``solve`` made one: a sub-cluster search of a few seconds would otherwise spend a second
    starting its own workers."""
    pool = leaf_pool(threads, backend) if SolverPool.current() is None else None
    if pool is None:
        yield
        return
    try:
        with pool.as_current():
            yield
    finally:
        pool.close()


def check_start(start: Any, cluster: Cluster, model: ModelSpec, training: TrainingSpec, launch: str | None) -> None:
    """``solve``'s ``start``: a :class:`Plan` of this cluster, model and training run (SpecError
    naming ``start`` otherwise)."""
    if start is None:
        return
    if not isinstance(start, Plan):
        raise SpecError("start", type(start).__name__, "is not a Plan",
                        "pass a plan from solve(...) or tangram_opt.Plan.load(path)")
    if launch is not None:
        raise SpecError("start", start.cluster, "is not used by launch targets (launch=)", "drop start= or launch=")
    islands = {isl.name: isl.num_gpus for isl in find_islands(cluster)}
    for name, n in start.gpus_by_island().items():
        if n > islands.get(name, 0):
            raise SpecError("start", start.cluster, f"uses {n} GPUs of island {name!r}, which cluster {cluster.name!r} "
                            + (f"has {islands[name]} of" if name in islands else "does not have"),
                            "start from a plan of this cluster")
    for field_, mine, want in (("model", start.model, model.name),
                               ("global_batch_size", start.global_batch_size, training.global_batch_size),
                               ("seq_len", start.seq_len, training.seq_len),
                               ("precision", start.precision, training.precision)):
        if mine != want:
            raise SpecError(f"start.{field_}", mine, f"differs from this solve's {want!r}",
                            "start from a plan of the same model and training run")


def _start_instead(plan: Plan, start: Plan, rel_gap: float) -> Plan:
    """``start`` with ``plan``'s certificate (its bound covers the space ``start`` lies in),
    re-stated for ``start``'s step time."""
    cert = plan.certificate
    if cert is None or cert.bound_s is None:
        return start
    gap = relative_gap(start.step_time_s, cert.bound_s)
    status = CertificateStatus.OPTIMAL if gap <= rel_gap else CertificateStatus.FEASIBLE
    notes = cert.notes + ("the plan is the start plan (solve(start=...)): nothing the search found beats it",)
    return replace(start, certificate=replace(cert, objective_s=start.step_time_s, gap=gap, status=status,
                                              notes=notes))


def _multi_pipeline_level(ctx: PlanningContext, search: BranchAndBound, single: Plan, knobs: SearchOptions, *,
                          backend: str, time_limit_s: float, t0: float, threads: int, seed: int,
                          rel_gap: float) -> Plan:
    """The multi-pipeline level after the single-pipeline search; the time it leaves over goes
    back to the single-pipeline search (``BranchAndBound.resume``) when that level's bound is the
    one that limits the certificate."""
    opts = knobs.multi_pipeline_options or MultiPipelineOptions()
    plan, run = run_multi_pipeline(ctx, single, solver=solve_single_pipeline, backend=backend,
                                   time_limit_s=time_limit_s, t0=t0, threads=threads, seed=seed, rel_gap=rel_gap,
                                   options=opts)
    cert = single.certificate
    assert cert is not None and plan.certificate is not None
    until = tuning.RESUME_DEADLINE_SHARE * time_limit_s
    binding = cert.bound_s is not None and cert.bound_s < run.level2.bound_s
    if binding and cert.status != "optimal" and until - (time.perf_counter() - t0) >= tuning.RESUME_MIN_S:
        better = run.level2.objective_s  # only single pipelines better than the level-2 plan matter now
        single = search.resume(until, cutoff_s=better if better is not None and better < cert.objective_s else None)
        plan = combine_levels(ctx, single, run, opts, t0=t0, backend=backend, rel_gap=rel_gap)
    return plan


def _solve_priced(cluster: Cluster, model: ModelSpec, training: TrainingSpec, goal: Objective, *,
                  options: SearchOptions, space: SearchSpace, calibration: Calibration | None,
                  profiles: ProfileSet | None, provider: CandidateProvider | None, moe_load_imbalance: Any,
                  expert_loads: Any, backend: str, time_limit_s: float, threads: int, seed: int, rel_gap: float,
                  on_progress: Callable[[SearchEvent], None] | None, t0: float, start: Plan | None = None) -> Plan:
    """``solve`` under a non-default objective or limits (priced.py): single pipelines, one priced
    positional MIP per pipeline micro-batch size. Search features whose bounds are step-time
    bounds are refused when asked for explicitly."""
    for name in ("windows", "knapsack", "sequence_leaves"):
        if getattr(options, name):
            raise SpecError(f"options.{name}", True, f"bounds the step time, not {goal.describe()}",
                            f"leave {name} None (or False) with a non-default objective")
    if options.multi_pipeline_options is not None:
        raise SpecError("options.multi_pipeline_options", options.multi_pipeline_options,
                        f"is given with a non-default objective ({goal.describe()}): the multi-pipeline level "
                        "searches for throughput only", "drop it, or plan for throughput")
    if expert_loads is not None:
        from tangram_opt.experts import ImbalanceModel

        moe_load_imbalance = ImbalanceModel(expert_loads, time_limit_s=max(1.0, min(10.0, time_limit_s / 20)))
    ctx = PlanningContext(cluster, model, training, space=space, calibration=calibration, provider=provider,
                          moe_load_imbalance=moe_load_imbalance, profiles=profiles)
    plan = PricedSearch(ctx, goal, backend=backend, time_limit_s=time_limit_s, threads=threads, seed=seed,
                        rel_gap=rel_gap, fluid_cuts=options.fluid_cuts, warm_start=options.warm_start,
                        on_progress=on_progress, t0=t0, solver=solve_single_pipeline).run(
                            start=[start] if start is not None else [])
    return _with_prices(_attach_expert_placement(plan, moe_load_imbalance), ctx, goal.max_nodes)


def _with_prices(plan: Plan, ctx: PlanningContext, max_nodes: dict[str, int] | None = None) -> Plan:
    """``plan`` with its dollar figures in the certificate (``Certificate.prices``), when every
    GPU of the cluster has a price."""
    if plan.certificate is None:
        return plan
    try:
        prices = plan_prices(plan, ctx, max_nodes)
    except SpecError:
        return plan
    return replace(plan, certificate=replace(plan.certificate, prices=prices))


def _solve_launch(cluster: Cluster, model: ModelSpec, training: TrainingSpec, *, launch: str,
                  options: SearchOptions, space: SearchSpace, calibration: Calibration | None,
                  profiles: ProfileSet | None, provider: CandidateProvider | None, moe_load_imbalance: Any,
                  expert_loads: Any, backend: str, time_limit_s: float, threads: int, seed: int, rel_gap: float,
                  on_progress: Callable[[SearchEvent], None] | None, t0: float) -> Plan:
    """``solve(..., launch=target)``: the launch space of ``target`` (launch.py)."""
    from tangram_opt.planner.search.launch import check_launch, launch_calibration, solve_launch

    rules = check_launch(launch, training.precision, model)
    if provider is not None:
        raise SpecError("provider", type(provider).__name__, "cannot be combined with launch=", "drop one of them")
    if options.multi_pipeline_options is not None:
        raise SpecError("options.multi_pipeline_options", options.multi_pipeline_options,
                        "is given with launch=: a launch target runs one pipeline", "drop it")
    knobs = replace(options, multi_pipeline=False).resolved(space.schedule, time_limit_s)
    if expert_loads is not None:
        from tangram_opt.experts import ImbalanceModel

        moe_load_imbalance = ImbalanceModel(expert_loads, time_limit_s=max(1.0, min(10.0, time_limit_s / 20)))
    ctx = PlanningContext(cluster, model, training, space=space, calibration=launch_calibration(rules, calibration),
                          moe_load_imbalance=moe_load_imbalance, profiles=profiles)
    plan = solve_launch(ctx, rules, backend=backend, time_limit_s=time_limit_s, threads=threads, seed=seed,
                        rel_gap=rel_gap, knobs=knobs, on_progress=on_progress, t0=t0)
    return _attach_expert_placement(plan, moe_load_imbalance)


@dataclass(frozen=True, slots=True)
class LaunchPrice:
    """What a stock launch costs: the best plan ``launch`` runs as one job against the best plan of
    the whole space (and the greedy plan), each with its certificate."""

    launch: str
    launch_plan: Plan
    free_plan: Plan
    greedy_step_s: float | None

    @property
    def price(self) -> float:
        """Relative step-time increase of the launchable plan over the unrestricted one."""
        return self.launch_plan.step_time_s / self.free_plan.step_time_s - 1

    def describe(self) -> str:
        free_cert = self.free_plan.certificate
        bound = f", certified within {100 * free_cert.gap:.2f}%" if free_cert is not None and free_cert.gap \
            is not None else ""
        greedy = f"; the greedy plan {self.greedy_step_s:.4g} s" if self.greedy_step_s is not None else ""
        return (f"price of a stock {self.launch} launch: {100 * self.price:+.1f}% "
                f"({self.launch_plan.step_time_s:.4g} s per step against {self.free_plan.step_time_s:.4g} s "
                f"for the best plan of the whole space{bound}){greedy}")


def launch_price(cluster: Cluster | str, model: ModelSpec | str, training: TrainingSpec | dict | str | Path | None = None,
                 *, launch: str, time_limit_s: float = 60.0, launch_share: float = 0.5, **kwargs: Any) -> LaunchPrice:
    """Plan with ``launch`` (``launch_share`` of ``time_limit_s``) and without (the rest), and the
    greedy plan: :class:`LaunchPrice` (``tangram-opt plan --launch`` prints it). ``kwargs`` go to
    both :func:`solve` calls."""
    if not (isinstance(launch_share, (int, float)) and 0 < launch_share < 1):
        raise SpecError("launch_share", launch_share, "must be a fraction in (0, 1)", "e.g. 0.5")
    t0 = time.perf_counter()
    cluster, model, training = planning_inputs(cluster, model, training)
    launch_plan = solve(cluster, model, training, time_limit_s=time_limit_s * launch_share, launch=launch, **kwargs)
    rest = max(0.0, time_limit_s - (time.perf_counter() - t0))
    free_plan = solve(cluster, model, training, time_limit_s=rest, **kwargs)
    greedy = None
    if free_plan.certificate is not None:
        for note in free_plan.certificate.notes:
            if note.startswith("greedy warm start "):
                greedy = float(note.split()[3])
    return LaunchPrice(launch=launch, launch_plan=launch_plan, free_plan=free_plan, greedy_step_s=greedy)


def solve_single_pipeline(cluster: Cluster | str, model: ModelSpec | str, training: Any = None, **kwargs: Any) -> Plan:
    """:func:`solve` without the multi-pipeline level (with the other options at their defaults):
    the search the multi-pipeline level runs on sub-clusters (its ``solver``)."""
    return solve(cluster, model, training, options=SearchOptions(multi_pipeline=False), **kwargs)


# --- inputs --------------------------------------------------------------------------------------
def planning_inputs(cluster: Cluster | str, model: ModelSpec | str,
                    training: TrainingSpec | dict | str | Path | None = None) -> tuple[Cluster, ModelSpec, TrainingSpec]:
    """The specs ``solve`` plans with: names and files loaded, ``training=None`` made the default
    (:func:`default_training`)."""
    cluster = cluster if isinstance(cluster, Cluster) else load_cluster(cluster)
    model = model if isinstance(model, ModelSpec) else load_model(model)
    if training is None:
        training = default_training(cluster, model)
    elif isinstance(training, dict):
        training = training_from_dict(training)
    elif not isinstance(training, TrainingSpec):
        training = load_training(training)
    return cluster, model, training


def default_training(cluster: Cluster, model: ModelSpec | None = None) -> TrainingSpec:
    """512 sequences of 4096 tokens per step (:func:`default_seq_len`: fewer for a model whose
    learned position table is shorter), in bf16 where every GPU of ``cluster`` supports it and in
    fp16 otherwise (every GPU type supports fp16)."""
    bf16 = all(g.gpu.supports("bf16") for g in cluster.node_groups)
    return TrainingSpec(global_batch_size=DEFAULT_GLOBAL_BATCH, seq_len=default_seq_len(model),
                        precision="bf16" if bf16 else "fp16")


def default_seq_len(model: ModelSpec | None) -> int:
    """4096 tokens, or for a model with learned positions the longest power of two its table
    holds (OPT's 2,050 rows, 2,048 positions and OPT's two offset rows: 2,048)."""
    if model is None or model.position_embedding != "learned":
        return DEFAULT_SEQ_LEN
    return min(DEFAULT_SEQ_LEN, 1 << (model.max_position_embeddings.bit_length() - 1))


def check_model_inputs(model: ModelSpec, training: TrainingSpec, expert_loads: Any) -> None:
    """Refuse a training run the model cannot take, and expert loads that are not the model's."""
    if model.position_embedding == "learned" and training.seq_len > model.max_position_embeddings:
        raise SpecError("training.seq_len", training.seq_len,
                        f"exceeds the {model.max_position_embeddings} rows of {model.name}'s learned position table "
                        "(max_position_embeddings): positions beyond it have no embedding",
                        f"train with seq_len <= {model.max_position_embeddings}, or a model with rotary positions")
    if expert_loads is None:
        return
    if not model.is_moe:
        raise SpecError("expert_loads", "...", f"is given but {model.name} has no MoE layers",
                        "drop expert_loads for a dense model")
    from tangram_opt.experts.api import _as_layers  # the placement MIPs load only when asked for

    rows, _ = _as_layers(expert_loads)
    assert model.moe is not None
    if rows.shape[1] != model.moe.num_experts:
        raise SpecError("expert_loads", f"{rows.shape[0]} row(s) of {rows.shape[1]}",
                        f"has {rows.shape[1]} loads per layer but {model.name} has {model.moe.num_experts} experts",
                        f"give one load per expert ({model.moe.num_experts}) in each row")


def check_numbers(*, time_limit_s: Any, threads: Any, seed: Any, rel_gap: Any, moe_load_imbalance: Any) -> None:
    """Refuse numeric arguments no search can honour, naming the argument (the CLI checks the same)."""
    def number(x: Any) -> bool:
        return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)

    if not number(time_limit_s) or time_limit_s < 0:
        raise SpecError("time_limit_s", time_limit_s, "must be a finite number of seconds >= 0",
                        "give the wall-clock budget, e.g. time_limit_s=60 (0: heuristic plan and bound only)")
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise SpecError("threads", threads, "must be an integer >= 1", "e.g. threads=2 (this machine's cores)")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise SpecError("seed", seed, "must be an integer >= 0", "e.g. seed=0")
    if not number(rel_gap) or not 0.0 <= rel_gap < 1.0:
        raise SpecError("rel_gap", rel_gap, "is not a relative gap in [0, 1)", "use e.g. 0.01 for within 1%")
    if not callable(moe_load_imbalance) and (not number(moe_load_imbalance) or moe_load_imbalance < 1.0):
        raise SpecError("moe_load_imbalance", moe_load_imbalance, "must be a finite ratio >= 1",
                        "pass max/mean tokens per expert-parallel rank (1.0 = uniform), or a function of "
                        "(ep, gpus_per_node)")


def calibration_input(calibration: Calibration | str | Path | None) -> Calibration | None:
    """``calibration`` as a :class:`Calibration` (a path is read with ``load_calibration``)."""
    if calibration is None or isinstance(calibration, Calibration):
        return calibration
    if isinstance(calibration, (str, Path)):
        return load_calibration(calibration)
    raise SpecError("calibration", type(calibration).__name__, "is not a Calibration or a calibration file path",
                    "pass tangram_opt.cost.Calibration(...) or the file 'tangram-opt calibrate' wrote")


def profiles_input(profiles: Any, model: ModelSpec, training: TrainingSpec) -> ProfileSet | None:
    """``profiles`` as a :class:`ProfileSet` checked against the run (None stays None): a set, one
    profile, a list of them, or the path of a profile file or of a directory of ``*.json`` profiles."""
    if profiles is None:
        return None
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


def _options(options: SearchOptions | None, legacy: dict[str, Any]) -> SearchOptions:
    """``options``, or the same knobs given the old way as keywords (deprecated)."""
    unknown = sorted(set(legacy) - set(LEGACY_KNOBS))
    if unknown:
        raise TypeError(f"solve() got an unexpected keyword argument {unknown[0]!r}")
    if options is not None and not isinstance(options, SearchOptions):
        raise SpecError("options", type(options).__name__, "is not a SearchOptions",
                        "pass tangram_opt.SearchOptions(...) or None")
    if not legacy:
        return options if options is not None else SearchOptions()
    if options is not None:
        raise SpecError("options", options, f"is given together with {', '.join(sorted(legacy))}=",
                        "put every knob into options=SearchOptions(...)")
    warnings.warn(f"solve({', '.join(f'{k}=' for k in legacy)}) is deprecated: pass options=SearchOptions(...)",
                  DeprecationWarning, stacklevel=3)
    kw = dict(legacy)
    if isinstance(kw.get("multi_pipeline"), MultiPipelineOptions):
        kw["multi_pipeline"], kw["multi_pipeline_options"] = True, kw["multi_pipeline"]
    return SearchOptions(**kw)


def _attach_expert_placement(plan: Plan, imbalance: Any) -> Plan:
    """Record the expert placements behind the MoE layer times of the chosen plan's EP degrees."""
    summary = getattr(imbalance, "summary", None)
    if summary is None:
        return plan
    used = {s.ep for s in plan.stages if s.ep > 1 and s.num_moe_layers}
    info = summary()
    info["ep_degrees"] = [d for d in info["ep_degrees"] if d["ep"] in used]
    return replace(plan, expert_placement=info)


__all__ = ["DEFAULT_GLOBAL_BATCH", "DEFAULT_SEQ_LEN", "LEGACY_KNOBS", "LaunchPrice", "calibration_input",
           "check_model_inputs", "check_numbers", "default_seq_len", "default_training", "launch_price",
           "planning_inputs", "profiles_input", "solve", "solve_single_pipeline"]
