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
1.0, since they are achieved figures, not datasheet ones). Then, separately and labelled as such,
it fits one compute scale and one memory efficiency per GPU type to the same data, to show how much
of the error is a per-GPU constant.

Part 2 reproduces Megatron-LM's published model FLOPs utilization for GPT models on A100-80GB
(Korthikanti et al. 2022, Table 3 configurations; MFU from the Megatron-LM README: 22B 41.5%,
175B 51.4%, 530B 56.0%, 1T 56.3%), by evaluating a 1F1B pipeline from the per-layer costs.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tangram_opt import units as u
from tangram_opt.cost import Calibration, CostModel, StageConfig, fit_calibration, pipeline_link
from tangram_opt.cost.calibration import percentile
from tangram_opt.cost.profiles import (SAILOR_MODELS, infer_sailor_precision, load_sailor_profile, read_sailor_raw,
                                       sailor_files, sailor_link_bandwidths)
from tangram_opt.errors import SpecError
from tangram_opt.specs import ModelSpec, NodeSpec, TrainingSpec, get_gpu_type
from tangram_opt.specs.hardware import LINKS

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
    """A node of ``tp`` GPUs whose TP link runs at Sailor's measured bandwidth for that group size."""
    gpu = get_gpu_type(gpu_name)
    link = LINKS[gpu.default_link]
    by_n = bws.get(sailor_gpu, {})
    bw = link.bw_bytes_per_s
    if by_n and tp > 1:
        sizes = sorted(by_n)
        n = max([s for s in sizes if s <= tp], default=sizes[0])
        bw = by_n[n]
    return NodeSpec(gpu=gpu, gpus_per_node=max(1, tp), intra_node_link=link.name, intra_node_bw_bytes_per_s=bw,
                    intra_node_latency_s=link.latency_s, nic_bw_bytes_per_s=100 * u.GBIT_PER_S)


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
        used[(r.gpu, r.tp)] = node.intra_node_bw_bytes_per_s
    print("\nDiagnostic: TP all-reduce bus bandwidth implied by the measurements vs the link figure used (GB/s):")
    for (gpu, tp), vals in sorted(implied.items()):
        print(f"  {gpu:<10} tp={tp}  implied {statistics.median(vals) / u.GB_PER_S:7.1f}   "
              f"used (Sailor's measured link) {used[(gpu, tp)] / u.GB_PER_S:7.1f}")


# --------------------------------------------------------------------------------------------------
# Part 2: published MFU
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MegatronRun:
    name: str
    heads: int
    hidden: int
    layers: int
    tp: int
    pp: int
    gpus: int
    global_batch: int
    published_mfu: float


#: Korthikanti et al. 2022, Table 3 (seq 2048, vocab 51200, micro-batch 1, A100-80GB DGX, dp = 1),
#: with sequence parallelism and selective recomputation; MFU from the Megatron-LM README.
MEGATRON_RUNS = (
    MegatronRun("GPT 22B", 64, 6144, 48, 8, 1, 8, 4, 0.415),
    MegatronRun("GPT 175B", 96, 12288, 96, 8, 8, 64, 64, 0.514),
    MegatronRun("GPT 530B", 128, 20480, 105, 8, 35, 280, 280, 0.560),
    MegatronRun("GPT 1T", 160, 25600, 128, 8, 64, 512, 512, 0.563),
)


def dgx_a100_80() -> NodeSpec:
    """DGX A100 80GB: 8 GPUs on NVLink3 (NVSwitch), 8 x 200 Gb/s HDR InfiniBand."""
    link = LINKS["nvlink3"]
    return NodeSpec(gpu=get_gpu_type("A100-80"), gpus_per_node=8, intra_node_link="nvlink3",
                    intra_node_bw_bytes_per_s=link.bw_bytes_per_s, intra_node_latency_s=link.latency_s,
                    nic_bw_bytes_per_s=8 * 200 * u.GBIT_PER_S)


