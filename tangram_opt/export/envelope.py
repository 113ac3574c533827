"""The plan file: a versioned JSON envelope around a plan and the inputs it was made from.

``tangram-opt plan --output plan.json`` writes, and ``show`` / ``simulate`` read::

    {
      "schema": "tangram_opt.plan/1",          # this envelope's name and major version
      "tangram_opt_version": "0.1.0",           # the writer (informative)
      "plan": {...},                            # Plan.to_dict() (its own "schema_version")
      "cluster": {...} | null,                  # Cluster.to_dict(): the cluster file form
      "model": {...} | null,                    # ModelSpec.to_dict(): the tangram model file form
      "training": {...} | null,                 # TrainingSpec.to_dict()
      "calibration": {...},                     # optional: the calibration planned with (file form)
      "profiles": [{...}, ...],                 # optional: the measured layer profiles planned with
      "summary": {...}                          # derived figures for readers; ignored when read
    }

Embedding the cluster and model makes a plan file self-contained: it can be shown, simulated and
exported on another machine without the original files; a plan made with a calibration file or
measured profiles carries them, so ``simulate`` replays it with the prices it was planned with. A bare ``Plan.save`` file (no envelope)
is also accepted; it then needs ``--cluster`` / ``--model`` for the verbs that use them.
See docs/cli.md, "The plan file".
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tangram_opt.cost.calibration import Calibration, calibration_from_dict, calibration_to_dict
from tangram_opt.cost.profiles import LayerProfile, profile_from_dict
from tangram_opt.errors import FormatError, SpecError
from tangram_opt.planner.plan import Plan
from tangram_opt.specs.cluster import Cluster, cluster_from_dict
from tangram_opt.specs.model import ModelSpec, model_from_dict
from tangram_opt.specs.training import TrainingSpec, training_from_dict

#: Name and major version of the plan file envelope. A reader accepts exactly this major version;
#: new optional keys may be added without changing it.
PLAN_FILE_SCHEMA = "tangram_opt.plan/1"
_SCHEMA_NAME = PLAN_FILE_SCHEMA.split("/")[0]


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanFile:
    """A plan and, when the file holds them, the cluster, model and training run it was made for."""

    plan: Plan
    cluster: Cluster | None = None
    model: ModelSpec | None = None
    training: TrainingSpec | None = None
    calibration: Calibration | None = None
    profiles: tuple[LayerProfile, ...] = ()
    source: str = ""

    @property
    def cost_inputs(self) -> dict[str, Any]:
        """The measured inputs the plan was made with, as keyword arguments of ``simulate``."""
        return {"calibration": self.calibration, "profiles": self.profiles or None}

    @property
    def training_or_default(self) -> TrainingSpec:
        """The stored training spec, else the one implied by the plan (batch, sequence, precision)."""
        return self.training if self.training is not None else training_of(self.plan)


def training_of(plan: Plan) -> TrainingSpec:
    """The training spec a plan implies (default bytes per parameter for its precision)."""
    return TrainingSpec(global_batch_size=plan.global_batch_size, seq_len=plan.seq_len, precision=plan.precision)


def plan_envelope(plan: Plan, *, cluster: Cluster | None = None, model: ModelSpec | None = None,
                  training: TrainingSpec | None = None, calibration: Calibration | None = None,
                  profiles: Iterable[LayerProfile] | None = None) -> dict[str, Any]:
    """The plan file as a dict (see the module docstring)."""
    from tangram_opt import __version__

    extra: dict[str, Any] = {}
    if calibration is not None:
        extra["calibration"] = calibration_to_dict(calibration)
    if profiles:
        extra["profiles"] = [p.to_dict() for p in profiles]
    return {
        "schema": PLAN_FILE_SCHEMA,
        "tangram_opt_version": __version__,
        "plan": plan.to_dict(),
        "cluster": cluster.to_dict() if cluster is not None else None,
        "model": model.to_dict() if model is not None else None,
        "training": (training or training_of(plan)).to_dict(),
        **extra,
        "summary": _summary(plan),
    }


def _summary(plan: Plan) -> dict[str, Any]:
    cert = plan.certificate
    return {"step_time_s": plan.step_time_s, "tokens_per_s": plan.tokens_per_s, "mfu": plan.mfu,
            "gpus_used": plan.gpus_used, "pipelines": len(plan.pipelines),
            "stages": [p.num_stages for p in plan.pipelines],
            "sequences_per_pipeline": list(plan.sequences_per_pipeline), "cross_sync_s": plan.cross_sync_s,
            "status": cert.status if cert else None, "gap": cert.gap if cert else None,
            "bound_s": cert.bound_s if cert else None}


def plan_file_json(plan: Plan, *, cluster: Cluster | None = None, model: ModelSpec | None = None,
                   training: TrainingSpec | None = None, calibration: Calibration | None = None,
                   profiles: Iterable[LayerProfile] | None = None) -> str:
    """The plan file's text (strict JSON: non-finite floats are written as ``null``)."""
    env = _finite(plan_envelope(plan, cluster=cluster, model=model, training=training, calibration=calibration,
                                profiles=profiles))
    return json.dumps(env, indent=2, allow_nan=False) + "\n"


