"""The one config object (a frozen dataclass) and its named presets."""
from __future__ import annotations

import dataclasses
import json
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mha_runtime.artifact.errors import BadValueError, ConfigError, first_line


@dataclass(frozen=True, kw_only=True)
class MHAConfig:
    """Shape of the tutorial's MultiHeadAttentionWrapper (chapter 3)."""

    d_in: int
    d_out: int  # per head
    num_heads: int
    context_length: int
    dropout: float = 0.0
    qkv_bias: bool = False
    # The wrapper followed by Linear(H * d_out, H * d_out) with bias: the book's MultiHeadAttention.out_proj,
    # GPT-2's c_proj.
    out_proj: bool = False

    def __post_init__(self) -> None:
        for name in ("d_in", "d_out", "num_heads", "context_length"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise BadValueError(f"config field {name!r}: expected a positive integer, got {value!r}")
        if not isinstance(self.dropout, (int, float)) or not 0.0 <= self.dropout < 1.0:
            raise BadValueError(f"config field 'dropout': expected a float in [0, 1), got {self.dropout!r}")
        for name in ("qkv_bias", "out_proj"):
            if not isinstance(getattr(self, name), bool):
                raise BadValueError(f"config field {name!r}: expected true or false, got {getattr(self, name)!r}")

    @property
    def d_model(self) -> int:
        """Width of the output: heads concatenated on the last axis."""
        return self.num_heads * self.d_out

    def to_dict(self) -> dict[str, Any]:
        """Every field; `out_proj` only when true, so that configs without it write the bytes they always did
        (the config is in every artifact's metadata)."""
        data = dataclasses.asdict(self)
        if not self.out_proj:
            del data["out_proj"]
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MHAConfig:
        fields = dataclasses.fields(cls)
        known = {f.name for f in fields}
        unknown = sorted(set(data) - known)
        if unknown:
            raise BadValueError(f"config: unknown field {unknown[0]!r}; expected only {sorted(known)}")
        required = [f.name for f in fields if f.default is dataclasses.MISSING]
        missing = [name for name in required if name not in data]
        if missing:
            raise BadValueError(f"config: missing field {missing[0]!r}; required: {', '.join(required)}")
        return cls(**data)

    @classmethod
    def from_file(cls, path: Path) -> MHAConfig:
        """A config from a JSON file; every problem is one ConfigError line naming the file."""
        try:
            return cls.from_json(read_regular(Path(path), MAX_CONFIG_BYTES).decode())
        except FileNotFoundError:
            raise ConfigError(f"--config {path}: expected a JSON file of config fields, found nothing there") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"--config {path}: cannot read it ({first_line(exc)})") from None
        except ConfigError as exc:  # its kind kept: a bad value is a usage error, an unreadable file is not
            raise type(exc)(f"--config {path}: {exc}") from None

    @classmethod
    def from_json(cls, text: str) -> MHAConfig:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"config: expected JSON, got a parse error ({exc})") from None
        except RecursionError:
            raise ConfigError("config: expected a flat JSON object of config fields, got nesting too deep to "
                              "parse") from None
        if not isinstance(data, dict):
            raise ConfigError(f"config: expected a JSON object, got {type(data).__name__}")
        return cls.from_dict(data)


# A config is a handful of fields: a larger file is not one (and is not read whole).
MAX_CONFIG_BYTES = 1 << 16


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


PRESETS: dict[str, MHAConfig] = {
    # The tutorial's toy example: "Your journey starts with one step", 6 tokens of width 3.
    "seed": MHAConfig(d_in=3, d_out=2, num_heads=2, context_length=6),
    # One GPT-2 small attention layer: 12 heads of 64, context 1024.
    "gpt2-small": MHAConfig(d_in=768, d_out=64, num_heads=12, context_length=1024),
}


def preset(name: str) -> MHAConfig:
    """Look up a named preset, or say which names exist."""
    try:
        return PRESETS[name]
    except KeyError:
        raise BadValueError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}") from None
