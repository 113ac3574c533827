"""``tangram-opt profile`` and ``tangram-opt calibrate``: measuring layers on a device, and fitting
the cost model to measured training runs (layer: command line)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from tangram_opt.cli.common import EXIT_OK, PROG, ComponentUnavailable, _console, _load_model, _note, _print
from tangram_opt.errors import SpecError


def cmd_profile(args: argparse.Namespace) -> int:
    from tangram_opt import profiling

    model = _load_model(args.model)
    req = profiling.ProfileRequest(
        model=model, seq_len=args.seq, micro_batch_sizes=tuple(args.micro_batch_sizes), tp=tuple(args.tp),
        gpu=args.gpu_name, precision=args.precision, device=args.device, attention=args.attention,
        warmup=args.warmup, repeats=args.repeats, ep=args.ep,
        kinds=tuple(k.lower() for k in args.kinds) if args.kinds else None)
    try:
        profiling.check_request(req)
        out_dir = profiling.check_output_dir(args.output)
        n = len(req.layer_kinds) * len(set(req.tp)) * len(set(req.micro_batch_sizes))
        if not args.quiet:
            _note(f"profiling {model.name}: {', '.join(req.layer_kinds)} x tp {','.join(map(str, sorted(set(req.tp))))}"
                  f" x micro-batch {','.join(map(str, sorted(set(req.micro_batch_sizes))))} = {n} entries at "
                  f"sequence length {req.seq_len}; {req.warmup} warm-up + {req.repeats} timed passes each")
        with _ProfileProgress(live=sys.stderr.isatty() and not args.plain, quiet=args.quiet) as progress:
            result = profiling.run_profile(req, on_progress=progress.update, on_note=progress.note,
                                           on_entry=progress.entry)
        path, csv_path, warns = profiling.write_profile(result, out_dir)
    except profiling.TorchUnavailableError as e:
        raise ComponentUnavailable(str(e)) from None
    except SpecError as e:  # name the command-line flag, not the Python field
        if e.field in profiling.CLI_FLAGS:
            raise type(e)(profiling.CLI_FLAGS[e.field], e.value, e.problem, e.fix, source=e.source) from None
        raise
    _print(_profile_table(result), args.width)
    _note(f"profile written: {path} ({len(result.profile.entries)} entries, {result.profile.gpu}, "
          f"{result.profile.precision}, sequence length {result.profile.seq_len})")
    _note(f"raw measurements: {csv_path}")
    for w in warns:
        _note(f"warning: {w}")
    from statistics import median

    from tangram_opt.profiling.run import spread

    noise = median(max(spread(r.fwd_times_s), spread(r.bwd_times_s)) for r in result.results)
    if noise > 0.25:
        _note(f"warning: the timed passes vary by {100 * noise:.0f}% (median spread): the device was busy or the "
              "layers are tiny; measure on an idle device, or raise --repeats")
    plan_precision = "fp32" if result.profile.precision in ("fp32", "tf32") else result.profile.precision
    _note(f"plan with it: {PROG} plan --cluster CLUSTER --model {args.model} --seq {req.seq_len} --precision "
          f"{plan_precision} --profiles {out_dir}")
    return EXIT_OK


class _ProfileProgress:
    """Progress of a profiling run on stderr: a rich bar on a terminal, else one line per measured entry."""

    def __init__(self, *, live: bool, quiet: bool):
        self.live_mode, self.quiet = live and not quiet, quiet
        self._progress: Any = None
        self._task: Any = None
        self._entries = 0

    def __enter__(self) -> _ProfileProgress:
        if self.live_mode:
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                                       TimeRemainingColumn)

            self._progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                      TimeElapsedColumn(), TimeRemainingColumn(), console=_console(stderr=True),
                                      transient=True)
            self._progress.__enter__()
            self._task = self._progress.add_task("starting", total=None)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._progress is not None:
            self._progress.__exit__(*exc)
            self._progress = None

    def update(self, label: str, done: int, total: int) -> None:
        if self._progress is not None:
            self._progress.update(self._task, description=f"{label:<22}", completed=done, total=total)

    def note(self, text: str) -> None:
        if self.quiet:
            return
        if self._progress is not None:
            self._progress.console.print(text, highlight=False, markup=False)
        else:
            _note(text)

    def entry(self, r: Any) -> None:
        self._entries += 1
        if self.quiet or self._progress is not None:
            return
        e = r.entry
        rate = r.achieved_flops_per_s
        _note(f"  {e.kind:<9} tp {e.tp} mb {e.micro_batch_size}: fwd {1e3 * e.fwd_time_s:.3f} ms, bwd "
              f"{1e3 * e.bwd_time_s:.3f} ms" + (f", {rate / 1e12:.2f} TFLOP/s" if rate else ""))


def _profile_table(result: Any) -> Any:
    from rich import box
    from rich.console import Group
    from rich.table import Table

    from tangram_opt import units as u
    from tangram_opt.profiling.run import spread

    p = result.profile
    head = (f"{p.model} on {p.gpu} ({result.device}), {p.precision}, sequence length {p.seq_len}: median of "
            f"{len(result.results[0].fwd_times_s)} passes per entry")
    gpu = any(r.peak_allocated_bytes is not None for r in result.results)
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    cols = ["kind", "tp", "mb", "fwd ms", "bwd ms", "bwd/fwd", "spread", "TFLOP/s"] + (["peak GiB"] if gpu else [])
    for c in cols:
        t.add_column(c, justify="left" if c == "kind" else "right", no_wrap=True)
    for r in result.results:
        e = r.entry
        rate = r.achieved_flops_per_s
        row = [e.kind, str(e.tp), str(e.micro_batch_size), f"{1e3 * e.fwd_time_s:.3f}", f"{1e3 * e.bwd_time_s:.3f}",
               f"{e.bwd_time_s / e.fwd_time_s:.2f}" if e.fwd_time_s > 0 else "-",
               f"{100 * max(spread(r.fwd_times_s), spread(r.bwd_times_s)):.0f}%",
               "-" if rate is None else f"{rate / 1e12:.3g}"]
        if gpu:
            row.append("-" if r.peak_allocated_bytes is None else f"{r.peak_allocated_bytes / u.GiB:.2f}")
        t.add_row(*row)
    legend = ("spread: (max - min) / median of the timed passes; TFLOP/s: model FLOPs (forward + backward, the MFU "
              "convention) per second on this rank")
    out: list[Any] = [head, t, legend]
    if result.skipped:
        out.append("not measured: " + ", ".join(f"{k} tp{tp} mb{mb} ({why})" for k, tp, mb, why in result.skipped))
    return Group(*out)


def cmd_calibrate(args: argparse.Namespace) -> int:
    from rich import box
    from rich.table import Table

    from tangram_opt.calibrate import check_memory_reserve, fit_measurements, load_base_calibration, load_measurements
    from tangram_opt.cost import save_calibration

    runs = load_measurements(args.measurements)
    base = load_base_calibration(args.base) if args.base else None
    if base is not None:
        check_memory_reserve(base, (r.gpu for r in runs), source=args.base)
    out = Path(args.output)
    if out.parent and not out.parent.exists():
        raise SpecError("--output", args.output, "is in a directory that does not exist", "create it first")
    _note(f"fitting {len(runs)} measured run(s) of {', '.join(sorted({r.gpu for r in runs}))}")
    fit = fit_measurements(runs, base, time_limit_s=args.time_limit)
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for name in ("run", "GPU", "GPUs", "measured s", "before s", "error", "after s", "error"):
        t.add_column(name, justify="left" if name in ("run", "GPU") else "right", no_wrap=True)

    def pct(e: float | None) -> str:
        return "-" if e is None else f"{100 * e:+.1f}%"

    def sec(v: float | None) -> str:
        return "-" if v is None else f"{v:.3f}"

    for r in fit.runs:
        t.add_row(r.run.name, r.run.gpu, str(r.run.num_gpus), sec(r.run.step_time_s), sec(r.before_s),
                  pct(r.before_error), sec(r.after_s), pct(r.after_error))
    _print(t, args.width)
    for r in fit.runs:
        if r.problem:
            _note(f"{r.run.name}: not planned as measured ({r.problem})")
    for gpu, scale in sorted(fit.scales.items()):
        _note(f"{gpu}: compute efficiencies x {scale:.3f}")
    before, after = fit.median_abs_error("before"), fit.median_abs_error("after")
    if before is not None and after is not None:
        _note(f"median |error|: {100 * before:.1f}% before, {100 * after:.1f}% after")
    for w in fit.warnings:
        _note(f"warning: {w}")
    if not fit.scales:
        raise SpecError("measurements", args.measurements, "no run could be planned as measured",
                        "check each run's configuration (the notes above say why)")
    header = (f"tangram_opt calibration fitted by 'tangram-opt calibrate {args.measurements}' to "
              f"{sum(r.after_s is not None for r in fit.runs)} measured run(s)")
    save_calibration(fit.calibration, out, gpus=sorted(fit.scales), sources=fit.sources(), header=header)
    _note(f"calibration written: {out} (use: tangram-opt plan ... --calibration {out})")
    return EXIT_OK
