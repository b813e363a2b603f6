"""Incremental decoding with a key/value cache, torch-free: the session owns the cache."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import numpy as np

from mha_runtime.artifact.errors import ContractError
from mha_runtime.attention.contract import (
    INPUT_NAME,
    OUTPUT_NAME,
    PAST_KEY,
    PAST_VALUE,
    PRESENT_KEY,
    PRESENT_VALUE,
    check_input,
    check_output,
)
from mha_runtime.attention.registry import DECODE
from mha_runtime.attention.runner import OnnxRunner


class DecodeSession:
    """Feed tokens in any chunks (prefill, single tokens, uneven pieces); each call returns the new
    tokens' context, equal to the full-sequence output at those positions.

    A step that would pass context_length, or that changes the batch size, is refused and the cache
    is left as it was.
    """

    def __init__(self, artifact: str | Path, *, model: str = DECODE.file, provider: str = "auto",
                 threads: int | None = None) -> None:
        self.runner = OnnxRunner(artifact, model=model, provider=provider, threads=threads)
        self.config = self.runner.config
        wanted = [INPUT_NAME, PAST_KEY, PAST_VALUE]
        if self.runner.input_names != wanted:
            raise ContractError(f"{self.runner.path.name}: expected the decode form with inputs {wanted}, got "
                                f"{self.runner.input_names}; run a plain artifact with OnnxRunner")
        self.reset()

    def reset(self) -> None:
        """Forget every past token."""
        self.past_key: np.ndarray | None = None  # (B, H, P, d_out)
        self.past_value: np.ndarray | None = None

    def snapshot(self) -> tuple[np.ndarray | None, np.ndarray | None]:
        """The cache as it is now, to come back to with restore() (steps never modify it in place)."""
        return self.past_key, self.past_value

    def restore(self, cache: tuple[np.ndarray | None, np.ndarray | None]) -> None:
        """Come back to a cache from snapshot(); one that does not fit this model is refused, the cache unchanged."""
        if not isinstance(cache, tuple) or len(cache) != 2:
            raise ContractError(f"cache: expected (past_key, past_value) from snapshot(), got {type(cache).__name__}")
        key, value = cache
        if key is None or value is None:
            if key is not None or value is not None:
                raise ContractError("cache: expected both past_key and past_value, or neither")
            self.reset()
            return
        h, d, limit = self.config.num_heads, self.config.d_out, self.config.context_length
        for name, array in ((PAST_KEY, key), (PAST_VALUE, value)):
            if (not isinstance(array, np.ndarray) or array.dtype != np.float32 or array.ndim != 4
                    or array.shape[1:2] + array.shape[3:] != (h, d) or array.shape[2] > limit or array.shape[0] < 1):
                shape = list(array.shape) if isinstance(array, np.ndarray) else type(array).__name__
                raise ContractError(f"cache {name!r}: expected float32 [batch, {h}, past_tokens <= {limit}, {d}], "
                                    f"got {shape}")
        if key.shape != value.shape:
            raise ContractError(f"cache: past_key {list(key.shape)} and past_value {list(value.shape)} differ")
        self.past_key, self.past_value = key, value

    @property
    def past_tokens(self) -> int:
        return 0 if self.past_key is None else int(self.past_key.shape[2])

    def step(self, x: Any) -> np.ndarray:
        """x: (B, N, d_in) -> context (B, N, H * d_out); the cache grows by N."""
        x = check_input(x, self.config, past_tokens=self.past_tokens)
        batch = x.shape[0]
        if self.past_key is None:
            shape = (batch, self.config.num_heads, 0, self.config.d_out)
            past_key, past_value = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
        else:
            if self.past_key.shape[0] != batch:
                raise ContractError(f"input {INPUT_NAME!r}: expected batch {self.past_key.shape[0]} (the cache's), "
                                    f"got {batch}; call reset() to start a new sequence")
            past_key, past_value = self.past_key, self.past_value
        context, present_key, present_value = self.runner.execute(
            [OUTPUT_NAME, PRESENT_KEY, PRESENT_VALUE], {INPUT_NAME: x, PAST_KEY: past_key, PAST_VALUE: past_value})
        check_output(context, x)
        self.past_key, self.past_value = present_key, present_value  # only after a successful, finite run
        return context


class Stepper(Protocol):
    """A decode session of either form."""

    def reset(self) -> None: ...

    def step(self, x: Any) -> np.ndarray: ...


def run_chunked(session: Stepper, x: np.ndarray, chunks: list[int]) -> np.ndarray:
    """Feed x (B, T, d_in) from an empty cache in the given chunk sizes; return the (B, T, H * d_out) context."""
    if sum(chunks) != x.shape[1]:
        raise ContractError(f"chunks {chunks} add up to {sum(chunks)}, expected the {x.shape[1]} tokens of the input")
    session.reset()
    outputs, start = [], 0
    for size in chunks:
        outputs.append(session.step(x[:, start:start + size]))
        start += size
    return np.concatenate(outputs, axis=1)


def golden_schedule(tokens: int) -> list[int]:
    """The golden fixtures' schedule: a prefill of ceil(T / 2) tokens, then one token per step."""
    first = (tokens + 1) // 2
    return [first] + [1] * (tokens - first)


def uneven_schedule(tokens: int, pattern: tuple[int, ...] = (5, 1, 17, 1, 3)) -> list[int]:
    """Uneven chunks 5, 1, 17, 1, 3, 5, 1, ... cut to add up to `tokens`."""
    chunks: list[int] = []
    while sum(chunks) < tokens:
        chunks.append(min(pattern[len(chunks) % len(pattern)], tokens - sum(chunks)))
    return chunks


SCHEDULES = {
    "prefill": lambda t: [t],
    "token-by-token": lambda t: [1] * t,
    "uneven": uneven_schedule,
    "golden": golden_schedule,
}
