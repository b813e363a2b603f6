"""ONNX Runtime's com.microsoft `Attention` op (fused Q/K/V, causal, dense attention) in one node."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
from onnx import TensorProto, numpy_helper

from mha_export.model.fused import fused_state_dict
from mha_export.model.wrapper import MultiHeadAttentionWrapper
from mha_runtime.attention.config import MHAConfig
from mha_runtime.attention.contract import BATCH_AXIS, INPUT_NAME, OUTPUT_NAME, TOKENS_AXIS, metadata
from mha_runtime.attention.registry import VARIANTS

CONTRIB_OPSET = 18
OUT_PROJ_MATMUL = "out_proj_matmul"  # int8 leaves this one in fp32 (mha_runtime.attention.registry)
# onnx.helper would stamp its newest IR version (14), which onnxruntime-node 1.30 refuses ("max supported 13");
# 10 is what the torch exporter writes for the other artifacts.
IR_VERSION = 10


def fused_initializers(wrapper: MultiHeadAttentionWrapper, config: MHAConfig
                       ) -> tuple[onnx.TensorProto, onnx.TensorProto | None]:
    """The wrapper's fused mapping as initializers: W_qkv (d_in, 3 * H * d_out) and b_qkv
    (3 * H * d_out,), the bias None when the config has none."""
    state = fused_state_dict(wrapper.state_dict(), config)
    weight = state["W_qkv.weight"].detach().numpy().T.astype(np.float32)  # (d_in, 3 * H * d_out)
    bias = state["W_qkv.bias"].detach().numpy().astype(np.float32) if config.qkv_bias else None
    return (numpy_helper.from_array(np.ascontiguousarray(weight), "W_qkv"),
            None if bias is None else numpy_helper.from_array(bias, "b_qkv"))


def output_projection(wrapper: MultiHeadAttentionWrapper, config: MHAConfig
                      ) -> tuple[str, list[onnx.NodeProto], list[onnx.TensorProto]]:
    """(the name attention should write, the nodes that make `context` of it, their initializers).

    Without out_proj the attention writes `context` itself; with it, context = attention @ W_out + b_out
    (W_out is the Linear's weight transposed to (in, out)).
    """
    if wrapper.out_proj is None:
        return OUTPUT_NAME, [], []
    weight = wrapper.out_proj.weight.detach().numpy().T.astype(np.float32)  # (H * d_out, H * d_out)
    bias = wrapper.out_proj.bias.detach().numpy().astype(np.float32)  # (H * d_out,)
    nodes = [oh.make_node("MatMul", ["attention", "W_out"], ["projected"], name=OUT_PROJ_MATMUL),
             oh.make_node("Add", ["projected", "b_out"], [OUTPUT_NAME], name="out_proj_add")]
    return "attention", nodes, [numpy_helper.from_array(np.ascontiguousarray(weight), "W_out"),
                                numpy_helper.from_array(bias, "b_out")]


def plain_io(config: MHAConfig) -> tuple[list[onnx.ValueInfoProto], list[onnx.ValueInfoProto]]:
    """The main contract's graph input x (B, T, d_in) and output context (B, T, H * d_out)."""
    return ([oh.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, [BATCH_AXIS, TOKENS_AXIS, config.d_in])],
            [oh.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, [BATCH_AXIS, TOKENS_AXIS, config.d_model])])


def i64(name: str, values: list[int] | int) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(values, np.int64), name)


def stamped_model(graph: onnx.GraphProto, props: dict[str, str], *, opset: int = CONTRIB_OPSET,
                  contrib: bool = True) -> onnx.ModelProto:
    """A hand-built graph (this package's and the GPT's) as a model: ONNX `opset`, plus com.microsoft with
    `contrib`, the IR version every runtime here loads, and `props` in metadata_props."""
    opsets = [oh.make_opsetid("", opset)] + ([oh.make_opsetid("com.microsoft", 1)] if contrib else [])
    model = oh.make_model(graph, opset_imports=opsets, producer_name="mha-export")
    model.ir_version = IR_VERSION
    oh.set_model_props(model, props)
    return model


def save_checked(model: onnx.ModelProto, path: Path) -> None:
    onnx.checker.check_model(model)  # contrib ops are not in onnx's schema registry: structural check only
    onnx.save(model, str(path))


def build_contrib(wrapper: MultiHeadAttentionWrapper, config: MHAConfig, folder: Path, *, opset: int) -> None:
    """x (B, T, d_in) -> Attention(x, W_qkv^T, b_qkv, unidirectional=1) -> context (B, T, H * d_out).

    ORT's kernel runs the Q/K/V projection as one GEMM and the heads in parallel; the scale
    1/sqrt(d_out) is its default. Needs onnxruntime (the op is in the com.microsoft domain).
    """
    weight, bias = fused_initializers(wrapper, config)
    if bias is None:  # the op takes a bias input either way
        bias = numpy_helper.from_array(np.zeros(3 * config.d_model, np.float32), "b_qkv")  # (3 * H * d_out,)
    attention, projection, proj_inits = output_projection(wrapper, config)
    node = oh.make_node("Attention", [INPUT_NAME, "W_qkv", "b_qkv"], [attention], domain="com.microsoft",
                        num_heads=config.num_heads, unidirectional=1)
    graph = oh.make_graph([node, *projection], "mha_contrib", *plain_io(config), [weight, bias, *proj_inits])
    save_checked(stamped_model(graph, metadata(config)), folder / VARIANTS["contrib"].file)
