"""Gemma 3's ONNX pieces (archs/protocol.py's Pieces), which decoder/graphs/ compose into both decoder forms.

What differs from the Llama family's pieces, which these extend (RMSNorm, rotate-half RoPE, the fused skip norm and
the per-head q/k norms are theirs):
- The embedding is scaled by sqrt(emb_dim) (a float32 constant, as transformers casts it to the weights' dtype); the
  head is the token embedding (tied) or its own matrix, as the weights say.
- Every RMSNorm multiplies by (1 + w): the 1 is folded into each initializer once, so the norms are Llama's.
- Four norms per block: before attention (norm1), after it (Layer.post_attention: the builders norm the out
  projection before the residual add), before the feed-forward (norm2) and after it (`mlp` returns the normed
  output, which the builders add to the residual; no bias).
- q and k RMSNorm per head, then RoPE with the layer's base: local (sliding) layers rotate with rope_local_base,
  global ones with rope_base, two cos/sin caches. The window is Layer.window (the builders mask it).
- Queries are scaled by query_pre_attn_scalar ** -0.5, not head_dim ** -0.5: GroupQueryAttention's `scale`; in the
  portable form, whose scores are scaled by head_dim ** -0.5, q is multiplied by the ratio where it is not 1.
- GeGLU: down(gelu_tanh(gate x) * up x), gate and up one (E, 2F) MatMul; Gelu(approximate="tanh") at opset 20 in
  the portable form, FastGelu (com.microsoft, the same tanh approximation) in the in-place one.
Initializer names: h{i}.norm1.weight, h{i}.post_attention.weight, h{i}.norm2.weight, h{i}.post_mlp.weight, ...
"""
from __future__ import annotations

import numpy as np

from mha_export.decoder.archs.gemma3.config import Gemma3Config
from mha_export.decoder.archs.llama.graph import LlamaPieces
from mha_export.decoder.archs.llama.rope import rope_caches
from mha_export.decoder.archs.protocol import AttentionInputs
from mha_export.decoder.graphs.shared import MS, TOKENS, Graph, Layer, Linear, Projected, project

QKV = ("W_query", "W_key", "W_value")
# (cos, sin) caches (C, D / 2) by layer kind: local layers' base rope_local_base, global layers' rope_base.
ROPE = {True: ("rope_local.cos", "rope_local.sin"), False: ("rope_global.cos", "rope_global.sin")}


