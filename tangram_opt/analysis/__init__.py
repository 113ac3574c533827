"""Analysis helpers built on ``solve``'s public outputs (not used by the planner itself).

- :mod:`.solver_study`: search traces, anytime gaps and model sizes as pandas tables, what
  docs/notebooks/solver_gaps.ipynb is written on.

Layer: consumers (beside sim, export and show), above the search.
"""
