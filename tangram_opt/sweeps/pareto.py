"""The Pareto front of a sweep (more tokens/s for fewer dollars per hour) and its figure.

A variant is on the front when no other variant of the same model has at least its throughput at
no more than its price per hour, and is strictly better in one of the two. Throughputs of
different models are not comparable, so each model has its own front.

The figure plots tokens/s against USD per hour of the GPUs each plan uses, every planned variant as
a grey point and each front as a line of coloured points, labelled with the variant's axis values.
A vertical bar above a point reaches the throughput at the plan's certified bound (tokens per step
over the lower bound on the step time): no plan of that variant's plan space is faster. It is drawn
with matplotlib's Agg canvas, without pyplot (no window, no global backend switch).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from tangram_opt.errors import SpecError

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

X, Y, Y_BOUND = "usd_per_hour", "tokens_per_s", "tokens_per_s_bound"
PALETTE = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860")
FIGURE_SUFFIXES = (".png", ".svg", ".pdf")


def _finite(x: object) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def pareto_front(df: pd.DataFrame, *, x: str = X, y: str = Y, by: str = "model") -> pd.Series:
    """A boolean column: the rows on the front (lowest ``x``, highest ``y``) of their ``by`` group;
    rows without both numbers are never on it."""
    import pandas as pd

    on = pd.Series(False, index=df.index, name="pareto")
    ok = df[[_finite(a) and _finite(b) for a, b in zip(df[x], df[y])]]
    for _, grp in ok.groupby(by, sort=False) if by in ok else [(None, ok)]:
        pts = list(zip(grp.index, grp[x], grp[y]))
        for i, xi, yi in pts:
            on[i] = not any(xj <= xi and yj >= yi and (xj < xi or yj > yi) for _, xj, yj in pts)
    return on


def pareto_figure(df: pd.DataFrame, path: str | Path | None = None, *, title: str = "") -> Figure:
    """Draw the sweep's throughput against its price per hour, the fronts highlighted; write it to
    ``path`` (``.png``, ``.svg`` or ``.pdf``) when given."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if path is not None and Path(path).suffix.lower() not in FIGURE_SUFFIXES:
        raise SpecError("figure", str(path), "has no picture suffix", "end the name with .png, .svg or .pdf")
    fig = Figure(figsize=(8.0, 5.0), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    front = df["pareto"] if "pareto" in df else pareto_front(df)
    planned = df[[_finite(a) and _finite(b) for a, b in zip(df[X], df[Y])]]
    ax.scatter(planned[X], planned[Y], s=18, color="#B0B0B0", label="variant", zorder=2)
    models = list(dict.fromkeys(planned["model"])) if "model" in planned else [None]
    for k, model in enumerate(models):
        rows = planned[front[planned.index] & ((planned["model"] == model) if model is not None else True)]
        rows = rows.sort_values(X)
        color = PALETTE[k % len(PALETTE)]
        name = "Pareto front" + (f" ({model})" if model is not None and len(models) > 1 else "")
        ax.plot(rows[X], rows[Y], "-o", color=color, ms=6, lw=1.5, label=name, zorder=3)
        if Y_BOUND in rows:
            for _, r in rows.iterrows():
                if _finite(r[Y_BOUND]) and r[Y_BOUND] > r[Y]:
                    ax.vlines(r[X], r[Y], r[Y_BOUND], color=color, lw=1, alpha=0.7, zorder=3)
        for j, (text, xy) in enumerate(_point_labels(rows)):
            ax.annotate(text, xy, textcoords="offset points", xytext=(6, -9 if j % 2 else 5), fontsize=7,
                        color="#303030", va="center")
    missing = len(df) - len(planned)
    ax.set_xlabel("USD per hour (GPUs the plan uses)")
    ax.set_ylabel("tokens/s")
    ax.yaxis.set_major_formatter(lambda v, _: f"{v:,.0f}")
    ax.set_title(title or "throughput vs price")
    ax.grid(True, alpha=0.3)
    note = ("front points: GPUs the plan uses (#first variant, +n more at the same point); a bar above a point "
            "reaches the throughput at its certified bound")
    if missing:
        note += f"; {missing} variant(s) without a plan not shown"
    fig.text(0.01, 0.0, note, fontsize=7, color="#606060", ha="left", va="top", wrap=True)
    ax.legend(loc="upper left", fontsize=8)
    if path is not None:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(p, dpi=150, bbox_inches="tight")
    return fig


def _point_labels(rows: pd.DataFrame) -> list[tuple[str, tuple[float, float]]]:
    """One label per distinct front point: the GPUs its plan uses and which variants sit there."""
    points: dict[tuple[float, float], list[object]] = {}
    for i, r in rows.iterrows():
        points.setdefault((round(float(r[X]), 6), round(float(r[Y]), 3)), []).append(i)
    out = []
    for (x, y), idx in points.items():
        first = rows.loc[min(idx, key=lambda i: rows.loc[i].get("variant", i))]
        name = first.get("variant", idx[0])
        more = f" +{len(idx) - 1}" if len(idx) > 1 else ""
        out.append((f"{first.get('gpu_mix', '')} (#{name}{more})", (x, y)))
    return out


__all__ = ["FIGURE_SUFFIXES", "pareto_figure", "pareto_front"]
