"""Reading YAML and JSON input files safely.

Every parse problem becomes a :class:`~tangram_opt.errors.FormatError` that names the file, the line
and column, and what to fix; nothing from the YAML or JSON parser escapes as a traceback. YAML is
read with a safe loader (no arbitrary Python objects) that also rejects a key written twice in one
mapping, and JSON likewise: both parsers would silently keep the last one, so a duplicated ``nodes:``
line would change a cluster without a word.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import yaml

from tangram_opt.errors import FormatError, SpecError
from tangram_opt.specs import _check

#: Suffixes read as JSON; everything else is read as YAML (JSON is a subset of YAML 1.2, but the
#: JSON parser gives better messages for JSON files).
JSON_SUFFIXES = (".json",)


class _StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses duplicate keys inside one mapping."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: dict[Any, Any] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            duplicate = key in seen
        except TypeError:  # unhashable key: let the base constructor report it
            break
        if duplicate:
            raise yaml.constructor.ConstructorError(
                "while reading a mapping", node.start_mark, f"found the key {key!r} twice", key_node.start_mark)
        seen[key] = True
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def read_text(path: str | Path, *, field: str = "path") -> tuple[Path, str]:
    """The file's text, or a :class:`FormatError` if it is missing, a directory or not UTF-8 text."""
    p = Path(path)
    if p.is_dir():
        raise FormatError(field, str(path), "is a directory, not a file", "give the path of a YAML or JSON file")
    if not p.is_file():
        raise FormatError(field, str(path), "file not found",
                          f"check the path (relative paths start from {Path.cwd()})")
    try:
        return p, p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise FormatError(field, str(path), f"is not UTF-8 text (byte {e.start})",
                          "give a YAML or JSON text file") from None
    except OSError as e:
        raise FormatError(field, str(path), f"cannot be read ({e.strerror})", "check the file's permissions") from None


def parse_json(text: str, source: str) -> Any:
    def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        obj: dict[str, Any] = {}
        for key, value in pairs:
            if key in obj:
                raise FormatError("file", source, f"is not valid JSON: found the key {key!r} twice in one object",
                                  f"keep one '{key}' entry (JSON parsers silently keep the last one)")
            obj[key] = value
        return obj

    try:
        return json.loads(text, object_pairs_hook=unique_keys)
    except json.JSONDecodeError as e:
        raise FormatError("file", source, f"is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})",
                          "fix the JSON syntax (a trailing comma or a missing quote is the usual cause)") from None


def parse_yaml(text: str, source: str) -> Any:
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - _StrictLoader is a SafeLoader
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise FormatError("file", source, f"is not valid YAML{where}: {problem}",
                          "fix the YAML syntax (check the indentation and the 'key: value' form there)") from None


def _yaml_float(text: str) -> str:
    """Exponent notation ``text`` (``1e3``) as YAML 1.1 (PyYAML) reads a float: a dot in the mantissa and a
    signed exponent (``1.0e+3``), followed by the plain decimal form when Python writes one (``or 1000``)."""
    mantissa, exponent = text.strip().lower().split("e")
    dotted = f"{mantissa if '.' in mantissa else mantissa + '.0'}e{int(exponent):+d}"
    plain = repr(float(text))
    return dotted if "e" in plain else f"{dotted} or {plain.removesuffix('.0')}"


def positive_number(field: str, value: Any, *, source: str = "", allow_zero: bool = False) -> float:
    """:func:`_check.positive_float` for a value read from a file, with a fix for a number that arrived as
    a string: PyYAML (YAML 1.1) reads ``1e3`` as the string '1e3', since its floats need a dot and a
    signed exponent (``1.0e+3``); a quoted number (``"100"``) is a string in YAML and JSON alike."""
    if isinstance(value, str):
        try:
            x = float(value)
        except ValueError:
            x = math.nan
        if math.isfinite(x):
            fix = (f"YAML reads exponent notation as a number only with a dot and a signed exponent: write "
                   f"{_yaml_float(value)}" if "e" in value.lower() else f"write {value.strip()} without quotes")
            raise SpecError(field, value, "must be a number", fix, source=source)
    return _check.positive_float(field, value, source=source, allow_zero=allow_zero)


def load_structured_file(path: str | Path) -> Any:
    """Parse a YAML or JSON file (by suffix); an empty file is an error, not ``None``."""
    p, text = read_text(path)
    data = parse_json(text, str(p)) if p.suffix.lower() in JSON_SUFFIXES else parse_yaml(text, str(p))
    if data is None:
        raise FormatError("file", str(p), "is empty", "write the description into the file")
    return data


__all__ = ["load_structured_file", "parse_json", "parse_yaml", "positive_number", "read_text"]
