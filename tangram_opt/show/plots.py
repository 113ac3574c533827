"""Pictures of a plan (matplotlib): one step's pipeline timeline, the islands, per-stage memory.

Every function draws into ``ax`` when given one, else into a new :class:`matplotlib.figure.Figure`
(created without pyplot, so it works headless and does not pop up windows); it returns the figure
and, with ``save_path=``, also writes it (``.png`` or ``.svg``, by suffix). In Jupyter a returned
figure is shown inline.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from tangram_opt import units as u
from tangram_opt.planner.plan import Plan

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from tangram_opt.sim import SimulationResult
    from tangram_opt.specs.cluster import Cluster

#: Colours: forward, backward, step tail, sends; per-stage palette for islands / memory.
KIND_COLORS = {"F": "#4C72B0", "B": "#DD8452", "tail": "#8C8C8C", "send_fwd": "#55A868", "send_bwd": "#C44E52",
               "sync": "#8172B3", "optimizer": "#CCB974"}
STAGE_PALETTE = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C",
                 "#CCB974", "#64B5CD")
UNUSED_COLOR = "#E5E5E5"


def _figure(ax: Axes | None, size: tuple[float, float]) -> tuple[Figure, Axes]:
    if ax is not None:
        return ax.figure, ax  # type: ignore[return-value]
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, layout="constrained")
    return fig, fig.add_subplot()


def _save(fig: Figure, save_path: str | Path | None, dpi: int) -> None:
    if save_path is None:
        return
    p = Path(save_path)
    if p.suffix.lower() not in (".png", ".svg", ".pdf"):
        from tangram_opt.errors import SpecError

        raise SpecError("save_path", str(save_path), "has no picture suffix", "end the name with .png or .svg")
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(p, dpi=dpi, bbox_inches="tight")


def stage_color(k: int) -> str:
    return STAGE_PALETTE[k % len(STAGE_PALETTE)]


# --- timeline --------------------------------------------------------------------------------------
def plot_timeline(sim: SimulationResult, ax: Axes | None = None, *, save_path: str | Path | None = None,
                  pipelines: Sequence[int] | None = None, show_sends: bool = False, labels: bool | None = None,
                  title: str | None = None, dpi: int = 110) -> Figure:
    """Gantt chart of one simulated step: a row per stage (top: first stage), forward (blue) and
    backward (orange) of each micro-batch, the step tail (grey); white gaps are pipeline bubbles.

    ``pipelines`` picks which pipelines to draw (default all); ``show_sends`` adds a thin row per
    stage boundary with the activation / gradient transfers; ``labels`` writes micro-batch numbers
    in the bars (default: when there are at most 16 micro-batches).
    """
    from matplotlib.patches import Patch

    events = [e for e in sim.events if pipelines is None or e.pipeline in pipelines]
    stage_rows = sorted({(e.pipeline, e.stage) for e in events if e.kind in ("F", "B", "tail")})
    rows: list[tuple[str, tuple[int, int, str]]] = []
    for p, s in stage_rows:
        rows.append((f"p{p} s{s}" if len({q for q, _ in stage_rows}) > 1 else f"stage {s}", (p, s, "compute")))
        if show_sends and (p, s + 1) in stage_rows:
            rows.append((f"  s{s}<->s{s + 1}", (p, s, "link")))
    index = {key: i for i, (_, key) in enumerate(rows)}
    fig, ax = _figure(ax, (10, 0.45 * len(rows) + 1.6))
    n_mb = 1 + max((e.micro_batch for e in events), default=0)
    if labels is None:
        labels = n_mb <= 16
    for e in events:
        if e.kind in ("F", "B", "tail"):
            y, h = index[(e.pipeline, e.stage, "compute")], 0.8
        elif show_sends:
            s = e.stage if e.kind == "send_fwd" else e.stage - 1
            key = (e.pipeline, s, "link")
            if key not in index:
                continue
            # activations (down the pipeline) in the upper half of the link row, gradients in the lower
            y, h = index[key] + (-0.2 if e.kind == "send_fwd" else 0.2), 0.35
        else:
            continue
        ax.barh(y, e.duration_s, left=e.start_s, height=h, color=KIND_COLORS[e.kind], edgecolor="white",
                linewidth=0.3)
        if labels and e.kind in ("F", "B") and e.duration_s > 0:
            ax.text(e.start_s + e.duration_s / 2, y, str(e.micro_batch), ha="center", va="center", fontsize=6,
                    color="white", clip_on=True)
    # several pipelines: the all-reduce across them, then every stage's optimizer step
    drawn = [p for p in sim.pipelines if pipelines is None or p.index in pipelines]
    after = [(sim.cross_pipeline_sync_s, "sync"), (sim.post_sync_time_s, "optimizer")]
    if len(sim.pipelines) > 1 and drawn and any(d > 0 for d, _ in after):
        t = max(p.step_time_s for p in sim.pipelines)
        for dur, kind in after:
            for (_, (p, s, what)) in rows:
                if what == "compute":
                    ax.barh(index[(p, s, "compute")], dur, left=t, height=0.8, color=KIND_COLORS[kind],
                            edgecolor="white", linewidth=0.3)
            t += dur
    ax.set_yticks(range(len(rows)), [name for name, _ in rows])
    ax.invert_yaxis()
    ax.set_xlim(0, sim.step_time_s * 1.005)
    ax.set_xlabel("time in the step (s)")
    ax.grid(axis="x", alpha=0.3)
    ax.set_axisbelow(True)
    handles = [Patch(color=KIND_COLORS["F"], label="forward"), Patch(color=KIND_COLORS["B"], label="backward"),
               Patch(color=KIND_COLORS["tail"], label="grad sync + optimizer")]
    if len(sim.pipelines) > 1 and (sim.cross_pipeline_sync_s > 0 or sim.post_sync_time_s > 0):
        handles[-1] = Patch(color=KIND_COLORS["tail"], label="grad sync in stage")
        handles += [Patch(color=KIND_COLORS["sync"], label="all-reduce across pipelines"),
                    Patch(color=KIND_COLORS["optimizer"], label="optimizer")]
    if show_sends:
        handles += [Patch(color=KIND_COLORS["send_fwd"], label="activation send"),
                    Patch(color=KIND_COLORS["send_bwd"], label="gradient send")]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.18 if len(rows) < 6 else -0.1),
              ncol=len(handles), frameon=False, fontsize=8)
    ax.set_title(title or f"one training step: {u.fmt_seconds(sim.step_time_s)}, bubble "
                          f"{100 * sim.bubble_fraction:.1f}% of stage time", fontsize=10)
    _save(fig, save_path, dpi)
    return fig


# --- islands ---------------------------------------------------------------------------------------
def plot_islands(plan: Plan, cluster: Cluster, ax: Axes | None = None, *, save_path: str | Path | None = None,
                 max_cells: int = 1024, title: str | None = None, dpi: int = 110) -> Figure:
    """The cluster's islands as rows of nodes (GPU cells), coloured by the stage that uses each GPU.

    Large islands are drawn one cell per node (colour of the node's first stage) when they have
    more than ``max_cells`` GPUs in total.
    """
    from matplotlib.patches import Patch, Rectangle

    from tangram_opt.export.ranks import assign_ranks
    from tangram_opt.planner.islands import find_islands

    islands = find_islands(cluster)
    ranks = assign_ranks(plan, cluster)
    owner: dict[tuple[str, int, int], tuple[int, int]] = {}
    for r in ranks:
        for sl in r.slices:
            for g in sl.local_gpus:
                owner[(sl.island, sl.node, g)] = (r.pipeline, r.stage)
    per_node = cluster.num_gpus > max_cells
    multi = len(plan.pipelines) > 1
    stage_keys = sorted({(r.pipeline, r.stage) for r in ranks})
    color_of = {key: stage_color(i) for i, key in enumerate(stage_keys)}
    # layout: one band per island; nodes in a grid of `cols` nodes per line
    max_nodes = max(i.num_nodes for i in islands)
    cell = 1.0
    node_w = 1 if per_node else max(i.gpus_per_node for i in islands)
    cols = max(1, min(max_nodes, 72 // (node_w + 1)))
    band_lines = [-(-i.num_nodes // cols) for i in islands]
    width_data = cols * (node_w + 1) + 0.6
    height_data = sum(band_lines) * 1.6 + 1.2 * len(islands) + 0.4
    unit_in = min(0.22, 9.0 / width_data)  # inches per data unit (cells stay square)
    n_legend = len({(r.pipeline, r.stage) for r in ranks}) + 1
    fig, ax = _figure(ax, (max(6.0, width_data * unit_in + 1.8),
                           max(2.0, height_data * unit_in + 0.9 + 0.12 * -(-n_legend // 2))))
    y = 0.0
    yticks, ylabels = [], []
    for isl, lines in zip(islands, band_lines):
        yticks.append(y + 0.5 * (lines - 1) * 1.6)
        ylabels.append(f"{isl.name}\n{isl.num_nodes}x{isl.gpus_per_node} {isl.gpu_name}")
        for n in range(isl.num_nodes):
            row, col = divmod(n, cols)
            x0, y0 = col * (node_w + 1), y + row * 1.6
            if per_node:
                key = next((owner[(isl.name, n, g)] for g in range(isl.gpus_per_node) if (isl.name, n, g) in owner),
                           None)
                ax.add_patch(Rectangle((x0, y0 - 0.5), cell, cell, facecolor=color_of.get(key, UNUSED_COLOR),
                                       edgecolor="white", linewidth=0.5))
            else:
                ax.add_patch(Rectangle((x0 - 0.15, y0 - 0.65), isl.gpus_per_node + 0.3, 1.3, facecolor="none",
                                       edgecolor="#999999", linewidth=0.6))
                for g in range(isl.gpus_per_node):
                    key = owner.get((isl.name, n, g))
                    ax.add_patch(Rectangle((x0 + g, y0 - 0.5), cell * 0.9, cell, edgecolor="white", linewidth=0.3,
                                           facecolor=color_of[key] if key is not None else UNUSED_COLOR))
        y += lines * 1.6 + 1.2
    ax.set_xlim(-0.6, cols * (node_w + 1))
    ax.set_ylim(y - 0.6, -1.0)
    ax.set_aspect("equal", adjustable="box")
    ax.set_yticks(yticks, ylabels, fontsize=8)
    ax.set_xticks([])
    for side in ("top", "right", "bottom", "left"):
        ax.spines[side].set_visible(False)
    handles = []
    for key in stage_keys:
        p, k = key
        s = plan.pipelines[p].stages[k]
        name = (f"p{p} " if multi else "") + f"stage {k}: layers {s.first_layer}-{s.first_layer + s.num_layers - 1}"
        name += (" +emb" if s.has_embedding else "") + (" +head" if s.has_head else "")
        handles.append(Patch(color=color_of[key], label=f"{name} ({s.gpus} GPUs, tp{s.tp} cp{s.cp} dp{s.dp})"))
    handles.append(Patch(color=UNUSED_COLOR, label="unused"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(0.0, 0.0), frameon=False, fontsize=7,
              ncol=2 if len(handles) > 3 else 1)
    ax.tick_params(axis="y", length=0)
    ax.set_title(title or f"{plan.model} on {cluster.name}: which stage runs where"
                          + ("\n(one cell per node)" if per_node else "\n(one cell per GPU, boxes are nodes)"),
                 fontsize=9, loc="left")
    _save(fig, save_path, dpi)
    return fig


# --- memory ----------------------------------------------------------------------------------------
def plot_memory(plan: Plan, ax: Axes | None = None, *, save_path: str | Path | None = None,
                peak_bytes: Sequence[float] | None = None, title: str | None = None, dpi: int = 110) -> Figure:
    """Per-stage memory per GPU (bars) against each GPU's usable memory (outline).

    ``peak_bytes`` (one per stage, e.g. ``SimulationResult.peak_memory_bytes``) adds the simulated
    peak as a tick on each bar.
    """
    stages = plan.stages
    multi = len(plan.pipelines) > 1
    names, used, cap = [], [], []
    for pi, p in enumerate(plan.pipelines):
        for k, s in enumerate(p.stages):
            names.append((f"p{pi} " if multi else "") + f"s{k}\n{s.island}\n{s.gpu}")
            used.append(s.memory_bytes / u.GiB)
            cap.append(s.capacity_bytes / u.GiB)
    fig, ax = _figure(ax, (max(4.5, 0.75 * len(stages) + 2.0), 3.6))
    x = list(range(len(stages)))
    colors = [stage_color(i) if m <= c else "#C44E52" for i, (m, c) in enumerate(zip(used, cap))]
    ax.bar(x, cap, width=0.7, facecolor="none", edgecolor="#555555", linewidth=1.0, label="usable per GPU")
    ax.bar(x, used, width=0.7, color=colors, alpha=0.85, label="planned per GPU")
    for xi, m in zip(x, used):
        ax.text(xi, m, f"{m:.1f}", ha="center", va="bottom", fontsize=7)
    if peak_bytes is not None:
        ax.scatter(x, [b / u.GiB for b in peak_bytes], marker="_", s=300, color="black", zorder=3,
                   label="simulated peak")
    ax.set_xticks(x, names, fontsize=7)
    ax.set_ylabel("GiB per GPU")
    ax.set_ylim(0, max(cap + used) * 1.12)
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    ax.legend(fontsize=7, loc="upper right", frameon=False)
    ax.set_title(title or "memory per GPU by stage", fontsize=10)
    _save(fig, save_path, dpi)
    return fig


def save_figure(fig: Figure, path: str | Path, dpi: int = 110) -> Path:
    """Write ``fig`` to ``path`` (.png/.svg); returns the path."""
    _save(fig, path, dpi)
    return Path(path)


__all__ = ["KIND_COLORS", "STAGE_PALETTE", "plot_islands", "plot_memory", "plot_timeline", "save_figure",
           "stage_color"]


