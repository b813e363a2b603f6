"""Load and run `mha.pt` (TorchScript) for the golden checks, the validator and the bench."""
from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from mha_runtime.artifact.config import MHAConfig
from mha_runtime.artifact.errors import ArtifactError, first_line

CONFIG_EXTRA = "config.json"


def torchscript_runner(path: Path) -> Callable[[np.ndarray], np.ndarray]:
    """x (B, T, d_in) -> context (B, T, H * d_out) through the loaded TorchScript module."""
    module, _ = load_torchscript(path)

    def run(x: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return module(torch.from_numpy(x)).numpy()

    return run


def load_torchscript(path: Path) -> tuple[torch.jit.ScriptModule, MHAConfig]:
    """Load `mha.pt` and the config embedded in it."""
    extra = {CONFIG_EXTRA: ""}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            module = torch.jit.load(str(path), map_location="cpu", _extra_files=extra)
    except Exception as exc:
        raise ArtifactError(f"{path}: torch.jit.load cannot read it ({first_line(exc)})") from None
    return module.eval(), MHAConfig.from_json(extra[CONFIG_EXTRA])
