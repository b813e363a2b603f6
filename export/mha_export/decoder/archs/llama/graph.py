"""The Llama family's ONNX pieces (archs/protocol.py's Pieces) for both llama and qwen3 configs, which
decoder/graphs/ compose into both decoder forms.

Its block's weights (q|k|v fused, gate|up fused, no bias anywhere), the token embedding alone (positions are
rotary), RMSNorm, rotate-half RoPE on q and k per head (Qwen3: RMSNorm of each head's q and k first), and the
SwiGLU MLP: one MatMul (E, 2F) -> Split -> silu(gate) * up -> MatMul (down). SiLU is Sigmoid * x in both forms
(opset 20 has no SiLU op).

- Portable form (fused=False): standard ONNX at opset 20. RMSNorm decomposed (x / sqrt(mean(x^2) + eps) * weight:
  RMSNormalization is opset 23); RoPE gathers rows of the (C, D / 2) cos/sin caches by position_ids.
- In-place form (fused=True): SkipSimplifiedLayerNormalization (com.microsoft) for every residual + norm; the
  first block's first norm, which has no residual to fold, stays decomposed, because SimplifiedLayerNormalization
  is registered by ONNX Runtime in the ONNX domain, which onnx.checker (the export's check) refuses. The rotation
  happens inside GroupQueryAttention (do_rotary, the same caches, rotary_interleaved=0), from each row's own
  positions. Qwen3's q/k norms must come before the rotation: q, k, v are then split, normed per head and given
  as GroupQueryAttention's three inputs; without them q|k|v goes in packed.
Initializer names are stable and readable: h{i}.norm1.weight, h{i}.qkv.weight, h{i}.q_norm.weight, ...
"""
from __future__ import annotations

import numpy as np

from mha_export.decoder.archs.llama.config import RotaryConfig
from mha_export.decoder.archs.llama.rope import rope_caches
from mha_export.decoder.archs.protocol import AttentionInputs
from mha_export.decoder.graphs.shared import MS, TOKENS, Graph, Layer, Linear, Projected, project

QKV = ("W_query", "W_key", "W_value")
COS, SIN = "rope.cos", "rope.sin"  # (C, D / 2)


