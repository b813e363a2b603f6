"""FLOP counts the bench rates runners by (a multiply-add counts 2)."""
from __future__ import annotations

from mha_runtime.attention.config import MHAConfig

DENSE_FORMULA = "2*B*T*d_in*3*H*d_out + 4*B*H*T^2*d_out"
OUT_PROJ_FORMULA = "2*B*T*(H*d_out)^2"


def dense_formula(config: MHAConfig) -> str:
    """The dense count's formula for this config: with out_proj, its term added."""
    return DENSE_FORMULA + (f" + {OUT_PROJ_FORMULA}" if config.out_proj else "")


def token_flops(config: MHAConfig, *, tokens: int) -> int:
    """The per-token work, the same in the dense, causal and decode counts: the Q/K/V projections
    2*T*d_in*(3*H*d_out), plus out_proj's matmul 2*T*(H*d_out)^2 when the config has one. Bias adds are not
    counted (nor does torch's FlopCounterMode count them)."""
    width = config.d_model  # H * d_out
    return 2 * tokens * config.d_in * 3 * width + (2 * tokens * width * width if config.out_proj else 0)


def dense_flops(config: MHAConfig, *, batch: int, tokens: int) -> int:
    """Dense FLOPs of one forward pass (a multiply-add counts 2): the per-token work (token_flops) + scores
    Q K^T 2*B*H*T*T*d_out + weights @ V 2*B*H*T*T*d_out. Softmax, scaling and masking are not counted; nor is the
    masked half skipped (a causal kernel may beat 100%)."""
    h, d = config.num_heads, config.d_out
    return batch * token_flops(config, tokens=tokens) + 4 * batch * h * tokens * tokens * d


def causal_flops(config: MHAConfig, *, batch: int, tokens: int) -> int:
    """The work an exact causal kernel cannot skip: the per-token work, plus scores and context over the
    T*(T+1)/2 unmasked (query, key) pairs only."""
    h, d = config.num_heads, config.d_out
    return batch * token_flops(config, tokens=tokens) + 4 * batch * h * d * tokens * (tokens + 1) // 2


def decode_step_flops(config: MHAConfig, *, past: int) -> int:
    """One new token at `past` cached tokens: its per-token work plus 1 x (past + 1) scores and context."""
    h, d = config.num_heads, config.d_out
    return token_flops(config, tokens=1) + 4 * h * (past + 1) * d
