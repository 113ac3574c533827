"""What a token costs (issue 30): cost-optimal plans against two ways of planning without the MIP's
dollar objective, in USD per 1M tokens, on every heterogeneous scenario of the suite.

    python -m benchmarks.cost                      # every heterogeneous scenario, full time limits
    python -m benchmarks.cost --quick              # the quick scenarios, quick limits
    python -m benchmarks.cost --only tiny-mixed-opt-350m --floors 0.5
    python -m benchmarks.cost --limit 20           # each solve capped at 20 s

For each scenario and each throughput floor F (a share of the all-GPU plan's tokens/s, ``--floors``):

- **all GPUs**: the throughput-optimal plan on the whole cluster (``solve``), priced for the GPUs it
  uses. It meets every floor up to its own throughput.
- **cheapest first**: the baseline of tangram_opt/baselines/cheapest.py: nodes rented cheapest USD
  per peak FLOP/s first until the greedy plan on them meets F.
- **cost-optimal**: ``solve(objective="cost_per_token", min_tokens_per_s=F)``, with its certificate.

All three are priced with :func:`tangram_opt.costing.plan_cost` (the GPUs a plan uses, at the
cluster file's or the default on-demand prices; no scenario prices egress). The page checks that
the cost-optimal plan costs no more per token than either baseline at the same floor. Scenarios
with a GPU type that has no price (no default and none in the cluster file) are listed, not priced.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import tangram_opt as to
from benchmarks.report import machine_info
from benchmarks.scenario_suite import Scenario, load_scenarios
from tangram_opt.baselines import cheapest_first
from tangram_opt.costing import plan_cost
from tangram_opt.errors import InfeasibleError, SpecError, TangramError
from tangram_opt.planner.context import PlanningContext
from tangram_opt.planner.islands import find_islands
from tangram_opt.specs.pricing import group_price

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "results" / "cost.md"
#: the rows of the last run (``--page-only`` re-renders the page from them)
ROWS = ROOT / "benchmarks" / "results" / "cost.json"
#: relative tolerance of "cost-optimal <= baseline" (two evaluations of one plan's figures)
RTOL = 1e-9


def _priced(plan: to.Plan, cluster: to.Cluster) -> dict[str, Any]:
    c = plan_cost(plan, cluster)
    return {"tokens_per_s": plan.tokens_per_s, "usd_per_hour": c.usd_per_hour,
            "usd_per_1m_tokens": c.usd_per_1m_tokens, "gpus": c.gpus_used, "idle": ", ".join(c.idle_groups) or "-",
            "step_s": plan.step_time_s}


def unpriced_reason(sc: Scenario) -> str | None:
    """Why a scenario cannot be priced (a group without a price), or None."""
    cluster = sc.load_cluster()
    for g in cluster.node_groups:
        try:
            group_price(cluster, g)
        except SpecError as e:
            return str(e).splitlines()[0]
    return None


def run_scenario(sc: Scenario, floors: list[float], *, quick: bool, threads: int, cap_s: float | None) -> dict:
    cluster, training = sc.load_cluster(), sc.training_spec()
    limit = sc.time_limit_s(quick) if cap_s is None else min(cap_s, sc.time_limit_s(quick))
    t0 = time.perf_counter()
    fast = to.solve(cluster, sc.model, training, time_limit_s=limit, threads=threads)
    row: dict[str, Any] = {"scenario": sc.name, "gpus": cluster.num_gpus, "limit_s": limit,
                           "all": {**_priced(fast, cluster), "wall_s": time.perf_counter() - t0,
                                   "gap": fast.certificate.gap if fast.certificate else None}, "floors": []}
    a = row["all"]
    print(f"{sc.name}: all GPUs {a['tokens_per_s']:,.0f} tok/s, ${a['usd_per_hour']:,.2f}/h, "
          f"${a['usd_per_1m_tokens']:.4f}/1M ({a['wall_s']:.0f} s)", flush=True)
    ctx = PlanningContext(cluster, to.load_model(sc.model), training)
    for share in floors:
        floor = share * fast.tokens_per_s
        f: dict[str, Any] = {"share": share, "floor": floor}
        t0 = time.perf_counter()
        try:
            base = cheapest_first(ctx, min_tokens_per_s=floor)
            f["cheapest"] = {**_priced(base.plan, cluster), "wall_s": time.perf_counter() - t0,
                             "nodes": base.nodes}
        except InfeasibleError as e:  # the greedy plan on every node stays below the floor
            f["cheapest"] = {"error": "cannot reach the floor: the greedy plan on all nodes makes "
                                      f"{e.closest.get('tokens_per_s', 0):,.0f} tok/s"}
        except TangramError as e:
            f["cheapest"] = {"error": str(e).splitlines()[0]}
        t0 = time.perf_counter()
        try:
            opt = to.solve(cluster, sc.model, training, time_limit_s=limit, threads=threads,
                           objective="cost_per_token", min_tokens_per_s=floor, start=fast)
            cert = opt.certificate
            f["optimal"] = {**_priced(opt, cluster), "wall_s": time.perf_counter() - t0,
                            "gap": cert.gap if cert else None, "status": cert.status.value if cert else "-"}
        except TangramError as e:
            f["optimal"] = {"error": str(e).splitlines()[0]}
        o, c = f["optimal"], f["cheapest"]
        print(f"  floor {share:.0%} ({floor:,.0f} tok/s): cheapest-first "
              + (f"${c['usd_per_1m_tokens']:.4f}/1M" if "error" not in c else c["error"][:80])
              + ", cost-optimal "
              + (f"${o['usd_per_1m_tokens']:.4f}/1M ({o['tokens_per_s']:,.0f} tok/s, gap {_pct(o['gap'])}, "
                 f"{o['wall_s']:.0f} s)" if "error" not in o else o["error"][:80]),
              flush=True)
        row["floors"].append(f)
    return row


def run(quick: bool, only: list[str] | None, floors: list[float], threads: int,
        cap_s: float | None) -> tuple[list[dict], list[tuple[str, str]]]:
    rows, skipped = [], []
    for sc in load_scenarios(only, quick=quick) if only else load_scenarios(quick=quick):
        if len(find_islands(sc.load_cluster())) < 2:
            skipped.append((sc.name, "one island: no choice of GPU type"))
            continue
        why = unpriced_reason(sc)
        if why:
            skipped.append((sc.name, why))
            continue
        rows.append(run_scenario(sc, floors, quick=quick, threads=threads, cap_s=cap_s))
    return rows, skipped


def cheaper_or_equal(rows: list[dict]) -> list[str]:
    """Floors where the cost-optimal plan costs more per token than a baseline that meets the floor."""
    bad = []
    for r in rows:
        for f in r["floors"]:
            o = f["optimal"]
            if "error" in o:
                bad.append(f"{r['scenario']} at {f['share']:.0%}: no cost-optimal plan ({o['error'][:80]})")
                continue
            rivals = [("all GPUs", r["all"])] if r["all"]["tokens_per_s"] >= f["floor"] * (1 - RTOL) else []
            rivals += [("cheapest first", f["cheapest"])] if "error" not in f["cheapest"] else []
            for name, x in rivals:
                if o["usd_per_1m_tokens"] > x["usd_per_1m_tokens"] * (1 + RTOL):
                    bad.append(f"{r['scenario']} at {f['share']:.0%}: cost-optimal ${o['usd_per_1m_tokens']:.4f} > "
                               f"{name} ${x['usd_per_1m_tokens']:.4f} per 1M tokens")
    return bad


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.2f}%"


def _money(x: dict) -> str:
    return "-" if "error" in x else f"${x['usd_per_1m_tokens']:.4f}"


def page(rows: list[dict], skipped: list[tuple[str, str]], *, quick: bool, floors: list[float], threads: int,
         cap_s: float | None, machine: dict[str, str] | None = None) -> str:
    m = machine or machine_info()
    cmd = ("python -m benchmarks.cost" + (" --quick" if quick else "")
           + (f" --floors {','.join(f'{s:g}' for s in floors)}" if floors != DEFAULT_FLOORS else "")
           + (f" --limit {cap_s:g}" if cap_s else ""))
    limits = f"the scenario's time limit capped at {cap_s:g} s" if cap_s else "the scenario's time limit"
    out = ["# What a token costs: cost-optimal plans against two baselines", "",
           f"Generated by `{cmd}` on {m.get('date', '-')}: {m.get('cpu', '-')}, {m.get('cores', '-')} cores, "
           f"{m.get('ram', '-')}; tangram_opt {to.__version__} (commit {m.get('commit', '-')}); backend highs, "
           f"{threads} thread(s), each solve with {limits}. One run; wall times are indicative.", "",
           "Every heterogeneous scenario of the suite, at throughput floors F given as a share of the all-GPU "
           "plan's tokens/s. Prices: the default on-demand table (tangram_opt/data/gpu_prices.yaml, sourced in "
           "docs/results/cloud_facts.md), charged for the GPUs a plan uses (idle nodes are released). "
           "**all GPUs**: the throughput-optimal plan on the whole cluster (`solve`); it meets every floor up "
           "to 100%. **cheapest first**: rent nodes cheapest USD per peak TFLOP/s first until the greedy plan "
           "on them meets F (tangram_opt/baselines/cheapest.py). **cost-optimal**: `solve(objective="
           "\"cost_per_token\", min_tokens_per_s=F)`; its gap is its certificate's, in USD per token over "
           "single-pipeline plans (formulations/pipeline_mip.md §4b). All figures are USD per 1M tokens.", "",
           "| scenario | GPUs | all GPUs: tok/s, $/h, $/1M | floor F | cheapest first: tok/s, GPUs, $/1M | "
           "cost-optimal: tok/s, GPUs, $/1M (gap) | saving vs all GPUs | saving vs cheapest first |",
           "|---|---:|---|---|---|---|---:|---:|"]
    for r in rows:
        a = r["all"]
        for i, f in enumerate(r["floors"]):
            c, o = f["cheapest"], f["optimal"]
            head = [r["scenario"], str(r["gpus"]),
                    f"{a['tokens_per_s']:,.0f}, ${a['usd_per_hour']:,.0f}, {_money(a)}"] if i == 0 else ["", "", ""]
            cc = (f"{c['tokens_per_s']:,.0f}, {c['gpus']}, {_money(c)}" if "error" not in c
                  else c["error"].replace("|", "/")[:160])
            oc = (f"{o['tokens_per_s']:,.0f}, {o['gpus']}, **{_money(o)}** ({_pct(o['gap'])})" if "error" not in o
                  else "no plan: " + o["error"].replace("|", "/")[:160])
            save_a = (f"{100 * (1 - o['usd_per_1m_tokens'] / a['usd_per_1m_tokens']):.1f}%" if "error" not in o
                      else "-")
            save_c = (f"{100 * (1 - o['usd_per_1m_tokens'] / c['usd_per_1m_tokens']):.1f}%"
                      if "error" not in o and "error" not in c else "-")
            out.append("| " + " | ".join(head + [f"{f['share']:.0%} ({f['floor']:,.0f} tok/s)", cc, oc, save_a,
                                                 save_c]) + " |")
    bad = cheaper_or_equal(rows)
    n = sum(len(r["floors"]) for r in rows)
    out += ["", ("**Check:** at every floor of every scenario above, the cost-optimal plan costs no more per token "
                 f"than the all-GPU plan and the cheapest-first plan ({n} of {n} floors)." if not bad else
                 "**Check failed** at: " + "; ".join(bad))]
    ties = sum(1 for r in rows for f in r["floors"] if "error" not in f["cheapest"] and "error" not in f["optimal"]
               and abs(f["optimal"]["usd_per_1m_tokens"] / f["cheapest"]["usd_per_1m_tokens"] - 1) < 1e-6)
    unreached = sum(1 for r in rows for f in r["floors"] if "error" in f["cheapest"])
    out += ["", "How to read it. Where the cheapest-first baseline and the cost-optimal plan cost the same "
            f"({ties} floors), the cheapest GPU type alone meets the floor and both rent it; the cost-optimal "
            "plan then says how close that is to the best plan (its gap). Where the floor needs a dearer GPU "
            "type too, the baseline rents nodes in price order and plans them greedily; the cost-optimal plan "
            "chooses how many of each type and how to use them. The baseline cannot reach "
            f"{unreached} floors at all (its greedy plan on every node is slower than the floor). At 90% the "
            "cost-optimal plan is often the all-GPU plan itself: it is passed as `start`, and nothing cheaper "
            "was found. Gaps grow with the floor: the bound prices the GPUs a floor needs as a fluid "
            "(formulations/pipeline_mip.md §4b, the capacity LP), not as whole stages."]
    out += ["", "Plans (GPUs used of the cluster's, idle node groups, wall time of each solve):", ""]
    for r in rows:
        a = r["all"]
        out.append(f"- {r['scenario']}: all GPUs {a['gpus']} of {r['gpus']} GPUs, idle: {a['idle']}, "
                   f"gap {_pct(a['gap'])}, {a['wall_s']:.0f} s")
        for f in r["floors"]:
            c, o = f["cheapest"], f["optimal"]
            if "error" not in c:
                nodes = ", ".join(f"{g} x{k}" for g, k in c["nodes"].items())
                out.append(f"  - {f['share']:.0%}: cheapest first rents {nodes}; {c['gpus']} GPUs used, "
                           f"{c['wall_s']:.1f} s")
            if "error" not in o:
                out.append(f"  - {f['share']:.0%}: cost-optimal {o['gpus']} GPUs, idle: {o['idle']}, "
                           f"{o['status']}, {o['wall_s']:.0f} s")
    if skipped:
        out += ["", "Not priced:", ""] + [f"- {name}: {why}" for name, why in skipped]
    return "\n".join(out) + "\n"


DEFAULT_FLOORS = [0.5, 0.75, 0.9]


def _floors(text: str) -> list[float]:
    try:
        xs = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--floors {text!r}: give shares such as 0.5,0.9") from None
    if not xs or any(not 0 < x <= 1 for x in xs):
        raise argparse.ArgumentTypeError(f"--floors {text!r}: each share must lie in (0, 1], e.g. 0.5,0.9")
    return xs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the quick scenarios and their quick time limits")
    ap.add_argument("--only", nargs="*", help="scenario names")
    ap.add_argument("--floors", type=_floors, default=DEFAULT_FLOORS, metavar="S,S",
                    help="throughput floors as shares of the all-GPU plan's tokens/s (default 0.5,0.75,0.9)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--limit", type=float, default=None, metavar="S", help="cap every solve's time limit at S s")
    ap.add_argument("--no-page", action="store_true", help=f"do not write {PAGE.relative_to(ROOT)}")
    ap.add_argument("--page-only", action="store_true",
                    help=f"re-render the page from the last run's rows ({ROWS.relative_to(ROOT)}) without solving")
    args = ap.parse_args(argv)
    if args.limit is not None and not args.limit > 0:
        ap.error("--limit must be a positive number of seconds")
    if args.page_only:
        saved = json.loads(ROWS.read_text(encoding="utf-8"))
        rows, skipped, args.quick, args.floors, args.threads, args.limit, machine = (
            saved["rows"], [tuple(x) for x in saved["skipped"]], saved["quick"], saved["floors"], saved["threads"],
            saved["limit"], saved.get("machine"))
    else:
        rows, skipped = run(args.quick, args.only, args.floors, args.threads, args.limit)
        machine = machine_info()  # the run's machine, date and commit, kept for --page-only
        ROWS.parent.mkdir(parents=True, exist_ok=True)
        ROWS.write_text(json.dumps({"rows": rows, "skipped": skipped, "quick": args.quick, "floors": args.floors,
                                    "threads": args.threads, "limit": args.limit, "machine": machine}, indent=1),
                        encoding="utf-8")
    if not args.no_page:
        PAGE.write_text(page(rows, skipped, quick=args.quick, floors=args.floors, threads=args.threads,
                             cap_s=args.limit, machine=machine), encoding="utf-8")
        print(f"wrote {PAGE}")
    bad = cheaper_or_equal(rows)
    for b in bad:
        print("CHECK FAILED:", b)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
