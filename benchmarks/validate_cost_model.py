"""Validate the analytical cost model against measured per-layer profiles and published MFU figures.

Run: ``python -m benchmarks.validate_cost_model`` (or ``python benchmarks/validate_cost_model.py``)
from the repository root; ``--rows`` prints every measured configuration, ``--no-fit`` skips the
calibration fit.

Part 1 compares the predicted forward+backward time of one transformer block with every measured
configuration in the Sailor profiles shipped in tangram_opt/data/profiles/sailor (GPU types x models
x tp x micro-batch). The cost model runs with its documented default calibration; the only inputs
taken from Sailor besides the model shapes are (a) the arithmetic each file ran in, inferred from
its best block throughput (above the GPU's FP32 peak means tensor cores, i.e. TF32), and (b)
Sailor's measured intra-node bandwidths for the TP links of those machines (with network efficiency
1.0, since they are achieved figures, not datasheet ones; per GPU, see :func:`sailor_node`). Then, separately and labelled as such,
it fits one compute scale and one memory efficiency per GPU type to the same data, to show how much
of the error is a per-GPU constant.

Part 2 plans every published end-to-end run of benchmarks/data/published_runs.yaml (A100, H100,
B200 and GB200; dense and MoE; llm-foundry, torchtitan, Megatron-LM, NeMo / Megatron-Bridge, NeMo
AutoModel, Meta's Llama 3) with its published configuration and compares the predicted tokens/s
per GPU (or MFU, where only MFU is published) with the published figure
(benchmarks/published_runs.py).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import os
import platform
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tangram_opt import units as u
from tangram_opt.cost import Calibration, CostModel, StageConfig, fit_calibration
from tangram_opt.cost.calibration import percentile
from tangram_opt.cost.profiles import (SAILOR_MODELS, infer_sailor_precision, load_sailor_profile, read_sailor_raw,
                                       sailor_files, sailor_link_bandwidths)
from tangram_opt.errors import SpecError
from tangram_opt.specs import NodeSpec, TrainingSpec, get_gpu_type
from tangram_opt.specs.hardware import LINKS

ROOT = Path(__file__).resolve().parent.parent

# --------------------------------------------------------------------------------------------------
# Part 1: Sailor per-layer profiles
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Row:
    model: str
    gpu: str  # catalog name
    precision: str
    mb: int
    tp: int
    measured_fwd_s: float
    measured_bwd_s: float
    kind: str = "block"

    @property
    def measured_s(self) -> float:
        return self.measured_fwd_s + self.measured_bwd_s


def sailor_node(gpu_name: str, sailor_gpu: str, tp: int, bws: dict[str, dict[int, float]]) -> NodeSpec:
    """A node of ``tp`` GPUs whose TP link runs at Sailor's measured bandwidth for that group size.

    Sailor's figure for ``n`` GPUs is an aggregate: its test (sailor/profiling/networking/
    test_sendrecv.py) has ranks ``0..n/2-1`` each send to rank ``r + n/2`` at the same time and
    reports ``n/2 x bytes / time``. Without GPU peer-to-peer (GeForce and Titan cards) every one of
    those transfers is staged through host memory and the concurrent pairs share the PCIe uplinks
    to the CPU; a ring all-reduce over the same ``n`` GPUs loads each shared uplink with as many
    streams per direction as the pair test did (each GPU sends up once and receives down once), so
    what one GPU gets in the ring is the per-pair figure, ``aggregate / (n/2)``. With peer-to-peer
    links (NVLink) the pairs do not share a path and NCCL's ring spreads its channels over all of a
    GPU's links, so the measured figure is kept as the per-GPU one.
    """
    gpu = get_gpu_type(gpu_name)
    link = LINKS[gpu.default_link]
    by_n = bws.get(sailor_gpu, {})
    bw = link.bw_bytes_per_s
    node = NodeSpec(gpu=gpu, gpus_per_node=max(1, tp), intra_node_link=link.name, intra_node_bw_bytes_per_s=bw,
                    intra_node_latency_s=link.latency_s, nic_bw_bytes_per_s=100 * u.GBIT_PER_S)
    if by_n and tp > 1:
        sizes = sorted(by_n)
        n = max([s for s in sizes if s <= tp], default=sizes[0])
        bw = by_n[n] if node.has_peer_to_peer else by_n[n] / (n / 2)
    return replace(node, intra_node_bw_bytes_per_s=bw)


def collect_rows() -> tuple[list[Row], list[str]]:
    """Every measured block (and head) configuration of the shipped Sailor profiles."""
    rows: list[Row] = []
    excluded: list[str] = []
    for model, sgpu, path in sailor_files():
        info = SAILOR_MODELS[model]
        try:
            load_sailor_profile(path, model=model)  # validates the layer count
        except SpecError as e:
            twins = [f"{m2}/{g2}" for m2, g2, p2 in sailor_files()
                     if p2 != path and read_sailor_raw(p2) == read_sailor_raw(path)]
            excluded.append(f"{model}/{sgpu}: {e.problem}" + (f"; identical to {', '.join(twins)}" if twins else ""))
            continue
        raw = read_sailor_raw(path)
        gpu_name = get_gpu_type(sgpu).name
        precision, _ = infer_sailor_precision(raw, model, sgpu)
        L = info.spec.num_layers
        for mb in sorted(raw):
            for tp in sorted(raw[mb]):
                lay = raw[mb][tp]
                blocks = [lay[i] for i in range(1, L + 1)]
                rows.append(Row(model, gpu_name, precision, mb, tp, statistics.median(b[0] for b in blocks),
                                statistics.median(b[1] for b in blocks)))
                if info.head_has_lm_head:
                    tail = [lay[i] for i in range(L + 1, len(lay))]
                    rows.append(Row(model, gpu_name, precision, mb, tp, sum(x[0] for x in tail),
                                    sum(x[1] for x in tail), kind="head"))
    return rows, excluded


class Predictor:
    """Builds (and caches) one CostModel per (model, precision, calibration) and predicts rows."""

    def __init__(self) -> None:
        self.bws = sailor_link_bandwidths()
        self._models: dict[tuple, CostModel] = {}
        self._sailor_gpu = {get_gpu_type(g).name: g for _, g, _ in sailor_files()}

    def model(self, model: str, precision: str, cal: Calibration) -> CostModel:
        key = (model, precision, cal)  # Calibration hashes and compares by value
        cm = self._models.get(key)
        if cm is None:
            if len(self._models) > 64:
                self._models.clear()
            info = SAILOR_MODELS[model]
            training = TrainingSpec(global_batch_size=1, seq_len=info.seq_len, precision="fp32")
            cm = CostModel(info.spec, training, calibration=cal, attention_kernel="eager",
                           fp32_matmul="tf32" if precision == "tf32" else "ieee", dropout=True)
            self._models[key] = cm
        return cm

    def predict(self, row: Row, cal: Calibration) -> tuple[float, float]:
        cm = self.model(row.model, row.precision, cal)
        node = sailor_node(row.gpu, self._sailor_gpu[row.gpu], row.tp, self.bws)
        cfg = StageConfig(tp=row.tp, micro_batch_size=row.mb, sequence_parallel=False)
        problems = cm.check_config(node, cfg)
        assert not problems, problems
        c = cm.layer(node, cfg, "dense") if row.kind == "block" else cm.head(node, cfg)
        return c.fwd_time_s, c.bwd_time_s


def rel_err(pred: float, meas: float) -> float:
    return pred / meas - 1.0


def summarize(rows: list[Row], preds: dict[Row, tuple[float, float]], kind: str) -> list[tuple]:
    """Per GPU type: n, median and p90 |error|, and the medians of the tp = 1 and tp > 1 rows."""
    groups: dict[str, list[Row]] = defaultdict(list)
    for r in rows:
        if r.kind == kind:
            groups[r.gpu].append(r)
            groups["ALL"].append(r)
    out = []
    for gpu in sorted(groups, key=lambda g: (g == "ALL", g)):
        rs = groups[gpu]
        errs = [abs(rel_err(sum(preds[r]), r.measured_s)) for r in rs]
        tp1 = [abs(rel_err(sum(preds[r]), r.measured_s)) for r in rs if r.tp == 1]
        tpn = [abs(rel_err(sum(preds[r]), r.measured_s)) for r in rs if r.tp > 1]
        out.append((gpu, len(errs), statistics.median(errs), percentile(errs, 90),
                    statistics.median(tp1) if tp1 else math.nan, len(tp1),
                    statistics.median(tpn) if tpn else math.nan, len(tpn)))
    return out


def print_summary(title: str, table: list[tuple]) -> None:
    print(f"\n{title}")
    print(f"  {'GPU type':<10} {'n':>4} {'median |err|':>13} {'p90 |err|':>10} {'median tp=1':>17} {'median tp>1':>17}")
    for gpu, n, med, p90, med1, n1, medn, nn in table:
        tp1 = f"{100 * med1:6.1f}% (n={n1:>3})" if n1 else ""
        tpn = f"{100 * medn:6.1f}% (n={nn:>3})" if nn else ""
        print(f"  {gpu:<10} {n:>4} {100 * med:12.1f}% {100 * p90:9.1f}% {tp1:>17} {tpn:>17}")


def part1(show_rows: bool, fit: bool) -> None:
    rows, excluded = collect_rows()
    pred = Predictor()
    base = Calibration(network_efficiency=1.0)
    preds = {r: pred.predict(r, base) for r in rows}
    print("=" * 100)
    print("Part 1: analytical block forward+backward time vs Sailor's measured profiles (default calibration)")
    print("=" * 100)
    precisions = sorted({(r.model, r.gpu, r.precision) for r in rows})
    print("Arithmetic per file (inferred from best block throughput vs the FP32 peak):")
    print("  " + ", ".join(f"{m}/{g}: {p}" for m, g, p in precisions))
    for x in excluded:
        print(f"Excluded: {x}")
    if show_rows:
        print(f"\n  {'model':<12} {'GPU':<10} {'prec':<5} {'mb':>4} {'tp':>3} {'meas fwd':>9} {'pred fwd':>9} "
              f"{'meas bwd':>9} {'pred bwd':>9} {'meas f+b':>10} {'pred f+b':>10} {'err':>7}")
        for r in rows:
            if r.kind != "block":
                continue
            pf, pb = preds[r]
            print(f"  {r.model:<12} {r.gpu:<10} {r.precision:<5} {r.mb:>4} {r.tp:>3} {r.measured_fwd_s / u.MS:8.2f}m "
                  f"{pf / u.MS:8.2f}m {r.measured_bwd_s / u.MS:8.2f}m {pb / u.MS:8.2f}m "
                  f"{r.measured_s / u.MS:9.2f}m {(pf + pb) / u.MS:9.2f}m {100 * rel_err(pf + pb, r.measured_s):+6.1f}%")
    per_model: dict[tuple[str, str], list[float]] = defaultdict(list)
    for r in rows:
        if r.kind == "block":
            per_model[(r.gpu, r.model)].append(rel_err(sum(preds[r]), r.measured_s))
    print(f"\n  Per file (block): {'GPU':<10} {'model':<12} {'n':>3} {'median err':>11} {'median |err|':>13} "
          f"{'min':>7} {'max':>7}")
    for (gpu, model), errs in sorted(per_model.items()):
        print(f"  {'':<18}{gpu:<10} {model:<12} {len(errs):>3} {100 * statistics.median(errs):+10.1f}% "
              f"{100 * statistics.median(abs(e) for e in errs):12.1f}% {100 * min(errs):+6.0f}% "
              f"{100 * max(errs):+6.0f}%")
    print_summary("Transformer block, forward+backward, DEFAULT calibration (not fitted):",
                  summarize(rows, preds, "block"))
    print_summary("Final norm + LM head + loss, forward+backward, DEFAULT calibration (GPT-Neo has no head entry):",
                  summarize(rows, preds, "head"))
    if not fit:
        return
    # ---- fitted calibration (on the same data; reported separately) ----
    cal = base
    fits = []
    for gpu in sorted({r.gpu for r in rows}):
        gpu_rows = [r for r in rows if r.gpu == gpu and r.kind == "block"]

        def errors(c: Calibration, rs: list[Row] = gpu_rows) -> list[float]:
            return [rel_err(sum(pred.predict(r, c)), r.measured_s) for r in rs]

        fitted, res = fit_calibration(gpu, cal, errors)
        cal = fitted
        fits.append(res)
    preds_fit = {r: pred.predict(r, cal) for r in rows}
    print("\nFitted per GPU type on the same block data (compute scale x default efficiencies, memory efficiency):")
    for f in fits:
        print(f"  {f.gpu_name:<10} compute x{f.compute_scale:.2f}  memory {f.memory_efficiency:.2f}")
    print_summary("Transformer block, forward+backward, FITTED calibration (in-sample, optimistic):",
                  summarize(rows, preds_fit, "block"))
    implied_tp_bandwidth(rows, pred, cal)


def implied_tp_bandwidth(rows: list[Row], pred: Predictor, cal: Calibration) -> None:
    """Diagnostic: the TP all-reduce bus bandwidth the measurements imply, next to the link figure used.

    comm = measured (fwd + bwd) - predicted compute (fitted calibration); traffic = 4 all-reduces of
    the layer activation x 2 (n-1)/n. Rough (it inherits the compute error), but it separates a link
    figure that does not match the machine from a wrong compute model.
    """
    implied: dict[tuple[str, int], list[float]] = defaultdict(list)
    used: dict[tuple[str, int], float] = {}
    for r in rows:
        if r.kind != "block" or r.tp == 1:
            continue
        info = SAILOR_MODELS[r.model]
        cm = pred.model(r.model, r.precision, cal)
        node = sailor_node(r.gpu, pred._sailor_gpu[r.gpu], r.tp, pred.bws)
        c = cm.layer(node, StageConfig(tp=r.tp, micro_batch_size=r.mb, sequence_parallel=False), "dense")
        comm = r.measured_s - (c.breakdown["compute_fwd"] + c.breakdown["compute_bwd"])
        msg = r.mb * info.seq_len * info.spec.hidden_size * 4.0
        traffic = 4 * 2 * (r.tp - 1) / r.tp * msg
        if comm > 0:
            implied[(r.gpu, r.tp)].append(traffic / comm)
        used[(r.gpu, r.tp)] = node.intra_node_bw_per_gpu
    print("\nDiagnostic: TP all-reduce bus bandwidth implied by the measurements vs the link figure used (GB/s;")
    print("Sailor's pair-test aggregate per GPU where the GPUs have no peer-to-peer access):")
    for (gpu, tp), vals in sorted(implied.items()):
        print(f"  {gpu:<10} tp={tp}  implied {statistics.median(vals) / u.GB_PER_S:7.1f}   "
              f"used (Sailor's measured link, per GPU) {used[(gpu, tp)] / u.GB_PER_S:7.1f}")


# --------------------------------------------------------------------------------------------------
# Part 2: published MFU
# --------------------------------------------------------------------------------------------------


def part2(fast: bool = False) -> list[Any]:
    """Published end-to-end runs (benchmarks/data/published_runs.yaml), planned as published."""
    from benchmarks.published_runs import compare, load_runs, predict, summarize, table_cells

    print("\n" + "=" * 100)
    print("Part 2: published end-to-end runs, planned with their published configuration (default calibration)")
    print("=" * 100)
    print(f"  {'run':<46} {'GPUs':>5} {'metric':<7} {'published':>10} {'predicted':>10} {'err':>7} {'MFU':>6}  "
          "approximations")
    comps = []
    for run in load_runs():
        p = predict(run, time_limit_s=5.0 if fast else 20.0)
        c = compare(run, p)
        comps.append(c)
        short, pub, val, err, mfu = table_cells(c, p)
        notes = "; ".join(([p.error.split(":")[0] + " (no plan)"] if p.error else [])
                          + [a for a in p.approximations if "assumed" not in a])
        print(f"  {run.id:<46} {run.num_gpus:>5} {short:<7} {pub:>10} {val:>10} {err:>7} {mfu:>6}  {notes}")
    stats = summarize(comps)
    rep = summarize(c for c in comps if c.run.representable)
    print("\n  group           n   median |err|   median err   (predicted / published - 1; tokens/s per GPU, "
          "MFU where only MFU is published)")
    for gen, st in sorted(stats.items(), key=lambda kv: (kv[0] != "all", kv[0])):
        print(f"  {gen:<12} {st['n']:>4} {100 * st['median_abs']:13.1f}% {100 * st['median']:+11.1f}%")
    if "all" in rep:
        st = rep["all"]
        print(f"  {'representable':<12} {st['n']:>4} {100 * st['median_abs']:13.1f}% {100 * st['median']:+11.1f}%"
              "   (every published setting is one tangram_opt states)")
    failed = [c.run.id for c in comps if c.prediction.error]
    print(f"  no plan (the model says the published configuration does not fit): {', '.join(failed) or 'none'}")
    part2_memory(load_runs())
    return comps


def part2_memory(runs: list[Any]) -> None:
    """Peak memory per GPU of every row that publishes one, priced for its published configuration
    (benchmarks/published_memory.py: no planning, so "does not fit" never hides the figure)."""
    from benchmarks.published_memory import predict_peak_memory

    rows = [predict_peak_memory(r) for r in runs if r.measured.peak_memory_gib is not None]
    print("\n  Peak memory per GPU, published configuration priced directly (GiB; torchtitan logs the caching")
    print("  allocator's max reserved bytes: compared with the predicted reserved peak)")
    print(f"  {'run':<46} {'capacity':>8} {'published':>9} {'allocated':>9} {'reserved':>9} {'compared':>9} {'err':>7}")
    for p in rows:
        print(f"  {p.run_id:<46} {p.capacity_gib:8.1f} {p.published_gib:9.1f} {p.allocated_gib:9.1f} "
              f"{p.reserved_gib:9.1f} {p.compared:>9} {100 * p.error:+6.1f}%")
    if rows:
        errs = [abs(p.error) for p in rows if p.error is not None]
        print(f"  peak memory: n={len(errs)}  median |err| {100 * statistics.median(errs):.1f}%  "
              f"max |err| {100 * max(errs):.1f}%")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", action="store_true", help="print every measured block configuration")
    ap.add_argument("--no-fit", action="store_true", help="skip the per-GPU calibration fit")
    ap.add_argument("--fast", action="store_true", help="shorter planning time limits for the published runs")
    ap.add_argument("--docs", action="store_true",
                    help="also write the report to docs/results/cost_model_validation.md (machine noted)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    out = io.StringIO()
    with contextlib.redirect_stdout(_Tee(sys.stdout, out)):
        part1(args.rows, not args.no_fit)
        part2(args.fast)
        print(f"\n(done in {time.perf_counter() - t0:.1f} s)")
    if args.docs:
        page = ROOT / "docs" / "results" / "cost_model_validation.md"
        page.write_text(
            "# Cost model validation\n\nGenerated by `python -m benchmarks.validate_cost_model --docs` on "
            f"{time.strftime('%Y-%m-%d')} ({platform.machine()}, {os.cpu_count()} cores, Python "
            f"{platform.python_version()}); what the numbers mean: docs/cost_model.md §7.\n\n"
            "```\n" + out.getvalue() + "```\n", encoding="utf-8")
        print(f"wrote {page}")
    return 0


class _Tee(io.TextIOBase):
    """Write to several streams (the terminal and the report page)."""

    def __init__(self, *streams: Any) -> None:
        self.streams = streams

    def write(self, text: str) -> int:
        for st in self.streams:
            st.write(text)
        return len(text)


if __name__ == "__main__":
    raise SystemExit(main())
