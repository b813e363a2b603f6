"""The fused form: one Q/K/V projection for all heads, split into heads; a pure function of the wrapper's weights."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from export.model import MultiHeadAttentionWrapper
from runtime.config import MHAConfig


FORMS = ("explicit", "sdpa", "blocked")
BLOCKS = 8  # query blocks of the "blocked" form; measured at gpt2-small T=1024: 2 -> 65 ms, 4 -> 52, 8 -> 49


class FusedCausalMHA(nn.Module):
    """The wrapper's function with one (d_in -> 3 * H * d_out) projection.

    form "explicit" spells attention out (matmul, causal mask from index comparisons, softmax), the
    wrapper's arithmetic per head; "sdpa" calls scaled_dot_product_attention, which the ONNX exporter
    turns into one `Attention` node at opset 23; "blocked" splits the queries into BLOCKS blocks, each
    attending only to the keys up to its end, so most of the masked half is never computed.
    """

    def __init__(self, config: MHAConfig, *, form: str = "explicit") -> None:
        super().__init__()
        if form not in FORMS:
            raise ValueError(f"form: expected one of {FORMS}, got {form!r}")
        self.num_heads, self.d_out, self.form = config.num_heads, config.d_out, form
        self.W_qkv = nn.Linear(config.d_in, 3 * config.d_model, bias=config.qkv_bias)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, offset: int | torch.SymInt) -> torch.Tensor:
        """q (B, H, n, d) at positions offset.., k and v (B, H, m, d) at 0..m-1 -> (B, H, n, d), causal."""
        scores = (q @ k.transpose(-2, -1)) / self.d_out ** 0.5  # (B, H, n, m)
        q_pos = torch.arange(q.shape[2], device=q.device) + offset
        k_pos = torch.arange(k.shape[2], device=q.device)
        scores = scores.masked_fill(k_pos[None, :] > q_pos[:, None], -torch.inf)  # (n, m): future keys
        return torch.softmax(scores, dim=-1) @ v

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape  # (B, T, d_in)
        qkv = self.W_qkv(x).view(b, t, 3, self.num_heads, self.d_out)  # (B, T, 3, H, d_out)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (B, H, T, d_out)
        if self.form == "sdpa":
            ctx = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, d_out)
        elif self.form == "blocked":
            ends = [(i * t + BLOCKS - 1) // BLOCKS for i in range(BLOCKS + 1)]  # ceil(i * T / BLOCKS)
            ctx = torch.cat([self.attend(q[:, :, ends[i]:ends[i + 1]], k[:, :, :ends[i + 1]], v[:, :, :ends[i + 1]],
                                         ends[i]) for i in range(BLOCKS)], dim=2)  # (B, H, T, d_out)
        else:
            ctx = self.attend(q, k, v, 0)  # (B, H, T, d_out)
        return ctx.transpose(1, 2).reshape(b, t, self.num_heads * self.d_out)  # (B, T, H * d_out)


def fused_state_dict(wrapper_state: dict[str, torch.Tensor], config: MHAConfig) -> dict[str, torch.Tensor]:
    """Stack every head's W_query, then every W_key, then every W_value (rows), biases likewise."""
    heads = range(config.num_heads)
    state = {"W_qkv.weight": torch.cat([wrapper_state[f"heads.{h}.W_{p}.weight"] for p in ("query", "key", "value")
                                        for h in heads], dim=0)}  # (3 * H * d_out, d_in)
    if config.qkv_bias:
        state["W_qkv.bias"] = torch.cat([wrapper_state[f"heads.{h}.W_{p}.bias"] for p in ("query", "key", "value")
                                         for h in heads], dim=0)  # (3 * H * d_out,)
    return state


def fuse(wrapper: MultiHeadAttentionWrapper, config: MHAConfig, *, form: str = "explicit") -> FusedCausalMHA:
    """The fused module carrying exactly the wrapper's weights, in eval mode."""
    fused = FusedCausalMHA(config, form=form)
    fused.load_state_dict(fused_state_dict(wrapper.state_dict(), config))
    return fused.eval()
