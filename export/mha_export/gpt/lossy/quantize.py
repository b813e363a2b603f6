"""The lossy forms: the fastest fp32 graph (gpt.inplace.onnx) with its MatMul weights in 8 or 4 bits.

onnxruntime's MatMulNBitsQuantizer (blocks of 32 along the input axis, symmetric) turns each MatMul into
com.microsoft.MatMulNBits; accuracy_level 4 lets its kernel compute in int8 with activations quantized per
block (level 1, fp32 compute, ran at 1.7 tokens/s on GPT_CONFIG_124M here: no fallback on this CPU). Chosen over
quantize_dynamic (MatMulInteger with one activation scale per tensor): on GPT_CONFIG_124M that moved logits 17x
further from fp32 for a similar speed (docs/gpt.md). The head is a MatMul on its own (E, V) copy in the graph
handed to the quantizer (graph.add_head); embeddings, LayerNorms and attention stay fp32.

A plan may keep some matrices at a higher precision (fp32 in the 8-bit form, 8 bits in the 4-bit form): the
export chooses them by measurement when the whole-model form misses its quality bar (mha_export.gpt.lossy.build).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from onnx import numpy_helper

from mha_export.gpt.graphs.inplace import inplace_model
from mha_export.onnx_file.check import check_model_light
from mha_export.onnx_file.save import save_streamed
from mha_runtime.gpt.config import GPTConfig

BLOCK = 32
ACCURACY_LEVEL = 4  # int8 compute
FP32 = "fp32"


@dataclass(frozen=True)
class QuantPlan:
    """How one lossy form is quantized: its bits, and the weights kept at a higher precision (name -> "fp32" or
    "int8"), as the manifest records it."""

    bits: int  # 8 | 4
    kept: dict[str, str] = field(default_factory=dict)
    block_size: int = BLOCK
    accuracy_level: int = ACCURACY_LEVEL

    def to_dict(self) -> dict[str, Any]:
        return {"method": "MatMulNBits (onnxruntime MatMulNBitsQuantizer, symmetric)", "bits": self.bits,
                "block_size": self.block_size, "accuracy_level": self.accuracy_level, "kept": dict(self.kept)}


def lossy_source(state: dict[str, torch.Tensor], cfg: GPTConfig, *, tied: bool) -> onnx.ModelProto:
    """The fp32 graph the quantizer reads: gpt.inplace.onnx with the head as its own MatMul."""
    return inplace_model(state, cfg, tied=tied, head_matmul=True).full()


def matmul_weights(model: onnx.ModelProto) -> dict[str, str]:
    """weight initializer name -> the name of the MatMul node that reads it (the quantizer's targets)."""
    inits = {t.name for t in model.graph.initializer}
    return {n.input[1]: n.name for n in model.graph.node if n.op_type == "MatMul" and n.input[1] in inits}


def weight_error(weight: np.ndarray, bits: int, block: int = BLOCK) -> float:
    """Relative RMS error of `weight` (in, out) after symmetric blockwise rounding along the input axis: the
    ranking of which matrices lose most (an estimate of the quantizer's, not its exact arithmetic)."""
    w = weight.astype(np.float64)
    rows = -(-w.shape[0] // block) * block
    padded = np.zeros((rows, w.shape[1]))
    padded[:w.shape[0]] = w
    blocks = padded.reshape(rows // block, block, w.shape[1])  # (in / block, block, out)
    top = 2 ** (bits - 1) - 1
    scale = np.abs(blocks).max(axis=1, keepdims=True) / top
    scale[scale == 0] = 1.0
    q = np.clip(np.round(blocks / scale), -top - 1, top) * scale
    err = float(np.sqrt(np.sum((q - blocks) ** 2)))
    norm = float(np.sqrt(np.sum(blocks ** 2)))
    return err / norm if norm else 0.0


def _quantizer(model: onnx.ModelProto, bits: int, exclude: list[str], plan: QuantPlan) -> onnx.ModelProto:
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    quantizer = MatMulNBitsQuantizer(model, bits=bits, block_size=plan.block_size, is_symmetric=True,
                                     accuracy_level=plan.accuracy_level, nodes_to_exclude=exclude)
    quantizer.process()
    out: onnx.ModelProto = quantizer.model.model
    return out


def quantize_to(source: onnx.ModelProto, path: Path, plan: QuantPlan) -> None:
    """Quantize `source` in place by `plan` (its fp32 MatMul weights are replaced) and save it to `path`, streamed
    (the bytes equal onnx.save's, whose serialized copy of the whole model was the export's peak:
    docs/measurements/gpt.md). The caller keeps no other copy of the weights, so the peak is about the fp32 model
    once. Kept matrices at int8 (in a 4-bit plan) are quantized by a second pass over what the first left as MatMul."""
    targets = matmul_weights(source)
    unknown = sorted(set(plan.kept) - set(targets))
    if unknown:
        raise AssertionError(f"plan keeps weights the graph does not quantize: {unknown}")
    logger = logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer")
    level = logger.level
    logger.setLevel(logging.WARNING)  # it logs two INFO lines per MatMul
    try:
        model = _quantizer(source, plan.bits, [targets[w] for w in plan.kept], plan)
        at8 = [w for w, p in plan.kept.items() if p == "int8"]
        if at8:
            others = [n for w, n in targets.items() if w not in at8]
            model = _quantizer(model, 8, others, plan)
    finally:
        logger.setLevel(level)
    check_model_light(model)  # the graph, not a second copy of the weights (check.py)
    arrays = [(t.name, numpy_helper.to_array(t)) for t in model.graph.initializer]
    model.graph.ClearField("initializer")
    save_streamed(model, arrays, path)
