"""The TorchScript artifact: torch.jit.trace in eval mode, config embedded as an extra file."""
from __future__ import annotations

import copy
import warnings
from pathlib import Path

import torch

from mha_export.infer.torchscript_runner import CONFIG_EXTRA
from mha_export.model.example import example_input
from mha_runtime.artifact.config import MHAConfig
from mha_runtime.artifact.registry import TORCHSCRIPT


def share_masks(module: torch.nn.Module) -> torch.nn.Module:
    """A copy whose heads hold one mask tensor: the masks are identical, and torch.jit.save writes
    a shared storage once (docs/design-notes.md, "The faithful graph", has the sizes)."""
    shared = copy.deepcopy(module)
    first = shared.heads[0].mask
    for head in shared.heads:
        if not torch.equal(head.mask, first):
            return module  # not the tutorial's identical masks: keep them as they are
        head.mask = first
    return shared


def export_torchscript(module: torch.nn.Module, config: MHAConfig, path: Path) -> None:
    """Trace at the example shape; the mask slice follows the input's size, so every length works."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TorchScript deprecation and tracer notes: expected, see README
        traced = torch.jit.trace(share_masks(module).eval(), (example_input(config),), check_trace=False)
        torch.jit.save(traced, str(path), _extra_files={CONFIG_EXTRA: config.to_json()})


def build_torchscript(wrapper: torch.nn.Module, config: MHAConfig, folder: Path, *, opset: int) -> None:
    export_torchscript(wrapper, config, folder / TORCHSCRIPT.file)
