"""Sweep files: a base cluster, model and training run, and the axes whose cartesian product is swept.

::

    name: tiny-mixed what-if
    cluster: tiny-mixed                 # example name, path (relative to this file) or inline mapping
    model: opt-350m
    training: {global_batch_size: 64, seq_len: 2048}   # precision: auto (default) = bf16 if every GPU has it
    solve: {time_limit_s: 5, rel_gap: 0.01, multi_pipeline: false}
    axes:
      node_groups.a100.nodes: [0, 1, 2]          # 0 leaves the group out
      node_groups.v100.price_per_gpu_hour: [0.79, 3.06]
      training.global_batch_size: [32, 64]
      model: [opt-350m, gpt-neo-2.7b]

Axis keys (:data:`AXIS_FORMS`): ``node_groups.<group>.<field>`` for any node group field of the
cluster file (``nodes``, ``gpu``, ``gpus_per_node``, ``price_per_gpu_hour``, ``nic_gbps``, ...),
``training.<field>`` for a training field, ``model`` and ``cluster`` for whole alternatives.
Every value is checked before anything is solved: a mistake raises a
:class:`~tangram_opt.errors.SpecError` naming ``axes.<key>`` (or the top-level field), the value
and the fix. A variant whose every node group is at ``nodes: 0`` is kept in the results as
``skipped``.

A ``gpu`` axis keeps the group's other fields as the cluster file writes them; fields the file
leaves out (the intra-node link, for one) follow the new GPU's defaults. A cluster given as a
:class:`~tangram_opt.specs.cluster.Cluster` object is taken in its ``to_dict()`` form, where every
field is written.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from tangram_opt.errors import SpecError
from tangram_opt.specs import _check
from tangram_opt.specs._io import load_structured_file
from tangram_opt.specs.cluster import _EXAMPLES, _GROUP_FIELDS, Cluster, cluster_from_dict, example_clusters
from tangram_opt.specs.model import ModelSpec
from tangram_opt.specs.presets import load_model
from tangram_opt.specs.pricing import GROUP_PRICE_FIELD
from tangram_opt.specs.training import TrainingSpec, check_precision, training_from_dict

SWEEP_FIELDS = ("name", "description", "cluster", "model", "training", "solve", "axes")
#: what a sweep file's ``solve:`` may set; passed to :func:`tangram_opt.solve` (``multi_pipeline``
#: through ``SearchOptions``)
SOLVE_FIELDS = ("time_limit_s", "rel_gap", "backend", "seed", "threads", "multi_pipeline")
#: a sweep's per-variant time limit when neither the file nor the caller gives one (``solve``'s own
#: default, 60 s, would make a 50-variant sweep take most of an hour)
DEFAULT_TIME_LIMIT_S = 10.0
TRAINING_FIELDS = tuple(f.name for f in fields(TrainingSpec))
AXIS_FORMS = ("node_groups.<group>.<field>", "training.<field>", "model", "cluster")
#: a group at ``nodes: 0`` is left out of the variant
ABSENT = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Axis:
    """One swept field and its values."""

    key: str
    values: tuple[Any, ...]

    @property
    def kind(self) -> str:
        """"model", "cluster", "training" or "group"."""
        head = self.key.split(".", 1)[0]
        return {"node_groups": "group"}.get(head, head)

    @property
    def group(self) -> str | None:
        return self.key.split(".")[1] if self.kind == "group" else None

    @property
    def field(self) -> str | None:
        return self.key.rsplit(".", 1)[1] if self.kind in ("group", "training") else None


@dataclass(frozen=True, slots=True, kw_only=True)
class Variant:
    """One point of the sweep: the axis values and the specs they give (``cluster`` is ``None``
    when the variant is skipped; ``skipped`` says why)."""

    index: int
    settings: tuple[tuple[str, Any], ...]
    cluster: Cluster | None
    model: ModelSpec
    training: TrainingSpec | None
    skipped: str = ""

    @property
    def label(self) -> str:
        return ", ".join(f"{_short(k)}={_show(v)}" for k, v in self.settings) or "base"


def _short(key: str) -> str:
    """``node_groups.a100.nodes`` -> ``a100.nodes``, ``training.seq_len`` -> ``seq_len`` (labels only)."""
    head, _, rest = key.partition(".")
    return rest if head in ("node_groups", "training") else key


def _show(v: Any) -> str:
    if isinstance(v, Mapping):
        return str(v.get("name", "inline"))
    return str(v)


@dataclass(frozen=True, slots=True, kw_only=True)
class SweepSpec:
    """A parsed, checked sweep: the base specs (file forms), the solve settings and the axes."""

    name: str
    cluster: Any
    model: Any
    training: Mapping[str, Any]
    solve: Mapping[str, Any]
    axes: tuple[Axis, ...]
    description: str = ""
    base_dir: Path | None = None
    source: str = ""

    @property
    def size(self) -> int:
        """Number of variants: the product of the axes' lengths."""
        return math.prod(len(a.values) for a in self.axes)

    def variants(self) -> list[Variant]:
        """Every variant, in the axes' order (the last axis varies fastest), each checked."""
        out = []
        for index, combo in enumerate(itertools.product(*(a.values for a in self.axes))):
            settings = tuple(zip((a.key for a in self.axes), combo))
            out.append(self._variant(index, settings))
        return out

    # --- building one variant -----------------------------------------------------------------
    def _variant(self, index: int, settings: tuple[tuple[str, Any], ...]) -> Variant:
        values = dict(settings)
        cluster_raw = _cluster_raw(values.get("cluster", self.cluster), self.base_dir, "cluster", self.source)
        groups = [dict(g) if isinstance(g, Mapping) else g for g in cluster_raw.get("node_groups") or []]
        training_raw = dict(self.training)
        for key, value in settings:
            axis = next(a for a in self.axes if a.key == key)
            if axis.kind == "group":
                g = _find_group(groups, axis.group, key, self.source)  # type: ignore[arg-type]
                g[axis.field] = value  # type: ignore[index]
            elif axis.kind == "training":
                training_raw[axis.field] = value  # type: ignore[index]
        kept = [g for g in groups if not (isinstance(g, Mapping) and g.get("nodes") == ABSENT)]
        model = _model(values.get("model", self.model), self.base_dir, "model", self.source)
        if not kept:
            return Variant(index=index, settings=settings, cluster=None, model=model, training=None,
                           skipped="no node group left (every group at nodes: 0)")
        zones = {str(g.get("zone", "default")) for g in kept if isinstance(g, Mapping)}
        links = [z for z in cluster_raw.get("zone_links") or []
                 if not isinstance(z, Mapping) or not isinstance(z.get("zones"), list)
                 or set(map(str, z["zones"])) <= zones]
        cluster = cluster_from_dict({**cluster_raw, "node_groups": kept, "zone_links": links},
                                    source=str(cluster_raw.get("name", "cluster")))
        training = _training(training_raw, cluster, self.source)
        return Variant(index=index, settings=settings, cluster=cluster, model=model, training=training)

    def _valid_base(self) -> bool:
        try:
            self._variant(0, ())
        except SpecError:
            return False
        return True

    def check(self) -> list[Variant]:
        """Every variant, or a :class:`SpecError` naming the axis (or variant) that gives a bad one.

        Each axis value is first applied alone to the base, so a bad value is named by its axis;
        then every combination is built (a combination can fail where each value alone does not,
        e.g. bf16 with a V100 ``gpu`` value)."""
        # a value is blamed on its axis when it breaks a valid base; a base that is itself invalid (bf16
        # with V100 nodes an axis may leave out) is judged by whole combinations. With a cluster axis a
        # group may exist in some clusters only.
        alone = not any(a.kind == "cluster" for a in self.axes) and self._valid_base()
        for axis in self.axes if alone else ():
            for value in axis.values:
                try:
                    self._variant(0, ((axis.key, value),))
                except SpecError as e:
                    raise SpecError(f"axes.{axis.key}", value, f"gives an invalid variant: {e.field} = {e.value!r} "
                                    f"{e.problem}", e.fix, source=self.source) from None
        out = []
        for index, combo in enumerate(itertools.product(*(a.values for a in self.axes))):
            settings = tuple(zip((a.key for a in self.axes), combo))
            try:
                out.append(self._variant(index, settings))
            except SpecError as e:
                label = ", ".join(f"{k}={_show(v)}" for k, v in settings)
                raise SpecError("axes", label, f"this combination is invalid: {e.field} = {e.value!r} {e.problem}",
                                e.fix or "change or remove one of the values", source=self.source) from None
        return out


