"""gpt.inplace.onnx: the decoder over one preallocated cache per layer, written in place, in fused ONNX Runtime ops.

Per block: the architecture's skip norm (residual + bias + norm in one op: GPT-2's SkipLayerNormalization) -> MatMul
(q|k|v) -> Add -> GroupQueryAttention (its query and key/value head counts; rotary positions where the
architecture has them) over past/present buffers of context_length rows, or a sliding window's rows where the layer
keeps only its window (bound to one OrtValue, so the kernel writes only the new rows; each row has its own
past_tokens, so batched rows need no padding) -> MatMul -> skip norm
-> the architecture's MLP (GPT-2: MatMul -> FastGelu, bias + tanh GELU -> MatMul). Positions are past_tokens +
0..T-1 per row. Only each row's last token reaches the head: decoding needs nothing else. The last block keeps every
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

from mha_export.decoder.archs import arch_of
from mha_export.decoder.archs.protocol import DecoderConfig
from mha_export.decoder.graphs.shared import (
    MS,
    Built,
    Graph,
    Projected,
    add_bias,
    add_head,
    attended,
    make_model,
    numpy_state,
    project,
)
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
from mha_runtime.decoder.shapes import cache_rows


def inplace_model(state: dict[str, torch.Tensor], cfg: DecoderConfig, *, tied: bool,
                  head_matmul: bool = False) -> Built:
    """The in-place decoder of `state`; `head_matmul` for the graph the int8 form quantizes (graph.add_head)."""
    w = numpy_state(state)
    g = Graph()
    arch = arch_of(cfg).graph_pieces(g, w, cfg, fused=True)
    layers = arch.add_weights()
    rows = cache_rows(cfg)  # each layer's cache rows
    # Positions and the kernel's sequence lengths from past_tokens (B,) int32 and T.
    t = g.one("Shape", [INPUT_IDS], start=1, end=2)  # (1,) int64
    t32 = g.one("Cast", [t], to=onnx.TensorProto.INT32)
    total = g.one("Add", [PAST_TOKENS, t32])  # (B,) rows in use after this call
    seqlens = g.one("Sub", [total, g.init("one_i32", np.array([1], np.int32))])  # last position
    total_max = g.one("ReduceMax", [total], keepdims=0)  # () int32
    offsets = g.one("Range", [g.i64("zero", 0), g.one("Squeeze", [t]), g.i64("one", 1)])  # (T,)
    past64 = g.one("Unsqueeze", [g.one("Cast", [PAST_TOKENS], to=onnx.TensorProto.INT64), g.i64("axis_1", [1])])
    positions = g.one("Add", [past64, offsets])  # (B, T)
    x = arch.embed(INPUT_IDS, positions)  # (B, T, E)
    last_index = g.one("Sub", [t, g.i64("one_1d", [1])])  # (1,) the last token's position within this call
    skip: Projected | None = None  # the previous block's last MatMul output and its bias, folded into the next norm
    for i, layer in enumerate(layers):
        if skip is None:
            a = arch.norm(x, layer.norm1)
        else:
            a, summed = arch.skip_norm(x, skip, layer.norm1)  # a = norm(x + skip + bias); x = x + skip + bias
            assert summed is not None
            x = summed
        qkv = add_bias(g, project(g, a, layer.qkv))  # (B, T, (H + 2K) D)
        given = arch.attention_inputs(qkv, layer)
        # A sliding window: ONNX Runtime 1.32's local_window_size counts the query's own position (W keys seen);
        # a layer whose cache keeps only the window (cache_rows < context) has the kernel evict (sliding_window_cache).
        window = {} if layer.window is None else {"local_window_size": layer.window}
        if rows[i] < cfg.context_length:
            assert layer.window is not None and rows[i] >= layer.window, (i, rows[i], layer.window)
            window["sliding_window_cache"] = 1
        attention = g.one("GroupQueryAttention", [*given.qkv, past_key(i), past_value(i), seqlens, total_max,
                                                  *given.rotary],
                          out=[f"h{i}.attention", present_key(i), present_value(i)], domain=MS,
                          num_heads=cfg.n_heads, kv_num_heads=cfg.kv_heads, **given.attrs, **window)  # (B, T, HD)
        if i == cfg.n_layers - 1:  # the rest of the block is position-wise: only the last token goes on
            attention = g.one("Gather", [attention, last_index], axis=1)  # (B, 1, HD)
            x = g.one("Gather", [x, last_index], axis=1)  # (B, 1, E) the residual, skip and bias added in
        m, summed = arch.skip_norm(x, attended(g, arch, attention, layer), layer.norm2)
        assert summed is not None
        x = summed
        skip = arch.mlp(m, layer)
    assert skip is not None
    final, _ = arch.skip_norm(x, skip, arch.final_norm(), summed=False)  # (B, 1, E)
    flat = g.one("Squeeze", [final, "axis_1"])  # (B, E)
    logits = add_head(g, w, flat, tied=tied, matmul=head_matmul)  # (B, V)
    g.nodes.append(oh.make_node("Identity", [logits], [NEXT_LOGITS], name="next_token_logits"))
    return make_model(g, "gpt_decoder_inplace", cfg, "inplace", inplace_signature(cfg), contrib=True)
