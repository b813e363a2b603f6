"""gpt.onnx: the whole decoder with a Concat-grown cache and Optimum's GPT-2 names, in standard ONNX ops only.

Per block: LayerNormalization -> MatMul (q|k|v) -> heads -> Concat(past, new) -> scores -> Where(allowed) ->
Softmax -> context -> MatMul + residual -> LayerNormalization -> MatMul -> Gelu(tanh) -> MatMul + residual.
`allowed` (B, 1, T, P + T) is computed once: key s is visible to query t when attention_mask[b, s] is 1 and
s <= P + t. Masked scores are set to float32's lowest finite value, not -inf, so that a row with nothing to
attend to (left padding) stays finite instead of turning the cache into NaN.
"""
from __future__ import annotations

import numpy as np
import onnx
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
    ATTENTION_MASK,
    INPUT_IDS,
    LOGITS,
    POSITION_IDS,
    concat_signature,
    past_key,
    past_value,
    present_key,
    present_value,
)


def _mask(g: Graph) -> str:
    """allowed (B, 1, T, S) bool from attention_mask (B, S) and the causal rule s <= S - T + t."""
    t = g.one("Shape", [INPUT_IDS], start=1, end=2)  # (1,) = T
    s = g.one("Shape", [ATTENTION_MASK], start=1, end=2)  # (1,) = S = P + T
    t0, s0 = g.one("Squeeze", [t]), g.one("Squeeze", [s])
    past = g.one("Sub", [s0, t0])
    one = g.i64("one", 1)
    queries = g.one("Range", [past, s0, one])  # (T,) absolute positions of the new tokens
    keys = g.one("Range", [g.i64("zero", 0), s0, one])  # (S,)
    causal = g.one("LessOrEqual", [keys, g.one("Unsqueeze", [queries, g.i64("axis_1", [1])])])  # (T, S)
    real = g.one("Cast", [ATTENTION_MASK], to=onnx.TensorProto.BOOL)  # (B, S)
    real = g.one("Unsqueeze", [real, g.i64("axes_12", [1, 2])])  # (B, 1, 1, S)
    return g.one("And", [causal, real])  # (B, 1, T, S)


def concat_model(state: dict[str, torch.Tensor], cfg: GPTConfig, *, tied: bool) -> Built:
    """The Optimum-named decoder of `state` (the book's GPTModel keys)."""
    w = numpy_state(state)
    g = Graph()
    e, h, d = cfg.emb_dim, cfg.n_heads, cfg.head_dim
    layers = add_weights(g, w, cfg)
    x = add_embeddings(g, w, INPUT_IDS, POSITION_IDS)  # (B, T, E)
    allowed = _mask(g)
    g.i64("split3", [e, e, e])
    g.i64("heads_shape", [0, 0, h, d])
    g.i64("merge_shape", [0, 0, e])
    g.init("scale", np.array(1.0 / np.sqrt(d), np.float32))
    g.init("lowest", np.array(np.finfo(np.float32).min, np.float32))
    for i, layer in enumerate(layers):
        a = g.one("LayerNormalization", [x, *layer.ln1], axis=-1, epsilon=LAYER_NORM_EPS)
        qkv = g.one("MatMul", [a, layer.qkv])  # (B, T, 3E)
        if layer.qkv_bias:
            qkv = g.one("Add", [qkv, layer.qkv_bias])
        q, k, v = g.op("Split", [qkv, "split3"], outputs=3, axis=2)  # each (B, T, E)
        q, k, v = (g.one("Transpose", [g.one("Reshape", [t, "heads_shape"])], perm=[0, 2, 1, 3])
                   for t in (q, k, v))  # (B, H, T, D)
        keys = g.one("Concat", [past_key(i), k], out=[present_key(i)], axis=2)  # (B, H, S, D)
        values = g.one("Concat", [past_value(i), v], out=[present_value(i)], axis=2)
        scores = g.one("Mul", [g.one("MatMul", [q, g.one("Transpose", [keys], perm=[0, 1, 3, 2])]), "scale"])
        scores = g.one("Where", [allowed, scores, "lowest"])  # (B, H, T, S)
        context = g.one("MatMul", [g.one("Softmax", [scores], axis=-1), values])  # (B, H, T, D)
        context = g.one("Reshape", [g.one("Transpose", [context], perm=[0, 2, 1, 3]), "merge_shape"])  # (B, T, E)
        x = g.one("Add", [x, g.one("Add", [g.one("MatMul", [context, layer.out[0]]), layer.out[1]])])
        m = g.one("LayerNormalization", [x, *layer.ln2], axis=-1, epsilon=LAYER_NORM_EPS)
        f = g.one("Gelu", [g.one("Add", [g.one("MatMul", [m, layer.fc[0]]), layer.fc[1]])], approximate="tanh")
        x = g.one("Add", [x, g.one("Add", [g.one("MatMul", [f, layer.proj[0]]), layer.proj[1]])])
    final = g.one("LayerNormalization", [x, g.init("final.scale", w["final_norm.scale"]),
                                         g.init("final.shift", w["final_norm.shift"])], axis=-1, epsilon=LAYER_NORM_EPS)
    flat = g.one("Reshape", [final, g.i64("rows_shape", [-1, e])])  # (B * T, E)
    logits = add_head(g, w, flat, tied=tied)  # (B * T, V)
    out_shape = g.one("Concat", [g.one("Shape", [INPUT_IDS]), g.i64("vocab", [cfg.vocab_size])], axis=0)
    g.one("Reshape", [logits, out_shape], out=[LOGITS])  # (B, T, V)
    return make_model(g, "gpt_decoder", cfg, "concat", concat_signature(cfg), contrib=False)
