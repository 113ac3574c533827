"""Model presets and the one model loader the rest of tangram_opt uses.

Each preset is the model's Hugging Face ``config.json`` as published on the Hub (values unchanged,
stored under ``tangram_opt/data/models/<preset>.json``), read through
:func:`~tangram_opt.specs.hf_config.model_from_hf_config`. Keeping the hub files rather than
hand-made shapes means every preset exercises the loader, and a preset can be checked against its
source by comparing two JSON files.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from tangram_opt.errors import SpecError
from tangram_opt.specs import _check
from tangram_opt.specs._io import load_structured_file, read_text
from tangram_opt.specs.hf_config import looks_like_hf_config, model_from_hf_config
from tangram_opt.specs.model import ModelSpec, model_from_dict

_MODELS = Path(__file__).resolve().parent.parent / "data" / "models"


def list_presets() -> tuple[str, ...]:
    """Names of the built-in model presets, sorted."""
    return tuple(sorted(p.stem for p in _MODELS.glob("*.json")))


def preset_path(name: str) -> Path:
    """The ``config.json`` file of preset ``name`` (case-insensitive)."""
    key = name.strip().lower()
    for preset in list_presets():
        if preset == key:
            return _MODELS / f"{preset}.json"
    hub_ids = _hub_ids()
    if key in hub_ids:
        return _MODELS / f"{hub_ids[key]}.json"
    guesses = _check.closest(key, list_presets())
    raise SpecError("model", name, "is not a model preset, a hub id of one, or an existing file",
                    f"did you mean {', '.join(guesses)}? All presets: {', '.join(list_presets())}; or give a path to a "
                    "config.json, a model directory, or a tangram model YAML/JSON file")


@lru_cache(maxsize=1)
def _hub_ids() -> dict[str, str]:
    """Lower-case hub ids (``_name_or_path``, e.g. ``meta-llama/meta-llama-3-8b``) -> preset name."""
    out: dict[str, str] = {}
    for preset in list_presets():
        data = load_structured_file(_MODELS / f"{preset}.json")
        hub_id = data.get("_name_or_path") if isinstance(data, dict) else None
        if isinstance(hub_id, str):
            out[hub_id.lower()] = preset
    return out


def load_preset(name: str) -> ModelSpec:
    """The :class:`ModelSpec` of a preset (name or hub id, case-insensitive)."""
    path = preset_path(name)
    return model_from_hf_config(path, name=path.stem)


def load_model(spec: str | Path | Mapping[str, Any] | ModelSpec, *, name: str | None = None) -> ModelSpec:
    """A model from any of the forms a user may give.

    - a :class:`ModelSpec`: returned as is;
    - a dict: a Hugging Face config (it has ``model_type`` or ``architectures``) or the tangram
      model form (:meth:`ModelSpec.to_dict`);
    - a path to a ``config.json``, to a directory holding one, or to a tangram model YAML/JSON file;
    - a preset name from :func:`list_presets` or the hub id of one (case-insensitive).

    ``name``, if given, renames the model (a ModelSpec passed in is returned unchanged).
    """
    if isinstance(spec, ModelSpec):
        return spec
    model = _load(spec)
    if name:
        _check.text("name", name)
        model = replace(model, name=name)
    return model


def _load(spec: Any) -> ModelSpec:
    if isinstance(spec, Mapping):
        return model_from_hf_config(spec) if looks_like_hf_config(spec) else model_from_dict(spec)
    if not isinstance(spec, (str, Path)):
        raise SpecError("model", spec, f"cannot be read from a {type(spec).__name__}",
                        "give a preset name, a path, a dict or a ModelSpec")
    path = Path(spec)
    if path.is_dir():
        return model_from_hf_config(path)
    if path.is_file():
        data = load_structured_file(path)
        if isinstance(data, Mapping) and looks_like_hf_config(data):
            return model_from_hf_config(path)
        return model_from_dict(data, source=str(path))
    if path.suffix.lower() in (".json", ".yaml", ".yml") or len(path.parts) > 2:
        read_text(path, field="model")  # raises "file not found" naming the path
    return load_preset(str(spec))


__all__ = ["list_presets", "load_model", "load_preset", "preset_path"]
