"""The Llama family's cached form, the module gpt.pte runs (executorch/decoder.py lowers it): the book's
Llama3Model or Qwen3Model weights (shared, not copied) over a key/value cache per layer, as gpt2's CachedGPT.

The cache is one registered buffer per layer for keys and one for values, [1, K, C, D] (K key/value heads,
C = context_length), written in place by `index_copy_` (ExecuTorch's own LLM export's KVCache); every query
attends over the whole cache with the additive mask built from the positions (keys after the query, stale rows of
an earlier sequence included, get -1e30). Grouped-query attention without copying keys: query head j reads
key/value head j // G (G = H / K, the book's repeat_interleave), so the queries are viewed as K groups of G * T rows.

Every op is one XNNPACK or the allow-list takes: RMSNorm as the mean over axes 2, 3 of a (1, N, W, 1) view
(XNNPACK's mean takes only that form) with sqrt and divide; SiLU as x * sigmoid(x); the rotary rows of the (C, D / 2)
cos/sin tables (rope.py, the ONNX forms' own) looked up with `embedding` at the positions, as the token embedding.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mha_export.decoder.archs.llama.config import RotaryConfig
from mha_export.decoder.archs.llama.rope import rope_caches
from mha_export.executorch.lower import causal_mask

PTE_BATCH = 1  # pte_bounds' batch: the cache buffers are planned for one sequence


class RMSNorm3D(nn.Module):
    """An RMSNorm of the book's model (torch's `weight` or the book's `scale`, its `eps`) over the last axis of
    (1, N, W), in ops XNNPACK takes."""

    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        self.weight = norm.scale if hasattr(norm, "scale") else norm.weight
        self.eps = float(norm.eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (1, N, W)
        b, n, w = x.shape
        x4 = x.view(b, n, w, 1)
        mean = (x4 * x4).mean(dim=(2, 3), keepdim=True)  # (1, N, 1, 1)
        return (x4 / torch.sqrt(mean + self.eps)).view(b, n, w) * self.weight


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE of x (1, T, heads, D) with cos, sin (1, T, 1, D / 2)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class CachedBlock(nn.Module):
    """The book's TransformerBlock over a [1, K, C, D] cache per key/value, written at `positions`."""

    def __init__(self, block: nn.Module, cfg: RotaryConfig) -> None:
        super().__init__()
        att, ff = block.att, block.ff
        self.h, self.kv, self.d, self.c = cfg.n_heads, cfg.kv_heads, cfg.head_dim, cfg.context_length
        self.W_query, self.W_key, self.W_value, self.out_proj = att.W_query, att.W_key, att.W_value, att.out_proj
        self.q_norm = RMSNorm3D(att.q_norm) if cfg.qk_norm else None
        self.k_norm = RMSNorm3D(att.k_norm) if cfg.qk_norm else None
        self.fc1, self.fc2, self.fc3 = ff.fc1, ff.fc2, ff.fc3
        self.norm1, self.norm2 = RMSNorm3D(block.norm1), RMSNorm3D(block.norm2)
        shape = (PTE_BATCH, cfg.kv_heads, cfg.context_length, cfg.head_dim)
        self.register_buffer("k_cache", torch.zeros(shape), persistent=False)
        self.register_buffer("v_cache", torch.zeros(shape), persistent=False)

    def _heads(self, x: torch.Tensor, n: int, norm: RMSNorm3D | None) -> torch.Tensor:
        """(1, T, n * D) -> (1, T, n, D), each head's D normed where `norm` (Qwen3's q/k norm)."""
        b, t, _ = x.shape
        return (x if norm is None else norm(x.view(b, t * n, self.d))).view(b, t, n, self.d)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, cos: torch.Tensor,
                sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape  # (1, T, E)
        g = self.h // self.kv
        a = self.norm1(x)
        q = rotate(self._heads(self.W_query(a), self.h, self.q_norm), cos, sin).transpose(1, 2)  # (1, H, T, D)
        k = rotate(self._heads(self.W_key(a), self.kv, self.k_norm), cos, sin).transpose(1, 2)  # (1, K, T, D)
        v = self.W_value(a).view(b, t, self.kv, self.d).transpose(1, 2)  # (1, K, T, D)
        self.k_cache.index_copy_(2, positions, k)  # rows positions[0] .. positions[-1]
        self.v_cache.index_copy_(2, positions, v)
        keys = self.k_cache.view(self.kv, self.c, self.d)  # batch 1: rank-3 bmm, which XNNPACK takes
        values = self.v_cache.view(self.kv, self.c, self.d)
        scores = torch.bmm(q.reshape(self.kv, g * t, self.d), keys.transpose(1, 2)) * (self.d ** -0.5)  # (K, GT, C)
        weights = torch.softmax(scores.view(self.kv, g, t, self.c) + mask, dim=-1)  # (K, G, T, C)
        context = torch.bmm(weights.view(self.kv, g * t, self.c), values).view(self.kv, g, t, self.d)  # (K, G, T, D)
        x = x + self.out_proj(context.permute(2, 0, 1, 3).reshape(b, t, self.h * self.d))  # heads in order j = kG + r
        f = self.norm2(x)
        gate = self.fc1(f)
        return x + self.fc3(gate * torch.sigmoid(gate) * self.fc2(f))


class CachedLlama(nn.Module):
    """The book's Llama3Model / Qwen3Model weights (shared, not copied) with a cache per layer; eval only.
    forward(input_ids [1, T] int64, input_pos [1] int64) -> logits [1, V] of the last token (CachedGPT's)."""

    def __init__(self, model: nn.Module, cfg: RotaryConfig) -> None:
        super().__init__()
        self.tok_emb, self.out_head = model.tok_emb, model.out_head
        self.final_norm = RMSNorm3D(model.final_norm)
        self.blocks = nn.ModuleList(CachedBlock(b, cfg) for b in model.trf_blocks)
        cos, sin = rope_caches(cfg.head_dim, cfg.rope_base, cfg.context_length, getattr(cfg, "rope_freq", None))
        self.register_buffer("cos", torch.from_numpy(cos), persistent=False)  # (C, D / 2)
        self.register_buffer("sin", torch.from_numpy(sin), persistent=False)
        self.register_buffer("key_pos", torch.arange(cfg.context_length, dtype=torch.float32), persistent=False)

    def forward(self, input_ids: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        t = input_ids.shape[1]
        positions = input_pos + torch.arange(t, dtype=torch.int64)  # (T,)
        mask = causal_mask(self.key_pos, positions.to(torch.float32))  # (T, C)
        cos = F.embedding(positions, self.cos).view(1, t, 1, -1)  # (1, T, 1, D / 2)
        sin = F.embedding(positions, self.sin).view(1, t, 1, -1)
        x = self.tok_emb(input_ids)  # (1, T, E)
        for block in self.blocks:
            x = block(x, positions, mask, cos, sin)
        last = x[:, -1:]  # (1, 1, E): only the last token reaches the head
        return self.out_head(self.final_norm(last)).view(1, -1)  # (1, V)