class Gemma3Pieces(LlamaPieces):
    """Gemma 3's ops in graph `g` from the book's weights `w` (numpy, the book's Gemma3Model keys); `fused`: the
    in-place form."""

    def __init__(self, g: Graph, w: dict[str, np.ndarray], cfg: Gemma3Config, *, fused: bool) -> None:
        super().__init__(g, w, cfg, fused=fused)  # type: ignore[arg-type]  # it reads norm_eps and the head counts
        self.gemma = cfg

    def _norm_weight(self, name: str, key: str) -> str:
        """A (1 + w) RMSNorm weight as an initializer (float32, the 1 added once here)."""
        return self.g.init(name, (1.0 + self.w[key]).astype(np.float32))

    def add_weights(self) -> list[Layer]:
        """Every block's weights, matrices (in, out): q|k|v (E, (H + 2K) D), gate|up (E, 2F); norms (1 + w); both
        rotary caches."""
        g, w, cfg = self.g, self.w, self.gemma
        for local, (cos_name, sin_name) in ROPE.items():
            cos, sin = rope_caches(cfg.head_dim, float(cfg.rope_local_base if local else cfg.rope_base),
                                   cfg.context_length)
            g.init(cos_name, cos)
            g.init(sin_name, sin)
        layers = []
        for i in range(cfg.n_layers):
            b = f"blocks.{i}."
            norm1 = (self._norm_weight(f"h{i}.norm1.weight", f"{b}input_layernorm.scale"),)
            qkv = g.init(f"h{i}.qkv.weight", np.concatenate([w[f"{b}att.{n}.weight"].T for n in QKV], axis=1))
            extra = (self._norm_weight(f"h{i}.q_norm.weight", f"{b}att.q_norm.scale"),
                     self._norm_weight(f"h{i}.k_norm.weight", f"{b}att.k_norm.scale"),
                     self._norm_weight(f"h{i}.post_mlp.weight", f"{b}post_feedforward_layernorm.scale"))
            out = Linear(g.init(f"h{i}.out.weight", w[f"{b}att.out_proj.weight"].T))  # (H D, E)
            post = (self._norm_weight(f"h{i}.post_attention.weight", f"{b}post_attention_layernorm.scale"),)
            norm2 = (self._norm_weight(f"h{i}.norm2.weight", f"{b}pre_feedforward_layernorm.scale"),)
            gate_up = np.concatenate([w[f"{b}ff.fc1.weight"].T, w[f"{b}ff.fc2.weight"].T], axis=1)  # (E, 2F)
            mlp = (Linear(g.init(f"h{i}.gate_up.weight", gate_up)),
                   Linear(g.init(f"h{i}.down.weight", w[f"{b}ff.fc3.weight"].T)))  # (F, E)
            layers.append(Layer(norm1=norm1, qkv=Linear(qkv), out=out, norm2=norm2, mlp=mlp, extra=extra,
                                window=cfg.window_of(i), post_attention=post))
        return layers

    def embed(self, input_ids: str, positions: str) -> str:
        """tok_emb[input_ids] * sqrt(emb_dim): (B, T, E); positions enter as rotations of q and k."""
        g = self.g
        g.init(TOKENS, self.w["tok_emb.weight"])  # (V, E)
        scale = self._const("embed.scale", np.array(np.sqrt(self.gemma.emb_dim), np.float32))
        return g.one("Mul", [g.one("Gather", [TOKENS, input_ids]), scale])

    def final_norm(self) -> tuple[str, ...]:
        return (self._norm_weight("final.weight", "final_norm.scale"),)

    def _rope(self, layer: Layer) -> tuple[str, str]:
        """The layer's (cos, sin) caches: a local layer is one with a window."""
        return ROPE[layer.window is not None]

    def heads(self, q: str, k: str, layer: Layer, positions: str) -> tuple[str, str]:
        """q (B, H, T, D) and k (B, K, T, D): normed per head, rotated by their positions with the layer's base;
        q rescaled so that the builder's head_dim ** -0.5 makes query_pre_attn_scalar ** -0.5."""
        g, cfg = self.g, self.gemma
        q, k = self._rms(q, layer.extra[0]), self._rms(k, layer.extra[1])
        cos_name, sin_name = self._rope(layer)
        key = f"{positions}:{cos_name}"
        if key not in self._angles:  # once per graph and base: (B, T) -> (B, 1, T, D / 2)
            axis = self._const("rope.axis", np.array([1], np.int64))
            self._angles[key] = (g.one("Unsqueeze", [g.one("Gather", [cos_name, positions]), axis]),
                                 g.one("Unsqueeze", [g.one("Gather", [sin_name, positions]), axis]))
        cos, sin = self._angles[key]
        ratio = np.sqrt(cfg.head_dim / float(cfg.query_pre_attn_scalar))
        if ratio != 1.0:
            q = g.one("Mul", [q, self._const("q.rescale", np.array(ratio, np.float32))])
        return self._rotate(q, cos, sin), self._rotate(k, cos, sin)

    def attention_inputs(self, qkv: str, layer: Layer) -> AttentionInputs:
        """q, k, v split, q and k normed per head, rotated inside GroupQueryAttention with the layer's caches;
        its scale query_pre_attn_scalar ** -0.5."""
        g, cfg = self.g, self.gemma
        h, kv, d = cfg.n_heads, cfg.kv_heads, cfg.head_dim
        split = self._const("qkv.split", np.array([h * d, kv * d, kv * d], np.int64))
        q, k, v = g.op("Split", [qkv, split], outputs=3, axis=2)  # (B, T, HD), (B, T, KD), (B, T, KD)
        heads = self._const("heads.shape", np.array([0, 0, -1, d], np.int64))  # (B, T, H or K, D)
        merged = self._const("merge.shape", np.array([0, 0, -1], np.int64))
        q, k = (g.one("Reshape", [self._rms(g.one("Reshape", [t, heads]), weight), merged])
                for t, weight in ((q, layer.extra[0]), (k, layer.extra[1])))
        attrs = dict(do_rotary=1, rotary_interleaved=0, scale=float(cfg.query_pre_attn_scalar) ** -0.5)
        return AttentionInputs((q, k, v), self._rope(layer), attrs)

    def mlp(self, x: str, layer: Layer) -> Projected:
        """GeGLU, then the post-feedforward norm: (post_norm(down(gelu_tanh(gate x) * up x)), no bias)."""
        g = self.g
        gate_up, down = layer.mlp
        gate, up = g.op("Split", [g.one("MatMul", [x, gate_up.weight])], outputs=2, axis=-1, num_outputs=2)
        act = (g.one("FastGelu", [gate], domain=MS) if self.fused
               else g.one("Gelu", [gate], approximate="tanh"))  # (B, T, F)
        out, _ = project(g, g.one("Mul", [act, up]), down)
        return self._rms(out, layer.extra[2]), None
