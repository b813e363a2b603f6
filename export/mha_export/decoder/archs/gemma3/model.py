"""Gemma 3's eager reference: the book's Gemma3Model (ch05/12_gemma3, a notebook, in no package) rebuilt module for
module, so its state_dict keys are the book's; the tests hold it to transformers' Gemma3ForCausalLM.

What the book computes: the token embedding times sqrt(emb_dim) (the factor in the weights' dtype, as transformers'
Gemma3TextScaledWordEmbedding); every RMSNorm multiplies by (1 + scale) in float32; each block norms before and
after attention and before and after the feed-forward, each residual added after the post-norm; q and k are
RMSNormed per head, then rotated (rotate-half) with their layer's base (rope_local_base on local layers, rope_base
on global ones), then the queries scaled by query_pre_attn_scalar ** -0.5; local layers see the last
sliding_window positions (the query's own included), global layers every earlier one; GeGLU with tanh GELU.

Computed in float32 whatever the config's `dtype` says. What the book hard-codes is the config's here: the RMSNorm
epsilon (1e-6 in the book, q/k norms included). The rotary tables are the Llama family's (llama/rope.py: float64
angles stored as float32), which the ONNX forms read too.
"""
from __future__ import annotations

import torch
from torch import nn

from mha_export.decoder.archs.gemma3.config import Gemma3Config
from mha_export.decoder.archs.gemma3.keys import NORMS
from mha_export.decoder.archs.llama.model import rotate
from mha_export.decoder.archs.llama.rope import rope_caches


class RMSNorm(nn.Module):
    """The book's Gemma RMSNorm: zero-centred `scale`, x / rms(x) * (1 + scale), computed in float32."""

    def __init__(self, width: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.scale = nn.Parameter(torch.zeros(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return (normed * (1.0 + self.scale.float())).to(x.dtype)


def masks(t: int, window: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(global, local) boolean masks (T, T), True where masked: the future (j > i); local also the far past
    (i - j >= window)."""
    ones = torch.ones(t, t, dtype=torch.bool)
    future = torch.triu(ones, diagonal=1)
    far_past = torch.triu(ones, diagonal=window).T
    return future, future | far_past


class GroupedQueryAttention(nn.Module):
    def __init__(self, cfg: Gemma3Config) -> None:
        super().__init__()
        e, self.h, self.kv, self.d = cfg.emb_dim, cfg.n_heads, cfg.kv_heads, cfg.head_dim
        self.W_query = nn.Linear(e, self.h * self.d, bias=False)
        self.W_key = nn.Linear(e, self.kv * self.d, bias=False)
        self.W_value = nn.Linear(e, self.kv * self.d, bias=False)
        self.out_proj = nn.Linear(self.h * self.d, e, bias=False)
        self.q_norm, self.k_norm = RMSNorm(self.d, cfg.norm_eps), RMSNorm(self.d, cfg.norm_eps)
        self.scaling = float(cfg.query_pre_attn_scalar) ** -0.5

    def forward(self, x: torch.Tensor, mask: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape  # (B, T, E)
        q = self.W_query(x).view(b, t, self.h, self.d).transpose(1, 2)  # (B, H, T, D)
        k = self.W_key(x).view(b, t, self.kv, self.d).transpose(1, 2)  # (B, K, T, D)
        v = self.W_value(x).view(b, t, self.kv, self.d).transpose(1, 2)
        q, k = rotate(self.q_norm(q), cos, sin), rotate(self.k_norm(k), cos, sin)
        group = self.h // self.kv  # query head j reads key/value head j // group (the book's repeat_interleave)
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # (B, H, T, D)
        scores = (q * self.scaling) @ k.transpose(2, 3)  # (B, H, T, T)
        weights = torch.softmax(scores.masked_fill(mask, -torch.inf), dim=-1)
        return self.out_proj((weights @ v).transpose(1, 2).reshape(b, t, self.h * self.d))


class FeedForward(nn.Module):
    """GeGLU: fc3(gelu_tanh(fc1 x) * fc2 x)."""

    def __init__(self, cfg: Gemma3Config) -> None:
        super().__init__()
        self.fc1 = nn.Linear(cfg.emb_dim, cfg.hidden_dim, bias=False)
        self.fc2 = nn.Linear(cfg.emb_dim, cfg.hidden_dim, bias=False)
        self.fc3 = nn.Linear(cfg.hidden_dim, cfg.emb_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(nn.functional.gelu(self.fc1(x), approximate="tanh") * self.fc2(x))


class TransformerBlock(nn.Module):
    def __init__(self, cfg: Gemma3Config, layer: int) -> None:
        super().__init__()
        self.local = cfg.is_local(layer)
        self.att, self.ff = GroupedQueryAttention(cfg), FeedForward(cfg)
        for name in NORMS:  # input_layernorm, post_attention_layernorm, pre_/post_feedforward_layernorm
            setattr(self, name, RMSNorm(cfg.emb_dim, cfg.norm_eps))

    def forward(self, x: torch.Tensor, mask: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.post_attention_layernorm(self.att(self.input_layernorm(x), mask, cos, sin))
        return x + self.post_feedforward_layernorm(self.ff(self.pre_feedforward_layernorm(x)))


class Gemma3Model(nn.Module):
    """The book's Gemma3Model: forward(in_idx (B, T) int64) -> logits (B, T, V)."""

    def __init__(self, cfg: Gemma3Config) -> None:
        super().__init__()
        self.emb_dim, self.window = cfg.emb_dim, cfg.sliding_window
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.emb_dim)
        self.blocks = nn.ModuleList(TransformerBlock(cfg, i) for i in range(cfg.n_layers))
        self.final_norm = RMSNorm(cfg.emb_dim, cfg.norm_eps)
        self.out_head = nn.Linear(cfg.emb_dim, cfg.vocab_size, bias=False)
        for kind, base in (("local", cfg.rope_local_base), ("global", cfg.rope_base)):
            cos, sin = rope_caches(cfg.head_dim, float(base), cfg.context_length)
            self.register_buffer(f"cos_{kind}", torch.from_numpy(cos), persistent=False)  # (C, D / 2)
            self.register_buffer(f"sin_{kind}", torch.from_numpy(sin), persistent=False)

    def forward(self, in_idx: torch.Tensor) -> torch.Tensor:
        t = in_idx.shape[1]
        table = self.tok_emb.weight
        x = self.tok_emb(in_idx) * torch.tensor(self.emb_dim ** 0.5, dtype=table.dtype)  # (B, T, E)
        mask_global, mask_local = masks(t, self.window)
        local = (mask_local, self.cos_local[:t], self.sin_local[:t])
        full = (mask_global, self.cos_global[:t], self.sin_global[:t])
        for block in self.blocks:
            x = block(x, *(local if block.local else full))
        return self.out_head(self.final_norm(x))


def eager(cfg: Gemma3Config) -> nn.Module:
    """The model for `cfg`, initialised by the global torch seed (the caller seeds it). The norms start at zero
    (a (1 + 0) identity), as the book's do."""
    return Gemma3Model(cfg)
