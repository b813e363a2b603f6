"""The decode form: the wrapper's weights with a key/value cache, for token-by-token generation."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx.helper as oh
from onnx import TensorProto, numpy_helper

from mha_export.graphs.contrib import contrib_domain_model, fused_initializers, output_projection, save_checked
from mha_export.graphs.onnx_trace import check_saved
from mha_export.model.wrapper import MultiHeadAttentionWrapper
from mha_runtime.artifact.config import MHAConfig
from mha_runtime.artifact.contract import (
    INPUT_NAME,
    OUTPUT_NAME,
    PAST_KEY,
    PAST_VALUE,
    PRESENT_KEY,
    PRESENT_VALUE,
    DecodeContract,
)
from mha_runtime.artifact.registry import VARIANTS


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
    inits += proj_inits
    contract = DecodeContract(config)
    signature = contract.signature()
    values = {name: oh.make_tensor_value_info(name, TensorProto.FLOAT, shape) for name, shape in signature.items()}
    graph = oh.make_graph(nodes, "mha_decode", [values[n] for n in (INPUT_NAME, PAST_KEY, PAST_VALUE)],
                          [values[n] for n in (OUTPUT_NAME, PRESENT_KEY, PRESENT_VALUE)], inits)
    path = folder / VARIANTS["decode"].file
    save_checked(contrib_domain_model(graph, config, contract.to_json()), path)
    check_saved(path, config, signature)