def one_f_one_b_step_s(cm: CostModel, node: NodeSpec, cfg: StageConfig, layers: int, pp: int, m: int) -> float:
    """1F1B step time with layers split evenly: ``(m - 1) T_max + sum_k T_k + tail`` (DESIGN.md objective)."""
    per_stage = [layers // pp + (1 if k < layers % pp else 0) for k in range(pp)]
    lay = cm.layer(node, cfg, "dense")
    emb, head = cm.embedding(node, cfg), cm.head(node, cfg)
    link = pipeline_link(node, node, None, intra_node=False)
    p2p = 2 * cm.p2p_time_s((node, cfg), (node, cfg), link) if pp > 1 else 0.0
    stage_times, tails = [], []
    for k, w in enumerate(per_stage):
        t = w * lay.time_s + (p2p if pp > 1 else 0.0)
        tail = w * lay.step_tail_time_s
        if k == 0:
            t += emb.time_s
            tail += emb.step_tail_time_s
        if k == pp - 1:
            t += head.time_s
            tail += head.step_tail_time_s
        stage_times.append(t)
        tails.append(tail)
    return (m - 1) * max(stage_times) + sum(stage_times) + max(tails)


def megatron_mfu() -> list[tuple[MegatronRun, float, float]]:
    """(run, predicted step seconds, predicted MFU) for every Megatron-LM configuration."""
    node = dgx_a100_80()
    out = []
    for run in MEGATRON_RUNS:
        model = ModelSpec(name=run.name, num_layers=run.layers, hidden_size=run.hidden, ffn_hidden_size=4 * run.hidden,
                          num_attention_heads=run.heads, vocab_size=51200, mlp_type="gelu", norm_type="layernorm",
                          attention_bias="all", mlp_bias=True, position_embedding="learned",
                          max_position_embeddings=2048, tied_embeddings=True)
        training = TrainingSpec(global_batch_size=run.global_batch, seq_len=2048, precision="fp16")
        cm = CostModel(model, training, attention_kernel="fused-softmax", dropout=True)
        cfg = StageConfig(tp=run.tp, dp=1, micro_batch_size=1, recompute="selective", sequence_parallel=True)
        assert not cm.check_config(node, cfg), cm.check_config(node, cfg)
        m = run.global_batch  # micro-batches per step (dp = 1, micro-batch 1)
        step = one_f_one_b_step_s(cm, node, cfg, run.layers, run.pp, m)
        mfu = cm.model_flops_per_step() / (step * run.gpus * node.gpu.peak_flops_per_s("fp16"))
        out.append((run, step, mfu))
    return out


def part2() -> None:
    print("\n" + "=" * 100)
    print("Part 2: Megatron-LM model FLOPs utilization, GPT on A100-80GB (Korthikanti et al. 2022; Megatron-LM README)")
    print("=" * 100)
    print(f"  {'model':<10} {'tp':>3} {'pp':>3} {'GPUs':>5} {'batch':>6} {'step (pred)':>12} {'MFU pred':>9} "
          f"{'MFU published':>14} {'rel. diff':>10}")
    for run, step, mfu in megatron_mfu():
        print(f"  {run.name:<10} {run.tp:>3} {run.pp:>3} {run.gpus:>5} {run.global_batch:>6} {step:11.2f}s "
              f"{100 * mfu:8.1f}% {100 * run.published_mfu:13.1f}% {100 * (mfu / run.published_mfu - 1):+9.1f}%")
    print("  (1F1B without interleaving, layers split evenly, embedding on the first and head on the last stage;\n"
          "   MFU counts 72 B s l h^2 (1 + s/6h + V/12lh) FLOPs per step, Narayanan et al. 2021 Eq. 3.)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", action="store_true", help="print every measured block configuration")
    ap.add_argument("--no-fit", action="store_true", help="skip the per-GPU calibration fit")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    part1(args.rows, not args.no_fit)
    part2()
    print(f"\n(done in {time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
