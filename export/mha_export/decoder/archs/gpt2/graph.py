"""GPT-2's ONNX pieces (archs/protocol.py's Pieces), which decoder/graphs/ compose into both decoder forms.

Its block's weights (q|k|v fused, every projection with its bias), token + learned position embeddings, LayerNorm
(eps 1e-5): LayerNormalization, fused with the residual as SkipLayerNormalization in the in-place form, and the MLP:
MatMul -> Gelu(tanh) -> MatMul, FastGelu (bias + tanh GELU in one op) in the in-place form. GPT-2 does nothing to q
and k per head. The initializers' names and their order are those gpt.onnx has always had (h{i}.ln1.scale, ...).
"""
from __future__ import annotations

import numpy as np

from mha_export.decoder.archs.gpt2 import QKV
from mha_export.decoder.archs.gpt2.config import LAYER_NORM_EPS, GPTConfig
from mha_export.decoder.archs.protocol import AttentionInputs
from mha_export.decoder.graphs.shared import MS, TOKENS, Graph, Layer, Linear, Projected, add_bias, project


class GPT2Pieces:
    """GPT-2's ops in graph `g` from the book's weights `w` (numpy, book keys); `fused`: the in-place form."""

    def __init__(self, g: Graph, w: dict[str, np.ndarray], cfg: GPTConfig, *, fused: bool) -> None:
        self.g, self.w, self.cfg, self.fused = g, w, cfg, fused

    def add_weights(self) -> list[Layer]:
        """Every block's weights: q|k|v fused on the output axis (all q heads, all k, all v), matrices (in, out)."""
        g, w = self.g, self.w
        layers = []
        for i in range(self.cfg.n_layers):
            p = f"trf_blocks.{i}."
            qkv = np.concatenate([w[f"{p}att.{n}.weight"].T for n in QKV], axis=1)  # (E, 3E)
            bias = (g.init(f"h{i}.qkv.bias", np.concatenate([w[f"{p}att.{n}.bias"] for n in QKV]))
                    if self.cfg.qkv_bias else None)
            norm1 = (g.init(f"h{i}.ln1.scale", w[f"{p}norm1.scale"]), g.init(f"h{i}.ln1.shift", w[f"{p}norm1.shift"]))
            qkv_weight = g.init(f"h{i}.qkv.weight", qkv)
            out = Linear(g.init(f"h{i}.out.weight", w[f"{p}att.out_proj.weight"].T),
                         g.init(f"h{i}.out.bias", w[f"{p}att.out_proj.bias"]))
            norm2 = (g.init(f"h{i}.ln2.scale", w[f"{p}norm2.scale"]), g.init(f"h{i}.ln2.shift", w[f"{p}norm2.shift"]))
            fc = Linear(g.init(f"h{i}.fc.weight", w[f"{p}ff.layers.0.weight"].T),
                        g.init(f"h{i}.fc.bias", w[f"{p}ff.layers.0.bias"]))
            proj = Linear(g.init(f"h{i}.proj.weight", w[f"{p}ff.layers.2.weight"].T),
                          g.init(f"h{i}.proj.bias", w[f"{p}ff.layers.2.bias"]))
            layers.append(Layer(norm1=norm1, qkv=Linear(qkv_weight, bias), out=out, norm2=norm2, mlp=(fc, proj)))
        return layers

    def embed(self, input_ids: str, positions: str) -> str:
        """tok_emb[input_ids] + pos_emb[positions]: (B, T, E)."""
        g = self.g
        g.init(TOKENS, self.w["tok_emb.weight"])  # (V, E)
        g.init("pos_emb", self.w["pos_emb.weight"])  # (C, E)
        return g.one("Add", [g.one("Gather", [TOKENS, input_ids]), g.one("Gather", ["pos_emb", positions])])

    def norm(self, x: str, params: tuple[str, ...]) -> str:
        return self.g.one("LayerNormalization", [x, *params], axis=-1, epsilon=LAYER_NORM_EPS)

    def skip_norm(self, x: str, skip: Projected, params: tuple[str, ...], *, summed: bool = True
                  ) -> tuple[str, str | None]:
        """LN(x + skip + bias) and x + skip + bias (outputs 0 and 3 of SkipLayerNormalization)."""
        out, bias = skip
        got = self.g.op("SkipLayerNormalization", [x, out, *params, *([] if bias is None else [bias])],
                        outputs=4 if summed else 1, domain=MS, epsilon=LAYER_NORM_EPS)
        return got[0], got[3] if summed else None

    def final_norm(self) -> tuple[str, ...]:
        return (self.g.init("final.scale", self.w["final_norm.scale"]),
                self.g.init("final.shift", self.w["final_norm.shift"]))

    def heads(self, q: str, k: str, layer: Layer, positions: str) -> tuple[str, str]:
        return q, k  # learned positions were added to the embedding; nothing per head

    def attention_inputs(self, qkv: str, layer: Layer) -> AttentionInputs:
        return AttentionInputs((qkv, "", ""))  # packed q|k|v, no rotary

    def mlp(self, x: str, layer: Layer) -> Projected:
        """fc -> tanh GELU -> proj, proj's bias left to the caller: (B, T, 4E) in between."""
        fc, proj = layer.mlp
        if self.fused:
            f = self.g.one("FastGelu", [self.g.one("MatMul", [x, fc.weight]), *([] if fc.bias is None else [fc.bias])],
                           domain=MS)
        else:
            f = self.g.one("Gelu", [add_bias(self.g, project(self.g, x, fc))], approximate="tanh")
        return project(self.g, f, proj)
