"""Iteration-level batching of generations over the in-place cache (torch-free): one slot per generation.

The step thread and PREFILL_LANES prefill lanes share the decoder's session (ONNX Runtime runs concurrent calls
on one session):
- Each prefill lane takes waiting requests one at a time, whenever a slot is free for one (the shortest prompt
  first, the oldest once it has waited AGE_LIMIT_S), and prefills the prompt alone at batch 1 into its own
  one-row cache, so the prompt starts exactly as it would alone. It samples and
  sends the first token at once, copies the prompt's keys and values out, and hands the generation over.
- With two lanes a burst of new requests is not prefilled one after another.
- A prompt goes first: while a lane prefills, the step thread waits (at most PREFILL_FIRST_MAX_S) before its
  next step, as a prefill-first scheduler does: a prefill beside a running step is slower than alone on two
  cores, and the steps lost no tokens/s by waiting (docs/serving.md, "Prefill first").
- The step thread owns the batch cache. Before every step it pastes each handed-over prefix into a free slot's
  rows, then runs one step for the slots 0..n-1 (n: one past the highest busy slot; a free slot inside that range
  is fed token 0 at position 0 of its own rows, which nothing reads). A finished or cancelled generation leaves
  at once and its slot is reused.
So a new request waits for the prefills ahead of it, not for the running batch's steps, and while prompts are
prefilled the batch waits at most PREFILL_FIRST_MAX_S before each step. Rows never mix (attention is per row),
and each generation samples from its own PCG64 stream, so every answer equals the same request generated alone:
the proof is tests/serving/test_gpt_serve.py.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any

import numpy as np

from mha_runtime.artifact.errors import first_line
from mha_runtime.decoder.decoder import InPlaceDecoder
from mha_runtime.decoder.generate import EosIds, take_token
from mha_runtime.decoder.sampling import Sampler
from mha_runtime.decoder.tokenizer import GPTTokenizer, TextStream
from mha_runtime.serve.decoder.job import Job
from mha_runtime.serve.decoder.wire import TEXT

log = logging.getLogger(__name__)
# How often a request waiting for a free slot looks whether its client has left.
CANCEL_POLL_S = 0.05
# A prefill lane takes the shortest waiting prompt first, the oldest once it has waited this long.
AGE_LIMIT_S = 1.0
# Prefill lanes: the second one serves bursts (several requests waiting at once).
PREFILL_LANES = 2
# The longest the step thread waits for the prefills in progress before it steps anyway: about one decode step of
# the 124M model at batch 8. It bounds the gap a burst of new prompts puts between two tokens of the running
# generations, and keeps a burst's generations joining at different steps: with 0.5 s they all joined at one step,
# ended together and came back as one burst again (docs/serving.md, "Prefill first").
PREFILL_FIRST_MAX_S = 0.1
# One prompt's cache as a prefill lane hands it over: per layer (keys, values), each (H, min(T, C), D) (C: the layer's
# rows; a windowed layer holds its last C positions).
Prefix = list[tuple[np.ndarray, np.ndarray]]


class BatchEngine:
    """`submit` from any thread; prefills run on the engine's prefill lanes, steps on its step thread, at most
    `max_batch` generations at once."""

    def __init__(self, decoder: InPlaceDecoder, *, max_batch: int, eos_id: EosIds,
                 tokenizer: GPTTokenizer | None) -> None:
        self.decoder, self.shapes = decoder, decoder.shapes
        self.max_batch, self.eos_id, self.tokenizer = max_batch, eos_id, tokenizer
        decoder.allocate(max_batch)
        decoder.step_rows([0], [0])  # warm-up of every binding: the first requests are not slow
        self.lanes = [InPlaceDecoder(decoder.session, decoder.shapes, decoder.where) for _ in range(PREFILL_LANES)]
        for lane in self.lanes:  # each lane's own one-row cache, warmed up too
            lane.allocate(1)
            lane.prefill_row(0, [0])
        self.slots: list[Job | None] = [None] * max_batch
        self.ready: queue.SimpleQueue[tuple[Job, Prefix] | None] = queue.SimpleQueue()
        self.room = threading.Condition()  # guards slots, waiting and promised; notified on submit and free
        self.promised = 0  # slots held for generations in a prefill lane or handed over, not yet pasted
        self.waiting: list[Job] = []  # submitted, not yet taken by a prefill lane (in no order)
        self.prefilling = 0  # generations being prefilled (one per busy lane)
        self.steps = 0  # decode steps run (tests read it: generations must share steps)
        self.yielding = False  # the step thread is waiting for a prefill (tests wait on it, not on a clock)
        self.cancelled = 0  # generations whose client left before the end, their slot freed early
        self.closed = False
        self.lane_threads = [threading.Thread(target=self._lane_loop, args=(lane,), name=f"gpt-prefill-{i}",
                                              daemon=True) for i, lane in enumerate(self.lanes)]
        self.thread = threading.Thread(target=self._loop, name="gpt-engine", daemon=True)
        for thread in self.lane_threads:
            thread.start()
        self.thread.start()

    def submit(self, job: Job) -> None:
        with self.room:
            self.waiting.append(job)
            self.room.notify_all()

    def close(self) -> None:
        with self.room:
            self.closed = True
            self.room.notify_all()
        for thread in self.lane_threads:
            thread.join(timeout=30)
        self.ready.put(None)
        self.thread.join(timeout=30)

    def busy(self) -> int:
        return sum(job is not None for job in self.slots)

    def status(self) -> dict[str, int]:
        """What GET /v1/health reports: generations running and waiting, decode steps, generations cancelled."""
        queued = len(self.waiting) + self.prefilling + self.ready.qsize()
        return {"running": self.busy(), "queued": queued,
                "steps": self.steps, "cancelled": self.cancelled}

    # ---- the prefill lanes --------------------------------------------------------------------------------------

    def _lane_loop(self, lane: InPlaceDecoder) -> None:
        while True:
            with self.room:  # a waiting request, and a slot that no running or handed-over generation holds
                while True:
                    if self.closed:
                        return
                    self._drop_cancelled()
                    if self.waiting and self.busy() + self.promised < self.max_batch:
                        break
                    self.room.wait(timeout=CANCEL_POLL_S if self.waiting else None)
                job = self._next_job()
                self.promised += 1
                self.prefilling += 1
            prefix = None
            try:
                prefix = self._prefill(job, lane)
            except Exception as exc:  # an ONNX Runtime failure: fail this generation, keep serving
                log.exception("prefill failed")
                job.emit(("error", {"error": f"internal error: {type(exc).__name__}: {first_line(exc)}"}))
            finally:  # even when telling the client failed: a count left up would hold every later step back
                with self.room:  # handed over before the step thread, waiting on `room`, wakes to join it
                    self.prefilling -= 1
                    if prefix is None:
                        self.promised -= 1
                    else:
                        self.ready.put((job, prefix))
                    self.room.notify_all()

    def _drop_cancelled(self) -> None:
        """Drop the waiting requests whose client has left (under `room`)."""
        for job in [j for j in self.waiting if j.cancelled]:
            self.waiting.remove(job)
            self.cancelled += 1

    def _next_job(self) -> Job:
        """The shortest waiting prompt (a burst's short prompts are not kept behind its long ones), unless the
        oldest request has waited AGE_LIMIT_S: then that one, so no prompt waits for ever."""
        oldest = min(self.waiting, key=lambda j: j.arrived)
        if time.perf_counter() - oldest.arrived >= AGE_LIMIT_S:
            job = oldest
        else:
            job = min(self.waiting, key=lambda j: (len(j.request.prompt_ids), j.arrived))
        self.waiting.remove(job)
        return job

    def _prefill(self, job: Job, lane: InPlaceDecoder) -> Prefix | None:
        """The prompt alone into the lane's row; the first token sent. -> its keys and values, or None when the
        generation already ended (its first token was eos, or max_new_tokens is 1)."""
        r = job.request
        job.sampler = Sampler(1, temperature=r.temperature, top_k=r.top_k, seed=r.seed,
                              vocab_size=self.shapes.vocab_size)
        job.text = TextStream(self.tokenizer) if self.tokenizer is not None else None
        logits = lane.prefill_row(0, r.prompt_ids)[None]  # (1, V)
        job.past = len(r.prompt_ids)
        self._take(job, logits)
        if job.stop:
            self._tell_done(job)
            return None
        t = job.past  # a layer's resident rows: min(t, its rows) (a windowed layer keeps its last W positions)
        return [(k[0, :, :min(t, k.shape[2])].copy(), v[0, :, :min(t, v.shape[2])].copy())
                for k, v in zip(lane.keys, lane.values, strict=True)]  # (H, min(T, C), D) each

    # ---- the step thread ----------------------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self.closed:
            try:
                self._yield_to_prefills()
                self._join(block=self.busy() == 0)
                self._free_cancelled()
                if self.busy():
                    self._step()
            except Exception as exc:  # an ONNX Runtime failure: fail the generations in flight, keep serving
                log.exception("generation step failed")
                self._fail_all(f"internal error: {type(exc).__name__}: {first_line(exc)}")

    def _yield_to_prefills(self) -> None:
        """Prefill first: while a lane prefills, wait (at most PREFILL_FIRST_MAX_S) before the next step."""
        deadline = time.perf_counter() + PREFILL_FIRST_MAX_S
        with self.room:
            try:
                while self.prefilling and self.busy() and not self.closed:
                    left = deadline - time.perf_counter()
                    if left <= 0:
                        return
                    self.yielding = True
                    self.room.wait(timeout=left)
            finally:
                self.yielding = False

    def _join(self, block: bool) -> None:
        """Paste every handed-over prefix into the lowest free slot (waiting for one when nothing runs)."""
        while True:
            try:
                item = self.ready.get(block=block)
            except queue.Empty:
                return
            block = False
            if item is None:  # close()
                return
            job, prefix = item
            with self.room:
                self.promised -= 1
                if job.cancelled:
                    self.cancelled += 1
                    self.room.notify_all()
                    continue
                slot = self.slots.index(None)  # the lowest: keeps the stepped range short
                for layer, (k, v) in enumerate(prefix):
                    self.decoder.keys[layer][slot, :, :k.shape[1]] = k
                    self.decoder.values[layer][slot, :, :v.shape[1]] = v
                self.slots[slot] = job

    def _take(self, job: Job, logits: np.ndarray) -> None:
        """Sample the job's next token from its (1, V) logits and tell the client; job.stop says if it ended."""
        assert job.sampler is not None
        token = job.sampler.next_ids(logits)[0]
        r = job.request
        job.stop = take_token(job.ids, token, prompt_tokens=len(r.prompt_ids), max_new_tokens=r.max_new_tokens,
                              eos_id=self.eos_id if r.stop_ids is None else r.stop_ids,  # a chat's own
                              context_length=self.shapes.context_length)
        now = time.perf_counter()
        if not job.first:
            job.first = now
        if job.stop != "eos":
            data: dict[str, Any] = {"id": token}
            if job.text is not None:
                data[TEXT] = job.text.push(token)
            job.emit(("token", data))

    def _tell_done(self, job: Job) -> None:
        if not job.cancelled:
            job.emit(("done", job.answer(time.perf_counter(), self.tokenizer)))

    def _finish(self, slot: int, error: str | None = None) -> None:
        with self.room:
            job = self.slots[slot]
            self.slots[slot] = None
            self.room.notify_all()
        if job is None:
            return
        if error is not None:
            job.emit(("error", {"error": error}))
        else:
            self._tell_done(job)

    def _free_cancelled(self) -> None:
        with self.room:
            for slot, job in enumerate(self.slots):
                if job is not None and job.cancelled:
                    self.slots[slot] = None
                    self.cancelled += 1
                    self.room.notify_all()

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
                self._take(job, logits[slot:slot + 1])
                if job.stop:
                    self._finish(slot)

    def _fail_all(self, line: str) -> None:
        for slot, job in enumerate(self.slots):
            if job is not None:
                self._finish(slot, error=line)
