"""The benchmark's MPS instances: each scenario's aggregated MIP exported to formulations/instances/."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import yaml

from tangram_opt.baselines import greedy_by_micro_batch
from tangram_opt.baselines.homogeneous import plan_layout
from tangram_opt.planner.context import PlanningContext
from tangram_opt.planner.plan import Plan
from tangram_opt.solvers import DEFAULT_BACKEND
from tangram_opt.specs import Cluster
from benchmarks.scenario_suite import (Scenario)


def export_mps(sc: Scenario, cluster: Cluster, ctx: PlanningContext, plan: Plan, directory: Path, *,
               backend: str = DEFAULT_BACKEND, threads: int = 1, verify_s: float = 5.0) -> dict[str, Any]:
    """Write the aggregated MIP of ``plan``'s pipeline micro-batch as ``<scenario>.mps.gz`` (no incumbent
    cutoff, so the instance is the whole sub-problem), with the scenario and its cluster next to it.

    The instance is then solved for ``verify_s`` seconds with ``backend``, hinted with ``plan``: the best
    objective found is the "best known" of the instance (in ticks; times ``tick_s`` in seconds). The
    aggregated model prices p2p and the step tail optimistically, so it can be below the plan's exact step.
    """
    import gzip

    from tangram_opt.planner.formulations.aggregated import AggregatedMIP
    from tangram_opt.planner.formulations.bounds import fluid_bottleneck_s
    from tangram_opt.planner.formulations.problem import FormulationOptions, StageChoice
    from tangram_opt.planner.formulations.ticks import tick_for
    from tangram_opt.solvers import SolveOptions, solve_model

    directory.mkdir(parents=True, exist_ok=True)
    b = plan.pipelines[0].pipeline_micro_batch
    problem = ctx.problem(b)
    tick = tick_for(plan.step_time_s)
    mip = AggregatedMIP(problem, FormulationOptions(fluid_cuts=True, cutoff_s=None, tick_s=tick))
    mip.lower_tmax_s = fluid_bottleneck_s(problem)
    mip.build()
    info: dict[str, Any] = {"scenario": sc.name, "pipeline_micro_batch": b, "micro_batches": problem.num_micro_batches,
                            "tick_s": tick, "plan_step_s": plan.step_time_s,
                            "bound_s": plan.certificate.bound_s if plan.certificate else None,
                            "cert_status": plan.certificate.status if plan.certificate else None}
    if mip.empty or problem.max_stages < 2 or not mip.model.vars:
        info["note"] = "no multi-stage pipeline fits: nothing to export"
        return info
    name = f"{sc.name}.mps.gz"
    tmp = directory / f"{sc.name}.mps"
    mip.model.write_mps(str(tmp))
    # Integer markers need the quoted form (`MARKER 'MARKER' 'INTORG'`): HiGHS and SCIP ignore an unquoted
    # marker line and would read the general-integer columns as continuous.
    text = tmp.read_text(encoding="ascii")
    text = text.replace(" MARKER MARKER INTORG", " MARKER 'MARKER' 'INTORG'")
    text = text.replace(" MARKER MARKER INTEND", " MARKER 'MARKER' 'INTEND'")
    with gzip.GzipFile(directory / name, "wb", mtime=0) as dst:
        dst.write(text.encode("ascii"))
    tmp.unlink()
    st = mip.model.stats()
    info.update({"file": name, "rows": st.rows, "columns": st.columns, "integers": st.integer_columns,
                 "binaries": st.binary_columns, "nonzeros": st.nonzeros})
    # encode the MIP's plan in the model (a hint; the greedy pipeline at b when the plan is not in this
    # single-pipeline space), then solve the instance briefly from it
    choices: list[StageChoice] = []
    if len(plan.pipelines) == 1:
        layout, _ = plan_layout(ctx, plan)
        index = {(c.island, c.config): i for i, c in enumerate(problem.candidates)}
        for s in layout:
            ci = index.get((s.island.index, s.config))
            if ci is None:
                choices = []
                break
            choices.append(StageChoice(candidate=ci, layers=dict(s.layers)))
    hint = mip.hint_from(choices) if choices else None
    source = "MIP plan"
    if hint is None:
        why = (f"the MIP plan runs {len(plan.pipelines)} pipelines" if len(plan.pipelines) > 1 else
               "the MIP plan is not in this instance's space (one stage, or dense layers off the first stage)")
        seeds = greedy_by_micro_batch(ctx)
        hint = mip.hint_from(seeds[b][1]) if b in seeds else None
        source = "greedy plan"
        info["note"] = why + ("; best known from the greedy pipeline at this b" if hint is not None else "")
    best: float | None = None
    if hint is not None:
        x = [0.0] * len(mip.model.vars)
        for v, val in hint.items():
            x[v.index] = val
        bad = mip.model.check(x)
        if bad:
            info["note"] = f"the {source}'s encoding violates {len(bad)} constraint(s), e.g. {bad[0]}"
        else:
            best = mip.model.objective.value(x)
            info["encoded_ticks"] = best
            info["encoded_from"] = source
        mip.model.set_hint(hint)
    res = solve_model(mip.model, backend, SolveOptions(time_limit_s=verify_s, threads=threads, rel_gap=1e-6))
    if res.objective is not None and (best is None or res.objective < best):
        best = res.objective
    info.update({"verify_backend": backend, "verify_s": verify_s, "verify_status": res.status.value,
                 "verify_objective_ticks": res.objective, "best_known_ticks": best,
                 "bound_ticks": res.bound if res.bound and res.objective is not None else None,
                 "best_known_s": None if best is None else best * tick})
    shutil.copyfile(sc.path, directory / f"{sc.name}.yaml")
    (directory / f"{sc.name}.cluster.yaml").write_text(
        f"# cluster of scenario {sc.name} (from {sc.cluster_ref})\n"
        + yaml.safe_dump(cluster.to_dict(), sort_keys=False), encoding="utf-8")
    _update_instances_index(directory, info)
    return info


def _update_instances_index(directory: Path, info: dict[str, Any]) -> None:
    idx_path = directory / "index.json"
    index = json.loads(idx_path.read_text(encoding="utf-8")) if idx_path.is_file() else {}
    index[info["scenario"]] = info
    idx_path.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    lines = ["# MIP instances of the benchmark scenarios", "",
             "Generated by `python -m benchmarks.run` (full run); do not edit by hand.", "",
             ("Each `<scenario>.mps.gz` (gzip-compressed free MPS, minimization; HiGHS, SCIP, CBC and Gurobi read it "
             "as is) is the aggregated pipeline MIP (tangram_opt/planner/formulations/aggregated.py, "
             "formulations/pipeline_mip.md) of the pipeline micro-batch size `b` of the scenario's MIP plan (its first pipeline) "
             "(`m` micro-batches), built without an incumbent cutoff. `<scenario>.yaml` is the scenario and "
             "`<scenario>.cluster.yaml` its cluster. All coefficients are integers: times in ticks of `tick` "
             "seconds, memory in MiB."), "",
             ("\"Best known\" is the better of the MIP plan encoded in the instance (a feasible point, checked "
             "against every constraint; the greedy pipeline at that `b` when the MIP plan is not a single "
             "multi-stage pipeline) and what a short solve of the instance itself found, hinted with that "
             "point (backend, time and status in the last column; \"bound\" is that solve's dual bound). The "
             "aggregated "
             "model prices p2p traffic and the step tail optimistically, so its optimum is a lower bound of the "
             "exact step of the plan it encodes; \"plan step\" is the exact (closed-form) step of the "
             "benchmark's MIP plan and \"certified bound\" the planner's lower bound over the whole plan space "
             "(every `b`)."), "",
             ("| instance | b | m | rows | columns | integer | binary | nonzeros | tick (s) | best known (ticks) "
             "| bound (ticks) | best known (s) | plan step (s) | certified bound (s) | verified with |"),
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for name in sorted(index):
        r = index[name]
        if "file" not in r:
            continue
        bk, bt, bks, bnd = (r.get("best_known_ticks"), r.get("bound_ticks"), r.get("best_known_s"), r.get("bound_s"))
        lines.append(f"| `{r['file']}` | {r['pipeline_micro_batch']} | {r['micro_batches']} | {r['rows']} | "
                     f"{r['columns']} | {r['integers']} | {r['binaries']} | {r['nonzeros']} | {r['tick_s']:g} | "
                     f"{'-' if bk is None else f'{bk:.0f}'} | {'-' if bt is None else f'{bt:.0f}'} | "
                     f"{'-' if bks is None else f'{bks:.6f}'} | {r['plan_step_s']:.6f} | "
                     f"{'-' if bnd is None else f'{bnd:.6f}'} | "
                     f"{r.get('verify_backend', '-')} {r.get('verify_s', 0):g} s: {r.get('verify_status', '-')} |")
    notes = [f"- {n}: {index[n]['note']}" for n in sorted(index) if index[n].get("note")]
    if notes:
        lines += ["", "Notes:", *notes]
    (directory / "README.md").write_text("\n".join(lines) + "\n", encoding="utf-8")


__all__ = ["export_mps"]
