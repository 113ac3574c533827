"""``tangram-opt``: plan, show, simulate and export from the command line.

Verbs (``tangram-opt <verb> --help`` for each): ``plan``, ``show``, ``simulate``, ``islands``,
``clusters``, ``models``, ``experts``, ``profile``, ``calibrate``, ``bench``, ``sweep``. Exit codes (docs/cli.md):

====  ==========================================================================================
0     success (``plan``: a plan was found)
1     internal error: a bug in tangram_opt (one line, "please report"; ``--debug`` for the traceback)
2     bad input: a wrong argument, file or field (:class:`SpecError`, :class:`FormatError`, an unwritable path)
3     infeasible: nothing in the plan space fits (:class:`InfeasibleError`)
4     no plan within the time limit (:class:`NoSolutionError`)
5     a required component is unavailable: solver backend, PyTorch (profile), simulator, expert placement, benchmarks
130   interrupted (Ctrl-C)
====  ==========================================================================================

Progress and status lines go to stderr; summaries and exports go to stdout, so
``tangram-opt plan ... > summary.txt`` still shows the live progress.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
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


def _int_list(text: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(x) for x in text.replace(" ", "").split(",") if x)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers, e.g. 1,2,4") from None
    if not vals or any(v < 0 for v in vals):
        raise argparse.ArgumentTypeError(f"{text!r} must list integers >= 0, e.g. 1,2,4")
    return vals


def _str_list(text: str) -> tuple[str, ...]:
    vals = tuple(x.strip() for x in text.split(",") if x.strip())
    if not vals:
        raise argparse.ArgumentTypeError("give at least one value")
    return vals


EXAMPLES = {
    "plan": """examples:
  tangram-opt plan --cluster tiny-mixed --model llama-3-8b --batch 32 --seq 2048 --time-limit 30
  tangram-opt plan --cluster my_cluster.yaml --model ./Llama-3-8B/config.json --batch 512 --seq 4096 \\
      --output plan.json --export megatron --export-dir launch/
  tangram-opt plan --cluster two-zone --model llama-3-70b --time-limit 0     # heuristic plan + bound, no MIP
""",
    "show": """examples:
  tangram-opt show plan.json
  tangram-opt show plan.json --format megatron > megatron_args.sh
  tangram-opt show plan.json --format csv > stages.csv
  tangram-opt show plan.json --islands-picture islands.png --memory-picture memory.svg
""",
    "simulate": """examples:
  tangram-opt simulate plan.json
  tangram-opt simulate plan.json --picture timeline.png --trace trace.csv
  tangram-opt simulate plan.json --schedule gpipe     # replay the same stages under GPipe
""",
    "experts": """examples:
  tangram-opt experts --profile zipf --experts 64 --ranks 16 --nodes 2 --slots 5
  tangram-opt experts --loads loads.json --ranks 8 --nodes 1 --slots 9 --method greedy
""",
    "profile": """examples:
  tangram-opt profile --model llama-3-8b --seq 4096 --micro-batch-sizes 1,2,4 --tp 1,2,4 --output profiles/
  tangram-opt profile --model llama-3-8b --gpu-name V100-16 --precision fp16 --seq 4096 --tp 2,4 --output profiles/
  tangram-opt profile --model tiny.json --gpu-name A100-40 --device cpu --precision fp32 --seq 32 \\
      --micro-batch-sizes 1,2 --tp 1,2 --output /tmp/prof     # CPU: tests the workflow, not a GPU's speed
  then: tangram-opt plan --cluster my_cluster.yaml --model llama-3-8b --seq 4096 --profiles profiles/
""",
    "calibrate": """examples:
  tangram-opt calibrate measured_steps.yaml --output my_calibration.yaml
  tangram-opt calibrate steps.csv --base my_calibration.yaml --output my_calibration.yaml
  then: tangram-opt plan --cluster my_cluster.yaml --model llama-3-8b --calibration my_calibration.yaml
""",
    "bench": """examples:
  tangram-opt bench --quick
  tangram-opt bench --scenarios h100-64-llama-3-8b --out /tmp/bench   # other arguments go to benchmarks.run
  tangram-opt bench -- --help                                   # benchmarks.run's own help
