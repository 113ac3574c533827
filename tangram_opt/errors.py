"""The user-facing error family.

Anything a user can cause (a bad file, a model that does not fit, a solver that found nothing in
time) raises a :class:`TangramError` subclass with a message that names the field, the value and
the fix. ``assert`` is kept for internal invariants only; an ``AssertionError`` is a bug in
tangram_opt, never the user's fault.
"""

from __future__ import annotations

from typing import Any


class TangramError(Exception):
    """Base class of every error tangram_opt raises on purpose."""


class SpecError(TangramError, ValueError):
    """Invalid input: a field of a cluster, model, GPU or training description is wrong.

    ``field`` is a dotted path to the offending value (``"node_groups[1].gpus_per_node"``),
    ``value`` the value found and ``fix`` a sentence telling the user what to do.
    """

    def __init__(self, field: str, value: Any, problem: str, fix: str = "", *, source: str = ""):
        self.field = field
        self.value = value
        self.problem = problem
        self.fix = fix
        self.source = source
        where = f"{source}: " if source else ""
        msg = f"{where}{field} = {value!r}: {problem}"
        if fix:
            msg += f". Fix: {fix}"
        super().__init__(msg)


class FormatError(SpecError):
    """A file could not be read or parsed (malformed YAML/JSON, wrong top-level type)."""


class InfeasibleError(TangramError):
    """Nothing in the plan space fits. The message says what came closest and by how much."""

    def __init__(self, message: str, *, closest: dict[str, Any] | None = None):
        self.closest = closest or {}
        super().__init__(message)


class NoSolutionError(TangramError):
    """A solver ran out of time (or failed) before finding any feasible plan."""


class SolverUnavailableError(TangramError):
    """The requested solver backend is not installed or not usable on this machine."""
