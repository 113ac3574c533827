"""Build the notebooks of this folder from their percent-format sources (the committed ones executed).

    python docs/notebooks/build.py --execute  # rebuild every <name>.ipynb and run it in fast mode: what is committed
    python docs/notebooks/build.py            # rebuild every <name>.ipynb with outputs cleared (quick, no kernel)
    python docs/notebooks/build.py --check    # exit 1 if a committed notebook differs from its source

The committed notebooks are stored executed (fast mode), so a reader sees their tables and figures
without running them. ``--check`` compares only what the source determines (cell ids, types, sources
and tags, and the notebook metadata the builder sets); outputs, execution counts and the metadata
the kernel adds are ignored, so an executed notebook passes and a stale source fails.
``--execute`` needs nbclient and ipykernel (the test extra: ``pip install -e ".[test]"``).

A source is a Python script whose cells start with ``# %%`` (code) or ``# %% [markdown]``
(markdown, every line commented with ``# ``). ``# %% tags=["parameters"]`` tags a code cell
(papermill convention). Lines before the first cell marker (a header comment) are not copied.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import re
import sys
import tempfile
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent
SOURCES = ("solver_gaps.py",)
_MARKER = re.compile(r"^# %%(?P<md> \[markdown\])?(?P<rest>.*)$")


def cells_of(text: str) -> list[nbformat.NotebookNode]:
    """Split a percent-format script into notebook cells."""
    cells: list[nbformat.NotebookNode] = []
    kind, tags, body = None, [], []

    def flush() -> None:
        if kind is None:
            return
        while body and not body[-1].strip():
            body.pop()
        while body and not body[0].strip():
            body.pop(0)
        if kind == "markdown":
            lines = [ln[2:] if ln.startswith("# ") else ln.lstrip("#") for ln in body]
            cell = nbformat.v4.new_markdown_cell("\n".join(lines))
        else:
            cell = nbformat.v4.new_code_cell("\n".join(body))
        if tags:
            cell.metadata["tags"] = list(tags)
        cells.append(cell)

    for line in text.splitlines():
        m = _MARKER.match(line)
        if m:
            flush()
            kind = "markdown" if m.group("md") else "code"
            rest = m.group("rest").strip()
            tm = re.match(r"tags=(\[.*\])", rest)
            tags = json.loads(tm.group(1)) if tm else []
            body = []
        elif kind is not None:
            body.append(line)
    flush()
    return cells


def build_kernelspec() -> dict:
    return {"display_name": "Python 3", "language": "python", "name": "python3"}


def build(source: Path) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = cells_of(source.read_text(encoding="utf-8"))
    for i, cell in enumerate(nb.cells):  # stable ids so a rebuild of an unchanged source is byte-identical
        cell["id"] = f"{source.stem.replace('_', '-')}-{i:02d}"
    nb.metadata = {"kernelspec": build_kernelspec(),
                   "language_info": {"name": "python"},
                   "tangram_source": source.name}
    nbformat.validate(nb)
    return nb


def render(nb: nbformat.NotebookNode) -> str:
    return nbformat.writes(nb) + "\n"


def source_view(nb: nbformat.NotebookNode) -> dict:
    """The part of a notebook its source determines (what ``--check`` compares): not the outputs, the
    execution counts or the metadata a kernel adds (``language_info`` beyond its name)."""
    return {
        "nbformat": [nb.get("nbformat"), nb.get("nbformat_minor")],
        "metadata": {"kernelspec": nb.metadata.get("kernelspec"), "tangram_source": nb.metadata.get("tangram_source"),
                     "language": nb.metadata.get("language_info", {}).get("name")},
        "cells": [{"id": c.get("id"), "cell_type": c.cell_type, "source": c.source,
                   "tags": list(c.get("metadata", {}).get("tags", []))} for c in nb.cells],
    }


def is_current(target: Path, source: Path) -> bool:
    """Whether the notebook ``target`` holds exactly the cells ``source`` builds (outputs ignored)."""
    if not target.is_file():
        return False
    try:
        stored = nbformat.reads(target.read_text(encoding="utf-8"), as_version=4)
    except ValueError:  # not a notebook (e.g. a merge conflict): out of date
        return False
    return source_view(stored) == source_view(build(source))


#: name of the throwaway kernelspec ``execute`` registers (this interpreter, whatever kernels the machine has)
KERNEL = "tangram-notebook-build"


def _set_environ(values: dict[str, str | None]) -> None:
    """Set each variable of ``values`` (None: unset it)."""
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@contextlib.contextmanager
def _environ(**values: str | None):
    old = {k: os.environ.get(k) for k in values}
    try:
        _set_environ(values)
        yield
    finally:
        _set_environ(old)


def execute(nb: nbformat.NotebookNode, *, timeout: int = 1200, cwd: Path = HERE) -> nbformat.NotebookNode:
    """Run a copy of ``nb`` top to bottom in fast mode (``TANGRAM_NOTEBOOK_FULL=0``) and return it with
    its outputs. The kernel is this interpreter (a kernelspec in a temporary ``JUPYTER_PATH``) with the
    inline matplotlib backend, started in ``cwd`` (this folder, as tests/test_notebook.py does); it
    inherits the environment, so ``PYTHONPATH`` selects the tangram_opt it imports. Raises
    ``nbclient.exceptions.CellExecutionError`` on the first failing cell."""
    try:
        import ipykernel  # noqa: F401  (the kernel below runs ipykernel_launcher)
        import nbclient
    except ImportError as exc:
        raise SystemExit(f"executing the notebooks needs nbclient and ipykernel ({exc}); install the test extra: "
                         'pip install -e ".[test]"') from exc
    nb = copy.deepcopy(nb)
    with tempfile.TemporaryDirectory(prefix="tangram-nb-") as tmp:
        spec_dir = Path(tmp) / "kernels" / KERNEL
        spec_dir.mkdir(parents=True)
        (spec_dir / "kernel.json").write_text(json.dumps({
            "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "Python 3 (tangram_opt notebook build)", "language": "python"}))
        jupyter_path = os.pathsep.join(p for p in (tmp, os.environ.get("JUPYTER_PATH")) if p)
        # MPLBACKEND unset: the kernel's inline backend puts the figures in the cells
        with _environ(TANGRAM_NOTEBOOK_FULL="0", JUPYTER_PATH=jupyter_path, MPLBACKEND=None):
            client = nbclient.NotebookClient(nb, timeout=timeout, kernel_name=KERNEL, record_timing=False,
                                             resources={"metadata": {"path": str(cwd)}})
            client.execute()
    nb.metadata["kernelspec"] = build_kernelspec()  # the reader's kernel, not the throwaway one
    nb.metadata["tangram_execution"] = {"mode": "fast", "cpu_count": os.cpu_count()}
    nbformat.validate(nb)
    return nb


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true",
                      help="fail if a notebook's cells differ from its source (outputs are ignored)")
    mode.add_argument("--execute", action="store_true",
                      help="build, run in fast mode and write the notebook with its outputs (what is committed)")
    ap.add_argument("--timeout", type=int, default=1200, help="per-cell timeout of --execute, seconds")
    args = ap.parse_args(argv)
    stale = []
    for name in SOURCES:
        src = HERE / name
        target = src.with_suffix(".ipynb")
        shown = target.relative_to(HERE.parent.parent)
        if args.check:
            if not is_current(target, src):
                stale.append(target.name)
            continue
        nb = build(src)
        if args.execute:
            print(f"executing {shown} in fast mode...", flush=True)
            nb = execute(nb, timeout=args.timeout)
        target.write_text(render(nb), encoding="utf-8")
        size = target.stat().st_size
        print(f"wrote {shown} ({size / 1e6:.2f} MB, " + ("executed)" if args.execute else
              "outputs cleared; the committed notebook is the executed one: run with --execute before committing)"))
    if stale:
        print(f"out of date with their sources: {', '.join(stale)}; run python docs/notebooks/build.py --execute",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
