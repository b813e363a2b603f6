"""Incremental decoding into one preallocated cache (mha.decode-inplace.onnx), torch-free.

The session owns a key and a value buffer of (B, H, context_length, d_out) as OrtValues, bound through IO
binding as both the model's past and present: ONNX Runtime writes each step's new rows into them in place.
Single-token steps reuse bound input and output buffers, so a step copies one token in and one out.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from mha_runtime.artifact.errors import ArtifactError, ContractError, first_line
from mha_runtime.attention.contract import (
    INPUT_NAME,
    OUTPUT_NAME,
    PAST_KEY,
    PAST_TOKENS,
    PAST_VALUE,
    PRESENT_KEY,
    PRESENT_VALUE,
    check_input,
    check_output,
)
from mha_runtime.attention.registry import DECODE_INPLACE
from mha_runtime.attention.runner import OnnxRunner


class InPlaceDecodeSession:
    """Feed tokens in chunks (a prefill, then single tokens; chunks > 1 after a past only at batch 1, an ONNX
    Runtime limit); each call returns the new tokens' context, equal to the full-sequence output there. A step
    past context_length, a batch change, or a refused chunk leaves the cache as it was."""

    def __init__(self, artifact: str | Path, *, model: str = DECODE_INPLACE.file, provider: str = "cpu",
                 threads: int | None = None) -> None:
        self.runner = OnnxRunner(artifact, model=model, provider=provider, threads=threads)
        self.config = self.runner.config
        wanted = [INPUT_NAME, PAST_KEY, PAST_VALUE, PAST_TOKENS]
        if self.runner.input_names != wanted:
            raise ContractError(f"{self.runner.path.name}: expected the in-place decode form with inputs {wanted}, "
                                f"got {self.runner.input_names}")
        self._batch = 0
        self.past_tokens = 0

    def reset(self) -> None:
        """Forget every past token (the buffers stay allocated; rows past past_tokens are never read)."""
        self.past_tokens = 0

    def rewind(self, past_tokens: int) -> None:
        """Go back to the first `past_tokens` tokens: their rows are still in the buffers."""
        valid = isinstance(past_tokens, int) and not isinstance(past_tokens, bool)
        if not valid or not 0 <= past_tokens <= self.past_tokens:
            raise ContractError(f"rewind: expected 0 <= past_tokens <= {self.past_tokens}, got {past_tokens!r}")
        self.past_tokens = past_tokens

    def _allocate(self, batch: int) -> None:
        c = self.config
        shape = (batch, c.num_heads, c.context_length, c.d_out)
        self._key = ort.OrtValue.ortvalue_from_numpy(np.zeros(shape, np.float32))
        self._value = ort.OrtValue.ortvalue_from_numpy(np.zeros(shape, np.float32))
        self._binding = self.runner.session.io_binding()
        for past, present, buffer in ((PAST_KEY, PRESENT_KEY, self._key), (PAST_VALUE, PRESENT_VALUE, self._value)):
            self._binding.bind_ortvalue_input(past, buffer)
            self._binding.bind_ortvalue_output(present, buffer)  # the same OrtValue: written in place
        self._one = np.zeros((batch, 1, c.d_in), np.float32)  # single-token steps: bound once, refilled
        self._one_out = np.zeros((batch, 1, c.d_model), np.float32)
        self._past = np.zeros((batch,), np.int32)
        self._binding.bind_ortvalue_input(PAST_TOKENS, ort.OrtValue.ortvalue_from_numpy(self._past))
        self._bound_one = False
        self._batch = batch

    def step(self, x: Any) -> np.ndarray:
        """x: (B, N, d_in) -> context (B, N, H * d_out); the cache grows by N in place."""
        x = check_input(x, self.config, past_tokens=self.past_tokens)
        batch, tokens = x.shape[0], x.shape[1]
        if self.past_tokens and batch != self._batch:
            raise ContractError(f"input {INPUT_NAME!r}: expected batch {self._batch} (the cache's), got {batch}; "
                                "call reset() to start a new sequence")
        if self.past_tokens and tokens > 1 and batch > 1:
            raise ContractError(f"input {INPUT_NAME!r}: a chunk of {tokens} tokens after a past needs batch 1 "
                                f"(ONNX Runtime's GroupQueryAttention), got batch {batch}: feed single tokens")
        if batch != self._batch:
            self._allocate(batch)
        self._past[:] = self.past_tokens
        if tokens == 1:
            if not self._bound_one:
                self._binding.bind_ortvalue_input(INPUT_NAME, ort.OrtValue.ortvalue_from_numpy(self._one))
                self._binding.bind_ortvalue_output(OUTPUT_NAME, ort.OrtValue.ortvalue_from_numpy(self._one_out))
                self._bound_one = True
            self._one[:] = x
            context = self._one_out
        else:  # a chunk: its own input and output, then the single-token buffers are bound again
            context = np.zeros((batch, tokens, self.config.d_model), np.float32)
            self._binding.bind_ortvalue_input(INPUT_NAME, ort.OrtValue.ortvalue_from_numpy(x))
            self._binding.bind_ortvalue_output(OUTPUT_NAME, ort.OrtValue.ortvalue_from_numpy(context))
            self._bound_one = False
        try:
            self.runner.session.run_with_iobinding(self._binding)
        except Exception as exc:  # ONNX Runtime's own error types
            raise ArtifactError(f"{self.runner.path}: ONNX Runtime failed on {list(x.shape)} at past_tokens="
                                f"{self.past_tokens} ({first_line(exc)})") from None
        check_output(context, x)
        self.past_tokens += tokens  # only after a successful, finite run
        return context.copy()
