"""The fused and attention variants: one Q/K/V projection and torch's scaled_dot_product_attention, traced."""
from __future__ import annotations

from pathlib import Path

import torch

from mha_export.attention.graphs.onnx_trace import export_onnx
from mha_export.model.fused import fuse
from mha_runtime.attention.config import MHAConfig
from mha_runtime.attention.registry import VARIANTS

FUSED_OPSET = 18  # fp16 and ort start from this form
ATTENTION_OPSET = 23  # scaled_dot_product_attention becomes one ONNX Attention node


# SDPA rather than the spelled-out softmax: faster at opset 18 (docs/design-notes.md, "Variants").
def build_fused(wrapper: torch.nn.Module, config: MHAConfig, folder: Path, *, opset: int) -> None:
    export_onnx(fuse(wrapper, config), config, folder / VARIANTS["fused"].file, opset=FUSED_OPSET)


def build_attention(wrapper: torch.nn.Module, config: MHAConfig, folder: Path, *, opset: int) -> None:
    export_onnx(fuse(wrapper, config), config, folder / VARIANTS["attention"].file, opset=ATTENTION_OPSET)
