"""Shared by every verb of the command line: exit codes, the errors that map to them, argument
types, console output, and loading the specs a verb names (layer: command line)."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from tangram_opt.errors import (FormatError, InfeasibleError, NoSolutionError, SolverUnavailableError, SpecError,
                                TangramError)

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_BAD_INPUT = 2
EXIT_INFEASIBLE = 3
EXIT_NO_PLAN = 4
EXIT_UNAVAILABLE = 5
EXIT_INTERRUPTED = 130

PROG = "tangram-opt"
#: Width of summaries written to a file or pipe (a terminal uses its own width).
PIPE_WIDTH = 120


class UsageError(Exception):
    """A command-line argument is wrong (argparse-level); exit code 2."""


class ComponentUnavailable(TangramError):
    """An optional part of tangram_opt (simulator, expert placement, benchmark suite) is missing."""


def exit_code_for(exc: BaseException) -> int:
    """The exit code for an exception raised while running a verb (docs/cli.md, "Exit codes")."""
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    if isinstance(exc, (UsageError, SpecError, FormatError)):  # FormatError is a SpecError; listed for clarity
        return EXIT_BAD_INPUT
    if isinstance(exc, InfeasibleError):
        return EXIT_INFEASIBLE
    if isinstance(exc, NoSolutionError):
        return EXIT_NO_PLAN
    if isinstance(exc, (SolverUnavailableError, ComponentUnavailable)):
        return EXIT_UNAVAILABLE
    if isinstance(exc, TangramError):
        return EXIT_BAD_INPUT
    if isinstance(exc, OSError):  # a path the user gave cannot be read or written
        return EXIT_BAD_INPUT
    return EXIT_INTERNAL


# --- argument parsing -------------------------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    """argparse that raises :class:`UsageError` (one line, exit 2) instead of printing usage."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: error: {message} (see '{self.prog} --help')")


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"{text} must be >= 1")
    return v


def _seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(v) or v < 0:
        raise argparse.ArgumentTypeError(f"{text} must be a number of seconds >= 0")
    return v


def _gap(text: str) -> float:
    """A relative gap: a fraction (0.01) or a percentage (1%)."""
    t = text.strip()
    try:
        v = float(t[:-1]) / 100 if t.endswith("%") else float(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a gap; write e.g. 0.01 or 1%") from None
    if not math.isfinite(v) or not 0 <= v < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a gap in [0, 1); write e.g. 0.01 or 1%")
    return v


def _int_list(text: str, minimum: int = 1, example: str = "1,2,4") -> tuple[int, ...]:
    """A comma-separated list of integers >= ``minimum`` (sizes and degrees: >= 1), no empty item."""
    items = text.replace(" ", "").split(",")
    try:
        vals = tuple(int(x) for x in items)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers with no empty item, "
                                         f"e.g. {example}") from None
    if any(v < minimum for v in vals):
        raise argparse.ArgumentTypeError(f"{text!r} must list integers >= {minimum}, e.g. {example}")
    return vals


def _zero_list(text: str) -> tuple[int, ...]:
    """A comma-separated list of ZeRO stages (0 allowed)."""
    return _int_list(text, minimum=0, example="0,1")


def _str_list(text: str) -> tuple[str, ...]:
    vals = tuple(x.strip() for x in text.split(",") if x.strip())
    if not vals:
        raise argparse.ArgumentTypeError("give at least one value")
    return vals


def _node_budget(text: str) -> dict[str, int]:
    """GROUP=N,GROUP=N: the most nodes of each named node group a plan may use."""
    out: dict[str, int] = {}
    for part in _str_list(text):
        name, sep, n = part.partition("=")
        try:
            out[name.strip()] = int(n)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{part!r} is not GROUP=NODES, e.g. v100=2") from None
        if not sep or not name.strip() or out[name.strip()] < 0:
            raise argparse.ArgumentTypeError(f"{part!r} is not GROUP=NODES with NODES >= 0, e.g. v100=2")
    return out


# --- output helpers ---------------------------------------------------------------------------------
def _console(stderr: bool = False, width: int | None = None):  # type: ignore[no-untyped-def]
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    tty = stream.isatty()
    return Console(file=stream, width=width or (None if tty else PIPE_WIDTH), highlight=False, emoji=False,
                   color_system="auto" if tty else None, force_terminal=tty, soft_wrap=False)


def _print(renderable: Any, width: int | None = None) -> None:
    """Print a rich renderable to stdout: coloured on a terminal, else plain text without trailing blanks."""
    if sys.stdout.isatty():
        _console(width=width).print(renderable)
        return
    import io

    from rich.console import Console

    buf = io.StringIO()
    Console(file=buf, width=width or PIPE_WIDTH, color_system=None, force_terminal=False, highlight=False,
            emoji=False, soft_wrap=False).print(renderable)
    sys.stdout.write("\n".join(line.rstrip() for line in buf.getvalue().splitlines()) + "\n")
    sys.stdout.flush()


def _note(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _fmt_s(x: float | None) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x:.4f} s"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[int] = ()) -> None:
    from rich import box
    from rich.table import Table

    t = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for i, h in enumerate(header):
        t.add_column(h, justify="right" if i in right else "left", no_wrap=i < len(header) - 1)
    for r in rows:
        t.add_row(*r)
    _print(t)


# --- specs named on the command line ------------------------------------------------------------
def _load_cluster(spec: str):  # type: ignore[no-untyped-def]
    from tangram_opt.specs import load_cluster

    return load_cluster(spec)


def _load_model(spec: str):  # type: ignore[no-untyped-def]
    from tangram_opt.specs import load_model

    return load_model(spec)
