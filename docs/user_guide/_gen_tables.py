"""Print the generated tables of docs/user_guide/inputs.md from the code, so the page stays true.

    python docs/user_guide/_gen_tables.py

and paste each table over the one of the same heading in inputs.md. tests/test_presets.py fails
when the page and this output differ.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

from tangram_opt import units as u
from tangram_opt.specs import hf_config
from tangram_opt.specs.hardware import _BUILTIN, LINKS
from tangram_opt.specs.presets import list_presets, load_model, preset_path
from tangram_opt.specs.pricing import default_gpu_prices


def _row(cells: list[Any]) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _table(header: list[str], rows: list[list[Any]]) -> str:
    return "\n".join([_row(header), _row(["---"] * len(header)), *(_row(r) for r in rows)])


def _num(x: float) -> str:
    return f"{x:,.1f}".rstrip("0").rstrip(".")


def gpu_table() -> str:
    """The built-in GPU catalog (the shipped entries, not user registrations)."""
    rows = []
    for g in _BUILTIN:
        bf16 = "-" if g.bf16_flops_per_s is None else _num(g.bf16_flops_per_s / u.TFLOPS)
        mem = f"{g.hbm_bytes / u.GiB:g} GiB" if g.hbm_bytes % u.GiB == 0 else f"{g.hbm_bytes / u.GB:g} GB"
        link = LINKS[g.default_link]
        cc = "-" if g.compute_capability is None else f"{g.compute_capability:g}"
        fp8 = "-" if g.fp8_flops_per_s is None else _num(g.fp8_flops_per_s / u.TFLOPS)
        rows.append([g.name, g.vendor, bf16, _num(g.fp16_flops_per_s / u.TFLOPS), fp8,
                     _num(g.fp32_flops_per_s / u.TFLOPS),
                     mem, _num(g.hbm_bw_bytes_per_s / u.GB_PER_S),
                     f"{link.name} ({_num(link.bw_bytes_per_s / u.GB_PER_S)})", g.num_sms or "-", cc,
                     "yes" if g.flash_attention else "no", g.source])
    return _table(["name", "vendor", "dense BF16 TFLOPS", "dense FP16 TFLOPS", "dense FP8 TFLOPS", "FP32 TFLOPS",
                   "memory",
                   "memory GB/s", "default link (GB/s per GPU per direction)", "SMs", "compute capability",
                   "flash attention", "source"], rows)


def link_table() -> str:
    rows = [[lk.name, _num(lk.bw_bytes_per_s / u.GB_PER_S), _num(lk.latency_s / u.US), lk.source]
            for lk in LINKS.values()]
    return _table(["intra_node_link", "GB/s per GPU per direction", "latency (us)", "source"], rows)


def price_table() -> str:
    """The default on-demand prices (tangram_opt/data/gpu_prices.yaml) with their quotes."""
    rows = []
    for p in default_gpu_prices().values():
        undated = "; ".join(p.cheaper_undated) or "-"
        per_instance = f"{p.usd_per_instance_hour:.4f}".rstrip("0").rstrip(".")
        rows.append([p.gpu, f"{p.usd_per_gpu_hour:.4f}", f"{p.provider} `{p.instance}`", p.gpus_per_instance,
                     per_instance, p.region, p.price_date, f"[source]({p.sources[0]})", undated])
    return _table(["GPU", "USD per GPU-hour", "instance", "GPUs", "USD per instance-hour", "region", "price date",
                   "price source", "cheaper undated quotes (left out)"], rows)


def _billions(n: int) -> str:
    return f"{n:,} ({n / 1e9:.2f}B)" if n >= 10**9 else f"{n:,} ({n / 1e6:.0f}M)"


def preset_table() -> str:
    rows = []
    for name in list_presets():
        m = load_model(name)
        hub = json.loads(preset_path(name).read_text())["_name_or_path"]
        heads = f"{m.num_attention_heads}/{m.kv_heads}" if m.mla is None else f"{m.num_attention_heads} (MLA)"
        if m.moe is None:
            experts, active = "-", "-"
        else:
            mo = m.moe
            experts = f"{mo.num_experts} top-{mo.top_k}" + (f" +{mo.num_shared_experts} shared" if
                                                           mo.num_shared_experts else "")
            if m.num_dense_layers:
                experts += f", {m.num_dense_layers} dense first"
            active = _billions(m.active_params)
        rows.append([f"`{name}`", hub, m.architecture, m.num_layers, m.hidden_size, heads, experts,
                     _billions(m.total_params), active, _billions(m.active_compute_params)])
    return _table(["preset", "hub config", "model_type", "layers", "hidden", "heads/KV", "experts",
                   "total parameters", "active (all touched)", "active in matmuls"], rows)


class _Recording(dict):
    """A config dict that remembers which keys the reader looked at."""

    def __init__(self, data: Mapping[str, Any]):
        super().__init__(data)
        self.seen: list[str] = []

    def _note(self, key: str) -> None:
        if key not in self.seen:
            self.seen.append(key)

    def get(self, key: str, default: Any = None) -> Any:
        self._note(key)
        return super().get(key, default)

    def __getitem__(self, key: str) -> Any:
        self._note(key)
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        self._note(str(key))
        return super().__contains__(key)


def _fields_read(arch: str) -> Iterator[str]:
    """The config keys the ``arch`` reader consults, found by reading that architecture's first preset."""
    name = next(p for p in list_presets() if load_model(p).architecture == arch)
    data = _Recording(json.loads(preset_path(name).read_text()))
    hf_config._READERS[arch](hf_config._Fields(data, arch, ""))
    return iter(data.seen)


def architecture_table() -> str:
    rows = [[f"`{arch}`", models, ", ".join(f"`{k}`" for k in _fields_read(arch))]
            for arch, models in hf_config.SUPPORTED_ARCHITECTURES.items()]
    return _table(["model_type", "models", "config.json fields read (everything else is ignored)"], rows)


if __name__ == "__main__":
    for title, table in (("GPU catalog", gpu_table()), ("Intra-node links", link_table()),
                         ("Model presets", preset_table()), ("Architectures", architecture_table()),
                         ("Default GPU prices", price_table())):
        print(f"<!-- {title}: generated by docs/user_guide/_gen_tables.py -->\n{table}\n")
