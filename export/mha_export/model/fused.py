"""The fused form: one Q/K/V projection for all heads, split into heads; a pure function of the wrapper's weights."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from mha_export.model.wrapper import MultiHeadAttentionWrapper
from mha_runtime.attention.config import MHAConfig


class FusedCausalMHA(nn.Module):
    """The wrapper's function with one (d_in -> 3 * H * d_out) projection and scaled_dot_product_attention,
    which the ONNX exporter turns into one `Attention` node at opset 23."""

    def __init__(self, config: MHAConfig) -> None:
        super().__init__()
        self.num_heads, self.d_out = config.num_heads, config.d_out
        self.W_qkv = nn.Linear(config.d_in, 3 * config.d_model, bias=config.qkv_bias)
        self.out_proj = nn.Linear(config.d_model, config.d_model) if config.out_proj else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape  # (B, T, d_in)
        qkv = self.W_qkv(x).view(b, t, 3, self.num_heads, self.d_out)  # (B, T, 3, H, d_out)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (B, H, T, d_out)
        ctx = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, d_out)
        ctx = ctx.transpose(1, 2).reshape(b, t, self.num_heads * self.d_out)  # (B, T, H * d_out)
        return ctx if self.out_proj is None else self.out_proj(ctx)  # (B, T, H * d_out)


def fused_state_dict(wrapper_state: dict[str, torch.Tensor], config: MHAConfig) -> dict[str, torch.Tensor]:
    """Stack every head's W_query, then every W_key, then every W_value (rows), biases likewise; the output
    projection, if any, as it is."""
    heads = range(config.num_heads)
    state = {"W_qkv.weight": torch.cat([wrapper_state[f"heads.{h}.W_{p}.weight"] for p in ("query", "key", "value")
                                        for h in heads], dim=0)}  # (3 * H * d_out, d_in)
    if config.qkv_bias:
        state["W_qkv.bias"] = torch.cat([wrapper_state[f"heads.{h}.W_{p}.bias"] for p in ("query", "key", "value")
                                         for h in heads], dim=0)  # (3 * H * d_out,)
    if config.out_proj:
        state |= {k: wrapper_state[k] for k in ("out_proj.weight", "out_proj.bias")}
    return state


def fuse(wrapper: MultiHeadAttentionWrapper, config: MHAConfig) -> FusedCausalMHA:
    """The fused module carrying exactly the wrapper's weights, in eval mode."""
    fused = FusedCausalMHA(config)
    fused.load_state_dict(fused_state_dict(wrapper.state_dict(), config))
    return fused.eval()
