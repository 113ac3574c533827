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

The package: this module assembles the parser and runs a verb (``main``, the ``tangram-opt``
console script and ``python -m tangram_opt``); ``common`` holds the exit codes, argument types and
output helpers every verb shares; one module per group of verbs: ``planning`` (plan),
``plan_files`` (show, simulate), ``catalogue`` (islands, clusters, models), ``experts``,
``measure`` (profile, calibrate), ``many_runs`` (bench, sweep). Layer: command line, the top one.

Progress and status lines go to stderr; summaries and exports go to stdout, so
``tangram-opt plan ... > summary.txt`` still shows the live progress.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from tangram_opt.cli.catalogue import cmd_clusters, cmd_islands, cmd_models
from tangram_opt.cli.common import (EXIT_BAD_INPUT, EXIT_INFEASIBLE, EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_NO_PLAN,
                                    EXIT_OK, EXIT_UNAVAILABLE, PIPE_WIDTH, PROG, ComponentUnavailable, UsageError,
                                    _gap, _int_list, _node_budget, _note, _Parser, _positive_int, _seconds, _str_list,
                                    _zero_list, exit_code_for)
from tangram_opt.cli.experts import cmd_experts
from tangram_opt.cli.many_runs import cmd_bench, cmd_sweep
from tangram_opt.cli.measure import cmd_calibrate, cmd_profile
from tangram_opt.cli.plan_files import cmd_show, cmd_simulate
from tangram_opt.cli.planning import SolveProgress, cmd_plan


# --- argument parsing -------------------------------------------------------------------------------
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
                    help="sequence length in tokens (default 4096; 2048 for a model with learned positions such as OPT)")
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
    pl.add_argument("--zero", type=_zero_list, metavar="LIST", help="allowed ZeRO stages (default 0,1,2,3)")
    pl.add_argument("--recompute", type=_str_list, metavar="LIST",
                    help="allowed recomputation: none,selective,full (default all)")
    pl.add_argument("--micro-batch-sizes", type=_int_list, metavar="LIST",
                    help="allowed per-rank micro-batch sizes (default 1,2,4,8)")
    pl.add_argument("--schedule", choices=("1f1b", "gpipe"), default="1f1b", help="pipeline schedule (default 1f1b)")
    pl.add_argument("--launch", choices=("megatron", "deepspeed", "torchtitan"), default=None,
                    help="search only plans this framework runs as one job (every stage the same layout, one "
                         "pipeline), certified in that space, and print the price of the stock launch against the "
                         "whole space (half the time limit each)")
    pl.add_argument("--objective", choices=("throughput", "min_cost", "cost_per_token"), default="throughput",
                    help="what to optimize: throughput (default), min_cost (USD/h of the GPUs used) or "
                         "cost_per_token (USD per token); prices from the cluster file or the default table")
    pl.add_argument("--budget-usd-per-h", type=float, default=None, metavar="USD",
                    help="plan only within this many USD per hour for the GPUs used")
    pl.add_argument("--min-tokens-per-s", type=float, default=None, metavar="N",
                    help="plan only plans of at least this throughput (tokens/s)")
    pl.add_argument("--max-nodes", type=_node_budget, default=None, metavar="GROUP=N,...",
                    help="a node budget per node group: use at most N of GROUP's nodes, e.g. v100=2,h100=1 "
                         "(plans single pipelines, like --objective)")
    pl.add_argument("--start", metavar="PLAN_FILE",
                    help="a plan file of this cluster, model and run to start from (e.g. the throughput plan, when "
                         "planning for dollars): the result is never worse than it under the objective")
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
    sh.add_argument("--cluster", help="cluster (default: the one stored in the plan file; the plan must match it)")
    sh.add_argument("--model", help="model (default: the one stored in the plan file; the plan must match it)")
    sh.add_argument("--islands-picture", metavar="FILE", help="draw the islands and which stage runs where (.png/.svg)")
    sh.add_argument("--memory-picture", metavar="FILE", help="draw per-stage memory against capacity (.png/.svg)")
    sh.add_argument("--width", type=_positive_int, default=None, help="table width in columns")

    # simulate --------------------------------------------------------------------------------------
    si = verb("simulate", "replay one training step of a saved plan",
              "Replay one step of the plan with the discrete-event simulator (recomputing every stage from the specs) "
              "and compare with the plan's predictions.")
    si.add_argument("plan_file", metavar="PLAN_JSON")
    si.add_argument("--cluster", help="cluster (default: the one stored in the plan file; the plan must match it)")
    si.add_argument("--model", help="model (default: the one stored in the plan file; the plan must match it)")
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
           "EXIT_INFEASIBLE", "EXIT_NO_PLAN", "EXIT_UNAVAILABLE", "EXIT_INTERRUPTED", "VERBS", "UsageError",
           "ComponentUnavailable", "PROG", "PIPE_WIDTH"]
