"""The benchmark's outputs: results.csv, results.md / docs/results/benchmark.md, plots, machine facts."""

from __future__ import annotations

import csv
import math
import os
import platform
import subprocess
from collections.abc import Sequence
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any


from tangram_opt.planner.plan import Plan
from benchmarks.scenario_suite import (BASELINES, METHODS, ROOT, TARGET_RATIO, ScenarioResult)


def _fmt_tps(x: float) -> str:
    return f"{x:,.0f}"


def _version(pkg: str) -> str:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return "-"


def machine_info() -> dict[str, str]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    ram = "-"
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                ram = f"{int(line.split()[1]) / 2**20:.1f} GiB"
                break
    except OSError:
        pass
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                timeout=5, check=False).stdout.strip() or "-"
    except (OSError, subprocess.SubprocessError):
        commit = "-"
    return {"cpu": cpu, "cores": str(os.cpu_count()), "ram": ram, "os": f"{platform.system()} {platform.release()}",
            "python": platform.python_version(), "ortools": _version("ortools"), "highspy": _version("highspy"),
            "tangram_opt": _version("tangram_opt"), "commit": commit,
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}


def csv_rows(results: Sequence[ScenarioResult]) -> list[dict[str, Any]]:
    rows = []
    for r in results:
        sc = r.scenario
        for m in METHODS:
            mr = r.methods.get(m)
            if mr is None:
                continue
            p = mr.plan
            cert = p.certificate if p else None
            row: dict[str, Any] = {
                "scenario": sc.name, "cluster": r.cluster.name, "model": sc.model, "gpus": r.cluster.num_gpus,
                "islands": r.num_islands, "heterogeneous": r.heterogeneous, "method": m,
                "status": "ok" if p else "no plan", "error": mr.error,
                "simulated": mr.simulated, "sim_note": mr.sim_note,
                "predicted_step_s": p.step_time_s if p else "", "simulated_step_s": mr.simulated_step_s or "",
                "sim_vs_predicted": (mr.simulated_step_s / p.step_time_s - 1) if p and mr.simulated_step_s else "",
                "tokens_per_s": mr.tokens_per_s if p else "", "predicted_tokens_per_s": p.tokens_per_s if p else "",
                "mip_over_this": (r.methods["mip"].tokens_per_s / mr.tokens_per_s)
                if p and r.methods.get("mip") and r.methods["mip"].ok else "",
                "cluster_mfu": (p.model_flops_per_step / mr.step_s / p.cluster_peak_flops_per_s) if p else "",
                "used_mfu": (p.model_flops_per_step / mr.step_s / p.used_peak_flops_per_s) if p else "",
                "het_efficiency": r.het_efficiency(m) if r.heterogeneous and p else "",
                "gpus_used": p.gpus_used if p else "", "pipelines": len(p.pipelines) if p else "",
                "stages": "+".join(str(q.num_stages) for q in p.pipelines) if p else "",
                "pipeline_micro_batch": "+".join(str(q.pipeline_micro_batch) for q in p.pipelines) if p else "",
                "micro_batches": "+".join(str(q.num_micro_batches) for q in p.pipelines) if p else "",
                "wall_s": mr.wall_s, "candidates_s": r.candidates_s if m == "mip" else "",
                "cert_status": cert.status if cert else "", "gap": cert.gap if cert and cert.gap is not None else "",
                "bound_s": cert.bound_s if cert and cert.bound_s is not None else "",
                "mip_below_this": any(b == m for b, _ in r.violations) if m != "mip" else "",
            }
            rows.append(row)
    return rows


def write_csv(results: Sequence[ScenarioResult], path: Path) -> None:
    rows = csv_rows(results)
    if not rows:
        return
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        for row in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()})


