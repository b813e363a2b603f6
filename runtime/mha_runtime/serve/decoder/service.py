"""The GPT's HTTP route in the one skeleton (serve/http.py: health, contract, refusals, the 500 line): body limit,
the answer or the stream. Ray Serve wraps it (gpt/replica.py); tests drive it directly.

    POST /v1/generate  wire.py's request (a prompt, or messages for the chat template) -> one JSON answer, or
                       Server-Sent Events with "stream": true
    GET  /v1/health    {"status": "ok", "running", "queued", "steps", "cancelled": counts of the engine}
    GET  /v1/contract  the model's name, files, config, I/O contract (with its shapes), tolerance and server limits

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
from mha_runtime.decoder.chat.folder import FolderChat
from mha_runtime.decoder.shapes import DecoderShapes
from mha_runtime.serve.decoder.engine import BatchEngine
from mha_runtime.serve.decoder.job import Event, Job
from mha_runtime.serve.decoder.wire import (
    DONE_EVENT,
    ERROR_EVENT,
    GENERATE,
    TOKEN_EVENT,
    GenerateRequest,
    generate_body_limit,
    limit_reason,
    parse_generate,
    sse_event,
)
from mha_runtime.serve.http import JSON, KindService, Reply, StreamReply, error_reply, media_type, read_limited


class GenerateService(KindService):
    """The GPT's route; generations go to `engine`."""

    route = GENERATE

    def __init__(self, *, shapes: DecoderShapes, info: dict[str, Any], engine: BatchEngine,
                 encode: Callable[[str], list[int]] | None, chat: FolderChat | None = None) -> None:
        super().__init__(info)
        self.shapes, self.engine, self.encode, self.chat = shapes, engine, encode, chat
        self.limit = generate_body_limit(shapes)

    def health(self) -> dict[str, Any]:
        return self.engine.status()

    async def work(self, headers: Mapping[str, str], body: AsyncIterator[bytes]) -> Reply | StreamReply:
        kind = media_type(headers.get("content-type"))
        if kind not in ("", JSON):
            raise RequestError(f"Content-Type: expected {JSON}, got {kind!r}")
        data = await read_limited(headers, body, self.limit, limit_reason(self.shapes))
        request = parse_generate(data, self.encode, self.shapes, self.chat)
        if request.stream:
            return StreamReply(sse_event(event, answer) async for event, answer in self._events(request))
        [(event, answer)] = [item async for item in self._events(request) if item[0] != TOKEN_EVENT]  # done or error
        return Reply(200, json.dumps(answer).encode()) if event == DONE_EVENT else error_reply(500, answer["error"])

    async def _events(self, request: GenerateRequest) -> AsyncIterator[Event]:
        """The generation's events as the engine tells them, up to its done or error event; submitted at the first."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[Event] = asyncio.Queue()
        job = Job(request, lambda event: loop.call_soon_threadsafe(events.put_nowait, event))
        self.engine.submit(job)
        try:
            while True:
                event, data = await events.get()
                yield event, data
                if event in (DONE_EVENT, ERROR_EVENT):
                    return
        finally:  # a no-op once done; frees the slot when the client left early (the server cancels the stream too)
            job.cancelled = True
