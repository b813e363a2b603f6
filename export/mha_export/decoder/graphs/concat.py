"""gpt.onnx: the whole decoder with a Concat-grown cache and Optimum's names, in standard ONNX ops only.

Per block: norm -> MatMul (q|k|v) -> heads -> the architecture's per-head step (rotary positions; GPT-2 has none)
-> Concat(past, new) -> scores -> Where(allowed) -> Softmax -> context -> MatMul + residual -> norm -> MLP +
residual; the norms, the embedding and the MLP are the architecture's pieces (archs/protocol.py). With fewer
key/value heads K than query heads H (grouped-query attention), each key/value head serves H / K query heads in
turn (query head j reads key/value head j // (H / K), as Hugging Face's repeat_kv): q is viewed as K groups of
(H / K) * T rows, so no key or value is copied.

`allowed` (B, 1, T, P + T) is computed once: key s is visible to query t when attention_mask[b, s] is 1 and
s <= P + t; for a layer with a sliding window W (Layer.window), once per W, also s > P + t - W. The window counts
cache columns, as transformers' sliding-window mask counts cache indices: with left padding (the only padding the
runners make) a real key's column and position differ by the row's padding, so the window is W positions. Masked
scores are set to float32's lowest finite value, not -inf, so that a row with nothing to attend to (left padding)
stays finite instead of turning the cache into NaN.
"""
from __future__ import annotations

import numpy as np
import onnx
import torch

from mha_export.decoder.archs import arch_of
from mha_export.decoder.archs.protocol import DecoderConfig
from mha_export.decoder.graphs.shared import (
    Built,
    Graph,
    add_bias,
    add_head,
    attended,
    make_model,
    numpy_state,
    project,
)
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


def _mask(g: Graph, windows: set[int]) -> dict[int | None, str]:
    """allowed (B, 1, T, S) bool from attention_mask (B, S) and the causal rule s <= S - T + t (key None), and for
    each window W also s > S - T + t - W (key W)."""
    t = g.one("Shape", [INPUT_IDS], start=1, end=2)  # (1,) = T
    s = g.one("Shape", [ATTENTION_MASK], start=1, end=2)  # (1,) = S = P + T
    t0, s0 = g.one("Squeeze", [t]), g.one("Squeeze", [s])
    past = g.one("Sub", [s0, t0])
    one = g.i64("one", 1)
    queries = g.one("Range", [past, s0, one])  # (T,) absolute positions of the new tokens
    keys = g.one("Range", [g.i64("zero", 0), s0, one])  # (S,)
    column = g.one("Unsqueeze", [queries, g.i64("axis_1", [1])])  # (T, 1)
    causal = g.one("LessOrEqual", [keys, column])  # (T, S)
    real = g.one("Cast", [ATTENTION_MASK], to=onnx.TensorProto.BOOL)  # (B, S)
    real = g.one("Unsqueeze", [real, g.i64("axes_12", [1, 2])])  # (B, 1, 1, S)
    allowed: dict[int | None, str] = {None: g.one("And", [causal, real])}  # (B, 1, T, S)
    for w in sorted(windows):
        near = g.one("Greater", [keys, g.one("Sub", [column, g.i64(f"window_{w}", w)])])  # (T, S)
        allowed[w] = g.one("And", [allowed[None], near])
    return allowed


def concat_model(state: dict[str, torch.Tensor], cfg: DecoderConfig, *, tied: bool) -> Built:
    """The Optimum-named decoder of `state` (the book's keys of the config's architecture)."""
    w = numpy_state(state)
    g = Graph()
    h, kv, d = cfg.n_heads, cfg.kv_heads, cfg.head_dim
    arch = arch_of(cfg).graph_pieces(g, w, cfg, fused=False)
    layers = arch.add_weights()
    x = arch.embed(INPUT_IDS, POSITION_IDS)  # (B, T, E)
    allowed = _mask(g, {layer.window for layer in layers if layer.window is not None})
    g.i64("split3", [h * d, kv * d, kv * d])
    g.i64("heads_shape", [0, 0, h, d])
    kv_shape = "heads_shape" if kv == h else g.i64("kv_heads_shape", [0, 0, kv, d])
    g.i64("merge_shape", [0, 0, h * d])
    g.init("scale", np.array(1.0 / np.sqrt(d), np.float32))
    g.init("lowest", np.array(np.finfo(np.float32).min, np.float32))
    grouped = kv != h  # grouped-query attention: q, the scores and the weights viewed by key/value head
    if grouped:
        g.i64("groups_shape", [0, kv, -1, d])  # (B, H, T, D) -> (B, K, (H / K) T, D)
        g.i64("scores_shape", [0, h, -1, 0])  # (B, K, (H / K) T, S) -> (B, H, T, S)
        g.i64("weights_shape", [0, kv, -1, 0])  # and back
        g.i64("context_shape", [0, h, -1, d])  # (B, K, (H / K) T, D) -> (B, H, T, D)
    for i, layer in enumerate(layers):
        a = arch.norm(x, layer.norm1)
        qkv = add_bias(g, project(g, a, layer.qkv))  # (B, T, (H + 2K) D)
        q, k, v = g.op("Split", [qkv, "split3"], outputs=3, axis=2)  # (B, T, HD), (B, T, KD), (B, T, KD)
        q, k, v = (g.one("Transpose", [g.one("Reshape", [t, shape])], perm=[0, 2, 1, 3])
                   for t, shape in ((q, "heads_shape"), (k, kv_shape), (v, kv_shape)))  # (B, H or K, T, D)
        q, k = arch.heads(q, k, layer, POSITION_IDS)
        keys = g.one("Concat", [past_key(i), k], out=[present_key(i)], axis=2)  # (B, K, S, D)
        values = g.one("Concat", [past_value(i), v], out=[present_value(i)], axis=2)
        q = g.one("Reshape", [q, "groups_shape"]) if grouped else q
        scores = g.one("Mul", [g.one("MatMul", [q, g.one("Transpose", [keys], perm=[0, 1, 3, 2])]), "scale"])
        scores = g.one("Reshape", [scores, "scores_shape"]) if grouped else scores
        scores = g.one("Where", [allowed[layer.window], scores, "lowest"])  # (B, H, T, S)
        weights = g.one("Softmax", [scores], axis=-1)
        weights = g.one("Reshape", [weights, "weights_shape"]) if grouped else weights
        context = g.one("MatMul", [weights, values])  # (B, H, T, D); grouped (B, K, (H / K) T, D)
        context = g.one("Reshape", [context, "context_shape"]) if grouped else context
        context = g.one("Reshape", [g.one("Transpose", [context], perm=[0, 2, 1, 3]), "merge_shape"])  # (B, T, HD)
        x = g.one("Add", [x, add_bias(g, attended(g, arch, context, layer))])
        m = arch.norm(x, layer.norm2)
        x = g.one("Add", [x, add_bias(g, arch.mlp(m, layer))])
    final = arch.norm(x, arch.final_norm())
    flat = g.one("Reshape", [final, g.i64("rows_shape", [-1, cfg.emb_dim])])  # (B * T, E)
    logits = add_head(g, w, flat, tied=tied)  # (B * T, V)
    out_shape = g.one("Concat", [g.one("Shape", [INPUT_IDS]), g.i64("vocab", [cfg.vocab_size])], axis=0)
    g.one("Reshape", [logits, out_shape], out=[LOGITS])  # (B, T, V)
    return make_model(g, "gpt_decoder", cfg, "concat", concat_signature(cfg), contrib=False)
