"""Torch-free side of mha-export: run and check the ONNX artifacts with onnxruntime and numpy only."""
from runtime.config import PRESETS, MHAConfig, preset
from runtime.contract import IOContract, check_input
from runtime.errors import ArtifactError, ConfigError, ContractError, MHAError, ProviderError
from runtime.runner import OnnxRunner

__all__ = ["PRESETS", "MHAConfig", "preset", "IOContract", "check_input", "OnnxRunner",
           "MHAError", "ArtifactError", "ConfigError", "ContractError", "ProviderError"]