""",
    "sweep": """examples:
  tangram-opt sweep benchmarks/sweeps/mixed-fleet.yaml --output sweep.csv --figure pareto.png
  tangram-opt sweep my_sweep.yaml --workers 2 --time-limit 5 --gap 1%
  tangram-opt sweep my_sweep.yaml --ray-address auto      # on a running Ray cluster (pip install 'tangram_opt[ray]')
""",
    "islands": "examples:\n  tangram-opt islands --cluster h100-a100-l4\n",
    "clusters": "examples:\n  tangram-opt clusters\n",
    "models": "examples:\n  tangram-opt models\n",
}


def build_parser() -> argparse.ArgumentParser:
    from tangram_opt import __version__

    p = _Parser(prog=PROG, formatter_class=argparse.RawDescriptionHelpFormatter,
                description="Plan LLM training on heterogeneous GPU clusters with a certified optimality gap.",
                epilog="""quick start:
  tangram-opt clusters                                   # built-in example clusters
  tangram-opt plan --cluster tiny-mixed --model llama-3-8b --batch 32 --seq 2048 --output plan.json
  tangram-opt show plan.json --format megatron

exit codes: 0 ok, 1 internal error, 2 bad input, 3 infeasible, 4 no plan within the time limit,
5 component unavailable (solver, simulator, ...), 130 interrupted. --debug shows tracebacks.
docs: docs/cli.md""")
    p.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = p.add_subparsers(dest="verb", metavar="VERB", parser_class=_Parser)

    def verb(name: str, help_: str, description: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help_, description=description, epilog=EXAMPLES.get(name),
                              formatter_class=argparse.RawDescriptionHelpFormatter)

    # plan ------------------------------------------------------------------------------------------
    pl = verb("plan", "find a training plan and print its summary",
              "Plan MODEL on CLUSTER: islands, per-island stage candidates, then a MIP over pipelines, with live "
              "progress (incumbent, bound, gap). Prints the plan summary; --output saves the plan file.")
    pl.add_argument("--cluster", required=True, help="cluster YAML/JSON file or built-in example name "
                                                     "(see 'tangram-opt clusters')")
    pl.add_argument("--model", required=True, help="model preset (see 'tangram-opt models'), Hugging Face "
                                                   "config.json or model directory, or tangram model YAML/JSON")
    pl.add_argument("--batch", type=_positive_int, default=None, metavar="N",
                    help="global batch in sequences (default 512)")
    pl.add_argument("--seq", type=_positive_int, default=None, metavar="N",
                    help="sequence length in tokens (default 4096)")
    pl.add_argument("--precision", choices=("auto", "bf16", "fp16", "fp32", "fp8"), default="auto",
                    help="training precision; auto = bf16 if every GPU type supports it, else fp16 (default auto); "
                         "fp8 = FP8 linear layers (Transformer Engine) in a bf16 model, Hopper/Ada/Blackwell/MI300X")
    pl.add_argument("--training", metavar="FILE", help="training spec YAML/JSON (replaces --batch/--seq/--precision)")
    pl.add_argument("--time-limit", type=_seconds, default=60.0, metavar="S",
                    help="solver time limit in seconds (default 60); 0 = heuristic plan and bound only, no MIP")
    pl.add_argument("--gap", type=_gap, default=1e-4, metavar="G",
                    help="stop once the plan is proved within this relative gap, e.g. 0.01 or 1%% (default 0.01%%)")
    pl.add_argument("--backend", default=None, help="MIP backend: highs (default), cp-sat, scip, cbc, pulp-cbc")
    pl.add_argument("--threads", type=_positive_int, default=1, metavar="N", help="solver threads (default 1); with HiGHS, N - 1 solver processes for leaf MIPs")
    pl.add_argument("--seed", type=int, default=0, metavar="N", help="solver random seed (default 0)")
    pl.add_argument("--max-stages", type=_positive_int, default=None, metavar="N",
                    help="most pipeline stages to consider")
    pl.add_argument("--tp", type=_int_list, metavar="LIST",
                    help="allowed tensor-parallel sizes, e.g. 1,2,4 (default: every valid)")
    pl.add_argument("--cp", type=_int_list, metavar="LIST", help="allowed context-parallel sizes (default 1,2,4,8)")
    pl.add_argument("--zero", type=_int_list, metavar="LIST", help="allowed ZeRO stages (default 0,1,2,3)")
    pl.add_argument("--recompute", type=_str_list, metavar="LIST",
                    help="allowed recomputation: none,selective,full (default all)")
    pl.add_argument("--micro-batch-sizes", type=_int_list, metavar="LIST",
                    help="allowed per-rank micro-batch sizes (default 1,2,4,8)")
    pl.add_argument("--schedule", choices=("1f1b", "gpipe"), default="1f1b", help="pipeline schedule (default 1f1b)")
    pl.add_argument("--launch", choices=("megatron", "deepspeed", "torchtitan"), default=None,
                    help="search only plans this framework runs as one job (every stage the same layout, one "
                         "pipeline), certified in that space, and print the price of the stock launch against the "
                         "whole space (half the time limit each)")
    pl.add_argument("--profiles", metavar="PATH",
                    help="measured layer profiles: a file or a directory of them ('tangram-opt profile' writes them); "
                         "they replace computed compute time for the GPU types they cover")
    pl.add_argument("--calibration", metavar="FILE",
                    help="calibration file (YAML/JSON; 'tangram-opt calibrate' writes one) replacing the shipped "
                         "efficiency table for the GPU types it names")
    pl.add_argument("--no-warm-start", action="store_true", help="do not seed the MIP with the greedy plan")
    pl.add_argument("--output", "-o", metavar="PLAN_JSON", help="write the plan file (plan + cluster + model + "
                                                                "training; see docs/cli.md)")
    pl.add_argument("--export", type=_str_list, metavar="FORMATS",
                    help="also write framework exports: megatron, deepspeed, torchtitan (comma-separated)")
    pl.add_argument("--export-dir", metavar="DIR", help="directory for --export files (default: next to --output, "
                                                        "else the current directory)")
    pl.add_argument("--plain", action="store_true", help="plain progress lines even on a terminal")
    pl.add_argument("--quiet", "-q", action="store_true", help="no progress output")
    pl.add_argument("--width", type=_positive_int, default=None, help="summary width in columns")

    # show ------------------------------------------------------------------------------------------
    sh = verb("show", "print a saved plan (table, JSON, CSV or a framework export)",
              "Print a plan file written by 'tangram-opt plan --output' in the chosen format, and draw pictures.")
    sh.add_argument("plan_file", metavar="PLAN_JSON")
    sh.add_argument("--format", "-f", default="table",
                    choices=("table", "json", "csv", "megatron", "deepspeed", "torchtitan"),
                    help="output format (default table)")
    sh.add_argument("--cluster", help="cluster (only needed when the plan file has none)")
    sh.add_argument("--model", help="model (only needed when the plan file has none)")
    sh.add_argument("--islands-picture", metavar="FILE", help="draw the islands and which stage runs where (.png/.svg)")
    sh.add_argument("--memory-picture", metavar="FILE", help="draw per-stage memory against capacity (.png/.svg)")
    sh.add_argument("--width", type=_positive_int, default=None, help="table width in columns")

    # simulate --------------------------------------------------------------------------------------
    si = verb("simulate", "replay one training step of a saved plan",
              "Replay one step of the plan with the discrete-event simulator (recomputing every stage from the specs) "
              "and compare with the plan's predictions.")
    si.add_argument("plan_file", metavar="PLAN_JSON")
    si.add_argument("--cluster", help="cluster (default: the one stored in the plan file)")
    si.add_argument("--model", help="model (default: the one stored in the plan file)")
    si.add_argument("--schedule", choices=("1f1b", "gpipe"), help="replay under another schedule")
    si.add_argument("--picture", metavar="FILE", help="draw the step timeline (.png/.svg)")
    si.add_argument("--sends", action="store_true", help="with --picture: also draw the p2p transfers")
    si.add_argument("--trace", metavar="CSV", help="write the event trace as CSV")
    si.add_argument("--width", type=_positive_int, default=None, help="table width in columns")

    # islands / clusters / models ---------------------------------------------------------------------
    isl = verb("islands", "show a cluster's islands and the links between them",
               "Group a cluster's nodes into islands (same node shape and zone) and show the pipeline links.")
    isl.add_argument("--cluster", required=True, help="cluster YAML/JSON file or built-in example name")
    verb("clusters", "list the built-in example clusters", "List the clusters shipped with tangram_opt.")
    verb("models", "list the built-in model presets", "List the model presets shipped with tangram_opt.")

    # experts ---------------------------------------------------------------------------------------
    ex = verb("experts", "place MoE experts (and replicas) on expert-parallel ranks",
              "Place routed experts on EP ranks to minimize the hottest rank's load, with a certified gap "
              "(tangram_opt.experts.place_experts).")
    src = ex.add_mutually_exclusive_group(required=True)
    src.add_argument("--loads", metavar="JSON", help="tokens per expert: a list (one layer) or list of lists")
    src.add_argument("--profile", choices=("zipf", "lognormal", "uniform"), help="synthetic load profile")
    ex.add_argument("--experts", type=_positive_int, default=64, help="experts (with --profile; default 64)")
    ex.add_argument("--skew", type=float, default=1.0, help="profile skew (with --profile; default 1.0)")
    ex.add_argument("--tokens", type=_positive_int, default=1_000_000, help="tokens per layer (with --profile)")
    ex.add_argument("--layers", type=_positive_int, default=1, help="layers (with --profile; default 1)")
    ex.add_argument("--profile-seed", type=int, default=0, help="profile random seed (default 0)")
    ex.add_argument("--ranks", type=_positive_int, required=True, help="expert-parallel ranks")
    ex.add_argument("--nodes", type=_positive_int, required=True, help="nodes the ranks are spread over")
    ex.add_argument("--slots", type=_positive_int, required=True, help="expert replicas each rank can hold")
    ex.add_argument("--method", choices=("mip", "greedy"), default="mip", help="mip (certified) or greedy (EPLB-style)")
    ex.add_argument("--time-limit", type=_seconds, default=10.0, metavar="S", help="per layer (default 10)")
    ex.add_argument("--backend", default=None, help="MIP backend (default highs)")
    ex.add_argument("--output", "-o", metavar="JSON", help="write the placement(s) as JSON")

    # profile ---------------------------------------------------------------------------------------
    pr = verb("profile", "measure a model's layers on this machine's GPU and write a layer profile",
              "Time one tensor-parallel rank of the model's transformer block(s), embedding and head (final norm + "
              "LM head + loss), forward and backward, on the local device for each --tp and micro-batch size, and "
              "write a tangram_opt.layer_profile JSON file into --output for 'plan --profiles'. TP collectives are "
              "not measured (the cost model adds them). Needs PyTorch: pip install 'tangram_opt[profile]'. "
              "See docs/user_guide/profiling.md.")
    pr.add_argument("--model", required=True, help="model preset (see 'tangram-opt models'), Hugging Face "
                                                   "config.json or model directory, or tangram model YAML/JSON")
    pr.add_argument("--gpu-name", metavar="NAME", help="catalog GPU type the file stands for, e.g. A100-80 (default: "
                                                       "recognized from the CUDA device; required on the CPU)")
    pr.add_argument("--seq", type=_positive_int, default=4096, metavar="N",
                    help="sequence length in tokens; must be the one you plan with (default 4096)")
    pr.add_argument("--micro-batch-sizes", type=_int_list, default=(1, 2, 4), metavar="LIST",
                    help="micro-batch sizes to measure, e.g. 1,2,4 (default 1,2,4)")
    pr.add_argument("--tp", type=_int_list, default=(1,), metavar="LIST",
                    help="tensor-parallel degrees to measure (one rank's shard each), e.g. 1,2,4 (default 1)")
    pr.add_argument("--precision", choices=("auto", "bf16", "fp16", "fp32", "tf32"), default="auto",
                    help="auto = bf16 on GPUs that have it, fp16 on older GPUs, fp32 on the CPU (default auto)")
    pr.add_argument("--device", default="auto", metavar="DEV",
                    help="auto (CUDA if present, else CPU), cpu, cuda or cuda:N (default auto)")
    pr.add_argument("--attention", choices=("sdpa", "eager"), default="sdpa",
                    help="sdpa: torch scaled_dot_product_attention (flash where available); eager: materialized "
                         "scores (default sdpa)")
    pr.add_argument("--ep", type=_positive_int, default=1, metavar="N",
                    help="MoE: measure one expert-parallel rank (num_experts / N experts) (default 1)")
    pr.add_argument("--kinds", type=_str_list, metavar="LIST",
                    help="layer kinds to measure: dense, moe, embedding, head (default: all of the model's)")
    pr.add_argument("--warmup", type=int, default=3, metavar="N", help="untimed passes per entry (default 3)")
    pr.add_argument("--repeats", type=_positive_int, default=10, metavar="N",
                    help="timed passes per entry; the median is recorded (default 10)")
    pr.add_argument("--output", "-o", required=True, metavar="DIR",
                    help="directory for the profile JSON (and its .measurements.csv); created if needed")
    pr.add_argument("--plain", action="store_true", help="plain progress lines even on a terminal")
    pr.add_argument("--quiet", "-q", action="store_true", help="no progress output")
    pr.add_argument("--width", type=_positive_int, default=None, help="table width in columns")

    # calibrate -------------------------------------------------------------------------------------
    ca = verb("calibrate", "fit a calibration file to training steps you measured",
              "Plan each measured run as it was launched, fit one compute factor per GPU type so the predicted "
              "step times match, print every run's error before and after, and write a calibration file that "
              "'plan --calibration' and solve(calibration=...) read. File format: tangram_opt.calibrate.")
    ca.add_argument("measurements", metavar="FILE", help="measured runs: YAML/JSON (runs: [...]) or CSV, one run each")
    ca.add_argument("--output", "-o", metavar="FILE", required=True, help="calibration file to write (YAML)")
    ca.add_argument("--base", metavar="FILE", help="calibration to start from (default: the shipped table)")
    ca.add_argument("--time-limit", type=_seconds, default=10.0, metavar="S",
                    help="solver time limit per planned run in seconds (default 10)")
    ca.add_argument("--width", type=_positive_int, default=None, help="table width in columns")

    # bench -----------------------------------------------------------------------------------------
    be = verb("bench", "run the benchmark suite (python -m benchmarks.run)",
              "Run the benchmark suite from a tangram_opt checkout (the benchmarks/ directory is not installed "
              "with the package). Arguments after -- are passed through.")
    be.add_argument("--quick", action="store_true", help="small instances only")
    be.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)

    # sweep -----------------------------------------------------------------------------------------
    sw = verb("sweep", "plan every variant of a what-if sweep; table, CSV and Pareto figure of throughput vs $/h",
              "Solve every variant of a sweep file (a base cluster, model and training run, and axes whose cartesian "
              "product is swept: node counts, GPU types, prices, batch sizes, models), price each plan and print "
              "the Pareto front of tokens/s against USD per hour. File format: docs/user_guide/costs_and_sweeps.md.")
    sw.add_argument("sweep_file", metavar="SWEEP_FILE", help="sweep YAML/JSON file")
    sw.add_argument("--output", "-o", metavar="CSV", help="write one row per variant (CSV)")
    sw.add_argument("--figure", metavar="FILE", help="write the Pareto figure (.png/.svg/.pdf)")
    sw.add_argument("--workers", type=_positive_int, default=None, metavar="N",
                    help="local worker processes (default: the machine's cores; 1 = solve in this process)")
    sw.add_argument("--ray-address", metavar="ADDR", default=None,
                    help="solve on Ray instead: local (start a runtime here), auto, or ray://host:10001 "
                         "(needs pip install 'tangram_opt[ray]')")
    sw.add_argument("--time-limit", type=_seconds, default=None, metavar="S",
                    help="solver time limit per variant in seconds (default: the file's, else 10)")
    sw.add_argument("--gap", type=_gap, default=None, metavar="G", help="relative gap per variant, e.g. 1%% "
                                                                          "(default: the file's, else solve's)")
    sw.add_argument("--backend", default=None, help="MIP backend (default: the file's, else highs)")
    sw.add_argument("--multi-pipeline", action=argparse.BooleanOptionalAction, default=None,
                    help="search multi-pipeline plans too (default: the file's, else solve's: on)")
    sw.add_argument("--quiet", "-q", action="store_true", help="no per-variant progress lines")
    sw.add_argument("--width", type=_positive_int, default=None, help="table width in columns")
    return p


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


class SolveProgress:
    """Receives :class:`SearchEvent` s: a rich live line on a terminal, else plain lines on change."""

    def __init__(self, *, time_limit_s: float, live: bool, quiet: bool = False, stream: Any = None):
        self.time_limit_s = time_limit_s
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
        return (f"{elapsed:6.1f} s / {self.time_limit_s:g} s | best {_fmt_s(self.incumbent_s)} | bound "
                f"{_fmt_s(self.bound_s)} | gap {'-' if gap is None else f'{100 * gap:.2f}%'} | {self.message}")

    def __enter__(self) -> SolveProgress:
        self.t0 = time.perf_counter()
        if self.live_mode:
            from rich.live import Live

            self._live = Live(self, console=_console(stderr=True), refresh_per_second=8, transient=True)
            self._live.__enter__()
        elif not self.quiet:
            self._print(f"solving (time limit {self.time_limit_s:g} s): elapsed | best plan's step time (incumbent) | "
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


# --- verbs ------------------------------------------------------------------------------------------
def _load_cluster(spec: str):  # type: ignore[no-untyped-def]
    from tangram_opt.specs import load_cluster

    return load_cluster(spec)


def _load_model(spec: str):  # type: ignore[no-untyped-def]
    from tangram_opt.specs import load_model

    return load_model(spec)


def _auto_precision(cluster: Any) -> str:
    unsupported = sorted({g.gpu.name for g in cluster.node_groups if not g.gpu.supports("bf16")})
    if unsupported:
        _note(f"precision: fp16 ({', '.join(unsupported)} cannot train in bf16; pass --precision to choose)")
        return "fp16"
    return "bf16"


def _training(args: argparse.Namespace, cluster: Any):  # type: ignore[no-untyped-def]
    from tangram_opt.specs import TrainingSpec, load_training

    if args.training:
        if args.batch or args.seq or args.precision != "auto":
            raise UsageError(f"{PROG} plan: error: --training replaces --batch, --seq and --precision; give one or "
                             "the other")
        return load_training(args.training)
    precision = _auto_precision(cluster) if args.precision == "auto" else args.precision
    return TrainingSpec(global_batch_size=args.batch or 512, seq_len=args.seq or 4096, precision=precision)


def _space(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from tangram_opt.planner.space import SearchSpace

    kw: dict[str, Any] = {"schedule": args.schedule}
    if args.max_stages is not None:
        kw["max_stages"] = args.max_stages
    if args.tp is not None:
        kw["tp"] = args.tp
    if args.cp is not None:
        kw["cp"] = args.cp
    if args.zero is not None:
        kw["zero"] = args.zero
    if args.recompute is not None:
        kw["recompute"] = args.recompute
    if args.micro_batch_sizes is not None:
        kw["micro_batch_sizes"] = args.micro_batch_sizes
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
    training = _training(args, cluster)
    check_precision(training, cluster)
    live = sys.stderr.isatty() and not args.plain
    _note(f"planning {model.name} on {cluster.name} ({cluster.num_gpus} GPUs): global batch "
          f"{training.global_batch_size} x {training.seq_len} tokens, {training.precision}, backend {backend}")
    calibration, profiles = _cost_inputs(args, cluster, model, training)
    price = None
    with SolveProgress(time_limit_s=args.time_limit, live=live, quiet=args.quiet) as progress:
        common = dict(backend=backend, threads=args.threads, seed=args.seed, rel_gap=args.gap, space=space,
                      options=SearchOptions(warm_start=not args.no_warm_start), calibration=calibration,
                      profiles=profiles, on_progress=progress)
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


def _read_plan(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from dataclasses import replace

    from tangram_opt.export import read_plan_file

    pf = read_plan_file(args.plan_file)
    if getattr(args, "cluster", None):
        pf = replace(pf, cluster=_load_cluster(args.cluster))
    if getattr(args, "model", None):
        pf = replace(pf, model=_load_model(args.model))
    return pf


def _need(pf: Any, what: str, verb: str) -> Any:
    v = getattr(pf, what)
    if v is None:
        raise SpecError(what, None, f"the plan file {pf.source} does not contain the {what}",
                        f"pass --{what} to '{PROG} {verb}'")
    return v


def cmd_show(args: argparse.Namespace) -> int:
    from tangram_opt.export import export_notes, export_text, plan_file_json
    from tangram_opt.show.summary import plan_table, summary_renderable

    pf = _read_plan(args)
    plan = pf.plan
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
        res.to_dataframe().to_csv(args.trace, index=False)
        _note(f"trace written: {args.trace}")
    if args.picture:
        from tangram_opt.show.plots import plot_timeline

        plot_timeline(res, save_path=args.picture, show_sends=args.sends)
        _note(f"picture written: {args.picture}")
    return EXIT_OK


def cmd_islands(args: argparse.Namespace) -> int:
    from tangram_opt.planner.islands import islands_report

    print(islands_report(_load_cluster(args.cluster)))
    return EXIT_OK


def cmd_clusters(args: argparse.Namespace) -> int:
    from tangram_opt.planner.islands import find_islands
    from tangram_opt.specs import example_clusters

    rows = []
    for name in example_clusters():
        c = _load_cluster(name)
        rows.append((name, str(c.num_gpus), str(len(find_islands(c))), c.description))
    _table(("name", "GPUs", "islands", "description"), rows, right=(1, 2))
    _note("use a name with --cluster, or copy its YAML from tangram_opt/data/clusters/ (docs/user_guide/inputs.md)")
    return EXIT_OK


def cmd_models(args: argparse.Namespace) -> int:
    from tangram_opt.specs import list_presets

    rows = []
    for name in list_presets():
        m = _load_model(name)
        kind = f"MoE {m.moe.num_experts}e top-{m.moe.top_k}" if m.moe is not None else "dense"
        rows.append((name, m.architecture, str(m.num_layers), str(m.hidden_size), f"{m.total_params / 1e9:.1f}B",
                     kind))
    _table(("preset", "architecture", "layers", "hidden", "params", "kind"), rows, right=(2, 3, 4))
    _note("use a preset name with --model, or a path to a Hugging Face config.json")
    return EXIT_OK


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[int] = ()) -> None:
    from rich import box
    from rich.table import Table

    t = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for i, h in enumerate(header):
        t.add_column(h, justify="right" if i in right else "left", no_wrap=i < len(header) - 1)
    for r in rows:
        t.add_row(*r)
    _print(t)


def _read_loads(path: str) -> Any:
    p = Path(path)
    if not p.is_file():
        raise FormatError("loads", path, "file not found", "pass a JSON file with tokens per expert")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise FormatError("loads", path, f"is not valid JSON (line {e.lineno}: {e.msg})",
                          "write a JSON list of numbers, or a list of lists (one per layer)") from None
    if isinstance(data, dict):
        if "loads" not in data:
            raise SpecError("loads", sorted(data), "a JSON object must have a 'loads' key",
                            "write {\"loads\": [...]} or a bare list")
        data = data["loads"]
    return data


def cmd_experts(args: argparse.Namespace) -> int:
    from rich import box
    from rich.table import Table

    try:
        from tangram_opt.experts import DEFAULT_PLACEMENT_BACKEND, place_experts, synthetic_expert_loads
    except ImportError as e:
        raise ComponentUnavailable(f"expert placement is not available in this installation "
                                   f"(tangram_opt.experts: {e})") from None
    if args.loads:
        loads = _read_loads(args.loads)
        src = args.loads
    else:
        loads = synthetic_expert_loads(args.profile, experts=args.experts, skew=args.skew, tokens=args.tokens,
                                       seed=args.profile_seed, layers=args.layers)
        src = f"{args.profile} profile (skew {args.skew}, seed {args.profile_seed})"
    res = place_experts(loads, args.ranks, args.nodes, args.slots, method=args.method,
                        backend=args.backend or DEFAULT_PLACEMENT_BACKEND, time_limit_s=args.time_limit)
    placements = res if isinstance(res, list) else [res]
    head = (f"expert placement ({args.method}): {src}; {args.ranks} ranks on {args.nodes} node(s), "
            f"{args.slots} slots per rank")
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for name in ("layer", "experts", "replicas", "max load", "mean load", "imbalance", "bound", "gap", "status"):
        t.add_column(name, justify="right", no_wrap=True)
    for i, pl in enumerate(placements):
        c = pl.certificate
        t.add_row(str(i), str(pl.experts), str(sum(pl.replicas)), f"{pl.max_load:,.0f}", f"{pl.mean_load:,.0f}",
                  f"{pl.imbalance:.3f}", f"{c.max_load_bound:,.0f}", f"{100 * c.gap:.2f}%", c.status)
    from rich.console import Group

    _print(Group(head, t))
    if args.output:
        out = [pl.to_dict() for pl in placements]
        Path(args.output).write_text(json.dumps(out if isinstance(res, list) else out[0], indent=2) + "\n",
                                     encoding="utf-8")
        _note(f"placement written: {args.output}")
    return EXIT_OK


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

    from tangram_opt.calibrate import fit_measurements, load_measurements
    from tangram_opt.cost import load_calibration, save_calibration

    runs = load_measurements(args.measurements)
    base = load_calibration(args.base) if args.base else None
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


def _find_benchmarks() -> Path | None:
    """The directory that holds ``benchmarks/run.py``: ``$TANGRAM_BENCH_ROOT`` if set, else the current
    directory or the source checkout this tangram_opt was installed from (``pip install -e``)."""
    env_root = os.environ.get("TANGRAM_BENCH_ROOT")
    roots = (Path(env_root),) if env_root else (Path.cwd(), Path(__file__).resolve().parent.parent)
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


VERBS: dict[str, Callable[[argparse.Namespace], int]] = {
    "plan": cmd_plan, "show": cmd_show, "simulate": cmd_simulate, "islands": cmd_islands, "clusters": cmd_clusters,
    "models": cmd_models, "experts": cmd_experts, "profile": cmd_profile, "calibrate": cmd_calibrate,
    "bench": cmd_bench, "sweep": cmd_sweep,
}


# --- entry point ------------------------------------------------------------------------------------
def _error_lines(exc: BaseException) -> list[str]:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (see the module docstring)."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args_list or os.environ.get("TANGRAM_DEBUG") == "1"
    args_list = [a for a in args_list if a != "--debug"]
    parser = build_parser()
    try:
        try:
            if args_list[:1] == ["bench"]:  # everything bench does not know goes to benchmarks.run
                args, extra = parser.parse_known_args(args_list)
                args.rest = extra + list(args.rest or [])
            else:
                args = parser.parse_args(args_list)
        except SystemExit as e:  # --help / --version
            return int(e.code or 0)
        if args.verb is None:
            parser.print_help()
            return EXIT_BAD_INPUT
        return VERBS[args.verb](args)
    except KeyboardInterrupt:
        _note(f"{PROG}: interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # e.g. piped into `head`
        try:
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silence the flush at exit
        except OSError:
            pass
        return EXIT_OK
    except Exception as exc:  # noqa: BLE001 - the CLI boundary turns every error into an exit code
        code = exit_code_for(exc)
        if debug:
            import traceback

            traceback.print_exc()
        lines = _error_lines(exc)
        if code == EXIT_INTERNAL:
            _note(f"{PROG}: internal error: {type(exc).__name__}: {lines[0]} -- this is a bug in tangram_opt, please "
                  f"report it (rerun with --debug for the traceback)")
        elif isinstance(exc, UsageError):
            _note(lines[0])
        else:
            kind = {EXIT_INFEASIBLE: "infeasible", EXIT_NO_PLAN: "no plan",
                    EXIT_UNAVAILABLE: "unavailable"}.get(code, "error")
            _note(f"{PROG}: {kind}: {lines[0]}")
            for extra in lines[1:]:
                _note(f"  {extra.strip()}")
        return code


__all__ = ["main", "build_parser", "exit_code_for", "SolveProgress", "EXIT_OK", "EXIT_INTERNAL", "EXIT_BAD_INPUT",
           "EXIT_INFEASIBLE", "EXIT_NO_PLAN", "EXIT_UNAVAILABLE", "EXIT_INTERRUPTED"]
