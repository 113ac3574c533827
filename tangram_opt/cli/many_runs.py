"""``tangram-opt bench`` and ``tangram-opt sweep``: many runs at once, the benchmark suite of a source
checkout and a sweep over cluster variants (layer: command line)."""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path
from typing import Any

from tangram_opt.cli.common import EXIT_OK, ComponentUnavailable, _note, _print
from tangram_opt.errors import SpecError


def _find_benchmarks() -> Path | None:
    """The directory that holds ``benchmarks/run.py``: ``$TANGRAM_BENCH_ROOT`` if set, else the current
    directory or the source checkout this tangram_opt was installed from (``pip install -e``)."""
    env_root = os.environ.get("TANGRAM_BENCH_ROOT")
    roots = (Path(env_root),) if env_root else (Path.cwd(), Path(__file__).resolve().parents[2])
    for root in roots:
        if (root / "benchmarks" / "run.py").is_file():
            return root
    return None


def cmd_bench(args: argparse.Namespace) -> int:
    import subprocess

    root = _find_benchmarks()
    if root is None:
        raise ComponentUnavailable("the benchmark suite (benchmarks/run.py) was not found: run 'tangram-opt bench' "
                                   "from a tangram_opt source checkout (benchmarks are not installed with the package)")
    rest = [a for a in (args.rest or []) if a != "--"]
    cmd = [sys.executable, "-m", "benchmarks.run"] + (["--quick"] if args.quick else []) + rest
    _note("running: " + " ".join(cmd))
    env = dict(os.environ)
    env["PYTHONPATH"] = str(root) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return subprocess.call(cmd, cwd=root, env=env)


def cmd_sweep(args: argparse.Namespace) -> int:
    from rich import box
    from rich.console import Group
    from rich.table import Table

    from tangram_opt.sweeps import RayUnavailableError, load_sweep, require_ray, sweep

    spec = load_sweep(args.sweep_file)
    if args.ray_address is not None:
        try:
            require_ray()
        except RayUnavailableError as e:
            raise ComponentUnavailable(str(e)) from None
    if args.output and not Path(args.output).resolve().parent.is_dir():
        raise SpecError("--output", args.output, "is in a directory that does not exist", "create it first")
    if not args.quiet:
        _note(f"sweep {spec.name!r}: {spec.size} variant(s) over {', '.join(a.key for a in spec.axes) or 'no axis'}")
    done = [0]

    def progress(row: dict[str, Any]) -> None:
        done[0] += 1
        if args.quiet:
            return
        what = row["status"]
        if math.isfinite(row["tokens_per_s"]):
            what += f", {row['tokens_per_s']:,.0f} tokens/s, ${row['usd_per_hour']:,.2f}/h"
        elif row["message"]:
            what += f": {row['message']}"
        _note(f"[{done[0]:>{len(str(spec.size))}}/{spec.size}] {row['label']}: {what}")

    try:
        df = sweep(spec, workers=args.workers, ray_address=args.ray_address, figure=args.figure,
                   time_limit_s=args.time_limit, backend=args.backend, rel_gap=args.gap,
                   multi_pipeline=args.multi_pipeline, on_result=progress)
    except RayUnavailableError as e:
        raise ComponentUnavailable(str(e)) from None
    front = df[df["pareto"]].sort_values(["model", "usd_per_hour", "variant"])
    points: dict[tuple[str, float, float], list[Any]] = {}  # variants at the same point: one row
    for _, r in front.iterrows():
        points.setdefault((r["model"], round(r["usd_per_hour"], 6), round(r["tokens_per_s"], 3)), []).append(r)
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for name in ("#", "variant", "GPUs used", "tokens/s", "$/h", "$/1M tokens", "gap", "same point"):
        t.add_column(name, justify="left" if name in ("variant", "GPUs used") else "right")
    for rows in points.values():
        r = rows[0]
        t.add_row(str(r["variant"]), str(r["label"]), str(r["gpu_mix"]), f"{r['tokens_per_s']:,.0f}",
                  f"{r['usd_per_hour']:,.2f}", f"{r['usd_per_1m_tokens']:.4f}",
                  "-" if not math.isfinite(r["gap"]) else f"{100 * r['gap']:.2f}%",
                  f"+{len(rows) - 1}" if len(rows) > 1 else "")
    counts = ", ".join(f"{n} {s}" for s, n in df["status"].value_counts().items())
    head = (f"{spec.name}: {len(df)} variants ({counts}), {df.attrs['distinct_solves']} distinct solve(s); "
            f"Pareto front of tokens/s against USD per hour of the GPUs used (gap: certified, on the step time; "
            f"same point: further variants with this plan's throughput and price):")
    _print(Group(head, t), args.width)
    if args.output:
        df.drop(columns=["plan"]).to_csv(args.output, index=False)
        _note(f"sweep table written: {args.output}")
    if args.figure:
        _note(f"Pareto figure written: {args.figure}")
    return EXIT_OK
