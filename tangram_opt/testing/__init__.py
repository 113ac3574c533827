"""Test oracles: exhaustive enumeration of small plan spaces, against which the tests hold the
certificates (not used by the planner itself).

- :mod:`.exhaustive`: every single-pipeline plan of a tiny instance (``brute_force``);
- :mod:`.exhaustive_multi`: every multi-pipeline plan over a declared template set.

Layer: consumers, above the search: imports the planning context and the formulations' problem types
to enumerate; the planner never imports it.
"""
