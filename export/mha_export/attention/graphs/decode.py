"""The decode form: the wrapper's weights with a key/value cache, for token-by-token generation."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
from onnx import TensorProto, numpy_helper

from mha_export.attention.graphs.contrib import fused_initializers, output_projection, save_checked, stamped_model
from mha_export.attention.graphs.onnx_trace import check_saved
from mha_export.model.wrapper import MultiHeadAttentionWrapper
from mha_runtime.attention.config import MHAConfig
from mha_runtime.attention.contract import (
    INPUT_NAME,
    PAST_KEY,
    PAST_TOKENS,
    PAST_VALUE,
    PRESENT_KEY,
    PRESENT_VALUE,
    DecodeContract,
    metadata,
)
from mha_runtime.attention.registry import VARIANTS


def build_decode(wrapper: MultiHeadAttentionWrapper, config: MHAConfig, folder: Path, *, opset: int) -> None:
    """x (B, N, d_in) -> MatMul -> q, k, v (B, N, H * d_out) -> com.microsoft.MultiHeadAttention with
    past_key/past_value (B, H, P, d_out), causal (unidirectional: query i sees keys up to P + i) ->
    context (B, N, H * d_out), present_key/present_value (B, H, P + N, d_out).

    The same weights as the fused form (the fused mapping); ONNX Runtime's kernel appends the cache and attends in
    one node: three nodes instead of the 33 of a traced eager cache module, and faster per step
    (docs/design-notes.md). The graph is checked (structure, names, symbolic axes) and saved.
    """
    weight, bias = fused_initializers(wrapper, config)  # (d_in, 3 * H * d_out), (3 * H * d_out,) or None
    inits = [weight, numpy_helper.from_array(np.array([config.d_model] * 3, np.int64), "splits")]
    if bias is not None:  # the op adds it to q, k and v itself
        inits.append(bias)
    attention, projection, proj_inits = output_projection(wrapper, config)  # on the new tokens only
    nodes = [oh.make_node("MatMul", [INPUT_NAME, "W_qkv"], ["qkv"]),  # (B, N, 3 * H * d_out)
             oh.make_node("Split", ["qkv", "splits"], ["q", "k", "v"], axis=2),  # each (B, N, H * d_out)
             oh.make_node("MultiHeadAttention",
                          ["q", "k", "v", "" if bias is None else bias.name, "", "", PAST_KEY, PAST_VALUE],
                          [attention, PRESENT_KEY, PRESENT_VALUE], domain="com.microsoft",
                          num_heads=config.num_heads, unidirectional=1),  # scale 1/sqrt(d_out)
             *projection]
    save_decode(DecodeContract(config), nodes, inits + proj_inits, "mha_decode", folder / VARIANTS["decode"].file)


def save_decode(contract: DecodeContract, nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto], name: str,
                path: Path) -> None:
    """The graph over `contract`'s signature (past_tokens int32, the rest float32) as a com.microsoft model,
    saved and checked (structure, names, symbolic axes)."""
    signature = contract.signature()
    values = [oh.make_tensor_value_info(n, TensorProto.INT32 if n == PAST_TOKENS else TensorProto.FLOAT, shape)
              for n, shape in signature.items()]
    # signature(): the inputs, then context, present_key and present_value
    graph = oh.make_graph(nodes, name, values[:-3], values[-3:], inits)
    save_checked(stamped_model(graph, metadata(contract.config, contract.to_json())), path)
    check_saved(path, contract.config, signature)
