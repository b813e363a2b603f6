"""A torch module the tests compare artifacts with, beside the book's own classes: the spelled-out fused form
(test-only: the shipped builders never use it)."""
from __future__ import annotations

import torch

from mha_export.model.fused import FusedCausalMHA, fused_state_dict
from mha_export.model.wrapper import MultiHeadAttentionWrapper
from mha_runtime.attention.config import MHAConfig


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
