"""Expert placement benchmark: EPLB-style greedy vs the certified MIP on reproducible skewed profiles.

Run ``python -m benchmarks.expert_placement`` (``--quick`` for a smoke run). Prints a Markdown table and
writes it to docs/results/expert_placement.md with the machine, CPU count and package versions; the
previous results (by default that file, before it is overwritten; ``--previous FILE``) are shown beside
the new ones. Sizes (experts / ranks x slots per rank):

* 8 / 8 x 2 (1 node): every expert may have a second replica;
* 64 / 16 x 5 (2 nodes): 16 spare slots;
* 256 / 64 x 5 (8 nodes), at most 32 redundant replicas: DeepSeek-V3-like;
* 64 / 16 x 4 and 256 / 64 x 4 (full): every slot is needed, no expert can be replicated;
* 256 / 32 x 9 (4 nodes), one spare slot per rank: DeepSeek-V3's prefill layout (8 experts and one
  redundant replica per GPU), few spare slots for many hot experts;
* 60 / 16 x 4 (2 nodes), 4 spare slots: Qwen1.5-MoE-A2.7B's 60 routed experts on 16 GPUs, so at most four
  experts can be split and hot whole experts crowd their ranks (the replica-case bound).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from importlib import metadata
from pathlib import Path

from tangram_opt.experts import place_experts, synthetic_expert_loads

SIZES = [  # (label, experts, ranks, nodes, slots per rank, max_redundant)
    ("8 / 8 x 2", 8, 8, 1, 2, None),
    ("64 / 16 x 5", 64, 16, 2, 5, None),
    ("256 / 64 x 5, 32 redundant", 256, 64, 8, 5, 32),
    ("64 / 16 x 4 (full)", 64, 16, 2, 4, None),
    ("256 / 64 x 4 (full)", 256, 64, 8, 4, None),
    ("256 / 32 x 9 (32 spare)", 256, 32, 4, 9, None),
    ("60 / 16 x 4 (4 spare)", 60, 16, 2, 4, None),
]
QUICK_SIZES = ("64 / 16 x 5", "64 / 16 x 4 (full)")
PROFILES = [("zipf", 0.5), ("zipf", 1.0), ("zipf", 1.5), ("lognormal", 0.5), ("lognormal", 1.0), ("lognormal", 1.5)]
SEED = 1
TOKENS_PER_EXPERT = 4096
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "docs" / "results" / "expert_placement.md"


def _version(pkg: str) -> str:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return "-"


def read_previous(path: str | Path | None) -> dict[tuple[str, str], dict[str, str]]:
    """``(size label, profile) -> {"max/mean", "gap", "time"}`` from an earlier results table (empty if none)."""
    if path is None or not Path(path).is_file():
        return {}
    out: dict[tuple[str, str], dict[str, str]] = {}
    cols: list[str] | None = None
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if not line.startswith("|"):
            cols = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cols is None:
            cols = cells
            continue
        if set("".join(cells)) <= set("-: "):
            continue
        row = dict(zip(cols, cells))
        try:
            out[(row["experts / ranks"], row["profile"])] = {
                "max/mean": row["MIP max/mean"], "gap": row["certified gap"], "time": row["time (s)"]}
        except KeyError:
            continue
    return out


def run(quick: bool = False, time_limit_s: float = 10.0, backend: str = "highs", threads: int = 2,
        previous: str | Path | None = None, note: str = "") -> str:
    sizes = [s for s in SIZES if s[0] in QUICK_SIZES] if quick else SIZES
    profiles = PROFILES[1::2] if quick else PROFILES
    tl = min(time_limit_s, 2.0) if quick else time_limit_s
    prev = read_previous(previous)
    head = ("| experts / ranks | profile | greedy max/mean | MIP max/mean | MIP vs greedy | certified gap | "
            "bound from | MIP solver used | time (s) | previous MIP max/mean | previous gap | previous time (s) | "
            "cross-node tokens greedy / MIP |")
    rows = [head, "|---|---|---:|---:|---:|---:|---|---|---:|---:|---:|---:|---:|"]
    total_t = time.perf_counter()
    worst_gap, worst_time = 0.0, 0.0
    for label, E, R, N, S, K in sizes:
        for kind, skew in profiles:
            w = synthetic_expert_loads(kind, E, skew, tokens=E * TOKENS_PER_EXPERT, seed=SEED)
            g = place_experts(w, R, N, S, max_redundant=K, method="greedy")
            t0 = time.perf_counter()
            m = place_experts(w, R, N, S, max_redundant=K, backend=backend, time_limit_s=tl, threads=threads)
            el = time.perf_counter() - t0
            c = m.certificate
            worst_gap, worst_time = max(worst_gap, c.gap), max(worst_time, el)
            used = "no (bound met)" if not c.backend else f"{c.backend}: {c.note.replace('MIP ', '')}"
            tot = float(sum(w))
            profile = f"{kind} {skew}"
            before = prev.get((label, profile), {"max/mean": "-", "gap": "-", "time": "-"})
            rows.append(f"| {label} | {profile} | {g.imbalance:.4f} | {m.imbalance:.4f} | "
                        f"{100 * (m.imbalance / g.imbalance - 1):+.1f}% | {100 * c.gap:.3f}% | {c.bound_source} | "
                        f"{used} | {el:.1f} | {before['max/mean']} | {before['gap']} | {before['time']} | "
                        f"{g.cross_node_tokens / tot:.3f} / {m.cross_node_tokens / tot:.3f} |")
            print(rows[-1], flush=True)
    total = time.perf_counter() - total_t
    cpu = platform.processor() or platform.machine()
    env = (f"Machine: {platform.system()} {platform.release()} ({cpu}), {os.cpu_count()} CPUs visible; "
           f"Python {platform.python_version()}; ortools {_version('ortools')}, highspy {_version('highspy')}, "
           f"numpy {_version('numpy')}. Backend `{backend}`, time limit {tl:g} s per layer, {threads} threads "
           f"(HiGHS runs single-threaded), default relative gap 0.1%. Total wall time {total:.0f} s; largest "
           f"certified gap {100 * worst_gap:.3f}%, slowest layer {worst_time:.1f} s.")
    notes = """
