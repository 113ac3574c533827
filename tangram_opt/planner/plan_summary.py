"""Readable summaries of a plan: a pandas table (notebooks) and a rich-rendered text table (terminals).

``plan_table(plan)`` has one row per stage; every figure keeps its base unit and says it in the
column name (``memory_bytes``, ``stage_time_s``). ``summary_text(plan)`` renders the headline
figures, the certificate and one table per pipeline as plain text; ``print_summary`` writes the same
to a terminal with colour.

They live beside the plan because ``Plan.summary()`` and ``Plan.to_dataframe()`` render them (a plan
layer must not import the presentation layer above it); ``tangram_opt.show`` re-exports them.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any

from rich import box
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from tangram_opt import units as u
from tangram_opt.planner.plan import Plan, limits_text

if TYPE_CHECKING:
    import pandas as pd

#: Columns of :func:`plan_table`, in order.
TABLE_COLUMNS = (
    "pipeline", "stage", "island", "gpu", "gpus", "tp", "cp", "dp", "ep", "zero", "recompute", "micro_batch_size",
    "first_layer", "last_layer", "num_layers", "num_dense_layers", "num_moe_layers", "has_embedding", "has_head",
    "fwd_time_s", "bwd_time_s", "stage_time_s", "tail_time_s", "p2p_time_s", "memory_bytes", "capacity_bytes",
    "memory_free_bytes", "memory_used_fraction", "inflight", "pipeline_micro_batch", "num_micro_batches",
    "schedule", "bubble_fraction", "sequences_per_step", "post_sync_time_s",
)


def plan_metrics(plan: Plan) -> dict[str, Any]:
    """Plan-level figures (also ``plan_table(plan).attrs``)."""
    cert = plan.certificate
    return {
        "model": plan.model, "cluster": plan.cluster, "method": plan.method, "precision": plan.precision,
        "global_batch_size": plan.global_batch_size, "seq_len": plan.seq_len, "step_time_s": plan.step_time_s,
        "tokens_per_s": plan.tokens_per_s, "mfu": plan.mfu, "cluster_mfu": plan.cluster_mfu,
        "gpus_used": plan.gpus_used, "cluster_gpus": sum(plan.island_gpus.values()) or plan.gpus_used,
        "pipelines": len(plan.pipelines), "sequences_per_pipeline": plan.sequences_per_pipeline,
        "cross_sync_s": plan.cross_sync_s, "post_sync_s": plan.post_sync_s,
        "status": cert.status if cert else None, "gap": cert.gap if cert else None,
        "bound_s": cert.bound_s if cert else None, "backend": cert.backend if cert else None,
        "solve_time_s": cert.solve_time_s if cert else None,
        "objective": cert.objective if cert else None, "objective_value": cert.objective_value if cert else None,
        "objective_bound": cert.objective_bound if cert else None,
        "usd_per_hour": cert.prices["usd_per_hour"] if cert and cert.prices else None,
        "usd_per_1m_tokens": cert.prices["usd_per_1m_tokens"] if cert and cert.prices else None,
    }


def plan_table(plan: Plan) -> pd.DataFrame:
    """One row per stage (columns :data:`TABLE_COLUMNS`); plan figures in ``.attrs``."""
    import pandas as pd

    rows = []
    for pi, p in enumerate(plan.pipelines):
        for k, s in enumerate(p.stages):
            rows.append((pi, k, s.island, s.gpu, s.gpus, s.tp, s.cp, s.dp, s.ep, s.zero, s.recompute,
                         s.micro_batch_size, s.first_layer, s.first_layer + s.num_layers - 1, s.num_layers,
                         s.num_dense_layers, s.num_moe_layers, s.has_embedding, s.has_head, s.fwd_time_s,
                         s.bwd_time_s, s.time_s, s.tail_time_s, s.p2p_time_s, s.memory_bytes, s.capacity_bytes,
                         s.memory_free_bytes, s.memory_bytes / s.capacity_bytes if s.capacity_bytes else float("nan"),
                         s.inflight, p.pipeline_micro_batch, p.num_micro_batches, p.schedule, p.bubble_fraction,
                         p.sequences_per_step, s.post_sync_time_s))
    df = pd.DataFrame(rows, columns=list(TABLE_COLUMNS))
    df.attrs.update(plan_metrics(plan))
    return df


def _pct(x: float | None, digits: int = 1) -> str:
    return "n/a" if x is None else f"{100 * x:.{digits}f}%"


def headline(plan: Plan) -> list[str]:
    """The summary's text lines above the tables."""
    m = plan_metrics(plan)
    lines = [f"{plan.model} on {plan.cluster}: {plan.method} plan, {plan.precision}, global batch "
             f"{plan.global_batch_size} x {plan.seq_len} tokens",
             f"step {u.fmt_seconds(plan.step_time_s)} | {plan.tokens_per_s:,.0f} tokens/s | MFU {_pct(plan.mfu)} "
             f"(over the whole cluster {_pct(plan.cluster_mfu)}) | {plan.gpus_used} of {m['cluster_gpus']} GPUs used"]
    cert = plan.certificate
    if cert is not None:
        if cert.gap is None:
            lines.append(f"certificate: {cert.status}, no bound ({cert.backend}, {cert.solve_time_s:.1f} s)")
        else:
            space = "searched space"
            if cert.plan_space.startswith("launch target "):
                space = f"{cert.plan_space.split()[2].rstrip(':')} launch space (one job, every stage alike)"
            if cert.objective != "throughput" or cert.limits:
                lim = limits_text(cert.limits)
                lines.append(f"objective: {cert.objective}{lim}: {cert.objective_value:,.6g} {cert.objective_unit}")
                lines.append(f"certificate: {cert.status}, gap {_pct(cert.gap, 2)} (bound {cert.objective_bound:,.6g} "
                             f"{cert.objective_unit} on every plan in the {space} that meets the limits; "
                             f"{cert.backend}, {cert.solve_time_s:.1f} s)")
            else:
                lines.append(f"certificate: {cert.status}, gap {_pct(cert.gap, 2)} (bound {u.fmt_seconds(cert.bound_s)}"
                             f" on every plan in the {space}; {cert.backend}, {cert.solve_time_s:.1f} s)")
            runtime = [n for n in cert.notes if n.startswith("runtime: ")]
            if runtime:
                lines.append(runtime[0])
            held = open_parts(plan)
            if held:
                lines.append("bounds below the plan (lowest first): " + "; ".join(held))
    if len(plan.pipelines) > 1:
        slowest = max(p.step_time_s for p in plan.pipelines)
        lines.append(f"{len(plan.pipelines)} data-parallel pipelines, batch shares "
                     f"{' + '.join(map(str, plan.sequences_per_pipeline))} sequences; step = slowest pipeline "
                     f"{u.fmt_seconds(slowest)} + cross-pipeline gradient all-reduce {u.fmt_seconds(plan.cross_sync_s)}"
                     f" + optimizer {u.fmt_seconds(plan.post_sync_s)}")
    prices = cert.prices if cert is not None else None
    if prices:
        free = ", ".join(f"{f['group']} {f['nodes_free']}/{f['nodes']} nodes" for f in prices["free_nodes"])
        lines.append(f"price: ${prices['usd_per_hour']:,.2f}/h for the GPUs used | ${prices['usd_per_1m_tokens']:,.4f} "
                     f"per 1M tokens | free: {free or 'no whole node'}")
    used = plan.gpus_by_island()
    if plan.island_gpus:
        lines.append("islands: " + ", ".join(f"{name} {used.get(name, 0)}/{n} GPUs"
                                             for name, n in plan.island_gpus.items()))
    return lines


