"""Run gpt.pte with ExecuTorch's Python runtime (`executorch.runtime`): the `gpt-executorch` entry point of the
`mha.runners` group, which mha_runtime.executorch.decoder finds for `mha generate --form gpt.pte` and `mha check`.

The program keeps its key/value cache in its own mutable buffers, so a decoder here only tracks the position:
prefill feeds the whole prompt at input_pos 0 (rows left from an earlier sequence are masked out by position),
each step feeds one token at the current length. Every call is checked against the bounds before ExecuTorch
sees it. The program is loaded on the first decoder, so a request refused by its bounds never loads it.
"""
from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from mha_export.infer.pte_runner import load_program, loading
from mha_runtime.artifact.errors import ArtifactError, ContractError, first_line
from mha_runtime.decoder.contract import PTE_FORM
from mha_runtime.decoder.shapes import DecoderShapes

# The program's constant methods (written by mha_export.executorch.decoder).
CONFIG_METHOD, BOUNDS_METHOD = "gpt_config", "gpt_bounds"


@contextlib.contextmanager
def one_torch_thread() -> Iterator[None]:
    """The binding clones each output with torch, whose OpenMP team splits a (1, V) copy across threads: on a
    loaded machine its barrier waited for a descheduled thread, 7.9 ms of a 9 ms step on gpt-mini (1.5-2 ms with
    one thread; gdb showed the main thread in gomp_team_barrier_wait_end under copy_). ExecuTorch's own pool
    (XNNPACK's threads) is not torch's and is left as it is."""
    saved = torch.get_num_threads()
    if saved == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


class PteGPT:
    """One loaded gpt.pte: its forward Method holds the cache, so one sequence at a time (a lock guards it)."""

    def __init__(self, data: bytes, config: dict[str, Any], shapes: DecoderShapes, bounds: dict[str, int], *,
                 where: str = PTE_FORM, threads: int | None = None) -> None:
        """`config`: the manifest's (the architecture's own dict, which the program's embedded one must equal);
        `shapes`: its contract.shapes."""
        self.data, self.config, self.shapes, self.bounds = data, config, shapes, bounds
        self.where, self.threads = where, threads
        self._method: Any = None
        self.lock = threading.Lock()

    def load(self) -> Any:
        if self._method is not None:
            return self._method
        with loading(self.where, self.threads) as runtime:
            self._program = load_program(runtime, self.data)  # kept: a Method outliving it crashes
            (text,) = self._program.load_method(CONFIG_METHOD).execute([])
            bounds = list(self._program.load_method(BOUNDS_METHOD).execute([]))
            method = self._program.load_method("forward")
        expected = [self.bounds["batch"], self.bounds["context_length"], self.bounds["max_prefill_tokens"]]
        if json.loads(text) != self.config or bounds != expected:
            raise ArtifactError(f"{self.where}: the program was built for another config or bounds (config "
                                f"{text}, bounds {bounds}; the manifest says bounds {expected})")
        self._method = method
        return method

    def forward(self, ids: list[int], start: int) -> np.ndarray:
        """ids (T,) at positions start .. start + T - 1 -> (V,) logits of the last one; bounds checked first."""
        t, c = len(ids), self.bounds["context_length"]
        if not 1 <= t <= self.bounds["max_prefill_tokens"]:
            raise ContractError(f"{self.where}: {t} tokens in one call, expected "
                                f"1..{self.bounds['max_prefill_tokens']}")
        if start < 0 or start + t > c:
            raise ContractError(f"{self.where}: positions {start}..{start + t - 1} are beyond its context_length {c}")
        method = self.load()
        inputs = [torch.tensor([ids], dtype=torch.int64), torch.tensor([start], dtype=torch.int64)]
        with self.lock, one_torch_thread():
            try:
                (out,) = method.execute(inputs)
            except Exception as exc:
                raise ArtifactError(f"{self.where}: ExecuTorch failed at {t} tokens from {start} "
                                    f"({first_line(exc)})") from None
        return out.numpy()[0]  # (V,): the binding returns a clone (its own tensor)

    def decoder(self) -> PteDecoder:
        return PteDecoder(self)


class PteDecoder:
    """mha_runtime.decoder.decoder.Decoder over gpt.pte: batch 1 (its bound)."""

    def __init__(self, program: PteGPT) -> None:
        self.program = program
        self.lengths: list[int] = []

    def _one(self, rows: int) -> None:
        if rows != self.program.bounds["batch"]:
            raise ContractError(f"{self.program.where}: batch {rows}, the program's bound is batch "
                                f"{self.program.bounds['batch']}")

    def prefill(self, prompts: list[list[int]]) -> np.ndarray:
        self._one(len(prompts))
        logits = self.program.forward(list(prompts[0]), 0)[None]  # (1, V)
        self.lengths = [len(prompts[0])]
        return logits

    def step(self, tokens: list[int], active: list[bool]) -> np.ndarray:
        self._one(len(tokens))
        if not active[0]:  # a stopped row: nothing to compute (batch 1), its cache stays as it is
            return np.zeros((1, self.program.shapes.vocab_size), np.float32)
        logits = self.program.forward([tokens[0]], self.lengths[0])[None]
        self.lengths = [self.lengths[0] + 1]
        return logits


# The `mha.runners` entry point `gpt-executorch` (export/pyproject.toml): gpt.pte from bytes the caller has verified,
# called as factory(data, config, shapes, bounds, where=, threads=) (mha_runtime.executorch.decoder.pte_program).
gpt_pte_program = PteGPT
