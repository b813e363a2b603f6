"""Torch-free side of mha-export: run and check the ONNX artifacts with onnxruntime and numpy only."""
from mha_runtime.config import PRESETS, MHAConfig, preset
from mha_runtime.contract import IOContract, check_input
from mha_runtime.decode import DecodeSession
from mha_runtime.errors import (
    ArtifactError,
    ConfigError,
    ContractError,
    ExportError,
    MHAError,
    ProviderError,
    ValidationError,
)
from mha_runtime.runner import OnnxRunner

__all__ = ["PRESETS", "ArtifactError", "ConfigError", "ContractError", "DecodeSession", "ExportError", "IOContract",
           "MHAConfig", "MHAError", "OnnxRunner", "ProviderError", "ValidationError", "check_input", "preset"]
