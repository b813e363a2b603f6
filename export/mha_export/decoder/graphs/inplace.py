"""gpt.inplace.onnx: the decoder over one preallocated cache per layer, written in place, in fused ONNX Runtime ops.

Per block: SkipLayerNormalization (residual + bias + LayerNorm in one op) -> MatMul (q|k|v) -> Add ->
GroupQueryAttention over past/present buffers of context_length rows (bound to one OrtValue, so the kernel
writes only the new rows; each row has its own past_tokens, so batched rows need no padding) -> MatMul ->
SkipLayerNormalization -> MatMul -> FastGelu (bias + tanh GELU) -> MatMul. Positions are past_tokens + 0..T-1
per row. Only each row's last token reaches the head: decoding needs nothing else. The last block keeps every
token up to its attention (GroupQueryAttention writes every prompt position's keys and values into the cache),
then gathers the last token: its out projection, feed-forward and the head are position-wise, so the other rows
could only be thrown away. A 128-token prefill skips 127 of 128 rows of the head and of the last block's out
projection and feed-forward (docs/measurements/gpt.md, the 2026-12-02 `make bench` runs).
"""
from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import torch

from mha_export.decoder.graphs.shared import (
    Built,
    Graph,
    add_embeddings,
    add_head,
    add_weights,
    make_model,
    numpy_state,
)
from mha_runtime.decoder.config import LAYER_NORM_EPS, GPTConfig
from mha_runtime.decoder.contract import (
    INPUT_IDS,
    NEXT_LOGITS,
    PAST_TOKENS,
    inplace_signature,
    past_key,
    past_value,
    present_key,
    present_value,
)

MS = "com.microsoft"


def inplace_model(state: dict[str, torch.Tensor], cfg: GPTConfig, *, tied: bool,
                  head_matmul: bool = False) -> Built:
    """The in-place decoder of `state`; `head_matmul` for the graph the int8 form quantizes (graph.add_head)."""
    w = numpy_state(state)
    g = Graph()
    layers = add_weights(g, w, cfg)
    # Positions and the kernel's sequence lengths from past_tokens (B,) int32 and T.
    t = g.one("Shape", [INPUT_IDS], start=1, end=2)  # (1,) int64
    t32 = g.one("Cast", [t], to=onnx.TensorProto.INT32)
    total = g.one("Add", [PAST_TOKENS, t32])  # (B,) rows in use after this call
    seqlens = g.one("Sub", [total, g.init("one_i32", np.array([1], np.int32))])  # last position
    total_max = g.one("ReduceMax", [total], keepdims=0)  # () int32
    offsets = g.one("Range", [g.i64("zero", 0), g.one("Squeeze", [t]), g.i64("one", 1)])  # (T,)
    past64 = g.one("Unsqueeze", [g.one("Cast", [PAST_TOKENS], to=onnx.TensorProto.INT64), g.i64("axis_1", [1])])
    positions = g.one("Add", [past64, offsets])  # (B, T)
    x = add_embeddings(g, w, INPUT_IDS, positions)  # (B, T, E)
    last_index = g.one("Sub", [t, g.i64("one_1d", [1])])  # (1,) the last token's position within this call
    skip = None  # the previous block's last MatMul output and its bias, folded into the next SkipLayerNorm
    for i, layer in enumerate(layers):
        if skip is None:
            a = g.one("LayerNormalization", [x, *layer.ln1], axis=-1, epsilon=LAYER_NORM_EPS)
        else:
            a, _, _, x = g.op("SkipLayerNormalization", [x, skip[0], *layer.ln1, skip[1]], outputs=4, domain=MS,
                              epsilon=LAYER_NORM_EPS)  # a = LN(x + skip + bias); x = x + skip + bias
        qkv = g.one("MatMul", [a, layer.qkv])  # (B, T, 3E)
        if layer.qkv_bias:
            qkv = g.one("Add", [qkv, layer.qkv_bias])
        attention = g.one("GroupQueryAttention", [qkv, "", "", past_key(i), past_value(i), seqlens, total_max],
                          out=[f"h{i}.attention", present_key(i), present_value(i)], domain=MS,
                          num_heads=cfg.n_heads, kv_num_heads=cfg.n_heads)  # (B, T, E); scale 1/sqrt(D), causal
        if i == cfg.n_layers - 1:  # the rest of the block is position-wise: only the last token goes on
            attention = g.one("Gather", [attention, last_index], axis=1)  # (B, 1, E)
            x = g.one("Gather", [x, last_index], axis=1)  # (B, 1, E) the residual, skip and bias added in
        m, _, _, x = g.op("SkipLayerNormalization", [x, g.one("MatMul", [attention, layer.out[0]]), *layer.ln2,
                                                     layer.out[1]], outputs=4, domain=MS, epsilon=LAYER_NORM_EPS)
        f = g.one("FastGelu", [g.one("MatMul", [m, layer.fc[0]]), layer.fc[1]], domain=MS)  # (B, T, 4E)
        skip = (g.one("MatMul", [f, layer.proj[0]]), layer.proj[1])
    assert skip is not None
    final = g.op("SkipLayerNormalization", [x, skip[0], g.init("final.scale", w["final_norm.scale"]),
                                            g.init("final.shift", w["final_norm.shift"]), skip[1]],
                 outputs=1, domain=MS, epsilon=LAYER_NORM_EPS)[0]  # (B, 1, E)
    flat = g.one("Squeeze", [final, "axis_1"])  # (B, E)
    logits = add_head(g, w, flat, tied=tied, matmul=head_matmul)  # (B, V)
    g.nodes.append(oh.make_node("Identity", [logits], [NEXT_LOGITS], name="next_token_logits"))
    return make_model(g, "gpt_decoder_inplace", cfg, "inplace", inplace_signature(cfg), contrib=True)
