"""Where the wrapper's weights come from: the tutorial's seed, or a user's checkpoint in any known layout.

Checkpoints are read lazily: a safetensors file through `safe_open` (only the chosen layer's tensors are
read, so one layer of a full GPT-2 checkpoint does not have to fit in memory), a torch file with
`weights_only=True` (no code runs) and memory-mapped where its format allows.
"""
from __future__ import annotations

import codecs
import warnings
from functools import partial
from pathlib import Path
from typing import Any

import torch

from mha_export.attention.weights.layouts import Located, layer_keys, locate, to_wrapper_state
from mha_export.model.wrapper import MultiHeadAttentionWrapper, build_wrapper
from mha_export.pipeline.preflight import check_weights_path
from mha_runtime.artifact.errors import ConfigError, first_line
from mha_runtime.artifact.manifest import sha256_file
from mha_runtime.attention.config import MHAConfig
from mha_runtime.attention.manifest import Manifest, WeightsRecord
from mha_runtime.attention.registry import WEIGHTS_FILE
from mha_runtime.attention.runner import DEFAULT_MODEL, OnnxRunner

SEED = 123
# Training scripts (the book's chapter 5 among them) save the state_dict inside a dict under these keys.
NESTED = ("model_state_dict", "state_dict", "model")
# Floating dtypes read as they are (then cast to float32); float8 and the like are refused: their checks
# (torch.isfinite) and casts are not defined for every one of them.
FLOATS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def seeded_model(config: MHAConfig) -> MultiHeadAttentionWrapper:
    """The tutorial's initialisation: `torch.manual_seed(123)`, then construct. Returned in eval mode."""
    torch.manual_seed(SEED)
    return build_wrapper(config).eval()


# Loaders' notes (pickle, mmap, storage) are not the user's concern.
_quiet = partial(warnings.catch_warnings, action="ignore")


# The first bytes of what torch.save writes: a zip archive (the default since 1.6) or a pickle (protocol 2+).
TORCH_MAGIC = (b"PK\x03\x04", b"\x80")


def _is_text(head: bytes) -> bool:
    """UTF-8 up to the cut (a character split at the end of `head` still counts)."""
    try:
        codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
    except UnicodeDecodeError:
        return False
    return True