#: How many parts of the search :func:`open_parts` names.
OPEN_PARTS_SHOWN = 3
#: Sub-problem statuses in the words of that line: "time limit" (more time may raise the bound),
#: "closed at its model bound" (every window done; the relaxation, not time, holds the bound)
_STATUS_WORDS = {"not finished (time limit)": "time limit", "not started (time limit)": "time limit, not started",
                 "closed": "closed at its model bound", "feasible": "not proved"}


def open_parts(plan: Plan, limit: int = OPEN_PARTS_SHOWN) -> list[str]:
    """The parts of the searched space whose lower bound is still below the plan's objective, lowest
    first: where the gap sits, and whether more time could close it there (a part stopped by the
    time limit) or not (closed at its model bound). Empty for a proved or bound-less plan."""
    cert = plan.certificate
    if cert is None or cert.gap is None or cert.status == "optimal":
        return []
    parts = []
    for sub in cert.subproblems:
        bound = sub.get("bound_s")
        if bound is None or not bound < cert.objective_s * (1 - 1e-4):  # within the solver tolerance: done
            continue
        if "pipeline_micro_batch" in sub:
            name = f"pipeline micro-batch {sub['pipeline_micro_batch']}"
        elif "level" in sub:
            name = str(sub["level"])
        else:
            continue
        status = _STATUS_WORDS.get(sub.get("status", ""), sub.get("status", "open"))
        parts.append((bound, f"{name}: {u.fmt_seconds(bound)} ({status})"))
    parts.sort(key=lambda q: q[0])
    shown = [text for _, text in parts[:limit]]
    if len(parts) > limit:
        shown.append(f"{len(parts) - limit} more")
    return shown


