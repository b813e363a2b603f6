"""The HTTP API without the server: routes, body limit, status codes. Ray Serve wraps it (app.py);
tests drive it directly.

    POST /v1/context   {"x": [[[...]]]} or a .npy body -> the context in the same format
    GET  /v1/health    {"status": "ok"}
    GET  /v1/contract  the model's name, file, sha256, config, I/O contract, tolerance and server limits

A contract violation, a malformed body or an unknown JSON key is 400; a body over its format's limit, or a batch
over the server's max batch, 413 (well-formed, but more than this server takes at once: split it); anything else
500. The body of every refusal is {"error": "<one line>"}.
"""
from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mha_runtime.artifact.config import MHAConfig
from mha_runtime.artifact.contract import INPUT_NAME, check_input
from mha_runtime.artifact.errors import ContractError, RequestError, cut, first_line
from mha_runtime.serve.wire import JSON, body_limit, decode_request, encode_answer, limit_reason, request_format

CONTEXT, HEALTH, CONTRACT = "/v1/context", "/v1/health", "/v1/contract"
ROUTES = {CONTEXT: "POST", HEALTH: "GET", CONTRACT: "GET"}
# Response headers that say how the request was batched (the load test counts them).
BATCH_REQUESTS, BATCH_TOKENS = "x-mha-batch-requests", "x-mha-batch-tokens"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Answer:
    """One request's output and the batch it rode in: how many requests, padded to how many tokens."""

    context: np.ndarray
    batch_requests: int
    batch_tokens: int


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes
    content_type: str = JSON
    headers: dict[str, str] = field(default_factory=dict)


def error_reply(status: int, message: str) -> Reply:
    """{"error": message}, a message of several lines joined into one."""
    line = " ".join(part.strip() for part in message.splitlines() if part.strip())
    return Reply(status, json.dumps({"error": line}).encode())


def route_refusal(method: str, path: str, routes: Mapping[str, str]) -> Reply | None:
    """404 for a path not in `routes` (path -> method), 405 for the wrong method; None when it is routed."""
    if path not in routes:
        return error_reply(404, f"no route {cut(path, 80)}; routes: {', '.join(f'{m} {p}' for p, m in routes.items())}")
    if method != routes[path]:
        return error_reply(405, f"{method} {path}: expected {routes[path]}")
    return None


class ContextService:
    """Routes one HTTP request; `infer` runs one checked input (B, T, d_in) and may batch it with others.
    `max_batch` bounds each request's batch and, through wire.body_limit, its body."""

    def __init__(self, *, config: MHAConfig, info: dict[str, Any], max_batch: int,
                 infer: Callable[[np.ndarray], Awaitable[Answer]]) -> None:
        self.config = config
        self.info = info
        self.max_batch = max_batch
        self.infer = infer

    async def handle(self, method: str, path: str, headers: Mapping[str, str], body: AsyncIterator[bytes]) -> Reply:
        path = path.rstrip("/") or "/"
        refused = route_refusal(method, path, ROUTES)
        if refused is not None:
            return refused
        try:
            if path == HEALTH:
                return Reply(200, json.dumps({"status": "ok"}).encode())
            if path == CONTRACT:
                return Reply(200, json.dumps(self.info).encode())
            return await self._context(headers, body)
        except RequestError as exc:
            return error_reply(exc.status, str(exc))
        except ContractError as exc:
            return error_reply(400, str(exc))
        except Exception as exc:  # an internal failure: one line to the client, the traceback to the replica's log
            log.exception("internal error on %s %s", method, path)
            return error_reply(500, f"internal error: {type(exc).__name__}: {first_line(exc)}")

    async def _context(self, headers: Mapping[str, str], body: AsyncIterator[bytes]) -> Reply:
        content_type = headers.get("content-type")
        fmt = request_format(content_type)  # the limit depends on it; another Content-Type is refused unread
        limit = body_limit(self.config, self.max_batch, fmt)
        data = await read_limited(headers, body, limit, limit_reason(self.config, self.max_batch, fmt))
        array, fmt = decode_request(data, content_type)
        x = check_input(array, self.config)  # before batching: one bad request never fails a batch
        if x.shape[0] > self.max_batch:  # after the contract check, so that a wrong rank is named as such
            raise RequestError(f"input {INPUT_NAME!r}: batch {x.shape[0]} is over this server's max batch "
                               f"{self.max_batch} (--max-batch); send at most {self.max_batch} per request",
                               status=413)
        answer = await self.infer(x)
        payload, content_type = encode_answer(answer.context, fmt)
        return Reply(200, payload, content_type, {BATCH_REQUESTS: str(answer.batch_requests),
                                                  BATCH_TOKENS: str(answer.batch_tokens)})


async def read_limited(headers: Mapping[str, str], body: AsyncIterator[bytes], limit: int, reason: str) -> bytes:
    """The whole body, or RequestError 413 as soon as it is known to be over `limit`: from Content-Length before
    reading anything, else while streaming (a chunked or lying body). `reason` says how the limit is made."""
    declared = headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise RequestError(f"Content-Length: expected an integer, got {declared!r}") from None
        if size > limit:
            raise RequestError(f"body of {size} bytes is over the limit of {limit} bytes ({reason})", status=413)
    chunks, total = [], 0
    async for chunk in body:
        total += len(chunk)
        if total > limit:
            raise RequestError(f"body is over the limit of {limit} bytes ({reason})", status=413)
        chunks.append(chunk)
    return b"".join(chunks)