def _find_group(groups: list[Any], name: str, key: str, source: str) -> dict[str, Any]:
    for g in groups:
        if isinstance(g, Mapping) and str(g.get("name")) == name:
            return g  # type: ignore[return-value]
    names = [str(g.get("name")) for g in groups if isinstance(g, Mapping)]
    raise SpecError(f"axes.{key}", name, "names no node group of the cluster",
                    f"use one of {', '.join(names)} (node groups need a name: to be swept)", source=source)


# --- base specs --------------------------------------------------------------------------------------
def _resolve_path(spec: Any, base_dir: Path | None) -> Path | None:
    if not isinstance(spec, (str, Path)):
        return None
    for p in ((base_dir / spec) if base_dir else None, Path(spec)):
        if p is not None and p.is_file():
            return p
    return None


def _cluster_raw(spec: Any, base_dir: Path | None, field: str, source: str) -> dict[str, Any]:
    """The cluster's file form as written (so fields it leaves out keep following the GPU)."""
    if isinstance(spec, Cluster):
        return spec.to_dict()
    if isinstance(spec, Mapping):
        return dict(spec)
    path = _resolve_path(spec, base_dir)
    if path is None and isinstance(spec, str) and spec in example_clusters():
        path = _EXAMPLES / f"{spec}.yaml"
    if path is None:
        raise SpecError(field, spec, "is neither a cluster file nor a built-in example cluster",
                        "give a YAML/JSON path (relative to the sweep file) or one of: "
                        f"{', '.join(example_clusters())}",
                        source=source)
    data = load_structured_file(path)
    _check.mapping(field, data, source=str(path))
    data = dict(data)
    data.setdefault("name", path.stem)
    return data


