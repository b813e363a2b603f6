"""Example inputs for tracing: shapes that cannot freeze an axis."""
from __future__ import annotations

import torch

from mha_runtime.artifact.errors import ConfigError
from mha_runtime.attention.config import MHAConfig

EXAMPLE_BATCH = 2


def example_tokens(config: MHAConfig) -> int:
    """Half the context, kept in 2 <= tokens < context_length (a size-1 or full axis gets frozen)."""
    return max(2, min(config.context_length // 2, config.context_length - 1))


def example_input(config: MHAConfig, *, batch: int = EXAMPLE_BATCH, tokens: int | None = None) -> torch.Tensor:
    """A (batch, tokens, d_in) tensor; refuses shapes that would silently freeze an axis in the graph."""
    tokens = example_tokens(config) if tokens is None else tokens
    if batch < 2:
        raise ConfigError(f"example input: expected batch >= 2 (batch {batch} freezes the batch axis)")
    if not 2 <= tokens < config.context_length:
        raise ConfigError(
            f"example input: expected 2 <= tokens < context_length={config.context_length}, got {tokens} "
            "(1 freezes the token axis; context_length >= 3 is needed for a dynamic token axis)"
        )
    gen = torch.Generator().manual_seed(0)
    return torch.randn(batch, tokens, config.d_in, generator=gen)
