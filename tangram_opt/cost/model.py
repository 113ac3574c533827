"""Analytical cost model of one homogeneous stage (first version; see docs/cost_model.md).

Inputs are specs only (model, training, node shape, stage configuration); outputs are
:class:`~tangram_opt.cost.config.LayerCost` records in seconds and bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tangram_opt import units as u
from tangram_opt.cost.config import LayerCost, StageConfig
from tangram_opt.specs.cluster import NodeSpec, ZoneLink
from tangram_opt.specs.model import LayerKind, ModelSpec
from tangram_opt.specs.training import TrainingSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class Calibration:
    """Achievable fractions of datasheet peaks, per GPU type name (``"*"`` is the default)."""

    matmul_efficiency: dict[str, float] = field(default_factory=lambda: {"*": 0.55})
    memory_efficiency: dict[str, float] = field(default_factory=lambda: {"*": 0.8})
    network_efficiency: float = 0.8
    memory_reserve_fraction: float = 0.08
    memory_reserve_bytes: float = 1.5 * u.GiB

    def matmul(self, gpu_name: str) -> float:
        return self.matmul_efficiency.get(gpu_name, self.matmul_efficiency.get("*", 0.55))

    def memory(self, gpu_name: str) -> float:
        return self.memory_efficiency.get(gpu_name, self.memory_efficiency.get("*", 0.8))


class CostModel:
    """Per-layer time and memory of a stage configuration on a node shape."""

    def __init__(self, model: ModelSpec, training: TrainingSpec, *, calibration: Calibration | None = None,
                 moe_load_imbalance: float = 1.0):
        self.model = model
        self.training = training
        self.calibration = calibration or Calibration()
        self.moe_load_imbalance = moe_load_imbalance

    # --- validity --------------------------------------------------------------------------
    def check_config(self, node: NodeSpec, cfg: StageConfig) -> list[str]:
        """Reasons ``cfg`` is not valid for this model on this node shape (empty when valid)."""
        m, problems = self.model, []
        if m.num_attention_heads % cfg.tp:
            problems.append(f"tp({cfg.tp}) does not divide attention heads ({m.num_attention_heads})")
        if m.mla is None and m.kv_heads % cfg.tp:
            problems.append(f"tp({cfg.tp}) does not divide KV heads ({m.kv_heads})")
        if cfg.tp > node.gpus_per_node:
            problems.append(f"tp({cfg.tp}) exceeds GPUs per node ({node.gpus_per_node})")
        if self.training.seq_len % (2 * cfg.cp) and cfg.cp > 1:
            problems.append(f"seq_len ({self.training.seq_len}) is not divisible by 2 x cp({cfg.cp})")
        if m.moe is None and cfg.ep > 1:
            problems.append(f"ep({cfg.ep}) > 1 on a dense model")
        if m.moe is not None and m.moe.num_experts % cfg.ep:
            problems.append(f"ep({cfg.ep}) does not divide the number of experts ({m.moe.num_experts})")
        if not node.gpu.supports(self.training.precision):
            problems.append(f"{node.gpu.name} does not support {self.training.precision}")
        return problems

    # --- memory ---------------------------------------------------------------------------
    def usable_memory_bytes(self, node: NodeSpec) -> float:
        c = self.calibration
        return node.gpu.hbm_bytes * (1.0 - c.memory_reserve_fraction) - c.memory_reserve_bytes

    def _static(self, dense_params: float, expert_params: float, cfg: StageConfig) -> tuple[float, float, float]:
        """Weights, grads, optimizer bytes per GPU under ZeRO (Rajbhandari et al. 2020)."""
        t = self.training
        dense_local = dense_params / cfg.tp
        expert_local = expert_params / (cfg.tp * cfg.ep)
        edp = max(1, cfg.dp * cfg.cp // cfg.ep)  # data-parallel group of the experts
        ddp = cfg.dp * cfg.cp  # data-parallel group of dense parameters (CP ranks hold replicas)

        def shard(x_dense: float, x_exp: float, sharded: bool) -> float:
            return x_dense / ddp + x_exp / edp if sharded else x_dense + x_exp

        w = shard(dense_local, expert_local, cfg.zero >= 3) * t.weight_bytes
        g = shard(dense_local, expert_local, cfg.zero >= 2) * t.grad_bytes
        o = shard(dense_local, expert_local, cfg.zero >= 1) * t.optimizer_bytes
        return w, g, o

    def _layer_param_split(self, kind: LayerKind) -> tuple[float, float]:
        m = self.model
        if kind == "dense":
            return float(m.layer_params("dense")), 0.0
        assert m.moe is not None
        experts = m.moe.num_experts * m.expert_params
        return float(m.layer_params("moe") - experts), float(experts)

    def _activation_bytes(self, kind: LayerKind, cfg: StageConfig) -> float:
        """Korthikanti et al. 2022 (Reducing Activation Recomputation), Eq. 2-5, with TP+SP.

        Per layer: s*b*h*(34 + 5*a*s/h) bytes without recomputation, 34*s*b*h with selective,
        2*s*b*h with full recomputation, all divided by tp (sequence parallel) and cp.
        """
        m, t = self.model, self.training
        s = t.seq_len / cfg.cp
        b = cfg.micro_batch_size
        h = m.hidden_size
        a = m.num_attention_heads
        scale = t.activation_bytes / 2
        if cfg.recompute == "full":
            per = 2 * s * b * h
        elif cfg.recompute == "selective":
            per = 34 * s * b * h
        else:
            per = s * b * h * (34 + 5 * a * s / h)
        if kind == "moe" and m.moe is not None:
            # expert MLP activations scale with top_k routed copies of each token
            per *= 1 + 0.5 * (m.moe.top_k - 1) * (0 if cfg.recompute == "full" else 1)
        return per * scale / cfg.tp

    # --- time -----------------------------------------------------------------------------
    def _fwd_flops(self, kind: LayerKind, cfg: StageConfig) -> float:
        """Forward FLOPs of one layer for one data-parallel rank's micro-batch, per GPU."""
        m, t = self.model, self.training
        tokens = cfg.micro_batch_size * t.seq_len
        s = t.seq_len
        attn_proj = 2 * tokens * m.attention_params
        attn_core = 2 * 2 * tokens * s * m.num_attention_heads * m.head_size * 0.5  # causal
        if kind == "dense":
            mlp = 2 * tokens * m.dense_mlp_params
        else:
            assert m.moe is not None
            mlp = 2 * tokens * (m.moe.top_k * m.expert_params * self.moe_load_imbalance
                                + m.shared_expert_params + m.router_params)
        return (attn_proj + attn_core + mlp) / (cfg.tp * cfg.cp)

    def _ring_time(self, bytes_: float, n: int, bw: float, lat: float) -> float:
        if n <= 1:
            return 0.0
        return (n - 1) * lat + (n - 1) / n * bytes_ / (bw * self.calibration.network_efficiency)

    def _link(self, node: NodeSpec, group: int, stride: int = 1) -> tuple[float, float]:
        """Bandwidth/latency of a group of ``group`` GPUs spaced ``stride`` apart in rank order."""
        if group * stride <= node.gpus_per_node:
            return node.intra_node_bw_bytes_per_s, node.intra_node_latency_s
        return node.nic_bw_per_gpu_bytes_per_s, node.nic_latency_s

    def layer(self, node: NodeSpec, cfg: StageConfig, kind: LayerKind) -> LayerCost:
        m, t, c = self.model, self.training, self.calibration
        peak = node.gpu.peak_flops_per_s(t.precision) * c.matmul(node.gpu.name)
        fwd_flops = self._fwd_flops(kind, cfg)
        fwd_compute = fwd_flops / peak
        bwd_compute = 2 * fwd_compute
        if cfg.recompute == "full":
            bwd_compute += fwd_compute
        elif cfg.recompute == "selective":
            bwd_compute += 0.1 * fwd_compute
        act_msg = cfg.micro_batch_size * t.seq_len / cfg.cp * m.hidden_size * t.activation_bytes
        bw, lat = self._link(node, cfg.tp)
        tp_comm = 4 * self._ring_time(act_msg, cfg.tp, bw, lat)  # 2 AG + 2 RS per pass (SP)
        cp_comm = 0.0
        if cfg.cp > 1:
            kv = 2 * act_msg * m.kv_heads / m.num_attention_heads / cfg.tp
            bw_c, lat_c = self._link(node, cfg.cp, cfg.tp)
            cp_comm = max(0.0, (cfg.cp - 1) * (lat_c + kv / (bw_c * c.network_efficiency)) - 0.5 * fwd_compute)
        ep_comm = 0.0
        if kind == "moe" and cfg.ep > 1:
            assert m.moe is not None
            msg = act_msg * m.moe.top_k / cfg.tp
            bw_e, lat_e = self._link(node, cfg.ep, cfg.tp)
            ep_comm = 2 * ((cfg.ep - 1) * lat_e + (cfg.ep - 1) / cfg.ep * msg / (bw_e * c.network_efficiency))
        dense_p, expert_p = self._layer_param_split(kind)
        w, g, o = self._static(dense_p, expert_p, cfg)
        z3 = 0.0
        if cfg.zero >= 3:
            bw_d, lat_d = self._link(node, cfg.dp * cfg.cp, cfg.tp)
            z3 = self._ring_time(dense_p / cfg.tp * t.weight_bytes, cfg.dp * cfg.cp, bw_d, lat_d)
        fwd = fwd_compute + tp_comm + cp_comm + ep_comm + z3
        bwd = bwd_compute + tp_comm + cp_comm + ep_comm + z3
        bw_d, lat_d = self._link(node, cfg.dp * cfg.cp, cfg.tp)
        grads = (dense_p / cfg.tp) * t.grad_bytes
        sync = 2 * self._ring_time(grads, cfg.dp * cfg.cp, bw_d, lat_d)
        opt_bytes = (o / max(t.optimizer_bytes, 1e-9)) * (2 * t.optimizer_bytes + t.weight_bytes + t.grad_bytes)
        opt_time = opt_bytes / (node.gpu.hbm_bw_bytes_per_s * c.memory(node.gpu.name))
        model_flops = 3 * (fwd_flops if self.moe_load_imbalance == 1 else fwd_flops / self.moe_load_imbalance)
        return LayerCost(fwd_time_s=fwd, bwd_time_s=bwd, weight_bytes=w, grad_bytes=g, optimizer_bytes=o,
                         activation_bytes=self._activation_bytes(kind, cfg),
                         transient_bytes=(dense_p / cfg.tp * t.weight_bytes if cfg.zero >= 3 else 0.0),
                         grad_sync_time_s=sync, optimizer_time_s=opt_time, model_flops=model_flops,
                         breakdown={"compute": fwd_compute + bwd_compute, "tp_comm": 2 * tp_comm,
                                    "cp_comm": 2 * cp_comm, "ep_comm": 2 * ep_comm, "zero3_gather": 2 * z3})

    def _vocab_cost(self, node: NodeSpec, cfg: StageConfig, params: float, flops_per_token: float,
                    logits: bool) -> LayerCost:
        t, c = self.training, self.calibration
        tokens = cfg.micro_batch_size * t.seq_len / cfg.cp
        peak = node.gpu.peak_flops_per_s(t.precision) * c.matmul(node.gpu.name)
        fwd = tokens * flops_per_token / cfg.tp / peak
        w, g, o = self._static(params, 0.0, cfg)
        transient = tokens * self.model.vocab_size / cfg.tp * 4 * 2 if logits else 0.0  # fp32 logits + grad
        bw_d, lat_d = self._link(node, cfg.dp * cfg.cp, cfg.tp)
        sync = 2 * self._ring_time(params / cfg.tp * t.grad_bytes, cfg.dp * cfg.cp, bw_d, lat_d)
        opt_time = (o / max(t.optimizer_bytes, 1e-9)) * (2 * t.optimizer_bytes + t.weight_bytes + t.grad_bytes) / (
            node.gpu.hbm_bw_bytes_per_s * c.memory(node.gpu.name))
        return LayerCost(fwd_time_s=fwd, bwd_time_s=2 * fwd, weight_bytes=w, grad_bytes=g, optimizer_bytes=o,
                         activation_bytes=tokens * self.model.hidden_size * t.activation_bytes / cfg.tp,
                         transient_bytes=transient, grad_sync_time_s=sync, optimizer_time_s=opt_time,
                         model_flops=3 * tokens * flops_per_token / cfg.tp)

    def embedding(self, node: NodeSpec, cfg: StageConfig) -> LayerCost:
        m = self.model
        return self._vocab_cost(node, cfg, float(m.embedding_params), 2.0 * m.hidden_size, logits=False)

    def head(self, node: NodeSpec, cfg: StageConfig) -> LayerCost:
        m = self.model
        params = float(m.head_params if not m.tied_embeddings else m.vocab_size * m.hidden_size)
        return self._vocab_cost(node, cfg, params, 2.0 * m.vocab_size * m.hidden_size, logits=True)

    # --- pipeline point-to-point -----------------------------------------------------------
    def p2p_bytes(self, pipeline_micro_batch: int) -> float:
        """Activation bytes one stage sends the next per micro-batch (the gradient is the same size)."""
        t = self.training
        return pipeline_micro_batch * t.seq_len * self.model.hidden_size * t.activation_bytes

    def p2p_time_s(self, pipeline_micro_batch: int, bw_bytes_per_s: float, latency_s: float) -> float:
        return latency_s + self.p2p_bytes(pipeline_micro_batch) / (bw_bytes_per_s * self.calibration.network_efficiency)

    def model_flops_per_step(self) -> float:
        """Useful FLOPs of one optimizer step (6 x active params x tokens + causal attention)."""
        m, t = self.model, self.training
        attn = 2 * 2 * t.seq_len * m.num_attention_heads * m.head_size * 0.5 * m.num_layers * 3
        return t.tokens_per_step * (6 * m.active_params + attn)


def pipeline_link(src: NodeSpec, dst: NodeSpec, zone_link: ZoneLink | None, *, intra_node: bool) -> tuple[float, float]:
    """Bandwidth (bytes/s) and latency (s) of the p2p path between two consecutive stages.

    Inside one node (``intra_node``) it is the scale-up link. Otherwise each side drives one node's
    NIC (a stage of at most one node; a conservative figure for larger stages), and a zone link
    caps the rate when the stages sit in different zones.
    """
    if intra_node:
        return src.intra_node_bw_bytes_per_s, src.intra_node_latency_s
    bw = min(src.nic_bw_bytes_per_s, dst.nic_bw_bytes_per_s)
    lat = max(src.nic_latency_s, dst.nic_latency_s)
    if zone_link is not None:
        bw = min(bw, zone_link.bw_bytes_per_s)
        lat += zone_link.latency_s
    return bw, lat
