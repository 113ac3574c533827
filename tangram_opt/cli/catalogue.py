"""``tangram-opt islands``, ``clusters`` and ``models``: the built-in inputs and how a cluster splits
into islands (layer: command line)."""

from __future__ import annotations

import argparse

from tangram_opt.cli.common import EXIT_OK, _load_cluster, _load_model, _note, _table


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
