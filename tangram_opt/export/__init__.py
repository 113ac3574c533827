"""Plan files and exports for training frameworks (Megatron-LM, DeepSpeed, torchtitan).

- :mod:`.envelope`: the versioned plan file (``tangram_opt.plan/1``) that embeds the cluster,
  model and training spec;
- :mod:`.ranks`: global ranks, nodes and GPUs of every stage;
- :mod:`.parts`: homogeneous parts (what one framework job can express);
- :mod:`.megatron`, :mod:`.deepspeed`, :mod:`.torchtitan`: the framework-specific forms.

See docs/exports.md for the flag sources and what a heterogeneous plan needs beyond each framework.
"""

import json
from pathlib import Path

from tangram_opt.export.deepspeed import deepspeed_config, deepspeed_json, deepspeed_notes, deepspeed_parts
from tangram_opt.export.envelope import (PLAN_FILE_SCHEMA, PlanFile, plan_envelope, plan_file_from_dict,
                                         plan_file_json, plan_file_json_schema, read_plan_file, save_plan_file,
                                         training_of)
from tangram_opt.export.megatron import megatron_args, megatron_export, megatron_script
from tangram_opt.export.parts import (Part, SyncGroup, cross_pipeline_groups, heterogeneity_notes, homogeneous_parts,
                                      replica_notes, single_job)
from tangram_opt.export.ranks import StageRanks, assign_ranks, node_launches
from tangram_opt.export.torchtitan import torchtitan_parts, torchtitan_toml

#: names accepted by ``plan --export`` and ``show --format`` for framework exports
FORMATS = ("megatron", "deepspeed", "torchtitan")


def export_notes(fmt: str, plan_file: PlanFile) -> list[str]:
    """Notes that do not fit in the export's own syntax (DeepSpeed JSON of a single-job plan)."""
    return deepspeed_notes(plan_file.plan) if fmt == "deepspeed" else []


def export_text(fmt: str, plan_file: PlanFile) -> str:
    """The text of one export format for a plan file (uses its model and cluster when present)."""
    plan, cluster = plan_file.plan, plan_file.cluster
    if fmt == "megatron":
        return megatron_script(plan, model=plan_file.model, cluster=cluster)
    if fmt == "deepspeed":
        return deepspeed_json(plan, cluster)
    if fmt == "torchtitan":
        return torchtitan_toml(plan, cluster)
    raise ValueError(f"unknown export format {fmt!r}")


#: file name written by ``tangram-opt plan --export-dir`` for each format
EXPORT_FILES = {"megatron": "megatron_args.sh", "deepspeed": "deepspeed.json", "torchtitan": "torchtitan.toml"}


def write_exports(plan_file: PlanFile, formats: tuple[str, ...] | list[str], out_dir: str | Path) -> list[Path]:
    """Write the export files of ``formats`` into ``out_dir``; returns the paths written.

    ``megatron_args.sh`` always; ``deepspeed.json`` (a bare ds_config for a single-job plan, else a
    listing with notes) plus ``deepspeed_part<i>.json`` per part when there are several;
    ``torchtitan.toml`` for a single-job plan, else ``torchtitan_part<i>.toml`` per part.
    """
    from tangram_opt.errors import FormatError

    out = Path(out_dir)
    written: list[Path] = []

    def put(name: str, text: str) -> None:
        p = out / name
        try:
            out.mkdir(parents=True, exist_ok=True)
            p.write_text(text, encoding="utf-8")
        except OSError as e:
            raise FormatError("export-dir", str(out), f"cannot be written ({e.strerror or e})",
                              "choose a writable directory") from None
        written.append(p)

    plan, cluster = plan_file.plan, plan_file.cluster
    for fmt in formats:
        if fmt == "megatron":
            put(EXPORT_FILES[fmt], megatron_script(plan, model=plan_file.model, cluster=cluster))
        elif fmt == "deepspeed":
            put(EXPORT_FILES[fmt], deepspeed_json(plan, cluster))
            parts = deepspeed_parts(plan, cluster)
            if len(parts) > 1:
                for p in parts:
                    put(f"deepspeed_{p.name}.json", json.dumps(p.config, indent=2) + "\n")
        elif fmt == "torchtitan":
            tparts = torchtitan_parts(plan, cluster)
            if single_job(tuple(p.part for p in tparts)):
                put(EXPORT_FILES[fmt], torchtitan_toml(plan, cluster))
            else:
                for p in tparts:
                    put(f"torchtitan_{p.name}.toml", p.toml())
        else:
            raise ValueError(f"unknown export format {fmt!r}")
    return written


__all__ = ["PLAN_FILE_SCHEMA", "PlanFile", "plan_envelope", "plan_file_json", "plan_file_json_schema",
           "plan_file_from_dict",
           "read_plan_file", "save_plan_file", "training_of", "megatron_args", "megatron_export", "megatron_script",
           "deepspeed_config", "deepspeed_json", "deepspeed_notes", "deepspeed_parts", "torchtitan_parts",
           "torchtitan_toml", "Part", "SyncGroup", "cross_pipeline_groups", "replica_notes", "heterogeneity_notes",
           "homogeneous_parts", "single_job", "StageRanks",
           "assign_ranks", "node_launches", "FORMATS", "EXPORT_FILES", "export_notes", "export_text", "write_exports"]
