"""Benchmark the MIP planner against the three baselines on the scenario suite (benchmarks/scenarios/).

    python -m benchmarks.run [--quick] [--scenarios a,b] [--out benchmarks/results] [--backend cp-sat]

``--quick`` (CI, < 3 min on 2 cores) runs the scenarios marked ``quick: true`` with their short time limits
and writes to benchmarks/results/quick/ (nothing else is touched unless asked with --docs / --mps).

For every scenario: plan with the MIP (``solve``, warm-started with the greedy plan) and with the three
baselines (greedy, best homogeneous island, heterogeneity-unaware; docs/baselines.md), replay every plan
with the independent simulator (``tangram_opt.sim.simulate``), and write ``results.csv``, ``results.md``
and PNG plots to ``--out``. A full run over every scenario also regenerates docs/results/benchmark.md and
exports each scenario's MIP (best pipeline micro-batch) as an MPS instance into formulations/instances/.

Throughput is always the simulated one (tokens per second of the replayed step); the planner's predicted
(closed-form) step is reported next to it. Any scenario where the MIP's plan is below a baseline is
printed and written as a BUG line: the MIP is warm-started with the greedy plan, and its plan space
contains every single-island plan, so that must not happen.

This module runs the scenarios and holds the command; the suite and its result records are in
scenario_suite.py, the CSV / Markdown / plots in report.py, the MPS instances in mps_export.py.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any


from tangram_opt.baselines import best_homogeneous, greedy, heterogeneity_unaware
from tangram_opt.errors import TangramError
from tangram_opt.planner.context import PlanningContext
from tangram_opt.planner.plan import Plan
from tangram_opt.solvers import DEFAULT_BACKEND
from tangram_opt.specs import Cluster, load_model
from benchmarks.scenario_suite import (BASELINES, DEFAULT_OUT, DOCS_PAGE, INSTANCES_DIR, RTOL,
                                      SCENARIO_DIR, MethodResult, Scenario, ScenarioResult, load_scenarios)
from benchmarks.mps_export import export_mps
from benchmarks.report import _fmt_tps, _ratio, geomean, machine_info, make_plots, report, write_csv


def _simulator():
    try:
        from tangram_opt.sim import simulate
    except ImportError:
        return None
    return simulate


def _simulate(res: MethodResult, cluster: Cluster, ctx: PlanningContext) -> None:
    """Fill ``res.simulated_step_s`` (independent replay); on failure keep the prediction and say why."""
    simulate = _simulator()
    if res.plan is None:
        return
    if simulate is None:
        res.sim_note = "not simulated (tangram_opt.sim not importable)"
        return
    try:
        sim = simulate(res.plan, cluster, ctx.model, ctx.training, calibration=ctx.calibration,
                       moe_load_imbalance=ctx.moe_load_imbalance)
    except Exception as e:  # noqa: BLE001 - reported in the table, never hidden
        res.sim_note = f"not simulated ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
        return
    res.simulated_step_s = sim.step_time_s
    res.simulated = True
    if not sim.fits:
        res.sim_note = "simulator: a stage exceeds its memory"


def _timed(fn):
    t0 = time.perf_counter()
    try:
        return fn(), "", time.perf_counter() - t0
    except TangramError as e:
        return None, f"{type(e).__name__}: {str(e).splitlines()[0]}", time.perf_counter() - t0
    except Exception as e:  # noqa: BLE001 - a crash is a bug: reported in the table, the other methods still run
        tb = traceback.format_exc().strip().splitlines()
        where = next((ln.strip() for ln in reversed(tb) if ln.strip().startswith("File ")), "")
        return None, f"CRASH {type(e).__name__}: {e} ({where})", time.perf_counter() - t0


def run_scenario(sc: Scenario, *, quick: bool = False, backend: str = DEFAULT_BACKEND, threads: int = 1,
                 instances_dir: Path | None = None, plans_dir: Path | None = None, log=print) -> ScenarioResult:
    """Plan ``sc`` with the MIP and the three baselines, simulate every plan, check MIP >= baselines."""
    t_start = time.perf_counter()
    cluster = sc.load_cluster()
    model = load_model(sc.model)
    training = sc.training_spec()
    ctx = PlanningContext(cluster, model, training)
    # The candidate tables are shared by every method (solve accepts the provider): built once, timed apart.
    t0 = time.perf_counter()
    for b in ctx.pipeline_micro_batches():
        ctx.candidates(b)
    out = ScenarioResult(scenario=sc, cluster=cluster, num_islands=len(ctx.islands),
                         candidates_s=time.perf_counter() - t0)
    tl, itl = sc.time_limit_s(quick), sc.island_time_limit_s(quick)
    from tangram_opt.planner.search import solve

    def mip() -> Plan:
        return solve(cluster, model, training, time_limit_s=tl, backend=backend, threads=threads, provider=ctx.provider)

    def grd() -> Plan:
        g = greedy(ctx)
        if g is None:
            raise _NoPlan("greedy: no greedy pipeline fits")
        return g.plan

    homog_result: dict[str, Any] = {}

    def hom() -> Plan:
        h = best_homogeneous(ctx, solver=solve, time_limit_s=itl, backend=backend, threads=threads)
        homog_result["r"] = h
        return h.plan

    def una() -> Plan:
        return heterogeneity_unaware(ctx).plan

    for name, fn in (("mip", mip), ("greedy", grd), ("homogeneous", hom), ("unaware", una)):
        plan, err, wall = _timed(fn)
        res = MethodResult(method=name, plan=plan, error=err, wall_s=wall)
        _simulate(res, cluster, ctx)
        out.methods[name] = res
        if plans_dir is not None and plan is not None:
            plans_dir.mkdir(parents=True, exist_ok=True)
            plan.save(plans_dir / f"{sc.name}.{name}.json")
        log(f"  {name:<12} {_fmt_tps(res.tokens_per_s) if res.ok else err:>14} tok/s  "
            f"(predicted {_fmt_tps(plan.tokens_per_s) if plan else '-'}, {wall:.1f} s)"
            + (f"  [{res.sim_note}]" if res.sim_note else ""))
    # what each island achieves alone (the denominator of heterogeneity efficiency), simulated too
    h = homog_result.get("r")
    if h is not None:
        for isl, p in h.per_island.items():
            r = MethodResult(method=f"alone:{isl}", plan=p)
            _simulate(r, cluster, ctx)
            out.island_alone_tokens_per_s[isl] = r.tokens_per_s if r.ok else 0.0
    _check(out)
    if instances_dir is not None and out.methods["mip"].ok:
        try:
            out.mps = export_mps(sc, cluster, ctx, out.methods["mip"].plan, instances_dir,  # type: ignore[arg-type]
                                 backend=backend, threads=threads, verify_s=min(5.0, tl))
        except Exception as e:  # noqa: BLE001 - an export problem must not lose the benchmark
            out.mps = {"error": f"{type(e).__name__}: {e}"}
            log(f"  MPS export failed: {out.mps['error']}")
    out.wall_s = time.perf_counter() - t_start
    return out


class _NoPlan(TangramError):
    pass


def _check(out: ScenarioResult) -> None:
    """Record every baseline that beats the MIP, in simulated and in predicted throughput."""
    mip = out.methods.get("mip")
    name = out.scenario.name
    if mip is None or not mip.ok:
        out.violations.append(("-", f"{name}: the MIP returned no plan ({mip.error if mip else 'not run'})"))
        return
    for b in BASELINES:
        r = out.methods.get(b)
        if r is None or not r.ok:
            continue
        if mip.tokens_per_s < r.tokens_per_s * (1 - RTOL):
            both_sim = mip.simulated and r.simulated
            why = ""
            if both_sim and mip.plan.tokens_per_s >= r.plan.tokens_per_s * (1 - RTOL):  # type: ignore[union-attr]
                why = (f"; the closed form ranks the MIP first ({mip.plan.tokens_per_s:,.0f} vs "  # type: ignore
                       f"{r.plan.tokens_per_s:,.0f} tok/s predicted) but the simulator finds the MIP plan "  # type: ignore
                       f"{100 * (mip.step_s / mip.plan.step_time_s - 1):+.1f}% slower than predicted and the "  # type: ignore
                       f"{b} plan {100 * (r.step_s / r.plan.step_time_s - 1):+.1f}%: closed form vs simulator "  # type: ignore
                       "mismatch")
            out.violations.append((b, (f"{name}: MIP {mip.tokens_per_s:,.0f} tok/s < {b} {r.tokens_per_s:,.0f} tok/s "
                                      f"({'simulated' if both_sim else 'predicted'}; ratio "
                                      f"{mip.tokens_per_s / r.tokens_per_s:.4f}){why}")))
        if mip.plan.tokens_per_s < r.plan.tokens_per_s * (1 - RTOL):  # type: ignore[union-attr]
            out.violations.append((b, (f"{name}: MIP predicted {mip.plan.tokens_per_s:,.0f} tok/s < {b} predicted "
                                      f"{r.plan.tokens_per_s:,.0f} tok/s (cost model; the MIP's plan space "  # type: ignore
                                      "contains this plan)")))



# --- command -------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="only scenarios marked quick, with their quick time limits")
    ap.add_argument("--scenarios", default="", help="comma-separated scenario names (default: all)")
    ap.add_argument("--out", default=None, help="directory for results.csv, results.md, plots and plans "
                                                "(default benchmarks/results, benchmarks/results/quick with --quick)")
    ap.add_argument("--backend", default=DEFAULT_BACKEND, help=f"MIP backend (default {DEFAULT_BACKEND})")
    ap.add_argument("--threads", type=int, default=min(os.cpu_count() or 1, 8), help="solver threads")
    ap.add_argument("--scenario-dir", default=str(SCENARIO_DIR), help=argparse.SUPPRESS)
    ap.add_argument("--docs", dest="docs", action="store_true", default=None,
                    help="regenerate docs/results/benchmark.md (default: on full runs of every scenario)")
    ap.add_argument("--no-docs", dest="docs", action="store_false")
    ap.add_argument("--mps", dest="mps", action="store_true", default=None,
                    help="export MPS instances to formulations/instances/ (default: on full runs)")
    ap.add_argument("--no-mps", dest="mps", action="store_false")
    ap.add_argument("--instances", default=str(INSTANCES_DIR), help=argparse.SUPPRESS)
    ap.add_argument("--no-plots", action="store_true")
    args = ap.parse_args(argv)

    names = [s for s in args.scenarios.split(",") if s]
    scenarios = load_scenarios(names or None, quick=args.quick, directory=Path(args.scenario_dir))
    complete = not names and not args.quick
    docs = complete if args.docs is None else args.docs
    mps = (not args.quick) if args.mps is None else args.mps
    out_dir = Path(args.out) if args.out else (DEFAULT_OUT / "quick" if args.quick else DEFAULT_OUT)
    out_dir.mkdir(parents=True, exist_ok=True)
    machine = machine_info()
    print(f"{len(scenarios)} scenario(s), backend {args.backend}, {args.threads} thread(s); "
          f"{machine['cpu']}, {machine['cores']} cores", flush=True)
    t0 = time.perf_counter()
    results: list[ScenarioResult] = []
    for sc in scenarios:
        print(f"[{time.perf_counter() - t0:6.0f} s] {sc.name}: {sc.description}", flush=True)
        try:
            r = run_scenario(sc, quick=args.quick, backend=args.backend, threads=args.threads,
                             instances_dir=Path(args.instances) if mps else None, plans_dir=out_dir / "plans",
                             log=lambda s: print(s, flush=True))
        except Exception:  # noqa: BLE001 - one broken scenario must not lose the others
            print(f"  scenario failed:\n{traceback.format_exc()}", flush=True)
            continue
        results.append(r)
        for _, v in r.violations:
            print(f"  !!! BUG: {v}", flush=True)
        print(f"  MIP/greedy {_ratio(r.ratio('greedy'))}, MIP/homogeneous {_ratio(r.ratio('homogeneous'))}, "
              f"MIP/unaware {_ratio(r.ratio('unaware'))} ({r.wall_s:.0f} s)", flush=True)
    total = time.perf_counter() - t0
    write_csv(results, out_dir / "results.csv")
    plots = [] if args.no_plots else make_plots(results, out_dir)
    kw = {"quick": args.quick, "backend": args.backend, "threads": args.threads, "total_s": total, "plots": plots}
    (out_dir / "results.md").write_text(report(results, machine, **kw) + "\n", encoding="utf-8")  # type: ignore
    if docs:
        DOCS_PAGE.parent.mkdir(parents=True, exist_ok=True)
        rel = os.path.relpath(out_dir.resolve(), DOCS_PAGE.parent.resolve()) + "/"
        DOCS_PAGE.write_text(report(results, machine, plot_prefix=rel, **kw) + "\n", encoding="utf-8")  # type: ignore
    violations = [v for r in results for _, v in r.violations]
    het = [r for r in results if r.heterogeneous]
    gm = geomean([r.ratio("greedy") for r in het])  # type: ignore[misc]
    print(f"\ndone in {total / 60:.1f} min; geometric mean MIP/greedy over {len(het)} heterogeneous scenarios: "
          f"{_ratio(gm)}; results in {out_dir}" + (f"; docs page {DOCS_PAGE}" if docs else ""))
    if violations:
        print(f"!!! {len(violations)} case(s) where the MIP is below a baseline:", file=sys.stderr)
        for v in violations:
            print(f"!!!   {v}", file=sys.stderr)
    return 1 if len(results) < len(scenarios) else 0


if __name__ == "__main__":
    raise SystemExit(main())
