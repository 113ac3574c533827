"""Small validators shared by the spec dataclasses.

Each raises :class:`~tangram_opt.errors.SpecError` naming the field, the value and the fix, so a
mistake in a YAML file or a ``config.json`` never surfaces as a traceback from deep inside.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from tangram_opt.errors import SpecError


def positive_int(field: str, value: Any, *, source: str = "", allow_zero: bool = False) -> int:
    """Return ``value`` as an int, or raise naming ``field`` if it is not a positive integer."""
    if isinstance(value, str):
        fix = f"write {value.strip()} without quotes" if value.strip().isdigit() else "write an integer such as 8"
        raise SpecError(field, value, "must be a whole number, not a string", fix, source=source)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
        isinstance(value, float) and not value.is_integer()
    ):
        raise SpecError(field, value, "must be a whole number", "write an integer such as 8", source=source)
    value = int(value)
    if value < 0 or (value == 0 and not allow_zero):
        lowest = "0" if allow_zero else "1"
        raise SpecError(field, value, f"must be >= {lowest}", f"use a count of at least {lowest}", source=source)
    return value


def positive_float(field: str, value: Any, *, source: str = "", allow_zero: bool = False) -> float:
    """Return ``value`` as a finite float > 0 (or >= 0), or raise naming ``field``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecError(field, value, "must be a number", "write a number such as 1.5", source=source)
    value = float(value)
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise SpecError(field, value, f"must be finite and {bound}", "use a positive number", source=source)
    return value


def fraction(field: str, value: Any, *, source: str = "") -> float:
    """A number in (0, 1]."""
    value = positive_float(field, value, source=source)
    if value > 1.0:
        raise SpecError(field, value, "must be a fraction in (0, 1]", "write e.g. 0.5 for 50%", source=source)
    return value


def probability(field: str, value: Any, *, source: str = "") -> float:
    """A dropout probability in [0, 1)."""
    value = positive_float(field, value, source=source, allow_zero=True)
    if value >= 1.0:
        raise SpecError(field, value, "must be a probability in [0, 1)", "write e.g. 0.1, or 0.0 for no dropout",
                        source=source)
    return value


def one_of(field: str, value: Any, allowed: Iterable[str], *, source: str = "") -> str:
    """A string among ``allowed`` (compared case-insensitively); returns the canonical spelling."""
    allowed = list(allowed)
    if isinstance(value, str):
        for a in allowed:
            if a.lower() == value.lower():
                return a
    raise SpecError(field, value, "is not a known value", f"use one of {', '.join(allowed)}", source=source)


def boolean(field: str, value: Any, *, source: str = "") -> bool:
    """A real boolean (``true``/``false`` in YAML or JSON); strings like "yes" or numbers are rejected."""
    if not isinstance(value, bool):
        raise SpecError(field, value, f"must be true or false, not {type(value).__name__}",
                        "write true or false without quotes", source=source)
    return value


def text(field: str, value: Any, *, source: str = "") -> str:
    """A non-empty string."""
    if not isinstance(value, str) or not value.strip():
        raise SpecError(field, value, "must be a non-empty string", "write a name such as my-model", source=source)
    return value


def mapping(field: str, value: Any, *, source: str = "") -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise SpecError(field, value, f"must be a mapping, not {type(value).__name__}",
                        "write key: value pairs", source=source)
    return value


def no_unknown_keys(field: str, data: Mapping[str, Any], known: Iterable[str], *, source: str = "") -> None:
    """Reject typos: a key the schema does not know is an error, not silently ignored."""
    known = set(known)
    for key in data:
        if key not in known:
            close = closest(str(key), known)
            raise SpecError(f"{field}.{key}" if field else str(key), data[key], "is not a known field",
                            f"remove it or use one of: {', '.join(close)}", source=source)


def required(field: str, data: Mapping[str, Any], key: str, *, source: str = "", hint: str = "") -> Any:
    if key not in data or data[key] is None:
        path = f"{field}.{key}" if field else key
        raise SpecError(path, None, "is required but missing", hint or f"add '{key}:'", source=source)
    return data[key]


def _distance(a: str, b: str) -> int:
    """Levenshtein distance, for 'did you mean' suggestions."""
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def closest(name: str, candidates: Iterable[str], n: int = 3) -> list[str]:
    """The ``n`` candidates closest to ``name`` (case-insensitive edit distance)."""
    # edit distance first; among ties, names that share a prefix with ``name``, then alphabetical,
    # so suggestions are deterministic (``known`` is often a set)
    low = name.lower()
    return sorted(set(candidates), key=lambda c: (_distance(low, c.lower()), not c.lower().startswith(low[:3]),
                                                   c))[:n]


def near_misses(name: str, candidates: Iterable[str], n: int = 3) -> list[str]:
    """Like :func:`closest`, but only candidates within a third of ``name``'s length (typos, not guesses)."""
    limit = max(2, len(name) // 3)
    return [c for c in closest(name, candidates, n) if _distance(name.lower(), c.lower()) <= limit]


@contextmanager
def in_source(source: str) -> Iterator[None]:
    """Attach ``source`` (a file name) to any :class:`SpecError` raised inside that lacks one."""
    try:
        yield
    except SpecError as e:
        if source and not e.source:
            raise type(e)(e.field, e.value, e.problem, e.fix, source=source) from None
        raise