def _pipeline_table(plan: Plan, pi: int) -> Table:
    p = plan.pipelines[pi]
    share = (f", share {p.sequences_per_step} of {plan.global_batch_size} seq, ready after "
             f"{u.fmt_seconds(p.step_time_s)}" if len(plan.pipelines) > 1 else "")
    t = Table(title=f"pipeline {pi}: {p.num_stages} stage(s), {p.num_micro_batches} micro-batches x "
                    f"{p.pipeline_micro_batch} seq, {p.schedule}, bubble {_pct(p.bubble_fraction)}{share}",
              box=box.SIMPLE_HEAD, title_justify="left", pad_edge=False, show_edge=False, collapse_padding=True)
    show_cp = any(s.cp > 1 for s in p.stages)
    show_ep = any(s.ep > 1 for s in p.stages)
    cols = [("stage", "right"), ("island", "left"), ("GPUs", "right"), ("tp", "right")]
    cols += [("cp", "right")] if show_cp else []
    cols += [("dp", "right")]
    cols += [("ep", "right")] if show_ep else []
    cols += [("ZeRO", "right"), ("recompute", "left"), ("mb", "right"), ("layers", "left"), ("mem GiB", "right"),
             ("free GiB", "right"), ("F+B ms", "right"), ("tail ms", "right")]
    for name, just in cols:
        t.add_column(name, justify=just, no_wrap=True, min_width=len(name))  # type: ignore[arg-type]
    slowest = max(s.time_s for s in p.stages)
    for k, s in enumerate(p.stages):
        last = s.first_layer + s.num_layers - 1
        layers = (f"{s.first_layer}-{last}" if s.num_layers else "-") + ("+E" if s.has_embedding else "") \
            + ("+H" if s.has_head else "")
        free = s.memory_free_bytes / u.GiB
        mem_style = "red" if free < 0 else ("yellow" if s.memory_bytes > 0.9 * s.capacity_bytes else "")
        time_style = "bold" if s.time_s == slowest and p.num_stages > 1 else ""
        row: list[Any] = [str(k), s.island, f"{s.gpus}x{s.gpu}", str(s.tp)]
        row += [str(s.cp)] if show_cp else []
        row += [str(s.dp)]
        row += [str(s.ep)] if show_ep else []
        row += [str(s.zero), s.recompute, str(s.micro_batch_size), layers,
                Text(f"{s.memory_bytes / u.GiB:.1f}/{s.capacity_bytes / u.GiB:.1f}", style=mem_style),
                Text(f"{free:.1f}", style=mem_style), Text(f"{s.time_s / u.MS:.1f}", style=time_style),
                f"{s.tail_time_s / u.MS:.1f}"]
        t.add_row(*row)
    return t


def summary_renderable(plan: Plan) -> Group:
    """The summary as a rich renderable (headline, one table per pipeline, legend)."""
    parts: list[Any] = [Text(line) for line in headline(plan)]
    for pi in range(len(plan.pipelines)):
        parts.append(Text(""))
        parts.append(_pipeline_table(plan, pi))
    parts.append(Text("layers +E: embedding, +H: LM head. mem: used/usable GiB per GPU. cp, ep: shown when > 1.",
                      style="dim"))
    if len(plan.pipelines) > 1:
        parts.append(Text("F+B: forward + backward of one micro-batch. tail: exposed intra-stage gradient sync; the "
                          "optimizer step follows the cross-pipeline all-reduce.", style="dim"))
    else:
        parts.append(Text("F+B: forward + backward of one micro-batch. tail: exposed gradient sync + optimizer step.",
                          style="dim"))
    return Group(*parts)


def summary_text(plan: Plan, width: int = 120) -> str:
    """The summary as plain text, ``width`` columns wide (no colour codes)."""
    buf = io.StringIO()
    console = Console(file=buf, width=width, color_system=None, force_terminal=False, highlight=False,
                      emoji=False, legacy_windows=False)
    console.print(summary_renderable(plan))
    return "\n".join(line.rstrip() for line in buf.getvalue().splitlines()) + "\n"


def print_summary(plan: Plan, console: Console | None = None) -> None:
    """Print the summary to ``console`` (default: stdout, coloured when it is a terminal)."""
    (console or Console(highlight=False)).print(summary_renderable(plan))


__all__ = ["TABLE_COLUMNS", "headline", "plan_metrics", "plan_table", "print_summary", "summary_renderable",
           "summary_text"]
