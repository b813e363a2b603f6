"""What `mha export` refuses from its flags alone, before it imports torch: the ONNX opset and the weights path.

Kept free of torch (and of onnx) so that a refusal is one line in the time the interpreter takes to start, not
after the seconds torch takes to import (the export's graphs and weights loader import these from here).
"""
from __future__ import annotations

from pathlib import Path

from mha_runtime.artifact.config_fields import file_kind
from mha_runtime.artifact.errors import BadValueError, ConfigError

DEFAULT_OPSET = 18
SUPPORTED_OPSETS = range(18, 26)  # the opsets the dynamo exporter was checked at (docs/design-notes.md)


def check_opset(opset: int) -> int:
    if opset not in SUPPORTED_OPSETS:
        raise BadValueError(f"--opset: expected {SUPPORTED_OPSETS.start}..{SUPPORTED_OPSETS.stop - 1}, got {opset}")
    return opset


def check_weights_path(path: Path) -> None:
    """--weights must name a regular file: a FIFO or a device would block or never end; a folder is no checkpoint."""
    if not path.exists():
        raise ConfigError(f"--weights {path}: expected a .safetensors file or a torch state_dict, found nothing there")
    if not path.is_file():
        raise ConfigError(f"--weights {path}: expected a regular file (.safetensors or a torch state_dict), "
                          f"got {file_kind(path.stat().st_mode)}")
