"""The HTTP API without the server: routes, body limit, status codes. Ray Serve wraps it (serve_app.py);
tests drive it directly.

    POST /v1/context   {"x": [[[...]]]} or a .npy body -> the context in the same format
    GET  /v1/health    {"status": "ok"}
    GET  /v1/contract  the model's name, file, sha256, config, I/O contract, tolerance and server limits

A contract violation or a malformed body is 400, a body over the limit 413, anything else 500; the body of
every refusal is {"error": "<one line>"}.
"""
from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mha_runtime.artifact.config import MHAConfig
from mha_runtime.artifact.contract import check_input
from mha_runtime.artifact.errors import ContractError, RequestError, first_line
from mha_runtime.serve.wire import JSON, decode_request, encode_answer

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


class ContextService:
    """Routes one HTTP request; `infer` runs one checked input (B, T, d_in) and may batch it with others."""

    def __init__(self, *, config: MHAConfig, info: dict[str, Any], max_body: int,
                 infer: Callable[[np.ndarray], Awaitable[Answer]]) -> None:
        self.config = config
        self.info = info
        self.max_body = max_body
        self.infer = infer

    async def handle(self, method: str, path: str, headers: Mapping[str, str], body: AsyncIterator[bytes]) -> Reply:
        path = path.rstrip("/") or "/"
        if path not in ROUTES:
            return error_reply(404, f"no route {path}; routes: {', '.join(f'{m} {p}' for p, m in ROUTES.items())}")
        if method != ROUTES[path]:
            return error_reply(405, f"{method} {path}: expected {ROUTES[path]}")
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
        data = await read_limited(headers, body, self.max_body)
        array, fmt = decode_request(data, headers.get("content-type"))
        x = check_input(array, self.config)  # before batching: one bad request never fails a batch
        answer = await self.infer(x)
        payload, content_type = encode_answer(answer.context, fmt)
        return Reply(200, payload, content_type, {BATCH_REQUESTS: str(answer.batch_requests),
                                                  BATCH_TOKENS: str(answer.batch_tokens)})


async def read_limited(headers: Mapping[str, str], body: AsyncIterator[bytes], limit: int) -> bytes:
    """The whole body, or RequestError 413 as soon as it is known to be over `limit`: from Content-Length before
    reading anything, else while streaming (a chunked or lying body)."""
    declared = headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise RequestError(f"Content-Length: expected an integer, got {declared!r}") from None
        if size > limit:
            raise RequestError(f"body of {size} bytes is over the limit of {limit} bytes "
                               "(max batch x context_length x d_in values as JSON)", status=413)
    chunks, total = [], 0
    async for chunk in body:
        total += len(chunk)
        if total > limit:
            raise RequestError(f"body is over the limit of {limit} bytes "
                               "(max batch x context_length x d_in values as JSON)", status=413)
        chunks.append(chunk)
    return b"".join(chunks)
