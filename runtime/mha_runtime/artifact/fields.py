"""Typed reads of JSON documents (manifest.json, cases.json): a wrong field is one line that names it."""
from __future__ import annotations

import dataclasses
import sys
import types
from collections.abc import Callable
from typing import Any, ClassVar, Self, TypeVar, Union, get_args, get_origin, get_type_hints

from mha_runtime.artifact.errors import ArtifactError, cut

T = TypeVar("T")
R = TypeVar("R")
_FLOAT_MAX = int(sys.float_info.max)
_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string", dict: "a JSON object",
          list: "a JSON array"}


class DuplicateKeyError(ValueError):
    """A JSON object that names one member twice."""


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json.loads' object_pairs_hook: the object, or DuplicateKeyError naming the first member given twice.
    json.loads alone keeps the last silently; the C runners refuse such a document, and so does every reader here
    of a document a user or a client writes (configs, manifests, request bodies)."""
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise DuplicateKeyError(f"expected unique member names, got {cut(key)!r} twice")
        seen.add(key)
    return dict(pairs)


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
        if abs(value) > _FLOAT_MAX:  # float() raises OverflowError past it
            raise ArtifactError(f"{where}: field {key!r} expected a number, got an integer of {len(str(abs(value)))} "
                                "digits (past a float's range)")
        value, ok = float(value), True
    if not ok:
        raise ArtifactError(f"{where}: field {key!r} expected {_NAMES.get(kind, kind.__name__)}, got {_kind(value)}")
    return value  # type: ignore[return-value]


def record(cls: type[R], data: Any, where: str, **convert: Callable[[Any], Any]) -> R:
    """A dataclass from a JSON object, field by field in declaration order (so the first bad field is the one
    named): each read by `get` against its annotation (`X | None` is optional; a dataclass-typed field is read as
    an object), then through `convert[name]` where one is given and the value is not None."""
    data = obj(data, where)
    hints = get_type_hints(cls)
    values: dict[str, Any] = {}
    for field in dataclasses.fields(cls):  # type: ignore[arg-type]
        kind, optional = _annotation(hints[field.name])
        value = get(data, field.name, kind, where, optional=optional)
        values[field.name] = convert[field.name](value) if field.name in convert and value is not None else value
    return cls(**values)


class Record:
    """A dataclass written as the JSON object of its fields, in declaration order, and read back by `record`."""

    # Fields left out while None (only optional ones can be), so that records written before they existed keep
    # their bytes.
    OMIT_NONE: ClassVar[bool] = False

    def to_dict(self) -> dict[str, Any]:
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # type: ignore[arg-type]
        return {k: _json(v) for k, v in values.items() if v is not None or not self.OMIT_NONE}

    @classmethod
    def from_dict(cls, data: Any, where: str) -> Self:
        return record(cls, data, where)


def keyed(data: dict[str, Any], where: str, read: Callable[[Any, str], R]) -> dict[str, R]:
    """A JSON object of records keyed by file name: each name checked by `plain_name`, each record read by `read`
    at `<where>.<name>`."""
    return {plain_name(name, where): read(value, f"{where}.{name}") for name, value in data.items()}


def _json(value: Any) -> Any:
    """A field's value as its JSON takes it: a record (or a config) by its own to_dict, a dict entry by entry."""
    if isinstance(value, dict):
        return {k: _json(v) for k, v in value.items()}
    return value.to_dict() if hasattr(value, "to_dict") else value


def _annotation(hint: Any) -> tuple[type, bool]:
    """(the JSON type to check, whether the field is optional) of one annotation."""
    args = get_args(hint)
    optional = get_origin(hint) in (Union, types.UnionType) and type(None) in args
    if optional:
        (hint,) = [a for a in args if a is not type(None)]
    kind = get_origin(hint) or hint
    return (dict if dataclasses.is_dataclass(kind) else kind), optional


def plain_name(value: str, where: str) -> str:
    """A file name inside the artifact folder: no absolute path, no '..', no backslash, nothing unprintable (a NUL
    is no path the OS takes; a newline would split the line that names the file)."""
    parts = value.split("/")
    if (not value or value.startswith("/") or "\\" in value or not value.isprintable()
            or any(p in ("", ".", "..") for p in parts)):
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
