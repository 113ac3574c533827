"""``tangram-opt plan``: specs from the flags, the search with its live progress line, the summary,
the plan file and the exports (layer: command line)."""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tangram_opt.cli.common import (EXIT_OK, PROG, UsageError, _console, _fmt_s, _load_cluster, _load_model, _note,
                                    _print)
from tangram_opt.errors import SpecError


class SolveProgress:
    """Receives :class:`SearchEvent` s: a rich live line on a terminal, else plain lines on change."""

    def __init__(self, *, time_limit_s: float, live: bool, quiet: bool = False, stream: Any = None,
                 unit: str = "s"):
        self.time_limit_s = time_limit_s
        #: the unit of the objective the events carry: "s" (step time) or a dollar unit (--objective)
        self.unit = unit
        self.live_mode = live and not quiet
        self.quiet = quiet
        self.stream = stream or sys.stderr
        self.t0 = time.perf_counter()
        self.incumbent_s: float | None = None
        self.bound_s: float | None = None
        self.message = "building candidate tables"
        self._last: tuple[float | None, float | None] | None = None
        self._live: Any = None

    # rich renders this object (elapsed time ticks even between events)
    def __rich__(self) -> Any:
        from rich.progress_bar import ProgressBar
        from rich.table import Table

        el = time.perf_counter() - self.t0
        g = Table.grid(padding=(0, 1))
        g.add_column(width=16)
        g.add_column()
        limit = max(self.time_limit_s, 1e-9)
        g.add_row(ProgressBar(total=limit, completed=min(el, limit), width=16), self._line(el))
        return g

    def _gap(self) -> float | None:
        if self.incumbent_s is None or self.bound_s is None or self.incumbent_s <= 0:
            return None
        return max(0.0, (self.incumbent_s - self.bound_s) / self.incumbent_s)

    def _line(self, elapsed: float) -> str:
        gap = self._gap()
        fmt = _fmt_s if self.unit == "s" else (lambda x: "-" if x is None or not math.isfinite(x)
                                                else f"{x:.6g} {self.unit}")
        return (f"{elapsed:6.1f} s / {self.time_limit_s:g} s | best {fmt(self.incumbent_s)} | bound "
                f"{fmt(self.bound_s)} | gap {'-' if gap is None else f'{100 * gap:.2f}%'} | {self.message}")

    def __enter__(self) -> SolveProgress:
        self.t0 = time.perf_counter()
        if self.live_mode:
            from rich.live import Live

            self._live = Live(self, console=_console(stderr=True), refresh_per_second=8, transient=True)
            self._live.__enter__()
        elif not self.quiet:
            what = "step time" if self.unit == "s" else self.unit
            self._print(f"solving (time limit {self.time_limit_s:g} s): elapsed | best plan's {what} (incumbent) | "
                        "lower bound | gap")
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)
            self._live = None
        if self.live_mode and exc[0] is None:
            self._print(self._line(time.perf_counter() - self.t0))

    def _print(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def __call__(self, ev: Any) -> None:
        if ev.incumbent_s is not None:
            self.incumbent_s = ev.incumbent_s
        if ev.bound_s is not None:
            self.bound_s = ev.bound_s
        heartbeat = ": incumbent" in ev.message
        if ev.message and (not heartbeat or self.live_mode):
            self.message = _readable(ev.message)
        if self.quiet or self.live_mode:
            return
        state = (self.incumbent_s, self.bound_s)
        phase = bool(ev.message) and not ev.message.startswith("b=") and ev.message != "done"
        if state != self._last or phase:
            self._last = state
            self._print(self._line(ev.elapsed_s))


def _readable(message: str) -> str:
    """``b=2: optimal`` -> ``pipeline micro-batch 2: optimal`` (the search's sub-problem names)."""
    if message.startswith("b="):
        head, _, rest = message.partition(":")
        rest = rest.strip()
        if rest.startswith("incumbent "):
            val = rest.split(" ", 1)[1]
            try:
                rest = f"sub-problem incumbent {float(val):.4f} s"
            except ValueError:
                rest = "searching"
        return f"pipeline micro-batch {head[2:]}: {rest}"
    return message


def _auto_precision(cluster: Any) -> str:
    unsupported = sorted({g.gpu.name for g in cluster.node_groups if not g.gpu.supports("bf16")})
    if unsupported:
        _note(f"precision: fp16 ({', '.join(unsupported)} cannot train in bf16; pass --precision to choose)")
        return "fp16"
    return "bf16"


def _training(args: argparse.Namespace, cluster: Any, model: Any):  # type: ignore[no-untyped-def]
    from tangram_opt.planner.search.api import default_seq_len
    from tangram_opt.specs import TrainingSpec, load_training

    if args.training:
        if args.batch or args.seq or args.precision != "auto":
            raise UsageError(f"{PROG} plan: error: --training replaces --batch, --seq and --precision; give one or "
                             "the other")
        return load_training(args.training)
    precision = _auto_precision(cluster) if args.precision == "auto" else args.precision
    return TrainingSpec(global_batch_size=args.batch or 512, seq_len=args.seq or default_seq_len(model),
                        precision=precision)


def _space(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from tangram_opt.planner.space import SearchSpace

    kw: dict[str, Any] = {"schedule": args.schedule}
    for name in ("max_stages", "tp", "cp", "zero", "recompute", "micro_batch_sizes"):  # flags left out keep defaults
        if getattr(args, name) is not None:
            kw[name] = getattr(args, name)
    return SearchSpace(**kw)


def _export_formats(names: Sequence[str] | None) -> tuple[str, ...]:
    from tangram_opt.export import FORMATS

    out = tuple(n.lower() for n in (names or ()))
    bad = [n for n in out if n not in FORMATS]
    if bad:
        raise UsageError(f"{PROG} plan: error: --export {','.join(bad)} is not a format; use {', '.join(FORMATS)}")
    return out


def cmd_plan(args: argparse.Namespace) -> int:
    from tangram_opt.export import PlanFile, export_notes, save_plan_file, write_exports
    from tangram_opt.planner.search import SearchOptions, solve
    from tangram_opt.show.summary import summary_renderable
    from tangram_opt.solvers import DEFAULT_BACKEND, get_backend

    formats = _export_formats(args.export)
    if args.export_dir and not formats:
        raise UsageError(f"{PROG} plan: error: --export-dir needs --export (e.g. --export megatron)")
    from tangram_opt.specs import check_precision

    cluster = _load_cluster(args.cluster)
    model = _load_model(args.model)
    space = _space(args)
    backend = args.backend or DEFAULT_BACKEND
    get_backend(backend)
    training = _training(args, cluster, model)
    check_precision(training, cluster)
    live = sys.stderr.isatty() and not args.plain
    _note(f"planning {model.name} on {cluster.name} ({cluster.num_gpus} GPUs): global batch "
          f"{training.global_batch_size} x {training.seq_len} tokens, {training.precision}, backend {backend}")
    calibration, profiles = _cost_inputs(args, cluster, model, training)
    price = None
    from tangram_opt.planner.search import Objective

    try:
        goal = Objective(kind=args.objective, budget_usd_per_h=args.budget_usd_per_h,
                         min_tokens_per_s=args.min_tokens_per_s, max_nodes=args.max_nodes)
    except SpecError as e:  # name the flag
        flag = "--" + e.field.split("[")[0].replace("_", "-")
        raise SpecError(flag, e.value, e.problem, f"give {flag} a finite number > 0, or leave it out") from None
    if args.launch and not goal.is_default:
        raise SpecError("--launch", args.launch, f"cannot be combined with {goal.describe()}: launch targets are "
                        "searched for throughput only", "drop --launch, or --objective and the limits")
    if not goal.is_default:
        _note(f"objective: {goal.describe()} (single pipelines, priced MIPs; formulations/pipeline_mip.md §4b)")
    unit = "s" if goal.kind == "throughput" else goal.unit
    with SolveProgress(time_limit_s=args.time_limit, live=live, quiet=args.quiet, unit=unit) as progress:
        common = dict(backend=backend, threads=args.threads, seed=args.seed, rel_gap=args.gap, space=space,
                      options=SearchOptions(warm_start=not args.no_warm_start), calibration=calibration,
                      profiles=profiles, on_progress=progress)
        if not goal.is_default:
            common["objective"] = goal
        if args.start:
            from tangram_opt.export.envelope import read_plan_file

            common["start"] = read_plan_file(args.start).plan
        if args.launch:
            from tangram_opt.planner.search import launch_price
            from tangram_opt.planner.search.launch import check_launch, launch_calibration

            rules = check_launch(args.launch, training.precision, model)
            _note(f"launch target {args.launch}: searching plans it runs as one job, then the whole space "
                  "(half the time each) for the price of a stock launch")
            price = launch_price(cluster, model, training, launch=args.launch, time_limit_s=args.time_limit,
                                 **common)  # type: ignore[arg-type]
            plan = price.launch_plan
            calibration = launch_calibration(rules, calibration)  # what the plan was priced with
        else:
            plan = solve(cluster, model, training, time_limit_s=args.time_limit, **common)  # type: ignore[arg-type]
    _print(summary_renderable(plan), args.width)
    if price is not None:
        _print(price.describe(), args.width)
    kept = tuple(profiles) if profiles is not None else ()
    if args.output:
        path = save_plan_file(args.output, plan, cluster=cluster, model=model, training=training,
                              calibration=calibration, profiles=kept)
        _note(f"plan file written: {path}")
    if formats:
        out_dir = Path(args.export_dir) if args.export_dir else (Path(args.output).parent if args.output else Path("."))
        pf = PlanFile(plan=plan, cluster=cluster, model=model, training=training, calibration=calibration,
                      profiles=kept)
        for f in write_exports(pf, formats, out_dir):
            _note(f"export written: {f}")
        for fmt in formats:
            for n in export_notes(fmt, pf):
                _note(f"note ({fmt}): {n}")
    return EXIT_OK


def _cost_inputs(args: argparse.Namespace, cluster: Any, model: Any, training: Any) -> tuple[Any, Any]:
    """--calibration and --profiles read and checked against the run; says which GPU types they cover."""
    from tangram_opt.cost import check_profiles, load_calibration, load_profiles

    calibration = load_calibration(args.calibration) if args.calibration else None
    if calibration is not None:
        from tangram_opt.specs._io import load_structured_file
        from tangram_opt.specs.hardware import get_gpu_type

        listed = {get_gpu_type(str(g)).name for g in (load_structured_file(args.calibration).get("gpus") or {})}
        types = sorted({g.gpu.name for g in cluster.node_groups})
        named = [t for t in types if t in listed]
        _note(f"calibration {args.calibration}: its own entries for {', '.join(named) or 'no GPU type here'}"
              + (f"; its defaults for {', '.join(t for t in types if t not in listed)}" if len(named) < len(types)
                 else ""))
    profiles = None
    if args.profiles:
        profiles = load_profiles(args.profiles)
        check_profiles(profiles, model, training.seq_len, training.precision)
        types = {g.gpu.name for g in cluster.node_groups}
        covered = sorted(p.gpu_name for p in profiles if p.gpu_name in types)
        unused = sorted(p.gpu_name for p in profiles if p.gpu_name not in types)
        missing = sorted(types - set(covered))
        _note(f"measured profiles for {', '.join(covered) or 'no GPU type of this cluster'}"
              + (f"; computed costs for {', '.join(missing)}" if missing else ""))
        if unused:
            _note(f"profiles not used (no such GPU in {cluster.name}): {', '.join(unused)}")
    return calibration, profiles