def save_plan_file(path: str | Path, plan: Plan, *, cluster: Cluster | None = None, model: ModelSpec | None = None,
                   training: TrainingSpec | None = None, calibration: Calibration | None = None,
                   profiles: Iterable[LayerProfile] | None = None) -> Path:
    """Write the plan file; returns the path."""
    p = Path(path)
    text = plan_file_json(plan, cluster=cluster, model=model, training=training, calibration=calibration,
                          profiles=profiles)
    try:
        if p.parent and not p.parent.exists():
            p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf-8")
    except OSError as e:
        raise FormatError("output", str(path), f"cannot be written ({e.strerror or e})",
                          "choose a writable path") from None
    return p


def _finite(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def read_plan_file(path: str | Path) -> PlanFile:
    """Read a plan file (envelope or bare ``Plan.save`` output)."""
    p = Path(path)
    if not p.is_file():
        raise FormatError("plan", str(path), "file not found",
                          "pass a file written by `tangram-opt plan --output` (check the path)")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise FormatError("plan", str(path), "is not a text file", "pass a JSON plan file") from None
    except json.JSONDecodeError as e:
        raise FormatError("plan", str(path), f"is not valid JSON (line {e.lineno}: {e.msg})",
                          "pass a file written by `tangram-opt plan --output`") from None
    return plan_file_from_dict(data, source=str(path))


def plan_file_from_dict(data: Any, *, source: str = "") -> PlanFile:
    """Inverse of :func:`plan_envelope` (also accepts a bare ``Plan.to_dict()``)."""
    if not isinstance(data, Mapping):
        raise FormatError("plan", type(data).__name__, "must be a JSON object", "pass a plan file", source=source)
    if "schema" not in data:
        if "pipelines" in data:  # a bare Plan.save file
            return PlanFile(plan=_plan(data, source), source=source)
        raise FormatError("schema", None, "is missing: this is not a tangram_opt plan file",
                          "pass a file written by `tangram-opt plan --output`", source=source)
    schema = data["schema"]
    if not isinstance(schema, str) or not schema.startswith(_SCHEMA_NAME + "/"):
        raise FormatError("schema", schema, "is not a tangram_opt plan file schema",
                          f"pass a file whose schema is {PLAN_FILE_SCHEMA!r}", source=source)
    if schema != PLAN_FILE_SCHEMA:
        raise FormatError("schema", schema, f"this tangram_opt reads {PLAN_FILE_SCHEMA!r}",
                          "re-create the plan with this version, or upgrade tangram_opt", source=source)
    if "plan" not in data:
        raise FormatError("plan", None, "is missing from the plan file", "pass a complete plan file", source=source)
    cluster = _part(data, "cluster", cluster_from_dict, source)
    model = _part(data, "model", model_from_dict, source)
    training = _part(data, "training", training_from_dict, source)
    calibration = _part(data, "calibration", calibration_from_dict, source)
    raw = data.get("profiles") or []
    if not isinstance(raw, list):
        raise FormatError("profiles", type(raw).__name__, "must be a list of layer profiles",
                          "re-write the plan file with tangram-opt plan --output", source=source)
    profiles = tuple(_part({"profiles": d}, "profiles", profile_from_dict, source) for d in raw)
    return PlanFile(plan=_plan(data["plan"], source), cluster=cluster, model=model, training=training,
                    calibration=calibration, profiles=profiles, source=source)


def plan_file_json_schema() -> dict[str, Any]:
    """JSON Schema (draft 2020-12) of the plan file, derived from the plan dataclasses' fields so it
    always matches what this version writes and reads."""
    from dataclasses import MISSING, fields

    from tangram_opt.planner.plan import PLAN_SCHEMA_VERSION, Certificate, PipelinePlan, StagePlan

    def obj(cls: type, override: dict[str, Any]) -> dict[str, Any]:
        props, required = {}, []
        for f in fields(cls):
            props[f.name] = override.get(f.name, _json_type(str(f.type)))
            if f.default is MISSING and f.default_factory is MISSING:  # type: ignore[misc]
                required.append(f.name)
        return {"type": "object", "properties": props, "required": required}

    stage = obj(StagePlan, {})
    pipe = obj(PipelinePlan, {"stages": {"type": "array", "items": stage, "minItems": 1}})
    cert = obj(Certificate, {"subproblems": {"type": "array", "items": {"type": "object"}},
                             "trajectory": {"type": "array", "items": {"type": "array"}},
                             "notes": {"type": "array", "items": {"type": "string"}}})
    plan = obj(Plan, {"pipelines": {"type": "array", "items": pipe, "minItems": 1},
                      "certificate": {"anyOf": [cert, {"type": "null"}]},
                      "island_gpus": {"type": "object", "additionalProperties": {"type": "integer"}},
                      "expert_placement": {"type": ["object", "null"]},
                      "schema_version": {"const": PLAN_SCHEMA_VERSION}})
    plan["required"] = sorted(set(plan["required"]) | {"schema_version"})
    plan["properties"]["metrics"] = {"type": "object", "description": "derived; ignored when read"}
    nullable_obj = {"type": ["object", "null"]}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"https://tangram-opt.invalid/schemas/{PLAN_FILE_SCHEMA}",
        "title": "tangram_opt plan file",
        "type": "object",
        "required": ["schema", "plan"],
        "properties": {
            "schema": {"const": PLAN_FILE_SCHEMA},
            "tangram_opt_version": {"type": "string"},
            "plan": plan,
            "cluster": {**nullable_obj, "description": "Cluster.to_dict(): the cluster file form"},
            "model": {**nullable_obj, "description": "ModelSpec.to_dict(): the tangram model file form"},
            "training": {**nullable_obj, "description": "TrainingSpec.to_dict()"},
            "summary": {"type": "object", "description": "derived figures for readers; ignored when read"},
        },
    }


