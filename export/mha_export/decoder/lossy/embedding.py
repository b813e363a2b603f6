"""The token embedding of a lossy form, quantized as its weights are and read by com.microsoft.GatherBlockQuantized.

The embedding is most of a small decoder (GPT-2 124M: 38.6M of 124M weights; a vocabulary of 50,257 at width 768);
kept in fp32 it made the int8 file of a 2-layer GPT-2 of that width larger than the fp32 one (the head was stored
again, quantized). llama.cpp quantizes it too (Q8_0, Q4_0, or Q6_K where it is also the output).

- Tied head: the lookup reads the head's own MatMulNBits weights. MatMulNBits keeps row n of the (V, E) matrix as
  `B[n]` (k_blocks x blob bytes, low bits first), which is GatherBlockQuantized's layout of uint8 data (V, E * bits
  / 8) quantized along axis 1: a Reshape of the same initializer, with the same scales and zero points, so the matrix
  is stored once and the looked-up rows are exactly the head's dequantized rows. Where the plan keeps the head at
  fp32, the head reads tok_emb as the fp32 graph does (Gemm, transB) and the lookup stays fp32: stored once too.
- Untied: tok_emb is a weight of the plan like the matrices (its name in `kept` and `finer`, ranked with them by
  the search for the bar: on the trained demo model it moves the int4 form most), quantized by the same routine
  (onnxruntime's DefaultWeightOnlyQuantizer.qbits_block_quant on its transpose, so each vocabulary row is a column
  of blocks along E, as the head's).

Position embeddings stay fp32: context_length x E, a small share (under 1.5% of every preset and test checkpoint).
A width E that no block divides (E not a multiple of 16, MatMulNBits' smallest block) keeps the embedding fp32:
MatMulNBits pads the head's rows to whole blocks, and a gather of padded rows would be wider than E. The plan
records it (fit() decides the same: whole_blocks).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnx.helper as oh
from onnx import numpy_helper

from mha_export.decoder.graphs.shared import MS, TOKENS  # every architecture's (V, E) token embedding initializer

__all__ = ["TOKENS", "quantize_embedding", "whole_blocks"]


def _node(model: onnx.ModelProto, match: Any) -> onnx.NodeProto:
    found = [n for n in model.graph.node if match(n)]
    assert len(found) == 1, f"expected one node, found {len(found)}"
    return found[0]


def _attr(node: onnx.NodeProto, name: str) -> int:
    return int(next(oh.get_attribute_value(a) for a in node.attribute if a.name == name))


def _drop_initializer(model: onnx.ModelProto, name: str) -> np.ndarray:
    """Remove initializer `name`; return its values."""
    index = next(i for i, t in enumerate(model.graph.initializer) if t.name == name)
    array = numpy_helper.to_array(model.graph.initializer[index])
    del model.graph.initializer[index]
    return array


def _replace(model: onnx.ModelProto, old: onnx.NodeProto, new: list[onnx.NodeProto]) -> None:
    nodes = list(model.graph.node)
    at = nodes.index(old)
    model.graph.ClearField("node")
    model.graph.node.extend([*nodes[:at], *new, *nodes[at + 1:]])


def whole_blocks(width: int, block: int) -> bool:
    """Whether an embedding row of `width` is a whole number of `block`s (else its quantized rows are padded)."""
    return width % block == 0


def quantize_embedding(model: onnx.ModelProto, *, head: str, tied: bool,
                       precision: tuple[int, int, bool] | None) -> dict[str, Any]:
    """Replace the Gather of tok_emb in the quantized `model` (its head weight named `head`, now MatMulNBits or
    still MatMul) by GatherBlockQuantized; `precision`: the untied embedding's (bits, block size, symmetric), None
    to keep it fp32. Returns how the embedding is stored, for the manifest's plan."""
    gather = _node(model, lambda n: n.op_type == "Gather" and n.input[0] == TOKENS)
    head_node = _node(model, lambda n: n.op_type in ("MatMul", "MatMulNBits") and len(n.input) > 1
                      and (n.input[1] == head or n.input[1].startswith(f"{head}_Q")))
    if tied and head_node.op_type == "MatMul":  # head kept at fp32: read tok_emb itself, as the fp32 graph does
        _drop_initializer(model, head)
        _replace(model, head_node, [oh.make_node("Gemm", [head_node.input[0], TOKENS], list(head_node.output),
                                                 name=head_node.name, transB=1)])
        return {"dtype": "fp32", "shared_with_head": True}
    width = next(t.dims[1] for t in model.graph.initializer if t.name == TOKENS)  # (V, E)
    block = _attr(head_node, "block_size") if tied else None if precision is None else precision[1]
    if block is None or not whole_blocks(width, block):  # kept at fp32 by the plan, or padded rows
        return {"dtype": "fp32", "shared_with_head": False}
    if tied:
        bits, block_size = _attr(head_node, "bits"), _attr(head_node, "block_size")
        symmetric = len(head_node.input) < 4
        data, scales = f"{TOKENS}.data", head_node.input[2]
        zero_points = None if symmetric else head_node.input[3]
        vocab = _attr(head_node, "N")
        model.graph.initializer.append(numpy_helper.from_array(np.array([vocab, -1], np.int64), f"{TOKENS}.shape"))
        _drop_initializer(model, TOKENS)
        # (V, k_blocks, blob) -> (V, k_blocks * blob): the same bytes
        first = [oh.make_node("Reshape", [head_node.input[1], f"{TOKENS}.shape"], [data], name=f"{TOKENS}.reshape")]
    else:
        assert precision is not None
        bits, block_size, symmetric = precision
        from onnxruntime.quantization.matmul_nbits_quantizer import (
            DefaultWeightOnlyQuantConfig,
            DefaultWeightOnlyQuantizer,
        )

        table = _drop_initializer(model, TOKENS)  # (V, E)
        quantizer = DefaultWeightOnlyQuantizer(DefaultWeightOnlyQuantConfig(block_size=block_size, bits=bits,
                                                                            is_symmetric=symmetric))
        packed, scale_array, zp_array = quantizer.qbits_block_quant(np.ascontiguousarray(table.T))  # (V, kb, blob)
        data, scales = f"{TOKENS}_Q{bits}", f"{TOKENS}_scales"
        zero_points = None if symmetric else f"{TOKENS}_zero_points"
        arrays = [(data, packed.reshape(packed.shape[0], -1)), (scales, scale_array)]  # (V, E * bits / 8), (V, kb)
        arrays += [] if zero_points is None else [(zero_points, zp_array)]
        model.graph.initializer.extend(numpy_helper.from_array(a, n) for n, a in arrays)
        first = []
    inputs = [data, gather.input[1], scales, *([] if zero_points is None else [zero_points])]
    _replace(model, gather, [*first, oh.make_node("GatherBlockQuantized", inputs, list(gather.output),
                                                  name=gather.name, domain=MS, bits=bits, block_size=block_size,
                                                  gather_axis=0, quantize_axis=1)])
    return {"dtype": f"int{bits}", "block_size": block_size, "symmetric": symmetric, "shared_with_head": tied}
