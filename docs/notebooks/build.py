"""Build the notebooks of this folder from their percent-format sources, with outputs cleared.

    python docs/notebooks/build.py            # rewrite every <name>.ipynb next to its <name>.py
    python docs/notebooks/build.py --check    # exit 1 if a committed notebook differs from its source

A source is a Python script whose cells start with ``# %%`` (code) or ``# %% [markdown]``
(markdown, every line commented with ``# ``). ``# %% tags=["parameters"]`` tags a code cell
(papermill convention). Lines before the first cell marker (a header comment) are not copied.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
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


def build(source: Path) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = cells_of(source.read_text(encoding="utf-8"))
    for i, cell in enumerate(nb.cells):  # stable ids so a rebuild of an unchanged source is byte-identical
        cell["id"] = f"{source.stem.replace('_', '-')}-{i:02d}"
    nb.metadata = {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
                   "language_info": {"name": "python"},
                   "tangram_source": source.name}
    nbformat.validate(nb)
    return nb


def render(nb: nbformat.NotebookNode) -> str:
    return nbformat.writes(nb) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="fail if a notebook is out of date with its source")
    args = ap.parse_args(argv)
    stale = []
    for name in SOURCES:
        src = HERE / name
        target = src.with_suffix(".ipynb")
        text = render(build(src))
        if args.check:
            if not target.is_file() or target.read_text(encoding="utf-8") != text:
                stale.append(target.name)
        else:
            target.write_text(text, encoding="utf-8")
            print(f"wrote {target.relative_to(HERE.parent.parent)}")
    if stale:
        print(f"out of date with their sources: {', '.join(stale)}; run python docs/notebooks/build.py",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