def _json_type(annotation: str) -> dict[str, Any]:
    a = annotation.replace(" ", "")
    nullable = "None" in a.split("|")
    base = [t for t in a.split("|") if t != "None"][0] if "|" in a else a
    t = {"int": "integer", "float": "number", "str": "string", "bool": "boolean"}.get(base)
    if t is None:
        t = "object" if base.startswith("dict") else "array" if base.startswith("tuple") else "string"
    if t == "number":
        t_list: Any = ["number", "null"] if nullable else "number"
    else:
        t_list = [t, "null"] if nullable else t
    return {"type": t_list}


def _plan(d: Any, source: str) -> Plan:
    try:
        return Plan.from_dict(d)
    except SpecError as e:
        if source and not e.source:
            raise type(e)(e.field, e.value, e.problem, e.fix, source=source) from None
        raise


def _part(data: Mapping[str, Any], key: str, reader: Any, source: str) -> Any:
    d = data.get(key)
    if d is None:
        return None
    try:
        return reader(d, source=source)
    except SpecError as e:
        raise type(e)(f"{key}.{e.field}" if e.field else key, e.value, e.problem, e.fix,
                      source=source or e.source) from None


__all__ = ["PLAN_FILE_SCHEMA", "PlanFile", "plan_envelope", "plan_file_json", "plan_file_json_schema",
           "plan_file_from_dict", "read_plan_file", "save_plan_file", "training_of"]
