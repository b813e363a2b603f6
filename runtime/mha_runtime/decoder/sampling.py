"""The book's sampling rule (chapter 5's `generate`), in numpy, and a specified random draw.

Top-k keeps the logits >= the k-th largest (ties at the k-th value stay, as torch.where does in the book), then
the logits are divided by the temperature and turned into probabilities by softmax; temperature 0 is argmax
(the first maximum, as torch.argmax). The draw is the inverse CDF at u = PCG64(seed).random(): one generator per
row, seeded by the row's seed, so a row samples the same tokens alone and inside a batch.
"""
from __future__ import annotations

import numpy as np

from mha_runtime.artifact.errors import ContractError

# Temperatures besides 0 (greedy): the logits are divided by the temperature in float32, so a tiny one overflows
# them (inf - inf is NaN: every probability NaN) and one past float32's range is inf (-inf / inf is NaN under
# top-k). The book's torch rule fails the same way (torch.multinomial refuses NaN). The bounds leave logits up to
# 1e34 finite and are the same in every runtime (runtime/native/common/gpt/sampling.mjs, runtime/native/c/gpt_sample.c).
TEMPERATURE_MIN, TEMPERATURE_MAX = 1e-4, 1e4
TEMPERATURE_RULE = "0 (greedy) or a number in 0.0001..10000"


def temperature_ok(temperature: object) -> bool:
    """0, or a number within TEMPERATURE_MIN..TEMPERATURE_MAX (NaN, infinities and bools are not)."""
    return not isinstance(temperature, bool) and isinstance(temperature, (int, float)) \
        and (temperature == 0 or TEMPERATURE_MIN <= temperature <= TEMPERATURE_MAX)


def check_sampling(temperature: float, top_k: int | None, vocab_size: int) -> None:
    if not temperature_ok(temperature):
        raise ContractError(f"temperature: expected {TEMPERATURE_RULE}, got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= vocab_size):
        raise ContractError(f"top_k: expected an integer in 1..{vocab_size}, got {top_k!r}")


def filtered_logits(logits: np.ndarray, top_k: int | None) -> np.ndarray:
    """logits (B, V) float32 with everything below each row's k-th largest set to -inf."""
    x = np.asarray(logits, np.float32)
    if top_k is None:
        return x
    kth = np.partition(x, -top_k, axis=-1)[:, -top_k][:, None]  # (B, 1)
    return np.where(x < kth, np.float32(-np.inf), x)


def probabilities(logits: np.ndarray, temperature: float, top_k: int | None) -> np.ndarray:
    """(B, V) float32 probabilities of the next token for temperature > 0: top-k, / temperature, softmax."""
    x = filtered_logits(logits, top_k) / np.float32(temperature)
    x = np.exp(x - x.max(axis=-1, keepdims=True))
    return (x / x.sum(axis=-1, keepdims=True)).astype(np.float32)


def draw(probs: np.ndarray, u: float) -> int:
    """The first id whose cumulative probability exceeds u * total (ids of probability 0 are never drawn)."""
    cdf = np.cumsum(probs, dtype=np.float64)
    return int(min(np.searchsorted(cdf, u * cdf[-1], side="right"), len(cdf) - 1))


class Sampler:
    """Next ids for a batch of rows, each with its own PCG64 stream."""

    def __init__(self, rows: int, *, temperature: float, top_k: int | None, seed: int | None, vocab_size: int) -> None:
        check_sampling(temperature, top_k, vocab_size)
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise ContractError(f"seed: expected an integer >= 0, got {seed!r}")
        self.temperature, self.top_k = float(temperature), top_k
        self.seed = int(np.random.SeedSequence().entropy % (1 << 63)) if seed is None else seed
        self.streams = [np.random.Generator(np.random.PCG64(self.seed)) for _ in range(rows)]

    def next_ids(self, logits: np.ndarray, rows: list[int] | None = None) -> list[int]:
        """logits (B, V) -> one id per row; `rows` names which stream each row of `logits` uses."""
        rows = list(range(len(logits))) if rows is None else rows
        if self.temperature == 0.0:
            return [int(i) for i in np.argmax(filtered_logits(logits, self.top_k), axis=-1)]
        probs = probabilities(logits, self.temperature, self.top_k)
        return [draw(p, float(self.streams[r].random())) for p, r in zip(probs, rows, strict=True)]
