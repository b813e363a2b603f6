"""FLOP counts the bench rates runners by (a multiply-add counts 2)."""
from __future__ import annotations

from mha_runtime.artifact.config import MHAConfig

DENSE_FORMULA = "2*B*T*d_in*3*H*d_out + 4*B*H*T^2*d_out"


def dense_flops(config: MHAConfig, *, batch: int, tokens: int) -> int:
    """Dense FLOPs of one forward pass (a multiply-add counts 2):
    Q/K/V projections 2*B*T*d_in*(3*H*d_out) + scores Q K^T 2*B*H*T*T*d_out + weights @ V 2*B*H*T*T*d_out.
    Softmax, scaling and masking are not counted; nor is the masked half skipped (a causal kernel may beat 100%)."""
    h, d = config.num_heads, config.d_out
    return 2 * batch * tokens * config.d_in * 3 * h * d + 4 * batch * h * tokens * tokens * d


def causal_flops(config: MHAConfig, *, batch: int, tokens: int) -> int:
    """The work an exact causal kernel cannot skip: the projections, plus scores and context over the
    T*(T+1)/2 unmasked (query, key) pairs only."""
    h, d = config.num_heads, config.d_out
    return 2 * batch * tokens * config.d_in * 3 * h * d + 4 * batch * h * d * tokens * (tokens + 1) // 2


def decode_step_flops(config: MHAConfig, *, past: int) -> int:
    """One new token at `past` cached tokens: its projections plus 1 x (past + 1) scores and context."""
    h, d = config.num_heads, config.d_out
    return 2 * config.d_in * 3 * h * d + 4 * h * (past + 1) * d
