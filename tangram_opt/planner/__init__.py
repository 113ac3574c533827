"""The planner: from a cluster, a model and a training run to a plan with a certified gap.

The layers, lowest first (each imports only its own and lower ones; tests/test_layers.py checks it):

- :mod:`.space`, :mod:`.islands`, :mod:`.plan` (+ :mod:`.plan_summary`): the plan space, the
  homogeneous islands of a cluster, and the plan with its certificate;
- :mod:`.candidates`: the candidate tables, the only part that reads the cost model;
- :mod:`.formulations`: the MIPs and bounds over those tables (never the cost model);
- :mod:`.context` (+ :mod:`.assemble`, :mod:`.diagnose`): one planning call's specs, tables and
  sub-problems; plans from decoded stages; why nothing fits;
- :mod:`.multi_pipeline`: plans of several data-parallel pipelines;
- :mod:`.search`: ``solve`` and the branch and bound.

docs/design.md draws the whole package.

This ``__init__`` itself belongs to the lowest planner layer (plan space, islands, plans) and
imports nothing.
"""
