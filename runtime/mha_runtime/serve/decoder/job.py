"""One generation as the engine holds it (`Job`), what it tells its client (`Event`) and the answer body it ends
with; torch-free."""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mha_runtime.decoder.sampling import Sampler
from mha_runtime.decoder.tokenizer import GPTTokenizer, TextStream
from mha_runtime.serve.decoder.wire import (
    IDS,
    PROMPT_TOKENS,
    SEED,
    STOP,
    TEXT,
    TOKENS_PER_S,
    TTFT,
    GenerateRequest,
)

# What the engine tells a generation, in order: ("token", {"id", "text"?}) per new token, then exactly one of
# ("done", the answer object) or ("error", {"error": line}).
Event = tuple[str, dict[str, Any]]


@dataclass(eq=False)
class Job:
    """One generation: its request, how to tell its client, and where it stands."""

    request: GenerateRequest
    emit: Callable[[Event], None]  # called on the engine's thread; must not block
    arrived: float = field(default_factory=time.perf_counter)
    cancelled: bool = False  # set by the client's side; the engine frees the slot before its next step
    ids: list[int] = field(default_factory=list)
    stop: str = ""
    past: int = 0  # tokens in this slot's cache
    first: float = 0.0
    sampler: Sampler | None = None
    text: TextStream | None = None

    def answer(self, now: float, tokenizer: GPTTokenizer | None) -> dict[str, Any]:
        """The non-streaming body (and the `done` event): counts and timings as Generation defines them."""
        later = len(self.ids) - 1
        rest = now - self.first
        body: dict[str, Any] = {IDS: self.ids}
        if tokenizer is not None:
            body[TEXT] = tokenizer.decode(self.ids)
        assert self.sampler is not None
        body.update({STOP: self.stop, PROMPT_TOKENS: len(self.request.prompt_ids),
                     TTFT: round(self.first - self.arrived, 6),
                     TOKENS_PER_S: round(later / rest, 3) if later > 0 and rest > 0 else 0.0,
                     SEED: self.sampler.seed})
        return body
