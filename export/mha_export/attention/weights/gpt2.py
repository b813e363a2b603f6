"""Hugging Face GPT-2's attention as both kinds read it (the attention's hf-gpt2 layout, the GPT's): its key names
and the split of the fused q|k|v, declared once."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the split is torch's slicing; importing the names needs no torch (the export's CLI imports them)
    import torch

C_ATTN_WEIGHT, C_ATTN_BIAS = "attn.c_attn.weight", "attn.c_attn.bias"
C_PROJ_WEIGHT, C_PROJ_BIAS = "attn.c_proj.weight", "attn.c_proj.bias"


def split_qkv(weight: torch.Tensor, bias: torch.Tensor | None
              ) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """Conv1D c_attn: weight (d_in, 3 * E) = [q | k | v] on the output axis, bias (3 * E,) -> for q, k and v in that
    order Linear's (E, d_in) weight (transposed) and its (E,) bias (None without one)."""
    width = weight.shape[1] // 3
    return [(weight[:, j * width:(j + 1) * width].T, None if bias is None else bias[j * width:(j + 1) * width])
            for j in range(3)]
