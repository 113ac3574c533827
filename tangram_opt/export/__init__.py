"""Plan files and exports for training frameworks (Megatron-LM, DeepSpeed, torchtitan).

- :mod:`.envelope`: the versioned plan file (``tangram_opt.plan/1``) that embeds the cluster,
  model and training spec;
- :mod:`.ranks`: global ranks, nodes and GPUs of every stage;
- :mod:`.parts`: homogeneous parts (what one framework job can express);
- :mod:`.launch`: whether a plan is one stock job of a framework (:func:`launchable`) and why each
  refused part is not written (:func:`part_refusals`);
- :mod:`.megatron`, :mod:`.deepspeed`, :mod:`.torchtitan`: the framework-specific forms.

See docs/exports.md for the flag sources and what a heterogeneous plan needs beyond each framework.

Layer: consumers (beside sim, show and analysis): reads plans and specs, imports nothing of the
search.
"""

import json
from pathlib import Path

from tangram_opt.export.deepspeed import deepspeed_config, deepspeed_json, deepspeed_notes, deepspeed_parts
from tangram_opt.export.envelope import (PLAN_FILE_SCHEMA, PlanFile, plan_envelope, plan_file_from_dict,
                                         plan_file_json, plan_file_json_schema, read_plan_file, save_plan_file,
                                         training_of)
from tangram_opt.export.launch import FRAMEWORKS, launchable, part_refusals
from tangram_opt.export.megatron import megatron_args, megatron_export, megatron_script
from tangram_opt.export.parts import (Part, SyncGroup, cross_pipeline_groups, heterogeneity_notes, homogeneous_parts,
                                      replica_notes, single_job)
from tangram_opt.export.ranks import StageRanks, assign_ranks, identical_pipelines, node_launches
from tangram_opt.export.torchtitan import torchtitan_parts, torchtitan_script, torchtitan_toml

#: names accepted by ``plan --export`` and ``show --format`` for framework exports: ``torchtitan`` is
#: the current release (0.3.x, command-line overrides), ``torchtitan-0.2`` the 0.2.x TOML job file
FORMATS = ("megatron", "deepspeed", "torchtitan", "torchtitan-0.2")


def export_refusals(fmt: str, plan_file: PlanFile) -> list[str]:
    """Why parts of the plan are not written in format ``fmt``: the framework's own checks reject them.
    Each reason ends with the nearest plan the framework accepts."""
    plan, cluster, model = plan_file.plan, plan_file.cluster, plan_file.model
    if fmt == "megatron":
        return list(megatron_export(plan, model=model, cluster=cluster).refusals)
    if fmt == "deepspeed":
        return [r for p in deepspeed_parts(plan, cluster) for r in p.refusals]
    if fmt in ("torchtitan", "torchtitan-0.2"):
        version = "0.2" if fmt == "torchtitan-0.2" else "0.3"
        return [r for p in torchtitan_parts(plan, cluster, version=version, model=model) for r in p.refusals]
    raise ValueError(f"unknown export format {fmt!r}")


def export_notes(fmt: str, plan_file: PlanFile) -> list[str]:
    """Notes that do not fit in the export's own syntax (DeepSpeed JSON of a single-job plan), and every
    refused part ("not written: <why>; <the nearest plan the framework accepts>")."""
    if fmt == "deepspeed":
        return deepspeed_notes(plan_file.plan)
    return [f"not written: {r}" for r in export_refusals(fmt, plan_file)]


def export_text(fmt: str, plan_file: PlanFile) -> str:
    """The text of one export format for a plan file (uses its model and cluster when present)."""
    plan, cluster = plan_file.plan, plan_file.cluster
    if fmt == "megatron":
        return megatron_script(plan, model=plan_file.model, cluster=cluster)
    if fmt == "deepspeed":
        return deepspeed_json(plan, cluster)
    if fmt == "torchtitan":
        return torchtitan_script(plan, cluster, model=plan_file.model)
    if fmt == "torchtitan-0.2":
        return torchtitan_toml(plan, cluster, model=plan_file.model)
    raise ValueError(f"unknown export format {fmt!r}")


#: file name written by ``tangram-opt plan --export-dir`` for each format (one pipeline of one part)
EXPORT_FILES = {"megatron": "megatron_args.sh", "deepspeed": "deepspeed.json", "torchtitan": "torchtitan.sh",
                "torchtitan-0.2": "torchtitan.toml"}


def write_exports(plan_file: PlanFile, formats: tuple[str, ...] | list[str], out_dir: str | Path) -> list[Path]:
    """Write the export files of ``formats`` into ``out_dir``; returns the paths written.

    Only what the framework's own checks accept is written (:func:`export_refusals` says why the rest
    is not; :func:`export_notes` carries the same reasons for the command line):
    ``megatron_args.sh`` unless every part is refused; ``deepspeed.json`` (a bare ds_config for a
    single-job plan, else a listing with notes) plus ``deepspeed_part<i>.json`` per accepted part when
    there are several; ``torchtitan.sh`` (torchtitan 0.3 overrides and launch lines);
    ``torchtitan.toml`` for a single-job plan (torchtitan 0.2), else ``torchtitan_part<i>.toml`` per
    accepted part.
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

    plan, cluster, model = plan_file.plan, plan_file.cluster, plan_file.model
    for fmt in formats:
        if fmt == "megatron":
            ex = megatron_export(plan, model=model, cluster=cluster)
            if any(not b.refusals for b in ex.blocks):
                put(EXPORT_FILES[fmt], megatron_script(plan, model=model, cluster=cluster))
        elif fmt == "deepspeed":
            parts = deepspeed_parts(plan, cluster)
            accepted = [p for p in parts if not p.refusals]
            if accepted:
                put(EXPORT_FILES[fmt], deepspeed_json(plan, cluster))
            if len(parts) > 1 or len(accepted) < len(parts):
                for p in accepted:
                    put(f"deepspeed_{p.name}.json", json.dumps(p.config, indent=2) + "\n")
        elif fmt == "torchtitan":
            tparts = torchtitan_parts(plan, cluster, version="0.3", model=model)
            if any(not p.refusals for p in tparts):
                put(EXPORT_FILES[fmt], torchtitan_script(plan, cluster, model=model))
        elif fmt == "torchtitan-0.2":
            tparts = torchtitan_parts(plan, cluster, version="0.2", model=model)
            if single_job(tuple(p.part for p in tparts)) and not tparts[0].refusals:
                put(EXPORT_FILES[fmt], torchtitan_toml(plan, cluster, model=model))
            else:
                for p in tparts:
                    if not p.refusals:
                        put(f"torchtitan_{p.name}.toml", p.toml())
        else:
            raise ValueError(f"unknown export format {fmt!r}")
    return written


__all__ = ["PLAN_FILE_SCHEMA", "PlanFile", "plan_envelope", "plan_file_json", "plan_file_json_schema",
           "plan_file_from_dict",
           "read_plan_file", "save_plan_file", "training_of", "megatron_args", "megatron_export", "megatron_script",
           "deepspeed_config", "deepspeed_json", "deepspeed_notes", "deepspeed_parts", "torchtitan_parts",
           "torchtitan_toml", "torchtitan_script", "launchable", "part_refusals", "export_refusals", "FRAMEWORKS",
           "identical_pipelines", "Part", "SyncGroup", "cross_pipeline_groups", "replica_notes", "heterogeneity_notes",
           "homogeneous_parts", "single_job", "StageRanks",
           "assign_ranks", "node_launches", "FORMATS", "EXPORT_FILES", "export_notes", "export_text", "write_exports"]
