"""GPT-2 in torch: the book's GPTModel (chapter 4) rebuilt module for module, the export's eager reference, and
its cached form, the module gpt.pte runs (executorch/decoder.py lowers it).

The modules are built in the book's order with the book's types and attribute names, so that
`torch.manual_seed(123)` gives the same weights as the book's `GPTModel(cfg)` and the state_dict keys are the
book's (the canonical weight format of this package; Hugging Face GPT-2 is mapped onto it). The tests compare
the artifacts with the book's own package and with transformers, never with this module alone.

The cached form keeps one registered buffer per layer for keys and one for values, [1, H, C, D] (batch 1, C =
context_length), written in place by `index_copy_` as ExecuTorch's own LLM export does (examples/models/llama
KVCache with enable_dynamic_shape): torch.export records them as mutated buffers, planned once in the program's
memory. Every query attends over the whole cache with an additive mask built from the positions (keys after the
query, stale rows of an earlier generation included, get -1e30, so exp gives exactly 0). The attention is plain
Linear / matmul / softmax, which XNNPACK takes.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from mha_export.decoder.archs.gpt2.config import LAYER_NORM_EPS, GPTConfig
from mha_export.executorch.lower import causal_mask

PTE_BATCH = 1  # pte_bounds' batch: the cache buffers are planned for one sequence


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



class LayerNorm4D(nn.Module):
    """The book's LayerNorm (population variance, eps 1e-5) in ops XNNPACK takes: the mean over the last axis as
    a mean over axes 2, 3 of a (1, T, E, 1) view (XNNPACK's global average pooling takes only that form)."""

    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        self.scale, self.shift, self.eps = norm.scale, norm.shift, norm.eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (1, T, E)
        b, t, e = x.shape
        x4 = x.view(b, t, e, 1)
        centred = x4 - x4.mean(dim=(2, 3), keepdim=True)
        var = (centred * centred).mean(dim=(2, 3), keepdim=True)
        return self.scale * (centred / torch.sqrt(var + self.eps)).view(b, t, e) + self.shift


def gelu(x: torch.Tensor) -> torch.Tensor:
    """The book's tanh GELU with x**3 as x * x * x (XNNPACK's pow takes only the power 2)."""
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * (x * x * x))))


class CachedBlock(nn.Module):
    """The book's TransformerBlock over a [1, H, C, D] cache per key/value, written at `positions`."""

    def __init__(self, block: nn.Module, cfg: GPTConfig) -> None:
        super().__init__()
        att, ff = block.att, block.ff.layers
        self.h, self.d, self.e, self.c = cfg.n_heads, cfg.head_dim, cfg.emb_dim, cfg.context_length
        self.W_query, self.W_key, self.W_value, self.out_proj = att.W_query, att.W_key, att.W_value, att.out_proj
        self.fc, self.proj = ff[0], ff[2]
        self.norm1, self.norm2 = LayerNorm4D(block.norm1), LayerNorm4D(block.norm2)
        shape = (PTE_BATCH, cfg.n_heads, cfg.context_length, cfg.head_dim)
        self.register_buffer("k_cache", torch.zeros(shape), persistent=False)
        self.register_buffer("v_cache", torch.zeros(shape), persistent=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape  # (1, T, E)
        a = self.norm1(x)
        q, k, v = (w(a).view(b, t, self.h, self.d).transpose(1, 2) for w in (self.W_query, self.W_key, self.W_value))
        self.k_cache.index_copy_(2, positions, k)  # (1, H, C, D): rows positions[0] .. positions[-1]
        self.v_cache.index_copy_(2, positions, v)
        keys = self.k_cache.view(self.h, self.c, self.d)  # batch 1: rank-3 bmm, which XNNPACK takes
        values = self.v_cache.view(self.h, self.c, self.d)
        scores = torch.bmm(q.reshape(self.h, t, self.d), keys.transpose(1, 2)) * (self.d ** -0.5) + mask  # (H, T, C)
        context = torch.bmm(torch.softmax(scores, dim=-1), values)  # (H, T, D)
        x = x + self.out_proj(context.transpose(0, 1).reshape(b, t, self.e))
        return x + self.proj(gelu(self.fc(self.norm2(x))))


class CachedGPT(nn.Module):
    """The eager GPTModel's weights (shared, not copied) with a cache per layer; eval only (no dropout)."""

    def __init__(self, model: GPTModel, cfg: GPTConfig) -> None:
        super().__init__()
        self.tok_emb, self.pos_emb, self.out_head = model.tok_emb, model.pos_emb, model.out_head
        self.final_norm = LayerNorm4D(model.final_norm)
        self.blocks = nn.ModuleList(CachedBlock(b, cfg) for b in model.trf_blocks)
        self.register_buffer("key_pos", torch.arange(cfg.context_length, dtype=torch.float32), persistent=False)

    def forward(self, input_ids: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        t = input_ids.shape[1]
        positions = input_pos + torch.arange(t, dtype=torch.int64)  # (T,)
        mask = causal_mask(self.key_pos, positions.to(torch.float32))  # (T, C)
        x = self.tok_emb(input_ids) + self.pos_emb(positions)  # (1, T, E)
        for block in self.blocks:
            x = block(x, positions, mask)
        last = x[:, -1:]  # (1, 1, E): only the last token reaches the head
        return self.out_head(self.final_norm(last)).view(1, -1)  # (1, V)
