"""Free-format MPS writer for :class:`~tangram_opt.solvers.model.LinearModel`.

MPS is the lingua franca of MIP solvers; we write names that are safe for every reader
(no spaces) and mark integer columns with quoted ``'MARKER' 'INTORG'`` / ``'INTEND'`` blocks (HiGHS
ignores unquoted markers and would read the columns as continuous).
"""

from __future__ import annotations

import math
import re

from tangram_opt.solvers.model import LinearModel


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.\[\]\-]", "_", name)[:255] or "x"


def write_mps(model: LinearModel, path: str) -> None:
    rows = [(_safe(c.name), c) for c in model.constraints]
    col_entries: dict[int, list[tuple[str, float]]] = {v.index: [] for v in model.vars}
    for i, c in model.objective.coefs.items():
        col_entries[i].append(("OBJ", c))
    for name, c in rows:
        for i, a in c.coefs.items():
            col_entries[i].append((name, a))
    out = [f"NAME {_safe(model.name)}", "ROWS", " N OBJ"]
    rhs, ranges = [], []
    for name, c in rows:
        if c.lb == c.ub:
            out.append(f" E {name}")
            rhs.append((name, c.ub))
        elif math.isinf(c.lb):
            out.append(f" L {name}")
            rhs.append((name, c.ub))
        elif math.isinf(c.ub):
            out.append(f" G {name}")
            rhs.append((name, c.lb))
        else:
            out.append(f" G {name}")
            rhs.append((name, c.lb))
            ranges.append((name, c.ub - c.lb))
    out.append("COLUMNS")
    in_int = False
    for v in model.vars:
        if v.integer and not in_int:
            out.append(" MARKER 'MARKER' 'INTORG'")
            in_int = True
        elif not v.integer and in_int:
            out.append(" MARKER 'MARKER' 'INTEND'")
            in_int = False
        entries = col_entries[v.index] or [("OBJ", 0.0)]
        for row, a in entries:
            out.append(f" {_safe(v.name)} {row} {a:.17g}")
    if in_int:
        out.append(" MARKER 'MARKER' 'INTEND'")
    out.append("RHS")
    if model.objective.const:
        out.append(f" RHS OBJ {-model.objective.const:.17g}")
    for name, val in rhs:
        if val:
            out.append(f" RHS {name} {val:.17g}")
    if ranges:
        out.append("RANGES")
        for name, val in ranges:
            out.append(f" RNG {name} {val:.17g}")
    out.append("BOUNDS")
    for v in model.vars:
        n = _safe(v.name)
        if v.integer and v.lb == 0 and v.ub == 1:
            out.append(f" BV BND {n}")
            continue
        if v.lb == v.ub:
            out.append(f" FX BND {n} {v.lb:.17g}")
            continue
        if math.isinf(v.lb):
            out.append(f" MI BND {n}")
        elif v.lb != 0:
            out.append(f" LO BND {n} {v.lb:.17g}")
        if math.isinf(v.ub):
            if v.integer:
                out.append(f" PL BND {n}")
        else:
            out.append(f" UP BND {n} {v.ub:.17g}")
    out.append("ENDATA")
    with open(path, "w", encoding="ascii") as f:
        f.write("\n".join(out) + "\n")