def _model(spec: Any, base_dir: Path | None, field: str, source: str) -> ModelSpec:
    if isinstance(spec, ModelSpec):
        return spec
    path = _resolve_path(spec, base_dir)
    try:
        return load_model(path if path is not None else spec)
    except SpecError as e:
        raise SpecError(field, spec, f"is not a model: {e.problem}", e.fix, source=source) from None


def _training(raw: Mapping[str, Any], cluster: Cluster, source: str) -> TrainingSpec:
    """The variant's training run; ``precision: auto`` (or none) is bf16 where every GPU has it, else
    fp16 (``solve``'s own default rule)."""
    from tangram_opt.planner.search.api import default_training

    data = dict(raw)
    if data.get("precision", "auto") == "auto":
        data["precision"] = default_training(cluster).precision
    training = training_from_dict(data, source=source)
    check_precision(training, cluster)
    return training


# --- reading a sweep file ----------------------------------------------------------------------------
def load_sweep(spec: str | Path | Mapping[str, Any] | SweepSpec) -> SweepSpec:
    """A :class:`SweepSpec` from a YAML/JSON file, a dict of the same form, or a SweepSpec (returned as is).
    Paths inside a file are read relative to the file first."""
    if isinstance(spec, SweepSpec):
        return spec
    if isinstance(spec, Mapping):
        return sweep_from_dict(spec)
    if not isinstance(spec, (str, Path)):
        raise SpecError("sweep", spec, f"cannot be read from a {type(spec).__name__}",
                        "give a YAML/JSON sweep file, a dict or a SweepSpec")
    path = Path(spec)
    data = load_structured_file(path)
    return sweep_from_dict(data, source=str(path), base_dir=path.resolve().parent)


