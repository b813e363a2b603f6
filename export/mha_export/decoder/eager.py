"""The export's eager reference: the architecture's own torch model (its `eager`: GPT-2's is the book's GPTModel,
archs/gpt2/model.py), seeded as the book seeds it, and its logits at chosen positions."""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from mha_export.decoder.archs import arch_of
from mha_export.decoder.archs.protocol import DecoderConfig

SEED = 123
# Any architecture's eager reference: forward(in_idx (B, T) int64) -> logits (B, T, V).
Eager = nn.Module


def seeded_gpt(cfg: DecoderConfig) -> Eager:
    """The book's initialisation: torch.manual_seed(123), then the architecture's model of `cfg`. In eval mode."""
    torch.manual_seed(SEED)
    return arch_of(cfg).eager(cfg).eval()


def eager_at(model: Eager, ids: list[list[int]], positions: list[int]) -> np.ndarray:
    """(B, len(positions), V): row by row, keeping only the positions compared (at context_length 1024 and
    GPT-2's vocabulary a whole batch's logits would be 617 MB)."""
    with torch.no_grad():
        return np.stack([model(torch.tensor([row], dtype=torch.int64))[0, positions].numpy() for row in ids])
