"""Typed reads of JSON documents (manifest.json, cases.json): a wrong field is one line that names it."""
from __future__ import annotations

from typing import Any, TypeVar

from mha_runtime.artifact.errors import ArtifactError

T = TypeVar("T")
_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string", dict: "a JSON object",
          list: "a JSON array"}


def obj(value: Any, where: str) -> dict[str, Any]:
    """`value` as a JSON object, or ArtifactError naming where it should have been one."""
    if not isinstance(value, dict):
        raise ArtifactError(f"{where}: expected a JSON object, got {_kind(value)}")
    return value


def get(data: dict[str, Any], key: str, kind: type[T], where: str, *, optional: bool = False) -> T:
    """data[key] checked to be of `kind` (int is not bool; a float field takes an int); None if optional and absent."""
    if key not in data or (optional and data[key] is None):
        if optional:
            return None  # type: ignore[return-value]
        raise ArtifactError(f"{where}: missing field {key!r}")
    value = data[key]
    ok = isinstance(value, kind) and not (kind in (int, float) and isinstance(value, bool))
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value, ok = float(value), True
    if not ok:
        raise ArtifactError(f"{where}: field {key!r} expected {_NAMES.get(kind, kind.__name__)}, got {_kind(value)}")
    return value  # type: ignore[return-value]


def plain_name(value: str, where: str) -> str:
    """A file name inside the artifact folder: no absolute path, no '..', no backslash."""
    parts = value.split("/")
    if not value or value.startswith("/") or "\\" in value or any(p in ("", ".", "..") for p in parts):
        raise ArtifactError(f"{where}: expected a file name inside the artifact folder, got {value!r}")
    return value


def shape3(value: Any, where: str) -> tuple[int, int, int]:
    """[batch, tokens, width] of positive integers."""
    if (not isinstance(value, list) or len(value) != 3
            or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value)):
        raise ArtifactError(f"{where}: expected [batch, tokens, width] of positive integers, got {value!r}")
    return (value[0], value[1], value[2])


def _kind(value: Any) -> str:
    return "null" if value is None else f"{type(value).__name__} {value!r}"[:80]
