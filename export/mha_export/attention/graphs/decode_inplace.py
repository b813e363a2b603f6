"""The in-place decode form: a key/value cache of context_length rows that each step writes into.

x (B, N, d_in) -> MatMul -> packed q|k|v (B, N, 3 * H * d_out) -> com.microsoft.GroupQueryAttention with
past_key/past_value (B, H, context_length, d_out) and past_tokens (B,) -> context (B, N, H * d_out) and
present_key/present_value, the same buffer shape. Bound to one OrtValue as both past and present (IO binding),
ONNX Runtime's kernel sees the shared buffer and copies only the N new rows into it, where mha.decode.onnx
returns a grown copy of the whole cache every step. The packed input is the fused projection's own column
order (all q heads, all k heads, all v heads), so no Split; attention is causal from past_tokens on.

ONNX Runtime's GroupQueryAttention needs d_out % 8 == 0 (the variant is left out of `all` otherwise), and a
chunk of more than one token after a non-empty past only at batch 1 (the session refuses it before the run).
docs/design-notes.md has the measurements.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx.helper as oh
from onnx import TensorProto, numpy_helper

from mha_export.attention.graphs.contrib import fused_initializers, output_projection
from mha_export.attention.graphs.decode import save_decode
from mha_export.model.wrapper import MultiHeadAttentionWrapper
from mha_runtime.attention.config import MHAConfig
from mha_runtime.attention.contract import (
    INPUT_NAME,
    PAST_KEY,
    PAST_TOKENS,
    PAST_VALUE,
    PRESENT_KEY,
    PRESENT_VALUE,
    InPlaceDecodeContract,
)
from mha_runtime.attention.registry import VARIANTS


def build_decode_inplace(wrapper: MultiHeadAttentionWrapper, config: MHAConfig, folder: Path, *, opset: int) -> None:
    """The graph above: MatMul [+ Add] -> GroupQueryAttention [-> projection], seqlens derived from past_tokens;
    checked (structure, names, symbolic axes) and saved."""
    weight, bias = fused_initializers(wrapper, config)  # (d_in, 3 * H * d_out), (3 * H * d_out,) or None
    inits = [weight, numpy_helper.from_array(np.array([1], np.int32), "one_i32")]
    nodes = [oh.make_node("MatMul", [INPUT_NAME, "W_qkv"], ["qkv"])]  # (B, N, 3 * H * d_out)
    packed = "qkv"
    if bias is not None:  # GroupQueryAttention has no bias input
        inits.append(bias)
        nodes.append(oh.make_node("Add", ["qkv", "b_qkv"], ["qkv_b"]))
        packed = "qkv_b"
    attention, projection, proj_inits = output_projection(wrapper, config)  # on the new tokens only
    nodes += [
        oh.make_node("Shape", [INPUT_NAME], ["N_i64"], start=1, end=2),  # (1,)
        oh.make_node("Cast", ["N_i64"], ["N"], to=TensorProto.INT32),
        oh.make_node("Add", [PAST_TOKENS, "N"], ["total_per_row"]),  # (B,): rows in use after this step
        oh.make_node("Sub", ["total_per_row", "one_i32"], ["seqlens_k"]),  # the kernel's 0-based last position
        oh.make_node("ReduceMax", ["total_per_row"], ["total_sequence_length"], keepdims=0),  # () int32
        oh.make_node("GroupQueryAttention",
                     [packed, "", "", PAST_KEY, PAST_VALUE, "seqlens_k", "total_sequence_length"],
                     [attention, PRESENT_KEY, PRESENT_VALUE], domain="com.microsoft", num_heads=config.num_heads,
                     kv_num_heads=config.num_heads),  # scale 1/sqrt(d_out), causal
        *projection,
    ]
    save_decode(InPlaceDecodeContract(config), nodes, inits + proj_inits, "mha_decode_inplace",
                folder / VARIANTS["decode-inplace"].file)
