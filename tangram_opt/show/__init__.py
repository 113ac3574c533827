"""Readable summaries (rich text, pandas) and pictures (matplotlib) of plans and simulated steps.

``summary_text(plan)`` / ``plan_table(plan)`` back ``Plan.summary()`` / ``Plan.to_dataframe()``;
``plot_timeline``, ``plot_islands`` and ``plot_memory`` draw the pictures of docs/pictures.md.
Plots import matplotlib only when called.

Layer: consumers (beside sim, export and analysis), above the search.
"""

from tangram_opt.planner.plan_summary import (TABLE_COLUMNS, headline, open_parts, plan_metrics, plan_table,
                                              print_summary, summary_renderable, summary_text)


def __getattr__(name: str):  # lazy: matplotlib is imported only when a plot is asked for
    if name in ("plot_timeline", "plot_islands", "plot_memory", "save_figure"):
        from tangram_opt.show import plots

        return getattr(plots, name)
    raise AttributeError(f"module 'tangram_opt.show' has no attribute {name!r}")


__all__ = ["TABLE_COLUMNS", "headline", "open_parts", "plan_metrics", "plan_table", "print_summary",
           "summary_renderable", "summary_text", "plot_timeline", "plot_islands", "plot_memory", "save_figure"]
