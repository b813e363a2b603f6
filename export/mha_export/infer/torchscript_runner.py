"""Load and run `mha.pt` (TorchScript) for the golden checks, the validator and the bench."""
from __future__ import annotations

import io
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from mha_runtime.artifact.errors import ArtifactError, ConfigError, first_line
from mha_runtime.attention.config import MHAConfig
from mha_runtime.attention.runner import read_model

CONFIG_EXTRA = "config.json"


def torchscript_runner(path: Path) -> Callable[[np.ndarray], np.ndarray]:
    """x (B, T, d_in) -> context (B, T, H * d_out) through the loaded TorchScript module."""
    module, _ = load_torchscript(path)

    def run(x: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return module(torch.from_numpy(x)).numpy()

    return run


def load_torchscript(path: Path) -> tuple[torch.jit.ScriptModule, MHAConfig]:
    """Load `mha.pt` and the config embedded in it, from bytes checked against the manifest beside it (when
    there is one) before torch.jit parses them."""
    data, path, _ = read_model(Path(path), Path(path).name, (".pt",))
    extra = {CONFIG_EXTRA: ""}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            module = torch.jit.load(io.BytesIO(data), map_location="cpu", _extra_files=extra)
    except Exception as exc:
        raise ArtifactError(f"{path}: torch.jit.load cannot read it ({first_line(exc)})") from None
    try:
        config = MHAConfig.from_json(extra[CONFIG_EXTRA])
    except ConfigError as exc:  # a bad file, not a bad value of the user's
        raise ArtifactError(f"{path}: its {CONFIG_EXTRA!r} is invalid: {exc}") from None
    return module.eval(), config
