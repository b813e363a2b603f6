"""The GPT's HTTP route in the one skeleton (serve/http.py: health, contract, refusals, the 500 line): body limit,
the answer or the stream. Ray Serve wraps it (gpt/replica.py); tests drive it directly.

    POST /v1/generate  wire.py's request -> one JSON answer, or Server-Sent Events with "stream": true
    GET  /v1/health    {"status": "ok", "running", "queued", "steps", "cancelled": counts of the engine}
    GET  /v1/contract  the model's name, files, config, I/O contract, tolerance and server limits

A malformed request is 400 and a body over the limit 413, each {"error": "<one line>"}, before the request takes a
slot. A client that goes away (its stream cancelled) marks its generation cancelled: the engine frees the slot
before its next step.
"""
from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from mha_runtime.artifact.errors import RequestError
from mha_runtime.gpt.config import GPTConfig
from mha_runtime.serve.gpt.engine import BatchEngine
from mha_runtime.serve.gpt.job import Event, Job
from mha_runtime.serve.gpt.wire import (
    DONE_EVENT,
    ERROR_EVENT,
    GENERATE,
    GenerateRequest,
    generate_body_limit,
    limit_reason,
    parse_generate,
    sse_event,
)
from mha_runtime.serve.http import KindService, Reply, StreamReply, error_reply, read_limited


class GenerateService(KindService):
    """The GPT's route; generations go to `engine`."""

    route = GENERATE

    def __init__(self, *, config: GPTConfig, info: dict[str, Any], engine: BatchEngine,
                 encode: Callable[[str], list[int]] | None) -> None:
        super().__init__(info)
        self.config, self.engine, self.encode = config, engine, encode
        self.limit = generate_body_limit(config)

    def health(self) -> dict[str, Any]:
        return self.engine.status()

    async def work(self, headers: Mapping[str, str], body: AsyncIterator[bytes]) -> Reply | StreamReply:
        kind = (headers.get("content-type") or "").split(";")[0].strip().lower()
        if kind not in ("", "application/json"):
            raise RequestError(f"Content-Type: expected application/json, got {kind!r}")
        data = await read_limited(headers, body, self.limit, limit_reason(self.config))
        request = parse_generate(data, self.encode, self.config)
        if request.stream:
            return StreamReply(self._stream(request))
        return await self._whole(request)

    def _start(self, request: GenerateRequest) -> tuple[Job, asyncio.Queue[Event]]:
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[Event] = asyncio.Queue()
        job = Job(request, lambda event: loop.call_soon_threadsafe(events.put_nowait, event))
        self.engine.submit(job)
        return job, events

    async def _whole(self, request: GenerateRequest) -> Reply:
        job, events = self._start(request)
        try:
            while True:
                event, data = await events.get()
                if event == DONE_EVENT:
                    return Reply(200, json.dumps(data).encode())
                if event == ERROR_EVENT:
                    return error_reply(500, data["error"])
        finally:
            job.cancelled = True  # a no-op once done; frees the slot when the client left early

    async def _stream(self, request: GenerateRequest) -> AsyncIterator[bytes]:
        job, events = self._start(request)
        try:
            while True:
                event, data = await events.get()
                yield sse_event(event, data)
                if event in (DONE_EVENT, ERROR_EVENT):
                    return
        finally:  # also when the server cancels this generator because the client disconnected
            job.cancelled = True