def sweep_from_dict(data: Any, *, source: str = "", base_dir: Path | None = None) -> SweepSpec:
    """Parse a sweep's file form, checking its fields, the base specs and the axes
    (:meth:`SweepSpec.check` then builds every variant; :func:`tangram_opt.sweep` calls it first)."""
    _check.mapping("sweep", data, source=source)
    _check.no_unknown_keys("", data, SWEEP_FIELDS, source=source)
    cluster = _check.required("", data, "cluster", source=source, hint="add cluster: (an example name or a file)")
    model = _check.required("", data, "model", source=source, hint="add model: (a preset name or a file)")
    training = data.get("training") or {}
    _check.mapping("training", training, source=source)
    _check.no_unknown_keys("training", training, TRAINING_FIELDS, source=source)
    solve = dict(data.get("solve") or {})
    _check.mapping("solve", solve, source=source)
    _check.no_unknown_keys("solve", solve, SOLVE_FIELDS, source=source)
    check_solve_settings(solve, source=source)
    axes = tuple(_axis(k, v, source) for k, v in _check.mapping("axes", data.get("axes") or {}, source=source).items())
    spec = SweepSpec(name=str(data.get("name") or (Path(source).stem if source else "sweep")),
                     description=str(data.get("description", "")), cluster=cluster, model=model,
                     training=training, solve=solve, axes=axes, base_dir=base_dir, source=source)
    base = _cluster_raw(cluster, base_dir, "cluster", source)
    with _check.in_source(source):
        cluster_from_dict(base, source=str(base.get("name", "cluster")))
        _model(model, base_dir, "model", source)
    group_names = {str(g.get("name")) for g in base.get("node_groups") or [] if isinstance(g, Mapping)}
    for a in axes:
        if a.kind == "group" and a.group not in group_names and not any(x.kind == "cluster" for x in axes):
            raise SpecError(f"axes.{a.key}", a.group, "names no node group of the base cluster",
                            f"use one of {', '.join(sorted(group_names))} (node groups need a name: to be swept)",
                            source=source)
    return spec


def _axis(key: Any, values: Any, source: str) -> Axis:
    field = f"axes.{key}"
    if not isinstance(key, str):
        raise SpecError(field, key, "is not an axis name", f"use one of the forms {', '.join(AXIS_FORMS)}",
                        source=source)
    parts = key.split(".")
    if parts[0] == "node_groups":
        if len(parts) != 3 or not parts[1]:
            raise SpecError(field, values, "is not an axis", "write node_groups.<group name>.<field>, e.g. "
                            "node_groups.a100.nodes", source=source)
        if parts[2] not in _GROUP_FIELDS or parts[2] == "name":
            close = _check.closest(parts[2], [f for f in _GROUP_FIELDS if f != "name"])
            raise SpecError(field, values, f"{parts[2]!r} is not a node group field that can be swept",
                            f"use one of {', '.join(close)} (docs/user_guide/inputs.md lists them all)", source=source)
    elif parts[0] == "training":
        if len(parts) != 2 or parts[1] not in TRAINING_FIELDS:
            raise SpecError(field, values, "is not a training field", f"use training.<one of "
                            f"{', '.join(TRAINING_FIELDS)}>", source=source)
    elif key not in ("model", "cluster"):
        close = _check.closest(key, ["model", "cluster", "training.global_batch_size", "node_groups.<group>.nodes"])
        raise SpecError(field, values, "is not a known axis",
                        f"use one of the forms {', '.join(AXIS_FORMS)} (did you mean {', '.join(close)}?)",
                        source=source)
    if not isinstance(values, list):
        raise SpecError(field, values, f"must be a list of values, not {type(values).__name__}",
                        f"write {key}: [a, b, ...]", source=source)
    if not values:
        raise SpecError(field, values, "is empty", f"give at least one value, or remove the axis {key}", source=source)
    seen: list[str] = []
    for v in values:
        if isinstance(v, (list, tuple)):
            raise SpecError(field, v, "is a list inside the axis", "give one value per entry", source=source)
        token = json.dumps(v, sort_keys=True, default=str)
        if token in seen:
            raise SpecError(field, v, "is listed twice", "list every value once", source=source)
        seen.append(token)
    if parts[-1] == "nodes":
        for v in values:
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise SpecError(field, v, "must be a whole number of nodes >= 0",
                                "write e.g. [0, 1, 2] (0 leaves the group out)", source=source)
    if parts[-1] == GROUP_PRICE_FIELD:
        from tangram_opt.specs.pricing import usd_amount

        for v in values:
            if v is not None:
                usd_amount(field, v, source=source)
    return Axis(key=key, values=tuple(values))


