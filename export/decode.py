"""The decode form: the wrapper's weights with a key/value cache, for token-by-token generation."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
import torch
import torch.nn as nn
from onnx import TensorProto, numpy_helper

from mha_export.contrib import contrib_domain_model, fused_initializers, output_projection, save_checked
from mha_export.fused import fused_state_dict
from mha_export.model import MultiHeadAttentionWrapper
from mha_export.onnx_export import check_saved
from mha_runtime.config import MHAConfig
from mha_runtime.contract import (
    INPUT_NAME,
    OUTPUT_NAME,
    PAST_KEY,
    PAST_VALUE,
    PRESENT_KEY,
    PRESENT_VALUE,
    DecodeContract,
)
from mha_runtime.variants import VARIANTS


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


def decode_model(wrapper: MultiHeadAttentionWrapper, config: MHAConfig) -> onnx.ModelProto:
    """x (B, N, d_in) -> MatMul -> q, k, v (B, N, H * d_out) -> com.microsoft.MultiHeadAttention with
    past_key/past_value (B, H, P, d_out), causal (unidirectional: query i sees keys up to P + i) ->
    context (B, N, H * d_out), present_key/present_value (B, H, P + N, d_out).

    The same weights as DecodeMHA (the fused mapping); ONNX Runtime's kernel appends the cache and
    attends in one node: three nodes instead of the 33 of DecodeMHA's trace, and faster per step
    (docs/design-notes.md).
    """
    weight, bias = fused_initializers(wrapper, config)  # (d_in, 3 * H * d_out), (3 * H * d_out,) or None
    inits = [weight, numpy_helper.from_array(np.array([config.d_model] * 3, np.int64), "splits")]
    if bias is not None:  # the op adds it to q, k and v itself
        inits.append(bias)
    attention, projection, proj_inits = output_projection(wrapper, config)  # on the new tokens only
    nodes = [oh.make_node("MatMul", [INPUT_NAME, "W_qkv"], ["qkv"]),  # (B, N, 3 * H * d_out)
             oh.make_node("Split", ["qkv", "splits"], ["q", "k", "v"], axis=2),  # each (B, N, H * d_out)
             oh.make_node("MultiHeadAttention",
                          ["q", "k", "v", "" if bias is None else bias.name, "", "", PAST_KEY, PAST_VALUE],
                          [attention, PRESENT_KEY, PRESENT_VALUE], domain="com.microsoft",
                          num_heads=config.num_heads, unidirectional=1),  # scale 1/sqrt(d_out)
             *projection]
    inits += proj_inits
    contract = DecodeContract(config)
    signature = contract.signature()
    values = {name: oh.make_tensor_value_info(name, TensorProto.FLOAT, shape) for name, shape in signature.items()}
    graph = oh.make_graph(nodes, "mha_decode", [values[n] for n in (INPUT_NAME, PAST_KEY, PAST_VALUE)],
                          [values[n] for n in (OUTPUT_NAME, PRESENT_KEY, PRESENT_VALUE)], inits)
    return contrib_domain_model(graph, config, contract.to_json())


def build_decode(wrapper: MultiHeadAttentionWrapper, config: MHAConfig, folder: Path, *, opset: int) -> None:
    """Build the decode graph, check it (structure, names, symbolic axes) and save it."""
    path = folder / VARIANTS["decode"].file
    save_checked(decode_model(wrapper, config), path)
    check_saved(path, config, DecodeContract(config).signature())
