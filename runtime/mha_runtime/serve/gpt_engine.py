"""Iteration-level batching of generations over the in-place cache (torch-free): one slot per generation.

One thread owns the decoder. Before every step it admits queued requests into free slots (each prompt prefilled
alone at batch 1 into its slot's rows of the cache, so it starts exactly as it would alone), then runs one step
for the slots 0..n-1 (n: one past the highest busy slot; a free slot inside that range is fed token 0 at
position 0 of its own rows, which nothing reads). A finished or cancelled generation leaves at once and its slot
is reused by the next request. Rows never mix (attention is per row), and each generation samples from its own
PCG64 stream, so every answer equals the same request generated alone: the proof is tests/test_gpt_serve.py.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mha_runtime.artifact.errors import first_line
from mha_runtime.gpt.decoder import InPlaceDecoder
from mha_runtime.gpt.generate import take_token
from mha_runtime.gpt.sampling import Sampler
from mha_runtime.gpt.tokenizer import GPTTokenizer, TextStream
from mha_runtime.serve.gpt_wire import (
    IDS,
    PROMPT_TOKENS,
    SEED,
    STOP,
    TEXT,
    TOKENS_PER_S,
    TTFT,
    GenerateRequest,
)

log = logging.getLogger(__name__)
# Prompt tokens prefilled between two decode steps (at least one prompt, however long).
PREFILL_BUDGET = 128
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


class BatchEngine:
    """`submit` from any thread; the generations run on the engine's own thread, at most `max_batch` at once."""

    def __init__(self, decoder: InPlaceDecoder, *, max_batch: int, eos_id: int | None,
                 tokenizer: GPTTokenizer | None) -> None:
        self.decoder, self.config = decoder, decoder.config
        self.max_batch, self.eos_id, self.tokenizer = max_batch, eos_id, tokenizer
        decoder.allocate(max_batch)
        self.slots: list[Job | None] = [None] * max_batch
        self.queue: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self.pending: Job | None = None  # taken from the queue, waiting for the next step's prefill budget
        self.steps = 0  # decode steps run (tests read it: generations must share steps)
        self.cancelled = 0  # generations whose client left before the end, their slot freed early
        self.closed = False
        self.thread = threading.Thread(target=self._loop, name="gpt-engine", daemon=True)
        self.thread.start()

    def submit(self, job: Job) -> None:
        self.queue.put(job)

    def close(self) -> None:
        self.closed = True
        self.queue.put(None)
        self.thread.join(timeout=30)

    def busy(self) -> int:
        return sum(job is not None for job in self.slots)

    def status(self) -> dict[str, int]:
        """What GET /v1/health reports: generations running and waiting, decode steps, generations cancelled."""
        return {"running": self.busy(), "queued": self.queue.qsize() + (self.pending is not None), "steps": self.steps,
                "cancelled": self.cancelled}

    def _loop(self) -> None:
        while not self.closed:
            try:
                self._admit(block=self.busy() == 0)
                self._free_cancelled()
                if self.busy():
                    self._step()
            except Exception as exc:  # an ONNX Runtime failure: fail the generations in flight, keep serving
                log.exception("generation step failed")
                self._fail_all(f"internal error: {type(exc).__name__}: {first_line(exc)}")

    def _admit(self, block: bool) -> None:
        """Prefill queued jobs into free slots (waiting for one when nothing runs): at least one, then more while
        this step's prompt tokens stay within PREFILL_BUDGET. Admitting a whole burst before one step would start
        (and so end) its generations on the same step, and every later burst would queue behind a whole burst of
        prefills again; spread over steps, each new request finds few prefills ahead of it."""
        budget = PREFILL_BUDGET
        while None in self.slots:
            if self.pending is None:
                try:
                    self.pending = self.queue.get(block=block)
                except queue.Empty:
                    return
            job, block = self.pending, False
            if job is None:  # close()
                return
            if job.cancelled:
                self.pending = None
                self.cancelled += 1
                continue
            tokens = len(job.request.prompt_ids)
            if budget < PREFILL_BUDGET and tokens > budget:  # waits for the next step, first in line
                return
            self.pending, budget = None, budget - tokens
            slot = self.slots.index(None)  # the lowest: keeps the stepped range short
            self.slots[slot] = job
            try:
                self._prefill(slot, job)
            except Exception as exc:
                log.exception("prefill failed")
                self._finish(slot, error=f"internal error: {type(exc).__name__}: {first_line(exc)}")

    def _prefill(self, slot: int, job: Job) -> None:
        r = job.request
        job.sampler = Sampler(1, temperature=r.temperature, top_k=r.top_k, seed=r.seed,
                              vocab_size=self.config.vocab_size)
        job.text = TextStream(self.tokenizer) if self.tokenizer is not None else None
        logits = self.decoder.prefill_row(slot, r.prompt_ids)[None]  # (1, V)
        job.past = len(r.prompt_ids)
        self._take(slot, job, logits)

    def _take(self, slot: int, job: Job, logits: np.ndarray) -> None:
        """Sample the job's next token from its (1, V) logits, tell the client, and free the slot if it stopped."""
        assert job.sampler is not None
        token = job.sampler.next_ids(logits)[0]
        r = job.request
        job.stop = take_token(job.ids, token, prompt_tokens=len(r.prompt_ids), max_new_tokens=r.max_new_tokens,
                              eos_id=self.eos_id, context_length=self.config.context_length)
        now = time.perf_counter()
        if not job.first:
            job.first = now
        if job.stop != "eos":
            data: dict[str, Any] = {"id": token}
            if job.text is not None:
                data[TEXT] = job.text.push(token)
            job.emit(("token", data))
        if job.stop:
            self._finish(slot)

    def _finish(self, slot: int, error: str | None = None) -> None:
        job = self.slots[slot]
        self.slots[slot] = None
        if job is None:
            return
        if error is not None:
            job.emit(("error", {"error": error}))
        elif not job.cancelled:
            job.emit(("done", job.answer(time.perf_counter(), self.tokenizer)))

    def _free_cancelled(self) -> None:
        if self.pending is not None and self.pending.cancelled:
            self.pending = None
            self.cancelled += 1
        for slot, job in enumerate(self.slots):
            if job is not None and job.cancelled:
                self.slots[slot] = None
                self.cancelled += 1

    def _step(self) -> None:
        """One token for every busy slot, in one call over slots 0..n-1."""
        n = max(i for i, job in enumerate(self.slots) if job is not None) + 1
        tokens = [job.ids[-1] if job is not None else 0 for job in self.slots[:n]]
        past = [job.past if job is not None else 0 for job in self.slots[:n]]
        logits = self.decoder.step_rows(tokens, past)  # (n, V)
        self.steps += 1
        for slot in range(n):
            job = self.slots[slot]
            if job is not None:
                job.past += 1
                self._take(slot, job, logits[slot:slot + 1])

    def _fail_all(self, line: str) -> None:
        for slot, job in enumerate(self.slots):
            if job is not None:
                self._finish(slot, error=line)