Columns: max/mean is the hottest rank's load over the mean rank load (1.0 = perfect balance; it multiplies the
MoE layer time). "MIP vs greedy" is the relative change of that ratio. The certified gap is
(objective - lower bound) / objective, where the bound is the strongest of the combinatorial bounds (mean,
replica-count, top-j, pigeonhole with cardinality fill, spread-fill, crowding, replica-case;
formulations/expert_placement.md) and the MIP's dual bound. "MIP solver used": "no (bound met)" when the warm
start (greedy, differencing, local search, starts from the replica cases, optimal shares) already met a
combinatorial bound within 0.1%, otherwise the backend and its final status. "previous" columns: the same rows in the results this run replaced (`-`: row not in them). Cross-node
tokens are a fraction of all routed tokens, with tokens generated uniformly over the EP ranks (definition in
docs/expert_placement.md); neither method was asked to minimize them here (cross_node_weight = 0), but the
MIP's shares are chosen to minimize them at the optimal max load.
Profiles: `synthetic_expert_loads(kind, experts, skew, tokens=experts * 4096, seed=1)`.
"""
    table = "\n".join(rows)
    extra = f"\n\n{note}" if note else ""
    md = (f"# Expert placement benchmark{' (quick)' if quick else ''}\n\nGenerated by "
          f"`python -m benchmarks.expert_placement{' --quick' if quick else ''}`.\n\n{env}{extra}\n\n{table}\n{notes}")
    return md


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="two sizes, three profiles, 2 s limit (smoke run)")
    ap.add_argument("--time-limit", type=float, default=10.0, help="seconds per layer for the MIP (default 10)")
    ap.add_argument("--backend", default="highs")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None, help="Markdown output (default docs/results/expert_placement.md; "
                                                "--quick writes nothing unless --out is given)")
    ap.add_argument("--previous", default=None, help="earlier results to show beside the new ones "
                                                     "(default: the output file before it is overwritten)")
    ap.add_argument("--note", default="", help="a sentence for the header, e.g. about the machine's load")
    args = ap.parse_args(argv)
    out = args.out or (None if args.quick else str(DEFAULT_OUT))
    previous = args.previous if args.previous is not None else out
    md = run(quick=args.quick, time_limit_s=args.time_limit, backend=args.backend, threads=args.threads,
             previous=previous, note=args.note)
    print()
    print(md)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(md, encoding="utf-8")
        print(f"written to {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
