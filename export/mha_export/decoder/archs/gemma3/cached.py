"""Gemma 3's cached form, the module gpt.pte runs (executorch/decoder.py lowers it): the book's Gemma3Model weights
(shared, not copied) over a key/value cache per layer, as llama/cached.py's CachedLlama.

The cache is one registered buffer per layer for keys and one for values, [1, K, C, D], written in place by
`index_copy_` at the positions; every query attends over the whole cache with an additive mask built from the
positions: keys after the query get NEG (stale rows of an earlier sequence included), and on local layers also keys
`sliding_window` or more positions before it (the window kept by the mask: the cache holds every position, so one
buffer plan serves both kinds of layer).

Every op is one XNNPACK or the allow-list takes (CachedLlama's): RMSNorm as the mean over axes 2, 3 of a
(1, N, W, 1) view, times (1 + scale); the tanh GELU with x**3 as x * x * x (gpt2/model.py's gelu); the two rotary
tables (local and global base) looked up with `embedding` at the positions.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mha_export.decoder.archs.gemma3.config import Gemma3Config
from mha_export.decoder.archs.gpt2.model import gelu
from mha_export.decoder.archs.llama.cached import PTE_BATCH, rotate
from mha_export.decoder.archs.llama.rope import rope_caches
from mha_export.executorch.lower import NEG, causal_mask


class GemmaNorm3D(nn.Module):
    """A Gemma RMSNorm of the book's model (its zero-centred `scale`, its `eps`) over the last axis of (1, N, W)."""

    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        self.scale, self.eps = norm.scale, float(norm.eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (1, N, W)
        b, n, w = x.shape
        x4 = x.view(b, n, w, 1)
        mean = (x4 * x4).mean(dim=(2, 3), keepdim=True)  # (1, N, 1, 1)
        return (x4 / torch.sqrt(mean + self.eps)).view(b, n, w) * (1.0 + self.scale)


class CachedBlock(nn.Module):
    """The book's TransformerBlock over a [1, K, C, D] cache per key/value, written at `positions`."""

    def __init__(self, block: nn.Module, cfg: Gemma3Config) -> None:
        super().__init__()
        att, ff = block.att, block.ff
        self.local = block.local
        self.h, self.kv, self.d, self.c = cfg.n_heads, cfg.kv_heads, cfg.head_dim, cfg.context_length
        self.scaling = att.scaling
        self.W_query, self.W_key, self.W_value, self.out_proj = att.W_query, att.W_key, att.W_value, att.out_proj
        self.q_norm, self.k_norm = GemmaNorm3D(att.q_norm), GemmaNorm3D(att.k_norm)
        self.fc1, self.fc2, self.fc3 = ff.fc1, ff.fc2, ff.fc3
        self.norm_in, self.norm_attn = GemmaNorm3D(block.input_layernorm), GemmaNorm3D(block.post_attention_layernorm)
        self.norm_ff, self.norm_out = (GemmaNorm3D(block.pre_feedforward_layernorm),
                                       GemmaNorm3D(block.post_feedforward_layernorm))
        shape = (PTE_BATCH, cfg.kv_heads, cfg.context_length, cfg.head_dim)
        self.register_buffer("k_cache", torch.zeros(shape), persistent=False)
        self.register_buffer("v_cache", torch.zeros(shape), persistent=False)

    def _heads(self, x: torch.Tensor, n: int, norm: GemmaNorm3D) -> torch.Tensor:
        """(1, T, n * D) -> (1, T, n, D), each head's D normed."""
        b, t, _ = x.shape
        return norm(x.view(b, t * n, self.d)).view(b, t, n, self.d)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, cos: torch.Tensor,
                sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape  # (1, T, E)
        g = self.h // self.kv
        a = self.norm_in(x)
        q = rotate(self._heads(self.W_query(a), self.h, self.q_norm), cos, sin).transpose(1, 2)  # (1, H, T, D)
        k = rotate(self._heads(self.W_key(a), self.kv, self.k_norm), cos, sin).transpose(1, 2)  # (1, K, T, D)
        v = self.W_value(a).view(b, t, self.kv, self.d).transpose(1, 2)  # (1, K, T, D)
        self.k_cache.index_copy_(2, positions, k)
        self.v_cache.index_copy_(2, positions, v)
        keys = self.k_cache.view(self.kv, self.c, self.d)  # batch 1: rank-3 bmm, which XNNPACK takes
        values = self.v_cache.view(self.kv, self.c, self.d)
        queries = q.reshape(self.kv, g * t, self.d) * self.scaling
        scores = torch.bmm(queries, keys.transpose(1, 2))  # (K, GT, C)
        weights = torch.softmax(scores.view(self.kv, g, t, self.c) + mask, dim=-1)  # (K, G, T, C)
        context = torch.bmm(weights.view(self.kv, g * t, self.c), values).view(self.kv, g, t, self.d)
        attended = self.out_proj(context.permute(2, 0, 1, 3).reshape(b, t, self.h * self.d))  # heads j = kG + r
        x = x + self.norm_attn(attended)
        f = self.norm_ff(x)
        return x + self.norm_out(self.fc3(gelu(self.fc1(f)) * self.fc2(f)))


class CachedGemma3(nn.Module):
    """The book's Gemma3Model weights (shared, not copied) with a cache per layer; eval only.
    forward(input_ids [1, T] int64, input_pos [1] int64) -> logits [1, V] of the last token (CachedLlama's)."""

    def __init__(self, model: nn.Module, cfg: Gemma3Config) -> None:
        super().__init__()
        self.tok_emb, self.out_head = model.tok_emb, model.out_head
        self.final_norm = GemmaNorm3D(model.final_norm)
        self.blocks = nn.ModuleList(CachedBlock(b, cfg) for b in model.blocks)
        self.embed_scale = float(cfg.emb_dim) ** 0.5
        self.window = float(cfg.sliding_window)
        for kind, base in (("local", cfg.rope_local_base), ("global", cfg.rope_base)):
            cos, sin = rope_caches(cfg.head_dim, float(base), cfg.context_length)
            self.register_buffer(f"cos_{kind}", torch.from_numpy(cos), persistent=False)  # (C, D / 2)
            self.register_buffer(f"sin_{kind}", torch.from_numpy(sin), persistent=False)
        self.register_buffer("key_pos", torch.arange(cfg.context_length, dtype=torch.float32), persistent=False)

    def forward(self, input_ids: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        t = input_ids.shape[1]
        positions = input_pos + torch.arange(t, dtype=torch.int64)  # (T,)
        queries = positions.to(torch.float32)
        full = causal_mask(self.key_pos, queries)  # (T, C)
        # local: also NEG where query - key >= window (the clamp is 0 or 1 on integer positions)
        local = full + torch.clamp(queries.unsqueeze(-1) - self.key_pos - (self.window - 1.0), 0.0, 1.0) * NEG
        tables = {}
        for kind in ("local", "global"):
            cos = F.embedding(positions, getattr(self, f"cos_{kind}")).view(1, t, 1, -1)  # (1, T, 1, D / 2)
            sin = F.embedding(positions, getattr(self, f"sin_{kind}")).view(1, t, 1, -1)
            tables[kind] = (cos, sin)
        x = self.tok_emb(input_ids) * self.embed_scale  # (1, T, E)
        for block in self.blocks:
            mask, (cos, sin) = (local, tables["local"]) if block.local else (full, tables["global"])
            x = block(x, positions, mask, cos, sin)
        last = x[:, -1:]  # (1, 1, E): only the last token reaches the head
        return self.out_head(self.final_norm(last)).view(1, -1)  # (1, V)
