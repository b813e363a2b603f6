"""The Llama family's eager reference: the book's Llama3Model and Qwen3Model (llms_from_scratch.llama3, .qwen3)
rebuilt module for module, so their state_dict keys are the book's and the export needs no package of the book's
(it declares tensorflow and jupyterlab; the tests hold this rebuild to the book's own models and to transformers').

Computed in float32 whatever the config's `dtype` says (informational: the book's configs name bfloat16 for
memory). What the book hard-codes is the config's here: the RMSNorm epsilon (the book's 1e-5 for Llama 3, 1e-6 for
Qwen3; a Hugging Face or GGUF config says its own). The rotary tables are rope.py's, which the ONNX forms and
gpt.pte read too.
"""
from __future__ import annotations

import torch
from torch import nn

from mha_export.decoder.archs.llama.config import RotaryConfig
from mha_export.decoder.archs.llama.rope import rope_caches


class ScaleNorm(nn.Module):
    """Qwen3Model's RMSNorm: a `scale` parameter, computed in float32."""

    def __init__(self, width: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.scale = nn.Parameter(torch.ones(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps) * self.scale


def _norm(cfg: RotaryConfig, width: int) -> nn.Module:
    """Llama3Model's torch.nn.RMSNorm (`weight`) or Qwen3Model's (`scale`)."""
    return ScaleNorm(width, cfg.norm_eps) if cfg.arch == "qwen3" else nn.RMSNorm(width, eps=cfg.norm_eps)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE of x (B, heads, T, D) with cos, sin (T, D / 2)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class GroupedQueryAttention(nn.Module):
    def __init__(self, cfg: RotaryConfig) -> None:
        super().__init__()
        e, self.h, self.kv, self.d = cfg.emb_dim, cfg.n_heads, cfg.kv_heads, cfg.head_dim
        self.W_query = nn.Linear(e, self.h * self.d, bias=False)
        self.W_key = nn.Linear(e, self.kv * self.d, bias=False)
        self.W_value = nn.Linear(e, self.kv * self.d, bias=False)
        self.out_proj = nn.Linear(self.h * self.d, e, bias=False)
        if cfg.qk_norm:
            self.q_norm, self.k_norm = ScaleNorm(self.d, cfg.norm_eps), ScaleNorm(self.d, cfg.norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape  # (B, T, E)
        q = self.W_query(x).view(b, t, self.h, self.d).transpose(1, 2)  # (B, H, T, D)
        k = self.W_key(x).view(b, t, self.kv, self.d).transpose(1, 2)  # (B, K, T, D)
        v = self.W_value(x).view(b, t, self.kv, self.d).transpose(1, 2)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        group = self.h // self.kv  # query head j reads key/value head j // group (the book's repeat_interleave)
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # (B, H, T, D)
        scores = q @ k.transpose(2, 3) / self.d ** 0.5  # (B, H, T, T)
        causal = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
        weights = torch.softmax(scores.masked_fill(causal, -torch.inf), dim=-1)
        return self.out_proj((weights @ v).transpose(1, 2).reshape(b, t, self.h * self.d))


class FeedForward(nn.Module):
    """SwiGLU: fc3(silu(fc1 x) * fc2 x)."""

    def __init__(self, cfg: RotaryConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(cfg.emb_dim, cfg.hidden_dim, bias=False)
        self.fc2 = nn.Linear(cfg.emb_dim, cfg.hidden_dim, bias=False)
        self.fc3 = nn.Linear(cfg.hidden_dim, cfg.emb_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(nn.functional.silu(self.fc1(x)) * self.fc2(x))


class TransformerBlock(nn.Module):
    def __init__(self, cfg: RotaryConfig) -> None:
        super().__init__()
        self.att, self.ff = GroupedQueryAttention(cfg), FeedForward(cfg)
        self.norm1, self.norm2 = _norm(cfg, cfg.emb_dim), _norm(cfg, cfg.emb_dim)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.att(self.norm1(x), cos, sin)
        return x + self.ff(self.norm2(x))


class RotaryModel(nn.Module):
    """The book's Llama3Model / Qwen3Model: forward(in_idx (B, T) int64) -> logits (B, T, V)."""

    def __init__(self, cfg: RotaryConfig) -> None:
        super().__init__()
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.emb_dim)
        self.trf_blocks = nn.ModuleList(TransformerBlock(cfg) for _ in range(cfg.n_layers))
        self.final_norm = _norm(cfg, cfg.emb_dim)
        self.out_head = nn.Linear(cfg.emb_dim, cfg.vocab_size, bias=False)
        cos, sin = rope_caches(cfg.head_dim, cfg.rope_base, cfg.context_length, getattr(cfg, "rope_freq", None))
        self.register_buffer("cos", torch.from_numpy(cos), persistent=False)  # (C, D / 2)
        self.register_buffer("sin", torch.from_numpy(sin), persistent=False)

    def forward(self, in_idx: torch.Tensor) -> torch.Tensor:
        t = in_idx.shape[1]
        x = self.tok_emb(in_idx)  # (B, T, E)
        for block in self.trf_blocks:
            x = block(x, self.cos[:t], self.sin[:t])
        return self.out_head(self.final_norm(x))


def eager(cfg: RotaryConfig) -> nn.Module:
    """The model for `cfg`, initialised by the global torch seed (the caller seeds it)."""
    return RotaryModel(cfg)
