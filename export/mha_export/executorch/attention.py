"""The ExecuTorch program (`mha.pte`, XNNPACK delegate); its runner is mha_export.infer.pte_runner.

The traced wrapper slices a (context, context) mask buffer, which torch.export refuses at T == context_length
(a contiguity guard) and which XNNPACK cannot delegate. `PerHeadBMM` computes the same function with ops
XNNPACK takes whole at dynamic batch and tokens: the wrapper's own per-head Linears, rank-3 `bmm`, and an
additive mask built from a stored position vector (no (T, T) tensor in the file). docs/design-notes.md has
the forms that lost and why.

ExecuTorch plans memory at the upper bounds, so batch has a maximum (PTE_MAX_BATCH), recorded in the contract
and the manifest; the runner refuses a larger batch, or more tokens than context_length, before the runtime.
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from mha_export.executorch.lower import causal_mask, lower
from mha_export.infer.pte_runner import BATCH_METHOD, CONFIG_METHOD
from mha_export.model.wrapper import MultiHeadAttentionWrapper
from mha_runtime.artifact.errors import ExportError
from mha_runtime.attention.config import MHAConfig
from mha_runtime.attention.registry import PTE, PTE_MAX_BATCH


class PerHeadBMM(nn.Module):
    """x (B, T, d_in) -> per head: q k^T (B, T, T) + mask -> softmax -> @ v (B, T, d_out) -> cat -> [out_proj].

    The wrapper's per-head weights, with 1/sqrt(d_out) folded into W_query (exact when d_out is a power of 4).
    """

    def __init__(self, wrapper: MultiHeadAttentionWrapper, config: MHAConfig) -> None:
        super().__init__()
        scale = config.d_out ** -0.5
        self.W_query = nn.ModuleList(copy.deepcopy(head.W_query) for head in wrapper.heads)
        with torch.no_grad():
            for layer in self.W_query:
                layer.weight.mul_(scale)
                if layer.bias is not None:
                    layer.bias.mul_(scale)
        self.W_key = nn.ModuleList(copy.deepcopy(head.W_key) for head in wrapper.heads)
        self.W_value = nn.ModuleList(copy.deepcopy(head.W_value) for head in wrapper.heads)
        self.out_proj = copy.deepcopy(wrapper.out_proj)
        self.register_buffer("pos", torch.arange(config.context_length, dtype=torch.float32))  # (context,)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = self.pos[: x.shape[1]]  # (T,)
        mask = causal_mask(p, p)  # (T, T)
        heads = []
        for w_q, w_k, w_v in zip(self.W_query, self.W_key, self.W_value, strict=True):
            scores = torch.bmm(w_q(x), w_k(x).transpose(1, 2)) + mask  # (B, T, T)
            heads.append(torch.bmm(torch.softmax(scores, dim=-1), w_v(x)))  # (B, T, d_out)
        # one head is its own context: XNNPACK does not delegate a cat of one tensor (the program was refused)
        context = heads[0] if len(heads) == 1 else torch.cat(heads, dim=-1)  # (B, T, H * d_out)
        return context if self.out_proj is None else self.out_proj(context)


def build_pte(wrapper: MultiHeadAttentionWrapper, config: MHAConfig, folder: Path, *, opset: int) -> None:
    """mha.pte: torch.export with dynamic batch (1..PTE_MAX_BATCH) and tokens (1..context_length inclusive), lowered to
    XNNPACK; refuses a program whose compute is not all delegated."""
    from torch.export import Dim

    def refuse(targets: list[Any]) -> None:
        outside = [t for t in targets if not any(ok in str(t) for ok in ("sym_size", "slice_copy", "view_copy"))]
        if outside:
            raise ExportError(f"{PTE.file}: XNNPACK did not take {len(outside)} op(s), e.g. {outside[0]}")

    tokens = max(2, min(3, config.context_length))  # > 1 and != batch: a 1 or a shared size gets specialised
    dynamic = {"x": {0: Dim("batch", min=1, max=PTE_MAX_BATCH), 1: Dim("tokens", min=1, max=config.context_length)}}
    (folder / PTE.file).write_bytes(lower(PerHeadBMM(wrapper, config).eval(), (torch.randn(2, tokens, config.d_in),),
                                          dynamic, {CONFIG_METHOD: config.to_json(), BATCH_METHOD: PTE_MAX_BATCH},
                                          refuse))
