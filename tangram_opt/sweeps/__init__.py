"""What-if sweeps: solve many cluster variants, price each plan, and find the Pareto front.

``tangram_opt.sweep(spec)`` reads a sweep (file, dict or :class:`SweepSpec`; the format is in
:mod:`tangram_opt.sweeps.spec` and docs/user_guide/costs_and_sweeps.md), checks every variant and
its prices before anything is solved, solves each distinct variant with :func:`tangram_opt.solve`
(in parallel: local worker processes, or Ray with ``ray_address``), prices each plan with
:func:`tangram_opt.costing.plan_cost`, and returns a :class:`pandas.DataFrame` with one row per
variant (:data:`COLUMNS`). ``figure=`` also writes the Pareto figure (:mod:`.pareto`).

Layer: consumers, above the search (calls ``solve`` and ``plan_cost``); the command line sits above
it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tangram_opt.errors import SpecError
from tangram_opt.sweeps.pareto import pareto_figure, pareto_front
from tangram_opt.sweeps.run import NO_PLAN_STATUSES, RayUnavailableError, require_ray, run_jobs, solve_job
from tangram_opt.sweeps.spec import (
    DEFAULT_TIME_LIMIT_S,
    SweepSpec,
    Variant,
    check_solve_settings,
    load_sweep,
    solve_key,
    sweep_from_dict,
)

if TYPE_CHECKING:
    import pandas as pd

#: the frame's columns: ``variant`` (index), ``label`` (its axis values), then one column per axis
#: (named by its key), then these
COLUMNS = ("cluster", "model", "gpus", "global_batch_size", "seq_len", "precision", "status", "tokens_per_s",
           "step_time_s", "mfu", "gpus_used", "gpu_mix", "gpus_idle", "idle_groups", "usd_per_hour",
           "usd_per_hour_cluster", "usd_per_step", "usd_per_1m_tokens", "gap", "tokens_per_s_bound", "solve_time_s", "solved_with",
           "message", "pareto", "plan")


def sweep(spec: str | Path | Mapping[str, Any] | SweepSpec, *, workers: int | None = None,
          ray_address: str | None = None, figure: str | Path | None = None, time_limit_s: float | None = None,
          backend: str | None = None, rel_gap: float | None = None, seed: int | None = None,
          threads: int | None = None, multi_pipeline: bool | None = None,
          on_result: Callable[[dict[str, Any]], None] | None = None) -> pd.DataFrame:
    """Solve every variant of a sweep and return one row per variant.

    - ``spec``: a sweep file (YAML/JSON), a dict of the same form, or a :class:`SweepSpec`;
    - ``workers``: local worker processes (default: this machine's cores, at most one per distinct
      solve; 1 solves in this process);
    - ``ray_address``: solve on Ray instead (``"local"`` starts a runtime here, ``"auto"`` joins a
      running one, ``"ray://host:10001"`` a remote cluster whose nodes have tangram_opt); needs the
      ``[ray]`` extra (:class:`RayUnavailableError` otherwise). ``workers`` does not apply: Ray
      schedules the tasks on the cluster's CPUs;
    - ``time_limit_s``, ``backend``, ``rel_gap``, ``seed``, ``threads``, ``multi_pipeline``: passed
      to :func:`tangram_opt.solve` for every variant, over the file's ``solve:`` settings (time
      limit default :data:`DEFAULT_TIME_LIMIT_S` per variant);
    - ``figure``: write the Pareto figure there (``.png``, ``.svg`` or ``.pdf``);
    - ``on_result``: called with each variant's row (a dict) as soon as its solve ends.

    Variants that differ only in prices share one solve (the planner maximizes throughput, which
    prices do not change; ``solved_with`` names the variant whose solve a row reuses). Raises
    :class:`SpecError` naming the field for a bad sweep, including a variant whose node group has
    no price (``node_groups[i].price_per_gpu_hour``); a variant that cannot be planned is a row
    with status ``infeasible``, ``no plan`` or ``error`` and its message.
    """
    import pandas as pd

    from tangram_opt.specs.pricing import GROUP_PRICE_FIELD, group_price

    spec = load_sweep(spec)
    settings = dict(spec.solve)
    for name, value in (("time_limit_s", time_limit_s), ("backend", backend), ("rel_gap", rel_gap), ("seed", seed),
                        ("threads", threads), ("multi_pipeline", multi_pipeline)):
        if value is not None:
            settings[name] = value
    check_solve_settings(settings, prefix="")
    settings.setdefault("time_limit_s", DEFAULT_TIME_LIMIT_S)
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise SpecError("workers", workers, "must be an integer >= 1", "e.g. workers=2 (this machine's cores)")
    if ray_address is not None and (not isinstance(ray_address, str) or not ray_address.strip()):
        raise SpecError("ray_address", ray_address, "must be a Ray address",
                        'use "local", "auto" or "ray://host:10001"')
    if ray_address is not None:
        require_ray()  # before any variant is built
    if figure is not None:
        from tangram_opt.sweeps.pareto import FIGURE_SUFFIXES

        if Path(figure).suffix.lower() not in FIGURE_SUFFIXES:
            raise SpecError("figure", str(figure), "has no picture suffix", "end the name with .png, .svg or .pdf")
    variants = spec.check()
    for v in variants:
        for g in v.cluster.node_groups if v.cluster is not None else ():
            try:
                group_price(v.cluster, g)
            except SpecError as e:  # named as the sweep names groups (its axes' form)
                raise SpecError(f"node_groups.{g.name}.{GROUP_PRICE_FIELD}", None, f"{e.problem} (variant {v.label})",
                                f"give node group {g.name!r} a {GROUP_PRICE_FIELD} in the cluster, or sweep it with "
                                f"the axis node_groups.{g.name}.{GROUP_PRICE_FIELD}", source=spec.source) from None
    # one job per distinct solve
    jobs: list[dict[str, Any]] = []
    job_of: dict[int, int] = {}
    first_of_job: list[int] = []
    keys: dict[str, int] = {}
    for v in variants:
        if v.cluster is None:
            continue
        key = solve_key(v, settings)
        if key not in keys:
            keys[key] = len(jobs)
            first_of_job.append(v.index)
            assert v.training is not None
            jobs.append({"cluster": v.cluster.to_dict(), "model": v.model.to_dict(), "training": v.training.to_dict(),
                         "solve": settings})
        job_of[v.index] = keys[key]
    n_workers = workers if workers is not None else max(1, min(os.cpu_count() or 1, len(jobs)))
    users: dict[int, list[Variant]] = {}
    for v in variants:
        if v.index in job_of:
            users.setdefault(job_of[v.index], []).append(v)
    rows: dict[int, dict[str, Any]] = {v.index: _row(v, None, None) for v in variants if v.cluster is None}

    def finished(j: int, outcome: dict[str, Any]) -> None:
        for v in users[j]:
            rows[v.index] = _row(v, outcome, first_of_job[j])
            if on_result is not None:
                on_result(rows[v.index])

    if on_result is not None:
        for r in rows.values():
            on_result(r)
    run_jobs(jobs, workers=n_workers, ray_address=ray_address, on_done=finished)
    df = pd.DataFrame([rows[v.index] for v in variants])
    df["pareto"] = pareto_front(df)
    df.attrs.update({"sweep": spec.name, "distinct_solves": len(jobs), "solve": dict(settings)})
    if figure is not None:
        pareto_figure(df, figure, title=f"{spec.name}: {len(df)} variants")
        df.attrs["figure"] = str(figure)
    return df


def _row(v: Variant, outcome: dict[str, Any] | None, solved_with: int | None) -> dict[str, Any]:
    """One variant's row of the frame (``outcome`` None: a skipped variant)."""
    from tangram_opt.costing import plan_cost
    from tangram_opt.planner.plan import Plan

    nan = float("nan")
    row: dict[str, Any] = {"variant": v.index, "label": v.label, **dict(v.settings)}
    c, t = v.cluster, v.training
    row.update({"cluster": c.name if c else "", "model": v.model.name, "gpus": c.num_gpus if c else 0,
                "global_batch_size": t.global_batch_size if t else nan, "seq_len": t.seq_len if t else nan,
                "precision": t.precision if t else "", "status": "skipped", "tokens_per_s": nan,
                "step_time_s": nan, "mfu": nan, "gpus_used": 0, "gpu_mix": "", "gpus_idle": c.num_gpus if c else 0,
                "idle_groups": "", "usd_per_hour": nan, "usd_per_hour_cluster": nan, "usd_per_step": nan,
                "usd_per_1m_tokens": nan, "gap": nan, "tokens_per_s_bound": nan, "solve_time_s": nan,
                "solved_with": solved_with if solved_with is not None else -1, "message": v.skipped,
                "pareto": False, "plan": None})
    if outcome is None:
        return row
    row.update({"status": outcome["status"], "message": outcome.get("message", ""), "solve_time_s": outcome["wall_s"]})
    if outcome.get("plan") is None or c is None:
        return row
    plan = Plan.from_dict(outcome["plan"])
    cost = plan_cost(plan, c, model=v.model, training=t)
    cert = plan.certificate
    bound = cert.bound_s if cert is not None else None
    row.update({"tokens_per_s": plan.tokens_per_s, "step_time_s": plan.step_time_s, "mfu": plan.mfu,
                "gpus_used": plan.gpus_used,
                "gpu_mix": " + ".join(f"{g.gpus_used} {g.gpu}" for g in cost.groups if g.gpus_used),
                "gpus_idle": cost.gpus_idle, "idle_groups": ",".join(cost.idle_groups),
                "usd_per_hour": cost.usd_per_hour, "usd_per_hour_cluster": cost.usd_per_hour_cluster,
                "usd_per_step": cost.usd_per_step, "usd_per_1m_tokens": cost.usd_per_1m_tokens,
                "gap": plan.gap if plan.gap is not None else nan,
                "tokens_per_s_bound": (plan.global_batch_size * plan.seq_len / bound) if bound else nan,
                "plan": plan})
    return row


__all__ = ["COLUMNS", "NO_PLAN_STATUSES", "RayUnavailableError", "SweepSpec", "Variant", "load_sweep",
           "pareto_figure", "pareto_front", "require_ray", "run_jobs", "solve_job", "sweep", "sweep_from_dict"]
