"""Where the wrapper's weights come from: the tutorial's seed, or a user's file (weights-only loading)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from export.artifacts import WEIGHTS_FILE
from export.model import MultiHeadAttentionWrapper, build_wrapper
from runtime.config import MHAConfig
from runtime.errors import ConfigError

SEED = 123


def seeded_model(config: MHAConfig) -> MultiHeadAttentionWrapper:
    """The tutorial's initialisation: `torch.manual_seed(123)`, then construct. Returned in eval mode."""
    torch.manual_seed(SEED)
    return build_wrapper(config).eval()


def read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """Tensors from a .safetensors file or a torch state_dict (loaded with weights_only=True)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"--weights {path}: expected a .safetensors file or a torch state_dict, found nothing")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(path))
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any parse failure becomes one line
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConfigError(f"--weights {path}: cannot read it as weights ({first})") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ConfigError(f"--weights {path}: expected a mapping of names to tensors (a state_dict)")
    return state


def check_state_dict(state: dict[str, torch.Tensor], model: MultiHeadAttentionWrapper) -> None:
    """Refuse a state_dict that does not fit the model, naming the first mismatch.

    Mask buffers may be left out (they are derived from the config); if present they must be the causal mask.
    """
    expected = model.state_dict()
    for key in sorted(expected):
        if key not in state:
            if key.endswith(".mask"):
                continue
            raise ConfigError(f"weights: missing key {key!r} (expected {len(expected)} keys such as {sorted(expected)[0]!r})")
        if tuple(state[key].shape) != tuple(expected[key].shape):
            raise ConfigError(f"weights: {key!r} has shape {list(state[key].shape)}, expected {list(expected[key].shape)} for this config")
        if key.endswith(".mask") and not torch.equal(state[key].float(), expected[key]):
            raise ConfigError(f"weights: {key!r} is not the causal mask this model requires")
    extra = sorted(set(state) - set(expected))
    if extra:
        raise ConfigError(f"weights: unexpected key {extra[0]!r}; this config expects only {sorted(expected)[:3]}...")


def load_artifact_model(folder: Path, manifest: dict[str, Any]) -> tuple[MultiHeadAttentionWrapper, MHAConfig]:
    """The eager wrapper an artifact folder was exported from: its manifest's config and its weights file."""
    config = MHAConfig.from_dict(manifest["config"])
    return load_model(config, Path(folder) / WEIGHTS_FILE), config


def load_model(config: MHAConfig, weights: Path | None = None) -> MultiHeadAttentionWrapper:
    """The wrapper for `config`, seeded, or with `weights` loaded after a strict fit check."""
    model = seeded_model(config)
    if weights is not None:
        state = read_state_dict(weights)
        check_state_dict(state, model)
        model.load_state_dict({k: v.to(torch.float32) for k, v in state.items()}, strict=False)
    return model.eval()
