"""The int8 form: onnxruntime's dynamic quantization of the fastest fp32 graph (gpt.inplace.onnx).

Weights of every MatMul become int8 (per output channel, symmetric); activations are quantized per call.
The head is a MatMul on its own (E, V) copy in the graph handed to the quantizer (graph.add_head); embeddings,
LayerNorms and attention stay fp32.
"""
from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import onnx
import torch

from mha_export.gpt.inplace import inplace_model
from mha_runtime.gpt.config import GPTConfig


def build_int8(state: dict[str, torch.Tensor], cfg: GPTConfig, path: Path, *, tied: bool) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory(prefix="mha-int8-") as tmp:
        source = Path(tmp) / "fp32.onnx"
        onnx.save(inplace_model(state, cfg, tied=tied, head_matmul=True), str(source))
        root = logging.getLogger()
        level = root.level
        root.setLevel(logging.ERROR)  # its "consider pre-processing" warning: shape inference of contrib ops
        try:
            quantize_dynamic(str(source), str(path), weight_type=QuantType.QInt8, per_channel=True,
                             op_types_to_quantize=["MatMul"],
                             extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})  # contrib ops' outputs
        finally:
            root.setLevel(level)
