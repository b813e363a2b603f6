"""The qblocks form, the fastest fp32 graph on CPU: causal query blocks of the ONNX `Attention` op (opset 23).

Query block i of n (rows T*i//n .. T*(i+1)//n) meets keys 0 .. T*(i+1)//n only, so scores, softmax and
weights @ V cover (n + 1) / 2n of the T x T square (9/16 for n = 8). ONNX Runtime's `Attention` reads the 3-D
q, k, v (B, T, H * d_out) in place (no per-head copies), each block gets its own small additive mask (rows x
keys), and q, k, v come from three MatMuls (no Split). Below DENSE_BELOW tokens an `If` runs one dense
`Attention(is_causal=1)` instead: faster for short inputs, and the op refuses the empty blocks T < n would
give. Keys past a block's end would weigh exactly 0, so only the order of sums changes. docs/design-notes.md
has the measurements and what lost.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
from onnx import TensorProto, numpy_helper

from mha_export.attention.graphs import contrib
from mha_export.attention.graphs.contrib import (
    fused_initializers,
    i64,
    output_projection,
    save_checked,
    stamped_model,
)
from mha_export.model.wrapper import MultiHeadAttentionWrapper
from mha_runtime.attention.config import MHAConfig
from mha_runtime.attention.contract import INPUT_NAME, metadata
from mha_runtime.attention.registry import VARIANTS

QBLOCKS_OPSET = 23
QUERY_BLOCKS = 8
DENSE_BELOW = 256


def _projections(wrapper: MultiHeadAttentionWrapper, config: MHAConfig) -> tuple[list[onnx.NodeProto],
                                                                                  list[onnx.TensorProto]]:
    """q, k, v (B, T, H * d_out) from three MatMuls on column blocks of the fused weight (plus the biases)."""
    weight, bias = fused_initializers(wrapper, config)  # (d_in, 3 * H * d_out), (3 * H * d_out,) or None
    w, width = numpy_helper.to_array(weight), config.d_model
    b = None if bias is None else numpy_helper.to_array(bias)
    nodes, inits = [], []
    for i, name in enumerate("qkv"):
        cols = slice(i * width, (i + 1) * width)
        inits.append(numpy_helper.from_array(np.ascontiguousarray(w[:, cols]), f"W_{name}"))
        if b is None:
            nodes.append(oh.make_node("MatMul", [INPUT_NAME, f"W_{name}"], [name]))
        else:
            inits.append(numpy_helper.from_array(b[cols], f"b_{name}"))
            nodes += [oh.make_node("MatMul", [INPUT_NAME, f"W_{name}"], [f"{name}_raw"]),
                      oh.make_node("Add", [f"{name}_raw", f"b_{name}"], [name])]
    return nodes, inits


def _blocks_branch(config: MHAConfig, blocks: int, out: str) -> onnx.GraphProto:
    """The query blocks, reading x, q, k, v from the outer graph; each block's additive mask is built from
    positions (rows x keys), never a T x T tensor."""
    heads = {"q_num_heads": config.num_heads, "kv_num_heads": config.num_heads}
    inits = [i64("block_ends", list(range(1, blocks))), i64("blocks", [blocks]), i64("zero_1d", [0]),
             i64("zero", 0), i64("one", 1), i64("axis_0", [0]), i64("axis_1", [1]),
             numpy_helper.from_array(np.array(-np.inf, np.float32), "neg_inf"),
             numpy_helper.from_array(np.array(0.0, np.float32), "f_zero")]
    bounds = [f"end_{i}" for i in range(1, blocks)]
    nodes = [
        oh.make_node("Shape", [INPUT_NAME], ["T"], start=1, end=2),  # (1,)
        oh.make_node("Squeeze", ["T"], ["T_scalar"]),
        oh.make_node("Range", ["zero", "T_scalar", "one"], ["pos"]),  # (T,) key positions
        oh.make_node("Unsqueeze", ["pos", "axis_1"], ["pos_col"]),  # (T, 1) query positions
        oh.make_node("Mul", ["T", "block_ends"], ["T_times"]),
        oh.make_node("Div", ["T_times", "blocks"], ["ends"]),  # T*i//n for i = 1 .. n-1
        oh.make_node("Split", ["ends"], bounds, axis=0, num_outputs=blocks - 1) if blocks > 2
        else oh.make_node("Identity", ["ends"], bounds),
    ]
    edges = ["zero_1d", *bounds, "T"]
    contexts, shaped = [], []
    for i in range(blocks):
        start, end, last = edges[i], edges[i + 1], i == blocks - 1
        key, value = ("k", "v") if last else (f"k_{i}", f"v_{i}")  # the last block meets every key
        nodes += [oh.make_node("Slice", ["q", start, end, "axis_1"], [f"q_{i}"]),  # (B, rows, H * d_out)
                  oh.make_node("Slice", ["pos_col", start, end, "axis_0"], [f"qpos_{i}"]),  # (rows, 1)
                  oh.make_node("Slice", ["pos", "zero_1d", end, "axis_0"], [f"kpos_{i}"])]  # (end,)
        if not last:
            nodes += [oh.make_node("Slice", ["k", "zero_1d", end, "axis_1"], [key]),  # (B, end, H * d_out)
                      oh.make_node("Slice", ["v", "zero_1d", end, "axis_1"], [value])]
        nodes += [oh.make_node("Greater", [f"kpos_{i}", f"qpos_{i}"], [f"future_{i}"]),  # (rows, end)
                  oh.make_node("Where", [f"future_{i}", "neg_inf", "f_zero"], [f"mask_{i}"]),
                  oh.make_node("Attention", [f"q_{i}", key, value, f"mask_{i}"], [f"context_{i}"], **heads)]
        contexts.append(f"context_{i}")
        shaped += [f"q_{i}", f"context_{i}"] + ([] if last else [key, value])
    nodes.append(oh.make_node("Concat", contexts, [out], axis=1))  # (B, T, H * d_out)
    # Shape inference loses every dim through the computed Slice bounds and would then write 0 for the
    # Attention output's width, which ONNX Runtime refuses at load: say what the shapes are.
    value_info = [oh.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", None, config.d_model]) for n in shaped]
    return oh.make_graph(nodes, "query_blocks", [],
                         [oh.make_tensor_value_info(out, TensorProto.FLOAT, ["batch", None, config.d_model])],
                         inits, value_info=value_info)


def qblocks_model(wrapper: MultiHeadAttentionWrapper, config: MHAConfig, *, blocks: int = QUERY_BLOCKS,
                  dense_below: int = DENSE_BELOW) -> onnx.ModelProto:
    """x -> three MatMuls -> If(T >= dense_below: query blocks; else one causal Attention) -> [projection]."""
    threshold = max(dense_below, blocks)  # never an empty block
    attention, projection, proj_inits = output_projection(wrapper, config)
    nodes, inits = _projections(wrapper, config)
    dense = oh.make_graph(
        [oh.make_node("Attention", ["q", "k", "v"], ["context_dense"], is_causal=1, q_num_heads=config.num_heads,
                      kv_num_heads=config.num_heads)], "dense", [],
        [oh.make_tensor_value_info("context_dense", TensorProto.FLOAT, ["batch", None, config.d_model])])
    nodes += [oh.make_node("Shape", [INPUT_NAME], ["T_outer"], start=1, end=2),
              oh.make_node("Squeeze", ["T_outer"], ["T_outer_scalar"]),
              oh.make_node("GreaterOrEqual", ["T_outer_scalar", "threshold"], ["use_blocks"]),
              oh.make_node("If", ["use_blocks"], [attention],
                           then_branch=_blocks_branch(config, blocks, "context_blocks"), else_branch=dense),
              *projection]
    io = contrib.plain_io(config)  # (inputs, outputs) as every attention graph has them
    graph = oh.make_graph(nodes, "mha_qblocks", *io, [*inits, i64("threshold", threshold), *proj_inits])
    return stamped_model(graph, metadata(config), opset=QBLOCKS_OPSET, contrib=False)


def build_qblocks(wrapper: MultiHeadAttentionWrapper, config: MHAConfig, folder: Path, *, opset: int) -> None:
    save_checked(qblocks_model(wrapper, config), folder / VARIANTS["qblocks"].file)
