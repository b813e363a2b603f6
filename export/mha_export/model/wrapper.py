"""The chapter 3 causal attention, faithful to the tutorial: same arguments, names and math."""
from __future__ import annotations

import torch
import torch.nn as nn

from mha_runtime.attention.config import MHAConfig


class CausalAttention(nn.Module):
    """One causal self-attention head (LLMs-from-scratch, chapter 3)."""

    def __init__(self, d_in: int, d_out: int, context_length: int, dropout: float, qkv_bias: bool = False) -> None:
        super().__init__()
        self.d_out = d_out
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.dropout = nn.Dropout(dropout)
        # (context_length, context_length): 1 above the diagonal marks a future token
        self.register_buffer("mask", torch.triu(torch.ones(context_length, context_length), diagonal=1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _, num_tokens, _ = x.shape  # (B, T, d_in)
        keys = self.W_key(x)  # (B, T, d_out)
        queries = self.W_query(x)  # (B, T, d_out)
        values = self.W_value(x)  # (B, T, d_out)
        attn_scores = queries @ keys.transpose(1, 2)  # (B, T, T)
        attn_scores.masked_fill_(self.mask.bool()[:num_tokens, :num_tokens], -torch.inf)
        attn_weights = torch.softmax(attn_scores / keys.shape[-1] ** 0.5, dim=-1)  # (B, T, T)
        attn_weights = self.dropout(attn_weights)
        context_vec = attn_weights @ values  # (B, T, d_out)
        return context_vec


class MultiHeadAttentionWrapper(nn.Module):
    """num_heads CausalAttention heads, outputs concatenated on the last axis; with `out_proj`, followed by
    one Linear(num_heads * d_out, num_heads * d_out) as the book's MultiHeadAttention and GPT-2 have."""

    def __init__(self, d_in: int, d_out: int, context_length: int, dropout: float, num_heads: int,
                 qkv_bias: bool = False, out_proj: bool = False) -> None:
        super().__init__()
        self.heads = nn.ModuleList(
            [CausalAttention(d_in, d_out, context_length, dropout, qkv_bias) for _ in range(num_heads)]
        )
        self.out_proj = nn.Linear(num_heads * d_out, num_heads * d_out) if out_proj else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        context = torch.cat([head(x) for head in self.heads], dim=-1)  # (B, T, num_heads * d_out)
        return context if self.out_proj is None else self.out_proj(context)  # (B, T, num_heads * d_out)


def build_wrapper(config: MHAConfig) -> MultiHeadAttentionWrapper:
    """A wrapper shaped by `config` (weights from the current torch RNG state)."""
    return MultiHeadAttentionWrapper(config.d_in, config.d_out, config.context_length, config.dropout,
                                     config.num_heads, qkv_bias=config.qkv_bias, out_proj=config.out_proj)