class LlamaPieces:
    """The Llama family's ops in graph `g` from the book's weights `w` (numpy, book keys); `fused`: the in-place
    form. The book's Llama3Model names a norm's parameter `weight` (torch's RMSNorm), its Qwen3Model `scale`."""

    def __init__(self, g: Graph, w: dict[str, np.ndarray], cfg: RotaryConfig, *, fused: bool) -> None:
        self.g, self.w, self.cfg, self.fused = g, w, cfg, fused
        self.param = "scale" if cfg.arch == "qwen3" else "weight"
        self._consts: dict[str, str] = {}
        self._angles: dict[str, tuple[str, str]] = {}  # position_ids -> its (B, 1, T, D / 2) cos and sin

    def _const(self, name: str, array: np.ndarray) -> str:
        """An initializer made once, however many times a piece asks for it."""
        if name not in self._consts:
            self._consts[name] = self.g.init(name, array)
        return self._consts[name]

    def add_weights(self) -> list[Layer]:
        """Every block's weights, matrices (in, out): q|k|v (E, (H + 2K) D), gate|up (E, 2F); the rotary caches."""
        g, w, cfg, p = self.g, self.w, self.cfg, self.param
        cos, sin = rope_caches(cfg.head_dim, cfg.rope_base, cfg.context_length, getattr(cfg, "rope_freq", None))
        g.init(COS, cos)
        g.init(SIN, sin)
        layers = []
        for i in range(cfg.n_layers):
            b = f"trf_blocks.{i}."
            norm1 = (g.init(f"h{i}.norm1.weight", w[f"{b}norm1.{p}"]),)
            qkv = g.init(f"h{i}.qkv.weight", np.concatenate([w[f"{b}att.{n}.weight"].T for n in QKV], axis=1))
            extra = ((g.init(f"h{i}.q_norm.weight", w[f"{b}att.q_norm.scale"]),
                      g.init(f"h{i}.k_norm.weight", w[f"{b}att.k_norm.scale"])) if cfg.qk_norm else ())
            out = Linear(g.init(f"h{i}.out.weight", w[f"{b}att.out_proj.weight"].T))  # (H D, E)
            norm2 = (g.init(f"h{i}.norm2.weight", w[f"{b}norm2.{p}"]),)
            gate_up = np.concatenate([w[f"{b}ff.fc1.weight"].T, w[f"{b}ff.fc2.weight"].T], axis=1)  # (E, 2F)
            mlp = (Linear(g.init(f"h{i}.gate_up.weight", gate_up)),
                   Linear(g.init(f"h{i}.down.weight", w[f"{b}ff.fc3.weight"].T)))  # (F, E)
            layers.append(Layer(norm1=norm1, qkv=Linear(qkv), out=out, norm2=norm2, mlp=mlp, extra=extra))
        return layers

    def embed(self, input_ids: str, positions: str) -> str:
        """tok_emb[input_ids]: (B, T, E); positions enter as rotations of q and k."""
        self.g.init(TOKENS, self.w["tok_emb.weight"])  # (V, E)
        return self.g.one("Gather", [TOKENS, input_ids])

    def _rms(self, x: str, weight: str) -> str:
        """x / sqrt(mean(x^2 over the last axis) + eps) * weight, for x of any rank (a block's (B, T, E), a
        head's (B, H, T, D))."""
        g = self.g
        eps = self._const("rms.eps", np.array(self.cfg.norm_eps, np.float32))
        last = self._const("rms.axes", np.array([-1], np.int64))
        mean = g.one("ReduceMean", [g.one("Mul", [x, x]), last], keepdims=1)
        return g.one("Mul", [g.one("Div", [x, g.one("Sqrt", [g.one("Add", [mean, eps])])]), weight])

    def norm(self, x: str, params: tuple[str, ...]) -> str:
        return self._rms(x, params[0])

    def skip_norm(self, x: str, skip: Projected, params: tuple[str, ...], *, summed: bool = True
                  ) -> tuple[str, str | None]:
        """RMSNorm(x + skip + bias) and x + skip + bias: SkipSimplifiedLayerNormalization's outputs 0 and 3 in
        the fused form, Add and the decomposed norm in the portable one."""
        out, bias = skip
        if not self.fused:
            total = self.g.one("Add", [x, out if bias is None else self.g.one("Add", [out, bias])])
            return self._rms(total, params[0]), total if summed else None
        got = self.g.op("SkipSimplifiedLayerNormalization", [x, out, *params, *([] if bias is None else [bias])],
                        outputs=4 if summed else 1, domain=MS, epsilon=self.cfg.norm_eps)
        return got[0], got[3] if summed else None

    def final_norm(self) -> tuple[str, ...]:
        return (self.g.init("final.weight", self.w[f"final_norm.{self.param}"]),)

    def _rotate(self, x: str, cos: str, sin: str) -> str:
        """Rotate-half RoPE of x (B, H, T, D): (x1 cos - x2 sin, x2 cos + x1 sin) of its halves."""
        g = self.g
        x1, x2 = g.op("Split", [x], outputs=2, axis=-1, num_outputs=2)  # (B, H, T, D / 2) each
        first = g.one("Sub", [g.one("Mul", [x1, cos]), g.one("Mul", [x2, sin])])
        second = g.one("Add", [g.one("Mul", [x2, cos]), g.one("Mul", [x1, sin])])
        return g.one("Concat", [first, second], axis=-1)

    def heads(self, q: str, k: str, layer: Layer, positions: str) -> tuple[str, str]:
        """q (B, H, T, D) and k (B, K, T, D): normed per head (Qwen3), then rotated by their positions."""
        g = self.g
        if self.cfg.qk_norm:
            q, k = self._rms(q, layer.extra[0]), self._rms(k, layer.extra[1])
        if positions not in self._angles:  # once per graph: (B, T) -> (B, 1, T, D / 2)
            axis = self._const("rope.axis", np.array([1], np.int64))
            self._angles[positions] = (g.one("Unsqueeze", [g.one("Gather", [COS, positions]), axis]),
                                       g.one("Unsqueeze", [g.one("Gather", [SIN, positions]), axis]))
        cos, sin = self._angles[positions]
        return self._rotate(q, cos, sin), self._rotate(k, cos, sin)

    def attention_inputs(self, qkv: str, layer: Layer) -> AttentionInputs:
        """Packed q|k|v, rotated inside GroupQueryAttention; Qwen3's q and k normed per head first (three inputs)."""
        rotary = dict(do_rotary=1, rotary_interleaved=0)
        if not self.cfg.qk_norm:
            return AttentionInputs((qkv, "", ""), (COS, SIN), rotary)
        g, cfg = self.g, self.cfg
        h, kv, d = cfg.n_heads, cfg.kv_heads, cfg.head_dim
        split = self._const("qkv.split", np.array([h * d, kv * d, kv * d], np.int64))
        q, k, v = g.op("Split", [qkv, split], outputs=3, axis=2)  # (B, T, HD), (B, T, KD), (B, T, KD)
        heads = self._const("heads.shape", np.array([0, 0, -1, d], np.int64))  # (B, T, H or K, D)
        merged = self._const("merge.shape", np.array([0, 0, -1], np.int64))
        q, k = (g.one("Reshape", [self._rms(g.one("Reshape", [t, heads]), weight), merged])
                for t, weight in ((q, layer.extra[0]), (k, layer.extra[1])))
        return AttentionInputs((q, k, v), (COS, SIN), rotary)

    def mlp(self, x: str, layer: Layer) -> Projected:
        """SwiGLU: down(silu(gate x) * up x), gate and up one (E, 2F) MatMul; no bias."""
        g = self.g
        gate_up, down = layer.mlp
        gate, up = g.op("Split", [g.one("MatMul", [x, gate_up.weight])], outputs=2, axis=-1, num_outputs=2)
        hidden = g.one("Mul", [g.one("Mul", [gate, g.one("Sigmoid", [gate])]), up])  # (B, T, F)
        return project(g, hidden, down)
