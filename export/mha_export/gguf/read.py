"""A GGUF file's metadata as plain values, read by gguf-py's GGUFReader (memory-mapped: the tensors are not read):
what a GGUF says about its model (general.architecture, then the architecture's own keys, which its
config_from_gguf reads: decoder/checkpoint.gguf_config)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from mha_runtime.artifact.errors import ConfigError, first_line


def read_metadata(path: Path) -> dict[str, Any]:
    """key -> value (a number, a string, or a list of them) of every metadata field of the GGUF at `path`; a file
    gguf-py cannot read is one ConfigError line."""
    import gguf

    try:
        reader = gguf.GGUFReader(str(path), "r")
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(f"{path}: not a GGUF file gguf-py can read ({first_line(exc)})") from None
    return fields_of(reader)


def fields_of(reader: Any) -> dict[str, Any]:
    """key -> value of every metadata field a gguf-py GGUFReader parsed."""
    out: dict[str, Any] = {}
    for name, field in reader.fields.items():
        value = field.contents()
        out[name] = value.item() if hasattr(value, "item") else value  # numpy scalars as Python numbers
    return out
