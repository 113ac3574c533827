"""A sweep's local worker process: ``python -m tangram_opt.sweeps.worker``.

Reads one job per line on stdin (JSON, :func:`tangram_opt.sweeps.run.solve_job`'s input) and writes
its outcome as one JSON line on stdout, until stdin closes. Anything else that would go to stdout
(a solver's log, a stray print) is sent to stderr instead, so the answers cannot be corrupted.
"""

from __future__ import annotations

import json
import os
import sys


def _plain(obj: object) -> object:
    """numpy scalars (and anything else with ``item()``) as Python numbers; the rest as text."""
    item = getattr(obj, "item", None)
    return item() if callable(item) else str(obj)


def main() -> None:
    answers = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # C-level writes to fd 1 now go to stderr
    sys.stdout = sys.stderr
    from tangram_opt.sweeps.run import solve_job

    for line in sys.stdin:
        if not line.strip():
            continue
        answers.write(json.dumps(solve_job(json.loads(line)), default=_plain) + "\n")
        answers.flush()


if __name__ == "__main__":
    main()
