"""What every model kind's config shares: its JSON file read (size-capped, a regular file, one line per problem),
its keys checked (unknown, missing) and its values checked (positive integers, a rate, flags). The config types
themselves (MHAConfig, GPTConfig) keep their own fields and rules."""
from __future__ import annotations

import dataclasses
import functools
import json
import stat
import sys
from pathlib import Path
from typing import Any, ClassVar, Self, TypeVar, get_type_hints

from mha_runtime.artifact.errors import ArtifactError, BadValueError, ConfigError, first_line
from mha_runtime.artifact.fields import DuplicateKeyError, get, unique_keys

# A config is a handful of fields: a larger file is not one (and is not read whole).
MAX_CONFIG_BYTES = 1 << 16
T = TypeVar("T")
_hints = functools.cache(get_type_hints)  # a config type's annotations, resolved once


def read_regular(path: Path, limit: int) -> bytes:
    """The bytes of a regular file of at most `limit` bytes. A FIFO, a device (/dev/zero) or a folder is refused
    before any read, as is a larger file: ConfigError naming what it is."""
    mode = path.stat().st_mode  # FileNotFoundError for the caller to word
    if not stat.S_ISREG(mode):
        raise ConfigError(f"expected a regular file, got {file_kind(mode)}")
    with open(path, "rb") as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise ConfigError(f"expected a file of at most {limit} bytes, got a larger one")
    return data


def file_kind(mode: int) -> str:
    kinds = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def check_fields(config: object, label: str) -> None:
    """Each field by its annotation, in declaration order: an int a positive integer (not a bool), a float a rate
    in [0, 1) (a dropout rate), a bool true or false; else BadValueError "<label> field 'x': expected ..."."""
    hints = _hints(type(config))
    for field in dataclasses.fields(config):  # type: ignore[arg-type]
        value, kind = getattr(config, field.name), hints[field.name]
        if kind is int and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            expected = "a positive integer"
        elif kind is float and (isinstance(value, bool) or not isinstance(value, (int, float))
                                or not 0.0 <= value < 1.0):
            expected = "a float in [0, 1)"
        elif kind is bool and not isinstance(value, bool):
            expected = "true or false"
        else:
            continue
        raise BadValueError(f"{label} field {field.name!r}: expected {expected}, got {value!r}")


def from_fields(cls: type[T], data: dict[str, Any], *, label: str, noun: str, expected: str) -> T:
    """`cls(**data)` once no key is unknown or missing: "<label>: unknown <noun> 'k'; <expected> [...]"."""
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    known = {f.name for f in fields}
    unknown = sorted(set(data) - known)
    if unknown:
        raise BadValueError(f"{label}: unknown {noun} {unknown[0]!r}; {expected} {sorted(known)}")
    required = [f.name for f in fields if f.default is dataclasses.MISSING]
    missing = [name for name in required if name not in data]
    if missing:
        raise BadValueError(f"{label}: missing {noun} {missing[0]!r}; required: {', '.join(required)}")
    return cls(**data)


def read_config_json(path: Path, *, flag: str, what: str) -> dict[str, Any]:
    """The JSON object in a config file; every problem is one ConfigError line naming the flag and the file
    (`what`: the file the flag expects, for the line when nothing is there)."""
    try:
        text = read_regular(Path(path), MAX_CONFIG_BYTES).decode()
    except FileNotFoundError:
        raise ConfigError(f"{flag} {path}: expected {what}, found nothing there") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{flag} {path}: cannot read it ({first_line(exc)})") from None
    except ConfigError as exc:  # its kind kept: a bad value is a usage error, an unreadable file is not
        raise type(exc)(f"{flag} {path}: {exc}") from None
    return json_object(text, f"{flag} {path}")


def json_object(text: str, where: str) -> dict[str, Any]:
    """The JSON object of config fields in `text`, or one ConfigError line starting with `where`."""
    try:
        data = json.loads(text, object_pairs_hook=unique_keys)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{where}: expected JSON, got a parse error ({first_line(exc)})") from None
    except DuplicateKeyError as exc:  # the file parses; which value was meant is the user's to say
        raise BadValueError(f"{where}: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{where}: expected a flat JSON object of config fields, got nesting too deep to "
                          "parse") from None
    except ValueError:  # json.loads refuses integers of over sys.get_int_max_str_digits() digits
        raise BadValueError(f"{where}: expected JSON integers of at most {sys.get_int_max_str_digits()} "
                            "digits") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a JSON object, got {type(data).__name__}")
    return data


class ConfigFile:
    """What both config types do alike: their JSON (sorted keys: the bytes in every artifact's metadata) and their
    file read, every problem one ConfigError line naming the flag and the file."""

    FILE_WHAT: ClassVar[str]  # the file `--config` expects, for the line when nothing is there

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        raise NotImplementedError

    @classmethod
    def from_document(cls, data: dict[str, Any], where: str) -> Self:
        """The `config` field of a document the export wrote (manifest.json, cases.json): every problem one
        ArtifactError at `where`."""
        try:
            return cls.from_dict(get(data, "config", dict, where))
        except ConfigError as exc:
            raise ArtifactError(f"{where}: {exc}") from None

    @classmethod
    def from_file(cls, path: Path, *, flag: str = "--config") -> Self:
        data = read_config_json(path, flag=flag, what=cls.FILE_WHAT)
        try:
            return cls.from_dict(data)
        except ConfigError as exc:  # its kind kept: a bad value is a usage error, an unreadable file is not
            raise type(exc)(f"{flag} {path}: {exc}") from None


def check_own_config(config: ConfigFile | dict[str, Any], own: Any, where: str) -> None:
    """The manifest's config is the model's own (`own`: the dict in its metadata, written at export), compared key by
    key whatever the keys (a decoder's config is its architecture's own dict). manifest.json is not listed in
    itself, so an edited one is caught here, before anything is sized from it (as the C runner does)."""
    if not isinstance(own, dict):
        raise ArtifactError(f"{where}: expected metadata holding the model's config")
    mine = config if isinstance(config, dict) else config.to_dict()
    for key in sorted(mine.keys() | own.keys()):
        if own.get(key) != mine.get(key):
            said = str(mine.get(key)) if len(str(mine.get(key))) <= 24 else str(mine.get(key))[:21] + "..."
            raise ArtifactError(f"{where}: the manifest's config says {key}={said}, the model's own metadata "
                                f"{key}={own.get(key)!r}; the model does not belong to this folder")