def geomean(xs: Sequence[float]) -> float | None:
    xs = [x for x in xs if x is not None and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def summary_table(results: Sequence[ScenarioResult]) -> list[str]:
    head = ("| scenario | GPUs (islands) | model | MIP tok/s | greedy | best homog. | unaware | MIP/greedy "
            "| MIP/homog. | MIP/unaware | MFU MIP | MFU greedy | het. eff. MIP | het. eff. greedy | MIP solve (s) "
            "| gap |")
    lines = [head, "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        def tps(m: str, r: ScenarioResult = r) -> str:
            x = r.methods.get(m)
            return _fmt_tps(x.tokens_per_s) if x and x.ok else "no plan"

        def mfu(m: str, r: ScenarioResult = r) -> str:
            x = r.methods.get(m)
            if not x or not x.ok:
                return "-"
            p = x.plan
            return _pct(p.model_flops_per_step / x.step_s / p.cluster_peak_flops_per_s)  # type: ignore[union-attr]

        mip = r.methods.get("mip")
        cert = mip.plan.certificate if mip and mip.ok else None  # type: ignore[union-attr]
        flag = " **BUG**" if r.violations else ""
        het = r.heterogeneous
        solve_s = f"{cert.solve_time_s:.1f}" if cert else "-"
        gap = _pct(cert.gap) if cert and cert.gap is not None else "-"
        lines.append(
            f"| {r.scenario.name}{flag} | {r.cluster.num_gpus} ({r.num_islands}) | {r.scenario.model} | {tps('mip')} | "
            f"{tps('greedy')} | {tps('homogeneous')} | {tps('unaware')} | {_ratio(r.ratio('greedy'))} | "
            f"{_ratio(r.ratio('homogeneous'))} | {_ratio(r.ratio('unaware'))} | {mfu('mip')} | {mfu('greedy')} | "
            f"{_pct(r.het_efficiency('mip')) if het else '(control)'} | "
            f"{_pct(r.het_efficiency('greedy')) if het else '-'} | {solve_s} | {gap} |")
    return lines


def detail_table(results: Sequence[ScenarioResult]) -> list[str]:
    lines = [("| scenario | method | GPUs used | stages (per pipeline) | b x m | predicted tok/s | simulated tok/s "
              "| sim vs pred "
              "| wall (s) | certificate |"),
             "|---|---|---:|---:|---|---:|---:|---:|---:|---|"]
    for r in results:
        for m in METHODS:
            x = r.methods.get(m)
            if x is None:
                continue
            if not x.ok:
                lines.append(f"| {r.scenario.name} | {m} | - | - | - | - | - | - | {x.wall_s:.1f} | {x.error} |")
                continue
            p = x.plan
            assert p is not None
            stages, bm = _shape(p)
            c = p.certificate
            cert = "-" if c is None else (f"{c.status}, gap {_pct(c.gap)}" if c.gap is not None else c.status)
            sim = _fmt_tps(x.tokens_per_s) if x.simulated else f"{x.sim_note}"
            diff = f"{100 * (x.simulated_step_s / p.step_time_s - 1):+.1f}%" if x.simulated else "-"  # type: ignore
            wall = x.wall_s + (r.candidates_s if m == "mip" else 0.0)
            lines.append(f"| {r.scenario.name} | {m} | {p.gpus_used}/{r.cluster.num_gpus} | "  # type: ignore
                         f"{stages} | {bm} | "
                         f"{_fmt_tps(p.tokens_per_s)} | {sim} | {diff} | {wall:.1f} | {cert} |")  # type: ignore
    return lines


def _shape(p: Plan) -> tuple[str, str]:
    """Stages and micro-batching of a plan: ('6', '8 x 64') or, with replicas, ('4+4', '8 x 32 + 8 x 32')."""
    return ("+".join(str(q.num_stages) for q in p.pipelines),
            " + ".join(f"{q.pipeline_micro_batch} x {q.num_micro_batches}" for q in p.pipelines))


def _stage_groups(p: Plan) -> str:
    """Runs of consecutive identical stages: '16 x h100[8 GPUs tp1 cp8 dp1 z2 sel mb1, 4 layers]', per pipeline."""
    per_pipe = []
    for q in p.pipelines:
        out: list[list[Any]] = []
        for s in q.stages:
            key = (s.island, s.gpus, s.tp, s.cp, s.dp, s.ep, s.zero, s.recompute, s.micro_batch_size, s.num_layers)
            if out and out[-1][0] == key:
                out[-1][1] += 1
            else:
                out.append([key, 1])
        parts = []
        for (isl, g, tp, cp, dp, ep, z, rc, mb, nl), n in out:
            ep_s = f" ep{ep}" if ep > 1 else ""
            parts.append(f"{n} x {isl}[{g} GPUs tp{tp} cp{cp} dp{dp}{ep_s} z{z} {rc[:3]} mb{mb}, {nl} layers]")
        per_pipe.append("; ".join(parts))
    if len(per_pipe) == 1:
        return per_pipe[0]
    return " || ".join(f"pipeline {i} ({q.pipeline_micro_batch} x {q.num_micro_batches}): {t}"
                       for i, (q, t) in enumerate(zip(p.pipelines, per_pipe)))


def _layers_by_island(p: Plan) -> str:
    """'h100 56 layers / 128 GPUs, a100 ...' per pipeline."""
    per_pipe = []
    for q in p.pipelines:
        acc: dict[str, list[int]] = {}
        for s in q.stages:
            v = acc.setdefault(s.island, [0, 0])
            v[0] += s.num_layers
            v[1] += s.gpus
        per_pipe.append(", ".join(f"{i} {n} layers / {g} GPUs" for i, (n, g) in acc.items()))
    return per_pipe[0] if len(per_pipe) == 1 else " || ".join(f"pipeline {i}: {t}" for i, t in enumerate(per_pipe))


def crosses_islands(p: Plan) -> bool:
    """Whether some pipeline of the plan has stages on more than one island (pipeline point-to-point
    transfers cross between islands)."""
    return any(len({s.island for s in q.stages}) > 1 for q in p.pipelines)


def _decompose(p: Plan) -> tuple[float, float, float]:
    """Predicted step of a one-pipeline plan = steady state ((m-1) x period) + fill/drain + exposed tail
    (tangram_opt/planner/formulations/pipeline_model.py)."""
    (pipe,) = p.pipelines
    steady = (pipe.num_micro_batches - 1) * pipe.bottleneck_s
    return steady, pipe.makespan_s - steady, p.step_time_s - pipe.makespan_s


def _period_line(p: Plan) -> str:
    parts = []
    for q in p.pipelines:
        parts.append(f"period {1e3 * q.bottleneck_s:.1f} ms (slowest stage {1e3 * max(s.time_s for s in q.stages):.1f} "
                     f"ms), {q.num_stages} stages, {q.pipeline_micro_batch} x {q.num_micro_batches}, bubble "
                     f"{100 * q.bubble_fraction:.0f}%")
    if len(parts) == 1:
        return parts[0]
    slowest = max(q.step_time_s for q in p.pipelines)
    return (f"{len(parts)} data-parallel pipelines, slowest {slowest:.3f} s + cross-pipeline sync and optimizer "
            f"{p.step_time_s - slowest:.3f} s: " + "; ".join(f"[{i}] {t}" for i, t in enumerate(parts)))


def gain_section(results: Sequence[ScenarioResult]) -> list[str]:
    """Where the MIP's gain over the greedy plan comes from, scenario by scenario, from the plans themselves."""
    lines = []
    for r in results:
        mip, g = r.methods.get("mip"), r.methods.get("greedy")
        if not r.heterogeneous or not mip or not g or not mip.ok or not g.ok:
            continue
        pm, pg = mip.plan, g.plan
        assert pm is not None and pg is not None
        total = pg.step_time_s - pm.step_time_s
        lines.append(f"**{r.scenario.name}** ({r.scenario.model}; MIP/greedy {_ratio(r.ratio('greedy'))} simulated, "
                     f"{pg.step_time_s / pm.step_time_s:.3f} predicted)")
        lines.append("")
        if total > 0 and len(pm.pipelines) == 1 and len(pg.pipelines) == 1:
            names = ("steady state (m-1) x period", "pipeline fill/drain", "exposed gradient sync/optimizer tail")
            d = [b - a for a, b in zip(_decompose(pm), _decompose(pg))]  # greedy - MIP: > 0 = MIP saves time there
            share = ", ".join(f"{nm} {1e3 * x:+.0f} ms ({100 * x / total:.0f}%)" for nm, x in zip(names, d))
            lines.append(f"- predicted step {pg.step_time_s:.3f} s -> {pm.step_time_s:.3f} s; saved: {share}.")
        elif total > 0:
            lines.append(f"- predicted step {pg.step_time_s:.3f} s -> {pm.step_time_s:.3f} s; the MIP plan runs "
                         f"{len(pm.pipelines)} data-parallel pipelines (uneven batch shares).")
        else:
            cert = pm.certificate
            why = ("the greedy plan is optimal in the plan space (certified gap "
                   f"{_pct(cert.gap)})" if cert and cert.gap is not None and cert.status == "optimal" else
                   "the MIP found nothing better than the greedy warm start within its time limit; certified gap "
                   f"{_pct(cert.gap) if cert and cert.gap is not None else '-'}")
            lines.append(f"- predicted step {pg.step_time_s:.3f} s -> {pm.step_time_s:.3f} s (no gain: {why}).")
        lines.append(f"- greedy: {_period_line(pg)}.")
        lines.append(f"- MIP: {_period_line(pm)}.")
        lines.append(f"- layer split: greedy {_layers_by_island(pg)} -> MIP {_layers_by_island(pm)}.")
        lines.append(f"- greedy stages: {_stage_groups(pg)}")
        lines.append(f"- MIP stages: {_stage_groups(pm)}")
        lines.append("")
    return lines


def technique_summary(results: Sequence[ScenarioResult]) -> list[str]:
    """GPU-weighted use of each technique by the MIP and the greedy plans (heterogeneous scenarios)."""
    acc: dict[str, dict[str, float]] = {"mip": {}, "greedy": {}}
    for r in results:
        if not r.heterogeneous:
            continue
        for m in ("mip", "greedy"):
            x = r.methods.get(m)
            if not x or not x.ok:
                continue
            a = acc[m]
            for s in x.plan.stages:  # type: ignore[union-attr]
                frac = s.gpus / r.cluster.num_gpus
                a["GPUs used"] = a.get("GPUs used", 0) + frac
                for key, on in (("tp > 1", s.tp > 1), ("cp > 1", s.cp > 1), ("ep > 1", s.ep > 1),
                                ("ZeRO >= 1", s.zero >= 1), ("ZeRO-3", s.zero == 3),
                                ("recompute selective", s.recompute == "selective"),
                                ("recompute full", s.recompute == "full")):
                    if on:
                        a[key] = a.get(key, 0) + frac
    n = sum(1 for r in results if r.heterogeneous)
    if not n:
        return []
    keys = ["GPUs used", "tp > 1", "cp > 1", "ep > 1", "ZeRO >= 1", "ZeRO-3", "recompute selective", "recompute full"]
    lines = ["| share of the cluster's GPUs (mean over heterogeneous scenarios) | MIP | greedy |", "|---|---:|---:|"]
    for k in keys:
        lines.append(f"| {k} | {_pct(acc['mip'].get(k, 0) / n)} | {_pct(acc['greedy'].get(k, 0) / n)} |")
    return lines


#: how to read the MFU column next to public runs (the published numbers are rows of
#: benchmarks/data/published_runs.yaml, with their sources; docs/results/cost_model_validation.md)
MFU_CONTEXT = ('MFU next to public runs (benchmarks/data/published_runs.yaml, each with its source; the cost model p'
               'redicts them within a median 7.9%, docs/results/cost_model_validation.md): dense models on A100 publ'
               'ished 49-64% (MosaicML llm-foundry, MPT 1B-70B, bf16) and 41-56% (Megatron-LM 2022, GPT 22B-1T, fp16'
               '); on H100 41-49% (Megatron-Core r0.8, GPT 1.7B-462B), 37-46% (llm-foundry, MPT 3B-70B), 38-43% (Lla'
               'ma 3 405B pre-training) and 33-39% (torchtitan, Llama-3.1 8B, FSDP); MoE runs lower (DeepSeek-V3 on '
               'H100: 216-250 model TFLOP/s per GPU, 22-25%). The control scenario (64 H100, Llama-3-8B) and the den'
               'se heterogeneous plans fall in these ranges. MFU here is over the dense bf16/fp16 tensor-core peaks.')


def report(results: Sequence[ScenarioResult], machine: dict[str, str], *, quick: bool, backend: str, threads: int,
           total_s: float, plots: Sequence[str] = (), plot_prefix: str = "") -> str:
    het = [r for r in results if r.heterogeneous]
    gm = {b: geomean([r.ratio(b) for r in het]) for b in BASELINES}  # type: ignore[misc]
    gm_pred = geomean([r.methods["greedy"].plan.step_time_s / r.methods["mip"].plan.step_time_s  # type: ignore
                       for r in het if r.methods.get("mip") and r.methods["mip"].ok and r.methods.get("greedy")
                       and r.methods["greedy"].ok])
    violations = [v for r in results for _, v in r.violations]
    not_sim = [f"{r.scenario.name}/{m}" for r in results for m, x in r.methods.items() if x.ok and not x.simulated]
    cmd = "python -m benchmarks.run" + (" --quick" if quick else "")
    out = [f"# Benchmark: MIP vs baselines{' (quick)' if quick else ''}", "",
           f"Generated by `{cmd}` on {machine['date']}; do not edit by hand.", "",
           (f"Machine: {machine['cpu']}, {machine['cores']} cores, {machine['ram']} RAM, {machine['os']}; Python "
           f"{machine['python']}, OR-Tools {machine['ortools']}, HiGHS (highspy) {machine['highspy']}, tangram_opt "
           f"{machine['tangram_opt']} (commit {machine['commit']}). Backend `{backend}`, {threads} thread(s). "
           f"{len(results)} scenarios, total wall time {total_s / 60:.1f} min."), "",
           "## Headline", ""]
    if gm["greedy"] is not None:
        out.append(f"- Geometric mean of MIP / greedy throughput over the {len(het)} heterogeneous scenarios: "
                   f"**{gm['greedy']:.3f}x** (simulated; {gm_pred:.3f}x by the planner's own cost model). "
                   f"Target: {TARGET_RATIO}x — {'met' if gm['greedy'] >= TARGET_RATIO else 'not met'}.")
        out.append(f"- MIP / best homogeneous island: {_ratio(gm['homogeneous'])}x; MIP / heterogeneity-unaware: "
                   f"{_ratio(gm['unaware'])}x (geometric means, heterogeneous scenarios, simulated).")
    crossing = [r for r in het if r.methods.get("mip") and r.methods["mip"].ok
                and crosses_islands(r.methods["mip"].plan)]  # type: ignore[arg-type]
    out.append(f"- MIP plans with a pipeline that crosses islands (stages on two or more islands): {len(crossing)} "
               f"of {len(het)} heterogeneous scenarios.")
    if violations:
        bad = sorted({r.scenario.name for r in results if r.violations})
        out.append(f"- **BUG: the MIP is below a baseline in {len(bad)} scenario(s): {', '.join(bad)}** "
                   f"({len(violations)} failed check(s), listed below).")
    else:
        out.append("- The MIP plan is >= every baseline in every scenario (simulated and predicted throughput).")
    if not_sim:
        out.append(f"- Not simulated (predicted time used instead): {', '.join(not_sim)}.")
    out += ["", "## Results", "",
            ("Throughput is tokens per second of the step replayed by the independent simulator "
            "(`tangram_opt.sim.simulate`). MFU is model FLOPs over the dense peak of *every* GPU in the cluster. "
            "Heterogeneity efficiency is the plan's throughput over the sum of the throughputs each island reaches "
            "alone (each island's best plan from the homogeneous baseline, simulated). MIP solve time is the "
            "certificate's (it includes the greedy warm start; the candidate table is built once per scenario "
            "and shared, its time is in the detail table's wall column); gap is the certified relative gap of the "
            "MIP's plan over the whole plan space, under the cost model."), ""]
    out += summary_table(results)
    out += ["", MFU_CONTEXT]
    if violations:
        out += ["", "## BUG: MIP below a baseline", "",
                ("The MIP is warm-started with the greedy plan and its plan space contains every single-island and "
                "every uniform plan, so each line below is a bug (solver, cost-model/simulator mismatch, or "
                "time limit too short to find the single-island plan):"), ""]
        out += [f"- {v}" for v in violations]
    out += ["", "## Where the gain comes from", "",
            ("Step decomposition under the planner's closed form (tangram_opt/planner/formulations/pipeline_model.py: step = "
            "(m-1) x steady period + fill/drain + exposed tail, where the period is the slowest stage, the "
            "slowest link or the 1F1B in-flight round trip, whichever is largest), the greedy plan against the "
            "MIP's, and the stages of both plans (runs of identical stages as "
            "`n x island[GPUs config, layers per stage]`)."), ""]
    out += gain_section(results)
    tech = technique_summary(results)
    if tech:
        out += ["Techniques, weighted by GPUs:", "", *tech, ""]
    out += ["## Details", "", *detail_table(results), ""]
    if plots:
        out += ["## Plots", ""] + [f"![{Path(p).stem}]({plot_prefix}{Path(p).name})" for p in plots] + [""]
    out += ["## Method", "",
            ("- MIP: `tangram_opt.solve(...)` (greedy warm start, the default), time limit per scenario in its file "
            "(benchmarks/scenarios/). Baselines are described in docs/baselines.md: greedy "
            "(`tangram_opt.baselines.greedy`), best homogeneous island (`best_homogeneous`: `solve` on each island "
            "alone with the scenario's `island_time_limit_s`, best kept), heterogeneity-unaware "
            "(`heterogeneity_unaware`: uniform Megatron-style plan for a cluster of the slowest GPU, evaluated on "
            "the real GPUs)."),
            "- Every plan is priced by the same cost model and replayed by the simulator with the same options.",
            ("- A scenario is heterogeneous when the planner sees more than one island (GPU type, node shape or "
            "zone differ); the control scenario has one island."), ""]
    return "\n".join(out)


def make_plots(results: Sequence[ScenarioResult], out_dir: Path) -> list[str]:
    """Three small PNGs: throughput per method, MIP / baseline ratios, cluster MFU and heterogeneity efficiency."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    names = [r.scenario.name for r in results]
    x = list(range(len(results)))
    colors = {"mip": "#1f77b4", "greedy": "#ff7f0e", "homogeneous": "#2ca02c", "unaware": "#d62728"}
    w = 0.2
    files = []

    fig, ax = plt.subplots(figsize=(10, 4), dpi=80)
    for k, m in enumerate(METHODS):
        ys = [r.methods[m].tokens_per_s if m in r.methods and r.methods[m].ok else 0 for r in results]
        ax.bar([i + (k - 1.5) * w for i in x], ys, w, label=m, color=colors[m])
    ax.set_yscale("log")
    ax.set_ylabel("tokens/s (simulated)")
    ax.set_xticks(x, names, rotation=40, ha="right", fontsize=7)
    ax.legend(fontsize=7, ncol=len(METHODS), loc="upper left")
    ax.set_title("Throughput per scenario")
    fig.tight_layout()
    files.append(str(out_dir / "tokens_per_s.png"))
    fig.savefig(files[-1])
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(10, 4), dpi=80)
    for k, b in enumerate(BASELINES):
        ys = [r.ratio(b) or 0 for r in results]
        ax.bar([i + (k - 1) * w for i in x], ys, w, label=f"MIP / {b}", color=colors[b])
    ax.axhline(1.0, color="k", lw=0.8)
    ax.axhline(TARGET_RATIO, color="gray", lw=0.8, ls="--", label=f"target {TARGET_RATIO}x vs greedy")
    ax.set_ylabel("throughput ratio")
    ax.set_xticks(x, names, rotation=40, ha="right", fontsize=7)
    ax.legend(fontsize=7)
    ax.set_title("MIP over each baseline (simulated)")
    fig.tight_layout()
    files.append(str(out_dir / "ratios.png"))
    fig.savefig(files[-1])
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), dpi=80)
    for k, m in enumerate(METHODS):
        mfu, eff = [], []
        for r in results:
            mr = r.methods.get(m)
            ok = mr is not None and mr.ok
            mfu.append(100 * mr.plan.model_flops_per_step / mr.step_s / mr.plan.cluster_peak_flops_per_s  # type: ignore
                       if ok else 0)
            eff.append(100 * (r.het_efficiency(m) or 0) if r.heterogeneous else 0)
        axes[0].bar([i + (k - 1.5) * w for i in x], mfu, w, label=m, color=colors[m])
        axes[1].bar([i + (k - 1.5) * w for i in x], eff, w, label=m, color=colors[m])
    axes[0].set_ylabel("MFU over the cluster's dense peak (%)")
    axes[1].set_ylabel("heterogeneity efficiency (%)")
    for ax in axes:
        ax.set_xticks(x, names, rotation=40, ha="right", fontsize=6)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=len(METHODS), fontsize=7)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    files.append(str(out_dir / "mfu_efficiency.png"))
    fig.savefig(files[-1])
    plt.close(fig)
    return files


__all__ = ["csv_rows", "detail_table", "gain_section", "geomean", "machine_info", "make_plots", "report", "summary_table",
           "technique_summary", "write_csv"]
