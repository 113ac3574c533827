"""The plan summaries of ``tangram_opt.show``: they live with the plan (tangram_opt/planner/plan_summary.py),
since ``Plan.summary()`` and ``Plan.to_dataframe()`` render them; this module keeps their ``show`` path."""

from tangram_opt.planner.plan_summary import (OPEN_PARTS_SHOWN, TABLE_COLUMNS, headline, open_parts, plan_metrics,
                                              plan_table, print_summary, summary_renderable, summary_text)

__all__ = ["OPEN_PARTS_SHOWN", "TABLE_COLUMNS", "headline", "open_parts", "plan_metrics", "plan_table",
           "print_summary", "summary_renderable", "summary_text"]
