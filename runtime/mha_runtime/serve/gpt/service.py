"""The GPT's HTTP API without the server: routes, body limit, status codes, the stream. Ray Serve wraps it
(app.py); tests drive it directly.

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
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from mha_runtime.artifact.errors import RequestError, first_line
from mha_runtime.gpt.config import GPTConfig
from mha_runtime.serve.gpt.engine import BatchEngine
from mha_runtime.serve.gpt.job import Event, Job
from mha_runtime.serve.gpt.wire import (
    DONE_EVENT,
    ERROR_EVENT,
    GENERATE,
    SSE,
    GenerateRequest,
    generate_body_limit,
    limit_reason,
    parse_generate,
    sse_event,
)
from mha_runtime.serve.service import CONTRACT, HEALTH, Reply, error_reply, read_limited, route_refusal

ROUTES = {GENERATE: "POST", HEALTH: "GET", CONTRACT: "GET"}
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StreamReply:
    """A 200 whose body is produced as the generation runs."""

    chunks: AsyncIterator[bytes]
    content_type: str = SSE


class GenerateService:
    """Routes one HTTP request; generations go to `engine`."""

    def __init__(self, *, config: GPTConfig, info: dict[str, Any], engine: BatchEngine,
                 encode: Callable[[str], list[int]] | None) -> None:
        self.config, self.info, self.engine, self.encode = config, info, engine, encode
        self.limit = generate_body_limit(config)

    async def handle(self, method: str, path: str, headers: Mapping[str, str],
                     body: AsyncIterator[bytes]) -> Reply | StreamReply:
        path = path.rstrip("/") or "/"
        refused = route_refusal(method, path, ROUTES)
        if refused is not None:
            return refused
        try:
            if path == HEALTH:
                return Reply(200, json.dumps({"status": "ok", **self.engine.status()}).encode())
            if path == CONTRACT:
                return Reply(200, json.dumps(self.info).encode())
            kind = (headers.get("content-type") or "").split(";")[0].strip().lower()
            if kind not in ("", "application/json"):
                raise RequestError(f"Content-Type: expected application/json, got {kind!r}")
            data = await read_limited(headers, body, self.limit, limit_reason(self.config))
            request = parse_generate(data, self.encode, self.config)
        except RequestError as exc:
            return error_reply(exc.status, str(exc))
        except Exception as exc:  # an internal failure: one line to the client, the traceback to the log
            log.exception("internal error on %s %s", method, path)
            return error_reply(500, f"internal error: {type(exc).__name__}: {first_line(exc)}")
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
