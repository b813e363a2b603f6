"""What the tests compare artifacts with, beside the book's own classes: the tutorial's printed output, and the
spelled-out fused form (test-only: the shipped builders never use it)."""
from __future__ import annotations

import torch

from mha_export.model.fused import FusedCausalMHA, fused_state_dict
from mha_export.model.wrapper import MultiHeadAttentionWrapper
from mha_runtime.attention.config import MHAConfig

# The book's six tokens "Your journey starts with one step", 3-dim embeddings.
INPUTS = torch.tensor([
    [0.43, 0.15, 0.89], [0.55, 0.87, 0.66], [0.57, 0.85, 0.64],
    [0.22, 0.58, 0.33], [0.77, 0.25, 0.10], [0.05, 0.80, 0.55],
])
# Printed by the tutorial for torch.manual_seed(123), d_out=2, num_heads=2, batch = stack((inputs, inputs)).
EXPECTED = torch.tensor([
    [-0.4519, 0.2216, 0.4772, 0.1063],
    [-0.5874, 0.0058, 0.5891, 0.3257],
    [-0.6300, -0.0632, 0.6202, 0.3860],
    [-0.5675, -0.0843, 0.5478, 0.3589],
    [-0.5526, -0.0981, 0.5321, 0.3428],
    [-0.5299, -0.1081, 0.5077, 0.3493],
])


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
