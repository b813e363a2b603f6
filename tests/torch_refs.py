"""Torch modules the tests compare artifacts with, beside the book's own classes: the spelled-out fused form
and a key/value-cache module (test-only: the shipped builders never use them)."""
from __future__ import annotations

import torch
import torch.nn as nn

from mha_export.model.fused import FusedCausalMHA, fused_state_dict
from mha_export.model.wrapper import MultiHeadAttentionWrapper
from mha_runtime.artifact.config import MHAConfig


class ExplicitFusedMHA(FusedCausalMHA):
    """The fused Q/K/V projection with attention spelled out (matmul, causal mask from index comparisons,
    softmax): the wrapper's arithmetic per head, for checking the fused weight mapping without SDPA."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape  # (B, T, d_in)
        qkv = self.W_qkv(x).view(b, t, 3, self.num_heads, self.d_out)  # (B, T, 3, H, d_out)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (B, H, T, d_out)
        scores = q @ k.transpose(-2, -1)  # (B, H, T, T)
        pos = torch.arange(t, device=x.device)
        future = pos[None, :] > pos[:, None]  # (T, T): True above the diagonal
        weights = torch.softmax(scores.masked_fill(future, -torch.inf) / self.d_out ** 0.5, dim=-1)
        ctx = (weights @ v).transpose(1, 2).reshape(b, t, self.num_heads * self.d_out)  # (B, T, H * d_out)
        return ctx if self.out_proj is None else self.out_proj(ctx)


def explicit_fused(wrapper: MultiHeadAttentionWrapper, config: MHAConfig) -> ExplicitFusedMHA:
    module = ExplicitFusedMHA(config)
    module.load_state_dict(fused_state_dict(wrapper.state_dict(), config))
    return module.eval()


class DecodeMHA(nn.Module):
    """Causal attention over [past + new] tokens; returns the new tokens' context and the grown cache.

    x: (B, N, d_in); past_key, past_value: (B, H, P, d_out) with P >= 0.
    -> context (B, N, H * d_out), present_key and present_value (B, H, P + N, d_out).
    """

    def __init__(self, config: MHAConfig) -> None:
        super().__init__()
        self.num_heads, self.d_out = config.num_heads, config.d_out
        self.W_qkv = nn.Linear(config.d_in, 3 * config.d_model, bias=config.qkv_bias)
        self.out_proj = nn.Linear(config.d_model, config.d_model) if config.out_proj else None

    def forward(self, x: torch.Tensor, past_key: torch.Tensor, past_value: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b, n, _ = x.shape  # (B, N, d_in)
        qkv = self.W_qkv(x).view(b, n, 3, self.num_heads, self.d_out)  # (B, N, 3, H, d_out)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (B, H, N, d_out)
        key = torch.cat([past_key, k], dim=2)  # (B, H, P + N, d_out)
        value = torch.cat([past_value, v], dim=2)  # (B, H, P + N, d_out)
        past = past_key.shape[2]
        q_pos = torch.arange(n, device=x.device) + past  # (N,): absolute positions of the new tokens
        k_pos = torch.arange(key.shape[2], device=x.device)  # (P + N,)
        future = k_pos[None, :] > q_pos[:, None]  # (N, P + N): the mask, offset by the past
        scores = (q @ key.transpose(-2, -1)).masked_fill(future, -torch.inf)  # (B, H, N, P + N)
        weights = torch.softmax(scores / self.d_out ** 0.5, dim=-1)
        context = (weights @ value).transpose(1, 2).reshape(b, n, self.num_heads * self.d_out)  # (B, N, H*d_out)
        if self.out_proj is not None:  # on the new tokens only; the cache holds keys and values
            context = self.out_proj(context)
        return context, key, value


def decode_module(wrapper: MultiHeadAttentionWrapper, config: MHAConfig) -> DecodeMHA:
    """The decode form carrying exactly the wrapper's weights (the fused Q/K/V mapping), in eval mode."""
    module = DecodeMHA(config)
    module.load_state_dict(fused_state_dict(wrapper.state_dict(), config))
    return module.eval()


def empty_cache(config: MHAConfig, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (batch, config.num_heads, 0, config.d_out)
    return torch.zeros(shape), torch.zeros(shape)
