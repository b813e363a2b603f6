"""The int8 form: the fastest fp32 graph (gpt.inplace.onnx) with every MatMul's weights in 8 bits.

onnxruntime's MatMulNBitsQuantizer (bits 8, blocks of 32 along the input axis, symmetric) turns each MatMul into
com.microsoft.MatMulNBits; accuracy_level 4 lets its kernel compute in int8 with activations quantized per
block. Chosen over quantize_dynamic (MatMulInteger with one activation scale per tensor): on GPT_CONFIG_124M
that moved logits 17x further from fp32 for a similar speed (docs/gpt.md). The head is a MatMul on its own (E, V)
copy in the graph handed to the quantizer (graph.add_head); embeddings, LayerNorms and attention stay fp32.
"""
from __future__ import annotations

import logging
from pathlib import Path

import onnx
import torch
from onnx import numpy_helper

from mha_export.gpt.check import check_model_light
from mha_export.gpt.inplace import inplace_model
from mha_export.gpt.stream_save import save_streamed
from mha_runtime.gpt.config import GPTConfig

BITS = 8
BLOCK = 32
ACCURACY_LEVEL = 4  # int8 compute


def int8_source(state: dict[str, torch.Tensor], cfg: GPTConfig, *, tied: bool) -> onnx.ModelProto:
    """The fp32 graph the quantizer reads: gpt.inplace.onnx with the head as its own MatMul."""
    return inplace_model(state, cfg, tied=tied, head_matmul=True).full()


def build_int8(state: dict[str, torch.Tensor], cfg: GPTConfig, path: Path, *, tied: bool) -> None:
    quantize_to(int8_source(state, cfg, tied=tied), path)


def quantize_to(source: onnx.ModelProto, path: Path) -> None:
    """Quantize `source` in place (its fp32 MatMul weights are replaced) and save it to `path`, streamed (the
    bytes equal onnx.save's, whose serialized copy of the whole model was the export's peak: docs/gpt.md). The
    caller keeps no other copy of the weights, so the peak is about the fp32 model once."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    logger = logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer")
    level = logger.level
    logger.setLevel(logging.WARNING)  # it logs two INFO lines per MatMul
    try:
        quantizer = MatMulNBitsQuantizer(source, bits=BITS, block_size=BLOCK, is_symmetric=True,
                                         accuracy_level=ACCURACY_LEVEL)
        quantizer.process()
    finally:
        logger.setLevel(level)
    model = quantizer.model.model
    del quantizer
    check_model_light(model)  # the graph, not a second copy of the weights (check.py)
    arrays = [(t.name, numpy_helper.to_array(t)) for t in model.graph.initializer]
    model.graph.ClearField("initializer")
    save_streamed(model, arrays, path)
