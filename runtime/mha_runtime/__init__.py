"""Torch-free side of mha-export: run, check and serve the ONNX artifacts with onnxruntime and numpy only.

The names below are loaded on first use, so `import mha_runtime.artifact.errors` (or any light module) does
not import onnxruntime.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "PRESETS": "mha_runtime.attention.config", "MHAConfig": "mha_runtime.attention.config",
    "preset": "mha_runtime.attention.config",
    "IOContract": "mha_runtime.attention.contract", "check_input": "mha_runtime.attention.contract",
    "ArtifactError": "mha_runtime.artifact.errors", "ConfigError": "mha_runtime.artifact.errors",
    "ContractError": "mha_runtime.artifact.errors", "ExportError": "mha_runtime.artifact.errors",
    "MHAError": "mha_runtime.artifact.errors", "ProviderError": "mha_runtime.artifact.errors",
    "ValidationError": "mha_runtime.artifact.errors",
    "DecodeSession": "mha_runtime.attention.decode_session",
    "InPlaceDecodeSession": "mha_runtime.attention.inplace_session",
    "OnnxRunner": "mha_runtime.attention.runner",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'mha_runtime' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