class WeightFile:
    """A checkpoint's key names, and its tensors on demand."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        check_weights_path(self.path)
        self._safe: Any = None
        self._state: dict[str, Any] = {}
        try:
            with _quiet():
                if self._is_safetensors():
                    from safetensors import safe_open

                    self._safe = safe_open(str(self.path), framework="pt")
                else:
                    self._state = self._load_torch()
        except ConfigError:
            raise
        except Exception as exc:
            raise ConfigError(f"--weights {self.path}: {self._unreadable(exc)}") from None

    def _unreadable(self, exc: Exception) -> str:
        """Why torch could not read the file, in the user's terms (torch's own lines name its internals, and for a
        pickle that would run code, advise the one thing not to do)."""
        if self._is_safetensors():
            return f"cannot read it as safetensors ({first_line(exc)})"
        with open(self.path, "rb") as fh:
            head = fh.read(512)
        if not head.startswith(TORCH_MAGIC):  # first: torch calls any bytes it cannot unpickle "unsafe"
            what = "an empty file" if not head else ("text" if _is_text(head) else "bytes of an unknown format")
            return f"expected a .safetensors file or a torch.save file (a zip or a pickle), got {what}"
        if "Weights only load failed" in str(exc):
            return ("refused: its pickle holds objects other than tensors, which could run code when loaded; only "
                    "a state_dict of tensors is read (save one with safetensors or torch.save(model.state_dict()))")
        return f"cannot read it as weights ({first_line(exc)})"

    def _is_safetensors(self) -> bool:
        with open(self.path, "rb") as fh:
            head = fh.read(9)
        return self.path.suffix == ".safetensors" or (len(head) == 9 and head[8:9] == b"{")

    def _load_torch(self) -> dict[str, Any]:
        try:
            state = torch.load(self.path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as exc:  # the legacy (non-zip) format cannot be memory-mapped
            if "mmap" not in str(exc):
                raise
            state = torch.load(self.path, map_location="cpu", weights_only=True)
        for key in NESTED:
            if isinstance(state, dict) and isinstance(state.get(key), dict):
                state = state[key]
                break
        if not isinstance(state, dict):
            raise ConfigError(f"--weights {self.path}: expected a mapping of names to tensors (a state_dict), "
                              f"got {type(state).__name__}")
        other = next((k for k, v in state.items() if not isinstance(v, torch.Tensor)), None)
        if other is not None:  # a training checkpoint's step count or optimizer state beside the tensors
            raise ConfigError(f"--weights {self.path}: expected a mapping of names to tensors (a state_dict), but "
                              f"{str(other)[:40]!r} holds {type(state[other]).__name__}")
        odd = next((k for k in state if not isinstance(k, str)), None)
        if odd is not None:
            raise ConfigError(f"--weights {self.path}: expected tensor names (strings) as its keys, got "
                              f"{type(odd).__name__} {str(odd)[:40]}")
        return state

    def keys(self) -> list[str]:
        return list(self._safe.keys()) if self._safe is not None else list(self._state)

    def get(self, key: str) -> torch.Tensor:
        """The tensor, dense and holding its data; a floating one in a dtype the export computes in."""
        with _quiet():
            tensor: torch.Tensor = self._safe.get_tensor(key) if self._safe is not None else self._state[key]
        if tensor.is_meta or tensor.layout != torch.strided:
            what = "meta" if tensor.is_meta else str(tensor.layout).removeprefix("torch.")
            raise ConfigError(f"weights: {key!r} is a {what} tensor; expected a dense tensor with its values")
        if tensor.is_floating_point() and tensor.dtype not in FLOATS:
            raise ConfigError(f"weights: {key!r} has dtype {str(tensor.dtype).removeprefix('torch.')}, expected "
                              "float32, float16, bfloat16 or float64")
        return tensor


def read_layer(path: Path, config: MHAConfig, *, layer: int | None = None) -> tuple[dict[str, torch.Tensor], Located]:
    """The wrapper's state_dict from one layer of a checkpoint, after every check; and where it came from."""
    source = WeightFile(path)
    located = locate(source.keys(), layer)
    tensors = {}
    for key in layer_keys(located, source.keys()):
        tensor = source.get(key)
        if not tensor.is_floating_point() and not located.layout.masks.fullmatch(key[len(located.prefix):]):
            raise ConfigError(f"weights: {key!r} has dtype {tensor.dtype}, expected floating point")
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            raise ConfigError(f"weights: {key!r} holds NaN or inf values")
        if tensor.dtype == torch.float64 and not torch.isfinite(tensor.to(torch.float32)).all():
            raise ConfigError(f"weights: {key!r} holds values beyond float32's range (3.4e38); the export computes "
                              "in float32")
        tensors[key] = tensor
    return to_wrapper_state(located, tensors, config), located


def load_model(config: MHAConfig, weights: Path | None = None, *, layer: int | None = None
               ) -> tuple[MultiHeadAttentionWrapper, WeightsRecord]:
    """The wrapper for `config`, seeded or with one layer of `weights`; and the record of where they came from."""
    model = seeded_model(config)
    if weights is None:
        return model, WeightsRecord(source=f"torch.manual_seed({SEED})")
    state, located = read_layer(weights, config, layer=layer)
    model.load_state_dict(state, strict=False)  # the masks stay the ones the config builds
    missing = sorted(set(model.state_dict()) - set(state) - {k for k in model.state_dict() if k.endswith(".mask")})
    if missing:  # a programming error in a mapping, not a user error
        raise AssertionError(f"layout {located.layout.name} left {missing} unset")
    # The file's name, not its path: an artifact carries no path of the machine that built it.
    record = WeightsRecord(source=Path(weights).name, sha256=sha256_file(Path(weights)), layout=located.layout.name,
                           layer=located.layer)
    return model.eval(), record


def load_artifact_model(folder: Path, manifest: Manifest) -> tuple[MultiHeadAttentionWrapper, MHAConfig]:
    """The eager wrapper an artifact folder was exported from: its manifest's config and its weights file. The
    config is first checked against mha.onnx's own (an edited context_length would size the causal mask)."""
    if DEFAULT_MODEL in manifest.artifacts:
        OnnxRunner(folder, model=DEFAULT_MODEL, provider="cpu", offline_optimized=False)
    model, _ = load_model(manifest.config, Path(folder) / WEIGHTS_FILE)
    return model, manifest.config