def check_solve_settings(solve: Mapping[str, Any], *, source: str = "", prefix: str = "solve.") -> None:
    """Refuse a ``solve:`` setting no search can honour before any variant is solved."""
    def number(x: Any) -> bool:
        return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)

    if "time_limit_s" in solve and (not number(solve["time_limit_s"]) or solve["time_limit_s"] < 0):
        raise SpecError(f"{prefix}time_limit_s", solve["time_limit_s"], "must be a number of seconds >= 0",
                        "write e.g. time_limit_s: 5", source=source)
    if "rel_gap" in solve and (not number(solve["rel_gap"]) or not 0 <= solve["rel_gap"] < 1):
        raise SpecError(f"{prefix}rel_gap", solve["rel_gap"], "is not a relative gap in [0, 1)",
                        "write e.g. rel_gap: 0.01 (within 1%)", source=source)
    for name in ("seed", "threads"):
        if name in solve:
            v = solve[name]
            low = 1 if name == "threads" else 0
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise SpecError(f"{prefix}{name}", v, f"must be an integer >= {low}", f"write e.g. {name}: {low}",
                                source=source)
    if "multi_pipeline" in solve and not isinstance(solve["multi_pipeline"], bool):
        raise SpecError(f"{prefix}multi_pipeline", solve["multi_pipeline"], "must be true or false",
                        "write multi_pipeline: false (one pipeline per variant, faster) or true", source=source)
    if "backend" in solve:
        from tangram_opt.solvers import get_backend

        if not isinstance(solve["backend"], str):
            raise SpecError(f"{prefix}backend", solve["backend"], "must be a backend name",
                            "write e.g. backend: highs", source=source)
        try:
            get_backend(solve["backend"])
        except SpecError as e:
            raise SpecError(f"{prefix}backend", solve["backend"], e.problem, e.fix, source=source) from None


def solve_key(variant: Variant, solve: Mapping[str, Any]) -> str:
    """What the solve of ``variant`` depends on. Prices are left out: the planner maximizes throughput,
    which they do not change, so variants that differ only in price share one solve. A ``solve``
    setting named ``objective`` (dollar objectives, issue 30 item 2) keeps them in."""
    assert variant.cluster is not None and variant.training is not None
    cluster = variant.cluster.to_dict()
    if "objective" not in solve:
        for g in cluster["node_groups"]:
            g.pop(GROUP_PRICE_FIELD, None)
        for z in cluster.get("zone_links", []):
            z.pop("egress_usd_per_gb", None)
    return json.dumps([cluster, variant.model.to_dict(), variant.training.to_dict(), dict(solve)], sort_keys=True,
                      default=str)


__all__ = [
    "AXIS_FORMS",
    "DEFAULT_TIME_LIMIT_S",
    "SOLVE_FIELDS",
    "SWEEP_FIELDS",
    "Axis",
    "SweepSpec",
    "Variant",
    "check_solve_settings",
    "load_sweep",
    "solve_key",
    "sweep_from_dict",
]

