"""Published end-to-end training runs (published_runs.yaml) and the cost model's prediction of each.

A row is predicted the way a user would plan it: a homogeneous cluster of the row's GPUs, the
row's model and training run, and ``tangram_opt.solve`` restricted to the published configuration
(tp, cp, ep, ZeRO stage, recomputation, micro-batch, pipeline depth and pipeline micro-batch), one
pipeline. The prediction is the plan's tokens/s per GPU (and MFU, and peak memory); a published MFU
without a throughput is compared as MFU. Interleaved (virtual) pipeline stages are not modelled:
such rows are priced as plain 1F1B and say so.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tangram_opt as to
from tangram_opt.cost import Calibration
from tangram_opt.errors import SpecError, TangramError
from tangram_opt.specs import ModelSpec, get_gpu_type
from tangram_opt.specs._io import load_structured_file

RUNS_FILE = Path(__file__).resolve().parent / "published_runs.yaml"
GENERATIONS = {"A100-40": "A100", "A100-80": "A100", "H100-SXM": "H100", "H200": "H100", "B200": "Blackwell",
               "GB200": "Blackwell"}
_FIELDS = ("id", "gpu", "gpus", "gpus_per_node", "nic_gbps", "nic_assumed", "model", "params", "seq_len",
           "global_batch", "micro_batch", "tp", "pp", "cp", "ep", "vp", "zero", "recompute", "precision",
           "attention", "dropout", "published", "src")


@dataclass(frozen=True, slots=True, kw_only=True)
class PublishedRun:
    id: str
    gpu: str
    gpus: int
    gpus_per_node: int
    nic_gbps: float
    nic_assumed: bool
    model: ModelSpec
    seq_len: int
    global_batch: int
    micro_batch: int
    tp: int
    pp: int
    cp: int
    ep: int
    vp: int
    zero: int
    recompute: str
    precision: str
    attention: str
    dropout: bool | None
    tokens_per_s_per_gpu: float | None
    mfu: float | None
    source: Mapping[str, Any]

    @property
    def generation(self) -> str:
        return GENERATIONS.get(self.gpu, self.gpu)

    @property
    def dp(self) -> int:
        return self.gpus // (self.tp * self.cp * self.pp)


@dataclass(frozen=True, slots=True)
class Prediction:
    run: PublishedRun
    tokens_per_s_per_gpu: float | None
    mfu: float | None
    peak_memory_bytes: float | None
    error: float | None  # predicted / published - 1 (throughput, else MFU)
    note: str = ""


def _gpt(shape: Mapping[str, Any], seq_len: int, name: str) -> ModelSpec:
    h = int(shape["hidden"])
    return ModelSpec(name=name, num_layers=int(shape["layers"]), hidden_size=h,
                     ffn_hidden_size=int(shape.get("ffn", 4 * h)), num_attention_heads=int(shape["heads"]),
                     vocab_size=int(shape.get("vocab", 50368)), tied_embeddings=True, mlp_type="gelu",
                     norm_type="layernorm", attention_bias="all", mlp_bias=True, position_embedding="learned",
                     max_position_embeddings=seq_len, architecture="gpt")


def load_runs(path: str | Path = RUNS_FILE) -> list[PublishedRun]:
    """Every row of the file, checked (unknown keys, GPU names, parameter counts)."""
    data = load_structured_file(path)
    sources = data.get("sources", {})
    out = []
    for i, row in enumerate(data["runs"]):
        where = f"runs[{i}]"
        unknown = sorted(set(row) - set(_FIELDS))
        if unknown:
            raise SpecError(f"{where}.{unknown[0]}", row[unknown[0]], "is not a field", f"use {', '.join(_FIELDS)}")
        src = sources.get(row["src"])
        if src is None or not src.get("url"):
            raise SpecError(f"{where}.src", row.get("src"), "names no source with a url", "add it under sources:")
        gpu = get_gpu_type(row["gpu"], field=f"{where}.gpu").name
        seq = int(row["seq_len"])
        model = to.load_model(row["model"]) if isinstance(row["model"], str) else _gpt(row["model"], seq, row["id"])
        if "params" in row and model.total_params != int(row["params"]):
            raise SpecError(f"{where}.params", row["params"], f"differs from the model's {model.total_params}",
                            "check the model shape")
        pub = row["published"]
        out.append(PublishedRun(
            id=row["id"], gpu=gpu, gpus=int(row["gpus"]), gpus_per_node=int(row.get("gpus_per_node", 8)),
            nic_gbps=float(row.get("nic_gbps", src.get("nic_gbps", 3200))),
            nic_assumed=bool(row.get("nic_assumed", src.get("nic_assumed", False))), model=model, seq_len=seq,
            global_batch=int(row["global_batch"]), micro_batch=int(row["micro_batch"]), tp=int(row.get("tp", 1)),
            pp=int(row.get("pp", 1)), cp=int(row.get("cp", 1)), ep=int(row.get("ep", 1)), vp=int(row.get("vp", 1)),
            zero=int(row.get("zero", 0)), recompute=str(row.get("recompute", "none")),
            precision=str(row.get("precision", "bf16")), attention=str(row.get("attention", "auto")),
            dropout=row.get("dropout"), tokens_per_s_per_gpu=pub.get("tokens_per_s_per_gpu"), mfu=pub.get("mfu"),
            source=dict(src)))
    return out


def predict(run: PublishedRun, calibration: Calibration | None = None, time_limit_s: float = 20.0) -> Prediction:
    """Plan ``run``'s published configuration with ``tangram_opt.solve`` and read off its throughput."""
    nodes = max(1, run.gpus // run.gpus_per_node)
    cluster = to.make_cluster(run.id, [dict(name="g", gpu=run.gpu, nodes=nodes, gpus_per_node=min(run.gpus,
                              run.gpus_per_node), nic_gbps=run.nic_gbps)])
    training = to.TrainingSpec(global_batch_size=run.global_batch, seq_len=run.seq_len, precision=run.precision)
    recompute = ("none", "selective", "full") if run.recompute == "any" else (run.recompute,)
    space = to.SearchSpace(tp=(run.tp,), cp=(run.cp,), ep=(run.ep,) if run.model.moe else None, zero=(run.zero,),
                           recompute=recompute, micro_batch_sizes=(run.micro_batch,), max_stages=run.pp,
                           pipeline_micro_batches=(run.dp * run.micro_batch,))
    notes = []
    if run.vp > 1:
        notes.append(f"vp {run.vp} priced as plain 1F1B")
    if run.nic_assumed:
        notes.append("network assumed")
    kwargs: dict[str, Any] = {}
    if run.attention != "auto" or run.dropout is not None:
        kwargs["cost_model_options"] = dict(attention_kernel=run.attention, dropout=run.dropout)
    try:
        plan = _solve(cluster, run, training, space, calibration, time_limit_s, **kwargs)
    except TangramError as e:
        return Prediction(run, None, None, None, None, "no plan: " + str(e).split(".")[0])
    if len(plan.pipelines[0].stages) != run.pp:
        notes.append(f"planned with {len(plan.pipelines[0].stages)} stages")
    tps = plan.tokens_per_s / plan.gpus_used
    peak = max(s.memory_bytes for p in plan.pipelines for s in p.stages)
    if run.tokens_per_s_per_gpu:
        err = tps / run.tokens_per_s_per_gpu - 1
    else:
        err = plan.mfu / run.mfu - 1 if run.mfu else None
    return Prediction(run, tps, plan.mfu, peak, err, "; ".join(notes))


def _solve(cluster: Any, run: PublishedRun, training: Any, space: Any, calibration: Calibration | None,
           time_limit_s: float, cost_model_options: Mapping[str, Any] | None = None) -> Any:
    if not cost_model_options:
        return to.solve(cluster, run.model, training, space=space, time_limit_s=time_limit_s, calibration=calibration,
                        multi_pipeline=False)
    # a kernel or dropout setting the public API does not take: plan through a context with that cost model
    from tangram_opt.cost import CostModel
    from tangram_opt.planner.search import solve as search_solve

    cm = CostModel(run.model, training, calibration=calibration, **cost_model_options)
    return search_solve(cluster, run.model, training, space=space, time_limit_s=time_limit_s, multi_pipeline=False,
                        provider=_provider(cm, run, space))


def _provider(cm: Any, run: PublishedRun, space: Any) -> Any:
    from tangram_opt.planner.candidates import AnalyticalCandidates

    return AnalyticalCandidates(run.model, cm, space)


def summarize(preds: Iterable[Prediction]) -> dict[str, dict[str, float]]:
    """Per GPU generation and overall: rows, median |error| and median signed error."""
    groups: dict[str, list[float]] = defaultdict(list)
    for p in preds:
        if p.error is not None and math.isfinite(p.error):
            groups[p.run.generation].append(p.error)
            groups["all"].append(p.error)
    return {g: {"n": len(v), "median_abs": statistics.median(abs(x) for x in v), "median": statistics.median(v)}
            for g, v in groups.items()}
