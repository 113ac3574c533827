"""``tangram-opt show`` and ``tangram-opt simulate``: what a saved plan file holds, shown, exported or
replayed by the simulator (layer: command line)."""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tangram_opt.cli.common import (EXIT_OK, PROG, ComponentUnavailable, _load_cluster, _load_model, _note,
                                    _print)
from tangram_opt.errors import SpecError

#: what tangram_opt.show.plots writes, by suffix
PICTURE_SUFFIXES = (".png", ".svg", ".pdf")


def _read_plan(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """The plan file, with ``--cluster`` / ``--model`` in place of the specs it holds, refused when the plan
    does not match the specs it is then shown or replayed against."""
    from dataclasses import replace

    from tangram_opt.export import read_plan_file

    pf = read_plan_file(args.plan_file)
    flags = [f"--{name}" for name in ("cluster", "model") if getattr(args, name, None)]
    if getattr(args, "cluster", None):
        pf = replace(pf, cluster=_load_cluster(args.cluster))
    if getattr(args, "model", None):
        pf = replace(pf, model=_load_model(args.model))
    diffs = pf.plan.spec_mismatches(cluster=pf.cluster, model=pf.model, training=pf.training_or_default)
    if diffs:
        given = " and ".join(flags)
        fix = (f"drop {given} (the plan file holds the specs it was planned for), or re-plan for these specs"
               if flags else f"restore the specs the plan file was written with, or re-plan with '{PROG} plan'")
        raise SpecError("plan", f"{pf.plan.model} on {pf.plan.cluster}",
                        f"does not match the specs {'given' if flags else 'the plan file holds'}:\n"
                        + "\n".join(f"  - {d}" for d in diffs), fix, source=pf.source)
    return pf


def _check_output(flag: str, path: str | None, suffixes: tuple[str, ...] = ()) -> None:
    """Refuse an output path before any work is done: a known suffix, not a directory, and a directory
    to write it in (the nearest existing one of its parents; missing ones are created) that takes files."""
    if not path:
        return
    p = Path(path)
    if suffixes and p.suffix.lower() not in suffixes:
        raise SpecError(flag, path, f"has no known suffix ({', '.join(suffixes)})",
                        f"end the name with one of {', '.join(suffixes)}")
    if p.is_dir():
        raise SpecError(flag, path, "is a directory", "give a file name")
    parent = next(a for a in p.absolute().parents if a.exists())
    if not parent.is_dir():
        raise SpecError(flag, path, f"{parent} is not a directory", "choose a path in a writable directory")
    try:
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as e:
        raise SpecError(flag, path, f"cannot be written: {parent} takes no new files ({e.strerror or e})",
                        "choose a path in a writable directory") from None


def _need(pf: Any, what: str, verb: str) -> Any:
    v = getattr(pf, what)
    if v is None:
        raise SpecError(what, None, f"the plan file {pf.source} does not contain the {what}",
                        f"pass --{what} to '{PROG} {verb}'")
    return v


def cmd_show(args: argparse.Namespace) -> int:
    from tangram_opt.export import export_notes, export_text, plan_file_json
    from tangram_opt.show.summary import plan_table, summary_renderable

    _check_output("--islands-picture", args.islands_picture, PICTURE_SUFFIXES)
    _check_output("--memory-picture", args.memory_picture, PICTURE_SUFFIXES)
    pf = _read_plan(args)
    plan = pf.plan
    if args.islands_picture:
        _need(pf, "cluster", "show")
    if args.format == "table":
        _print(summary_renderable(plan), args.width)
    elif args.format == "json":
        sys.stdout.write(plan_file_json(plan, cluster=pf.cluster, model=pf.model, training=pf.training,
                                        calibration=pf.calibration, profiles=pf.profiles))
    elif args.format == "csv":
        plan_table(plan).to_csv(sys.stdout, index=False)
    else:
        sys.stdout.write(export_text(args.format, pf))
        for n in export_notes(args.format, pf):
            _note(f"note: {n}")
    if args.islands_picture:
        from tangram_opt.show.plots import plot_islands

        plot_islands(plan, _need(pf, "cluster", "show"), save_path=args.islands_picture)
        _note(f"picture written: {args.islands_picture}")
    if args.memory_picture:
        from tangram_opt.show.plots import plot_memory

        plot_memory(plan, save_path=args.memory_picture)
        _note(f"picture written: {args.memory_picture}")
    return EXIT_OK


def _import_simulator() -> Callable[..., Any]:
    try:
        from tangram_opt.sim import simulate
    except ImportError as e:
        raise ComponentUnavailable(f"the simulator is not available in this installation (tangram_opt.sim: {e})") \
            from None
    return simulate


def cmd_simulate(args: argparse.Namespace) -> int:
    from rich import box
    from rich.table import Table

    from tangram_opt import units as u

    simulate = _import_simulator()
    _check_output("--trace", args.trace)
    _check_output("--picture", args.picture, PICTURE_SUFFIXES)
    pf = _read_plan(args)
    cluster, model = _need(pf, "cluster", "simulate"), _need(pf, "model", "simulate")
    plan = pf.plan
    kw = {"schedule": args.schedule} if args.schedule else {}
    res = simulate(plan, cluster, model, pf.training_or_default, **pf.cost_inputs, **kw)
    out: list[Any] = []
    diff = (res.step_time_s - plan.step_time_s) / plan.step_time_s if plan.step_time_s else 0.0
    out.append(f"{plan.model} on {plan.cluster}: simulated step {u.fmt_seconds(res.step_time_s)} "
              f"(plan predicted {u.fmt_seconds(plan.step_time_s)}, {100 * diff:+.2f}%), bubble "
              f"{100 * res.bubble_fraction:.1f}% of stage time, "
              f"{'fits in memory' if res.fits else 'EXCEEDS MEMORY'}")
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for name in ("pipeline", "stage", "stage (island, layers)", "GPUs", "busy s", "idle s", "bubble",
                 "peak GiB", "usable GiB", "ends at s"):
        t.add_column(name, justify="left" if name.startswith("stage (") else "right", no_wrap=True)
    for s in res.stages:
        t.add_row(str(s.pipeline), str(s.stage), s.label, str(s.gpus), f"{s.busy_s:.3f}", f"{s.idle_s:.3f}",
                  f"{100 * s.bubble_fraction:.1f}%", f"{s.peak_memory_bytes / u.GiB:.1f}",
                  f"{s.capacity_bytes / u.GiB:.1f}", f"{s.end_s:.3f}")
    out.append(t)
    if not args.schedule:
        problems = res.compare_with(plan).problems()
        if problems:
            out.append("differences from the plan's predictions beyond 2%:")
            out += [f"  - {pr}" for pr in problems]
        else:
            out.append("every stage agrees with the plan's predictions within 2%")
    from rich.console import Group

    _print(Group(*out), args.width)
    if args.trace:
        Path(args.trace).parent.mkdir(parents=True, exist_ok=True)
        res.to_dataframe().to_csv(args.trace, index=False)
        _note(f"trace written: {args.trace}")
    if args.picture:
        from tangram_opt.show.plots import plot_timeline

        plot_timeline(res, save_path=args.picture, show_sends=args.sends)
        _note(f"picture written: {args.picture}")
    return EXIT_OK
