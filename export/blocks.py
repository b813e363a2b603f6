"""The blocks form: the fused Q/K/V projection, then causal attention in query blocks that skip masked keys.

Query block i of n (rows T*i//n .. T*(i+1)//n) only meets keys 0 .. T*(i+1)//n: scores, softmax and
weights @ V cover (n + 1) / 2n of the T x T square instead of all of it (5/8 for n = 4). Each block is one
ONNX Runtime `com.microsoft.MultiHeadAttention` node with the block's slice of the additive causal mask.
Keys past a block's end would weigh exactly 0, so leaving them out changes only the order of
floating-point sums (7e-7 max abs against the wrapper at gpt2-small, as for the other fp32 forms).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
from onnx import TensorProto, numpy_helper

from export.contrib import CONTRIB_OPSET, IR_VERSION
from export.fused import fused_state_dict
from export.model import MultiHeadAttentionWrapper
from runtime.config import MHAConfig
from runtime.contract import BATCH_AXIS, INPUT_NAME, META_CONFIG, META_CONTRACT, OUTPUT_NAME, TOKENS_AXIS, IOContract

# gpt2-small, T=1024, 2 threads, 20 interleaved rounds: 2 blocks 51.6 ms, 3: 49.1, 4: 49.1, 6: 48.1,
# 8: 51.9 (more blocks copy more key/value slices); the one-node contrib Attention 54.5 ms. A traced
# torch version of the same idea (plain MatMul/Softmax per block) ran 51.2 ms with 79 nodes, and its
# session took 16.7 ms to create against 10.2 ms for these 34 nodes.
QUERY_BLOCKS = 4


def _i64(name: str, values: list[int] | int) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(values, np.int64), name)


def blocks_model(wrapper: MultiHeadAttentionWrapper, config: MHAConfig, *, blocks: int = QUERY_BLOCKS) -> onnx.ModelProto:
    """x (B, T, d_in) -> MatMul -> q, k, v (B, T, H * d_out) -> one MultiHeadAttention per query block
    (its keys: 0 .. block end; its mask: the block's rows of the additive causal mask) -> Concat."""
    state = fused_state_dict(wrapper.state_dict(), config)
    weight = state["W_qkv.weight"].detach().numpy().T.copy()  # (d_in, 3 * H * d_out)
    width = config.d_model
    inits = [numpy_helper.from_array(weight.astype(np.float32), "W_qkv"), _i64("splits", [width] * 3),
             _i64("block_ends", list(range(1, blocks))), _i64("blocks", [blocks]), _i64("zero_1d", [0]),
             _i64("zero", 0), _i64("one", 1), _i64("axis_1", [1]), _i64("axis_2", [2]), _i64("axis_3", [3]),
             _i64("axes_01", [0, 1]), numpy_helper.from_array(np.array(-np.inf, np.float32), "neg_inf"),
             numpy_helper.from_array(np.array(0.0, np.float32), "f_zero")]
    nodes = [oh.make_node("MatMul", [INPUT_NAME, "W_qkv"], ["qkv"])]  # (B, T, 3 * H * d_out)
    qkv = "qkv"
    if config.qkv_bias:
        inits.append(numpy_helper.from_array(state["W_qkv.bias"].detach().numpy().astype(np.float32), "b_qkv"))
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
    nodes.append(oh.make_node("Concat", outputs, [OUTPUT_NAME], axis=1))  # (B, T, H * d_out)
    graph = oh.make_graph(
        nodes, "mha_blocks",
        [oh.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, [BATCH_AXIS, TOKENS_AXIS, config.d_in])],
        [oh.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, [BATCH_AXIS, TOKENS_AXIS, width])], inits)
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", CONTRIB_OPSET), oh.make_opsetid("com.microsoft", 1)],
                          producer_name="mha-export")
    model.ir_version = IR_VERSION
    oh.set_model_props(model, {META_CONFIG: config.to_json(), META_CONTRACT: IOContract(config).to_json()})
    return model


def export_blocks(wrapper: MultiHeadAttentionWrapper, config: MHAConfig, path: Path) -> None:
    model = blocks_model(wrapper, config)
    onnx.checker.check_model(model)  # contrib ops are not in onnx's schema registry: structural check only
    onnx.save(model, str(path))
