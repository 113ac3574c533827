"""Regenerate the pictures shown in docs/pictures.md.

    python -m tangram_opt.show.make_pictures --out docs/images
    python -m tangram_opt.show.make_pictures --plan plan.json --out pictures/   # from a saved plan

Without ``--plan`` it plans the documented example (``--cluster tiny-mixed --model llama-3-8b
--batch 32 --seq 2048``, fp16, ``--time-limit 20``), simulates one step and writes
``timeline.png``, ``islands.png`` and ``memory.png`` (``--format svg`` for SVG).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tangram_opt.show.make_pictures", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="docs/images", help="output directory (default docs/images)")
    ap.add_argument("--plan", help="a plan file to draw (default: plan the documented example)")
    ap.add_argument("--cluster", default="tiny-mixed")
    ap.add_argument("--model", default="llama-3-8b")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--precision", default="fp16")
    ap.add_argument("--time-limit", type=float, default=20.0)
    ap.add_argument("--format", choices=("png", "svg"), default="png")
    args = ap.parse_args(argv)

    from tangram_opt.export import PlanFile, read_plan_file
    from tangram_opt.show.plots import plot_islands, plot_memory, plot_timeline
    from tangram_opt.specs import TrainingSpec, load_cluster, load_model

    if args.plan:
        pf = read_plan_file(args.plan)
    else:
        from tangram_opt.planner.search import solve

        cluster, model = load_cluster(args.cluster), load_model(args.model)
        training = TrainingSpec(global_batch_size=args.batch, seq_len=args.seq, precision=args.precision)
        plan = solve(cluster, model, training, time_limit_s=args.time_limit)
        pf = PlanFile(plan=plan, cluster=cluster, model=model, training=training)
    out = Path(args.out)
    written = []
    if pf.cluster is not None:
        written.append(out / f"islands.{args.format}")
        plot_islands(pf.plan, pf.cluster, save_path=written[-1])
    peak = None
    if pf.cluster is not None and pf.model is not None:
        try:
            from tangram_opt.sim import simulate
        except ImportError:
            print("simulator not available: skipping timeline.png", file=sys.stderr)
        else:
            res = simulate(pf.plan, pf.cluster, pf.model, pf.training_or_default, **pf.cost_inputs)
            peak = res.peak_memory_bytes
            written.append(out / f"timeline.{args.format}")
            plot_timeline(res, save_path=written[-1])
    written.append(out / f"memory.{args.format}")
    plot_memory(pf.plan, save_path=written[-1], peak_bytes=peak)
    for p in written:
        print(f"{p} ({p.stat().st_size // 1024} KiB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
