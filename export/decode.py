"""The decode form: the wrapper's weights with a key/value cache, for token-by-token generation."""
from __future__ import annotations

from pathlib import Path

import onnx_ir as ir
import torch
import torch.nn as nn
from torch.export import Dim

from export.example import EXAMPLE_BATCH, example_tokens
from export.fused import fused_state_dict
from export.mask_rewrite import additive_mask
from export.model import MultiHeadAttentionWrapper
from export.onnx_export import save_onnx, trace
from runtime.config import MHAConfig
from runtime.contract import (BATCH_AXIS, INPUT_NAME, NEW_AXIS, OUTPUT_NAME, PAST_AXIS, PAST_KEY, PAST_VALUE,
                              PRESENT_KEY, PRESENT_VALUE, TOTAL_AXIS, DecodeContract)
from runtime.errors import ConfigError


class DecodeMHA(nn.Module):
    """Causal attention over [past + new] tokens; returns the new tokens' context and the grown cache.

    x: (B, N, d_in); past_key, past_value: (B, H, P, d_out) with P >= 0.
    -> context (B, N, H * d_out), present_key and present_value (B, H, P + N, d_out).
    """

    def __init__(self, config: MHAConfig) -> None:
        super().__init__()
        self.num_heads, self.d_out = config.num_heads, config.d_out
        self.W_qkv = nn.Linear(config.d_in, 3 * config.d_model, bias=config.qkv_bias)

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
        return context, key, value


def decode_module(wrapper: MultiHeadAttentionWrapper, config: MHAConfig) -> DecodeMHA:
    """The decode form carrying exactly the wrapper's weights (the fused Q/K/V mapping), in eval mode."""
    module = DecodeMHA(config)
    module.load_state_dict(fused_state_dict(wrapper.state_dict(), config))
    return module.eval()


def empty_cache(config: MHAConfig, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (batch, config.num_heads, 0, config.d_out)
    return torch.zeros(shape), torch.zeros(shape)


DECODE_FILE = "mha.decode.onnx"
DECODE_OPSET = 18


def export_decode(wrapper: MultiHeadAttentionWrapper, config: MHAConfig, path: Path) -> None:
    """Export the decode form with symbolic batch, past_tokens and new_tokens; check the saved file."""
    contract = DecodeContract(config)
    batch, new = EXAMPLE_BATCH, example_tokens(config)
    past = min(2, config.context_length - new)  # example past >= 2 keeps the axis symbolic
    if past < 2:
        raise ConfigError(f"decode export: expected context_length >= 5 for symbolic cache axes, got {config.context_length}")
    gen = torch.Generator().manual_seed(0)
    args = (torch.randn(batch, new, config.d_in, generator=gen),  # (B, N, d_in)
            torch.randn(batch, config.num_heads, past, config.d_out, generator=gen),  # (B, H, P, d_out)
            torch.randn(batch, config.num_heads, past, config.d_out, generator=gen))
    batch_dim = Dim(BATCH_AXIS)
    past_dim = Dim(PAST_AXIS, max=config.context_length - 1)
    dynamic_shapes = {"x": {0: batch_dim, 1: Dim(NEW_AXIS, max=config.context_length)},
                      "past_key": {0: batch_dim, 2: past_dim}, "past_value": {0: batch_dim, 2: past_dim}}
    model = trace(decode_module(wrapper, config), args, input_names=[INPUT_NAME, PAST_KEY, PAST_VALUE],
                  output_names=[OUTPUT_NAME, PRESENT_KEY, PRESENT_VALUE], dynamic_shapes=dynamic_shapes,
                  opset=DECODE_OPSET)
    additive_mask(model)  # exact; export/mask_rewrite.py
    for value in model.graph.outputs[1:]:  # the exporter spells P + N in either order; use one name
        value.shape = ir.Shape([value.shape[0], value.shape[1], TOTAL_AXIS, value.shape[3]])
    save_onnx(model, path, config, contract_json=contract.to_json(), signature=contract.signature())
