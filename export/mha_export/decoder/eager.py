"""The book's GPTModel (chapter 4), module for module, as the export's eager reference.

The modules are built in the book's order with the book's types and attribute names, so that
`torch.manual_seed(123)` gives the same weights as the book's `GPTModel(cfg)` and the state_dict keys are the
book's (the canonical weight format of this package; Hugging Face GPT-2 is mapped onto it). The tests compare
the artifacts with the book's own package and with transformers, never with this module alone.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from mha_runtime.decoder.config import LAYER_NORM_EPS, GPTConfig

SEED = 123


class LayerNorm(nn.Module):
    def __init__(self, emb_dim: int) -> None:
        super().__init__()
        self.eps = LAYER_NORM_EPS
        self.scale = nn.Parameter(torch.ones(emb_dim))
        self.shift = nn.Parameter(torch.zeros(emb_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = x.mean(dim=-1, keepdim=True)
        var = x.var(dim=-1, keepdim=True, unbiased=False)
        return self.scale * (x - mean) / torch.sqrt(var + self.eps) + self.shift


class GELU(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:  # the tanh approximation (GPT-2's gelu_new)
        return 0.5 * x * (1 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3))))


class FeedForward(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(cfg.emb_dim, 4 * cfg.emb_dim), GELU(),
                                    nn.Linear(4 * cfg.emb_dim, cfg.emb_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class MultiHeadAttention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        e = cfg.emb_dim
        self.num_heads, self.head_dim = cfg.n_heads, cfg.head_dim
        self.W_query = nn.Linear(e, e, bias=cfg.qkv_bias)
        self.W_key = nn.Linear(e, e, bias=cfg.qkv_bias)
        self.W_value = nn.Linear(e, e, bias=cfg.qkv_bias)
        self.out_proj = nn.Linear(e, e)
        self.dropout = nn.Dropout(cfg.drop_rate)
        self.register_buffer("mask", torch.triu(torch.ones(cfg.context_length, cfg.context_length), diagonal=1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, e = x.shape  # (B, T, E)
        q, k, v = (w(x).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)  # (B, H, T, D)
                   for w in (self.W_query, self.W_key, self.W_value))
        scores = q @ k.transpose(2, 3)  # (B, H, T, T)
        scores = scores.masked_fill(self.mask.bool()[:t, :t], -torch.inf)
        weights = torch.softmax(scores / self.head_dim ** 0.5, dim=-1)
        context = (weights @ v).transpose(1, 2).reshape(b, t, e)  # (B, T, E)
        return self.out_proj(context)


class TransformerBlock(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.att = MultiHeadAttention(cfg)
        self.ff = FeedForward(cfg)
        self.norm1 = LayerNorm(cfg.emb_dim)
        self.norm2 = LayerNorm(cfg.emb_dim)
        self.drop_resid = nn.Dropout(cfg.drop_rate)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_resid(self.att(self.norm1(x)))
        return x + self.drop_resid(self.ff(self.norm2(x)))


class GPTModel(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.emb_dim)
        self.pos_emb = nn.Embedding(cfg.context_length, cfg.emb_dim)
        self.drop_emb = nn.Dropout(cfg.drop_rate)
        self.trf_blocks = nn.Sequential(*[TransformerBlock(cfg) for _ in range(cfg.n_layers)])
        self.final_norm = LayerNorm(cfg.emb_dim)
        self.out_head = nn.Linear(cfg.emb_dim, cfg.vocab_size, bias=False)

    def forward(self, in_idx: torch.Tensor) -> torch.Tensor:
        """in_idx (B, T) int64 -> logits (B, T, V)."""
        positions = torch.arange(in_idx.shape[1], device=in_idx.device)
        x = self.drop_emb(self.tok_emb(in_idx) + self.pos_emb(positions))  # (B, T, E)
        return self.out_head(self.final_norm(self.trf_blocks(x)))


def seeded_gpt(cfg: GPTConfig) -> GPTModel:
    """The book's initialisation: torch.manual_seed(123), then GPTModel(cfg). In eval mode."""
    torch.manual_seed(SEED)
    return GPTModel(cfg).eval()


def eager_at(model: GPTModel, ids: list[list[int]], positions: list[int]) -> np.ndarray:
    """(B, len(positions), V): row by row, keeping only the positions compared (at context_length 1024 and
    GPT-2's vocabulary a whole batch's logits would be 617 MB)."""
    with torch.no_grad():
        return np.stack([model(torch.tensor([row], dtype=torch.int64))[0, positions].numpy() for row in ids])
