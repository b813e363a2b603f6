"""The blocks form: the fused Q/K/V projection, then causal attention in query blocks that skip masked keys.

Query block i of n (rows T*i//n .. T*(i+1)//n) only meets keys 0 .. T*(i+1)//n: scores, softmax and
weights @ V cover (n + 1) / 2n of the T x T square instead of all of it (5/8 for n = 4). Each block is one
ONNX Runtime `com.microsoft.MultiHeadAttention` node with the block's slice of the additive causal mask.
Keys past a block's end would weigh exactly 0, so leaving them out changes only the order of
floating-point sums, as for the other fp32 forms (docs/design-notes.md, "Tolerance rows").
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
from onnx import numpy_helper

from mha_export.attention.graphs.contrib import (
    fused_initializers,
    i64,
    output_projection,
    plain_io,
    save_checked,
    stamped_model,
)
from mha_export.model.wrapper import MultiHeadAttentionWrapper
from mha_runtime.attention.config import MHAConfig
from mha_runtime.attention.contract import INPUT_NAME, metadata
from mha_runtime.attention.registry import VARIANTS

# 4 blocks: the fastest of the counts tried (more blocks copy more key/value slices); docs/design-notes.md.
QUERY_BLOCKS = 4


def blocks_model(wrapper: MultiHeadAttentionWrapper, config: MHAConfig, *,
                 blocks: int = QUERY_BLOCKS) -> onnx.ModelProto:
    """x (B, T, d_in) -> MatMul -> q, k, v (B, T, H * d_out) -> one MultiHeadAttention per query block
    (its keys: 0 .. block end; its mask: the block's rows of the additive causal mask) -> Concat."""
    weight, bias = fused_initializers(wrapper, config)  # (d_in, 3 * H * d_out), (3 * H * d_out,) or None
    width = config.d_model
    inits = [weight, i64("splits", [width] * 3),
             i64("block_ends", list(range(1, blocks))), i64("blocks", [blocks]), i64("zero_1d", [0]),
             i64("zero", 0), i64("one", 1), i64("axis_1", [1]), i64("axis_2", [2]), i64("axis_3", [3]),
             i64("axes_01", [0, 1]), numpy_helper.from_array(np.array(-np.inf, np.float32), "neg_inf"),
             numpy_helper.from_array(np.array(0.0, np.float32), "f_zero")]
    nodes = [oh.make_node("MatMul", [INPUT_NAME, "W_qkv"], ["qkv"])]  # (B, T, 3 * H * d_out)
    qkv = "qkv"
    if bias is not None:
        inits.append(bias)
        nodes.append(oh.make_node("Add", ["qkv", "b_qkv"], ["qkv_b"]))
        qkv = "qkv_b"
    bounds = [f"end_{i}" for i in range(1, blocks)]
    nodes += [
        oh.make_node("Split", [qkv, "splits"], ["q", "k", "v"], axis=2),  # each (B, T, H * d_out)
        oh.make_node("Shape", [INPUT_NAME], ["T"], start=1, end=2),  # (1,)
        oh.make_node("Mul", ["T", "block_ends"], ["T_times"]),
        oh.make_node("Div", ["T_times", "blocks"], ["ends"]),  # T*i//n for i = 1 .. n-1 (integer division)
        oh.make_node("Split", ["ends"], bounds, axis=0, num_outputs=blocks - 1) if blocks > 2
        else oh.make_node("Identity", ["ends"], bounds),
        oh.make_node("Squeeze", ["T"], ["T_scalar"]),
        oh.make_node("Range", ["zero", "T_scalar", "one"], ["pos"]),  # (T,)
        oh.make_node("Unsqueeze", ["pos", "axis_1"], ["pos_col"]),  # (T, 1)
        oh.make_node("Greater", ["pos", "pos_col"], ["future"]),  # (T, T): key after query
        oh.make_node("Where", ["future", "neg_inf", "f_zero"], ["mask_2d"]),
        oh.make_node("Unsqueeze", ["mask_2d", "axes_01"], ["mask"]),  # (1, 1, T, T) additive
    ]
    edges = ["zero_1d", *bounds, "T"]
    outputs = []
    for i in range(blocks):
        start, end, last = edges[i], edges[i + 1], i == blocks - 1
        nodes += [oh.make_node("Slice", ["q", start, end, "axis_1"], [f"q_{i}"]),  # (B, rows, H * d_out)
                  oh.make_node("Slice", ["mask", start, end, "axis_2"], [f"mask_rows_{i}"])]  # (1, 1, rows, T)
        key, value, mask = "k", "v", f"mask_rows_{i}"
        if not last:  # the last block meets every key
            key, value, mask = f"k_{i}", f"v_{i}", f"mask_{i}"
            nodes += [oh.make_node("Slice", ["k", "zero_1d", end, "axis_1"], [key]),  # (B, end, H * d_out)
                      oh.make_node("Slice", ["v", "zero_1d", end, "axis_1"], [value]),
                      oh.make_node("Slice", [f"mask_rows_{i}", "zero_1d", end, "axis_3"], [mask])]  # (1, 1, rows, end)
        nodes.append(oh.make_node("MultiHeadAttention", [f"q_{i}", key, value, "", "", mask], [f"context_{i}"],
                                  domain="com.microsoft", num_heads=config.num_heads))  # scale 1/sqrt(d_out)
        outputs.append(f"context_{i}")
    attention, projection, proj_inits = output_projection(wrapper, config)
    nodes.append(oh.make_node("Concat", outputs, [attention], axis=1))  # (B, T, H * d_out)
    graph = oh.make_graph(nodes + projection, "mha_blocks", *plain_io(config), inits + proj_inits)
    return stamped_model(graph, metadata(config))


def build_blocks(wrapper: MultiHeadAttentionWrapper, config: MHAConfig, folder: Path, *, opset: int) -> None:
    save_checked(blocks_model(wrapper, config), folder / VARIANTS["blocks"].file)
