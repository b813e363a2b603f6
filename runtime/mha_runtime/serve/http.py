"""The HTTP skeleton every model kind is served through, without the server: routes, the health and contract
routes, the refusals and the 500 line. A kind gives its one POST route (`KindService.route`) and its handler
(`work`); Ray Serve wraps the service (deployment.py), tests drive it directly.

    POST <route>       the kind's work: /v1/context (attention), /v1/generate (GPT)
    GET  /v1/health    {"status": "ok", ...the kind's counts}
    GET  /v1/contract  the model's name, files, config, I/O contract, tolerance and server limits

A malformed request is 400 (a RequestError or a ContractError), an unknown path 404, a wrong method 405 (HEAD is
answered where GET is), a body over its limit 413, a body that stalls or trickles 408; anything else 500 with one
line, the traceback going to the replica's log. The body of every refusal is {"error": "<one line>"}.
"""
from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from mha_runtime.artifact.errors import ContractError, RequestError, cut, first_line

HEALTH, CONTRACT = "/v1/health", "/v1/contract"
# Longest pause between two pieces of a request's body (nginx's client_body_timeout is the same idea, at 60 s):
# a body is a few KB to MB sent at once, and a stalled one holds a replica's slot.
BODY_IDLE_S = 10.0
# And a least rate, as Apache's mod_reqtimeout does it ("body=20,MinRate=500"): BODY_GRACE_S for the body, one more
# second for every BODY_MIN_RATE bytes that came. A client sending a byte every few seconds never trips the idle
# limit, and held a slot as long as it liked.
BODY_GRACE_S, BODY_MIN_RATE = 20.0, 500
JSON = "application/json"
SSE = "text/event-stream"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes
    content_type: str = JSON
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class StreamReply:
    """A 200 whose body is produced as the work runs (a GPT's Server-Sent Events)."""

    chunks: AsyncIterator[bytes]
    content_type: str = SSE


def error_reply(status: int, message: str) -> Reply:
    """{"error": message}, a message of several lines joined into one."""
    line = " ".join(part.strip() for part in message.splitlines() if part.strip())
    return Reply(status, json.dumps({"error": line}).encode())


def media_type(content_type: str | None) -> str:
    """'application/json; charset=utf-8' -> 'application/json'."""
    return (content_type or "").split(";")[0].strip().lower()


async def read_limited(headers: Mapping[str, str], body: AsyncIterator[bytes], limit: int, reason: str,
                       idle_s: float = BODY_IDLE_S, grace_s: float = BODY_GRACE_S,
                       min_rate: float = BODY_MIN_RATE) -> bytes:
    """The whole body, or RequestError 413 as soon as it is known to be over `limit`: from Content-Length before
    reading anything, else while streaming (a chunked or lying body). `reason` says how the limit is made.
    A body that stalls for `idle_s`, or is not all there after `grace_s` + one second per `min_rate` bytes, is 408:
    stalled or trickling uploads held every slot of a replica, its health route too."""
    declared = headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise RequestError(f"Content-Length: expected an integer, got {declared!r}") from None
        if size > limit:
            raise RequestError(f"body of {size} bytes is over the limit of {limit} bytes ({reason})", status=413)
    chunks, total = [], 0
    stream = aiter(body)
    clock = asyncio.get_running_loop().time
    start = clock()
    while True:
        left = start + grace_s + total / min_rate - clock()
        try:
            chunk = await asyncio.wait_for(anext(stream), max(0.0, min(idle_s, left)))
        except StopAsyncIteration:
            break
        except TimeoutError:
            said = "" if declared is None else f" of the {cut(declared)} its Content-Length says"
            if left < idle_s:
                raise RequestError(f"body: {total} bytes{said} in {clock() - start:.0f} s, under {min_rate:g} bytes/s "
                                   f"after the first {grace_s:g} s; send the whole body", status=408) from None
            raise RequestError(f"body: no bytes for {idle_s:g} s after {total}{said}; send the whole body",
                               status=408) from None
        total += len(chunk)
        if total > limit:
            raise RequestError(f"body is over the limit of {limit} bytes ({reason})", status=413)
        chunks.append(chunk)
    return b"".join(chunks)


class KindService:
    """One model kind's HTTP service: subclasses set `route` and implement `work` (and `health` for counts)."""

    route: str  # the kind's POST route

    def __init__(self, info: dict[str, Any]) -> None:
        self.info = info
        self.routes = {self.route: "POST", HEALTH: "GET", CONTRACT: "GET"}
        self.in_flight = 0  # requests inside handle: the attention replica's lone-request shortcut reads it

    def health(self) -> dict[str, Any]:
        """The kind's counts beside {"status": "ok"}."""
        return {}

    async def work(self, headers: Mapping[str, str], body: AsyncIterator[bytes]) -> Reply | StreamReply:
        """The POST route: one request's answer (RequestError or ContractError for a malformed one)."""
        raise NotImplementedError

    async def handle(self, method: str, path: str, headers: Mapping[str, str],
                     body: AsyncIterator[bytes]) -> Reply | StreamReply:
        path = path.rstrip("/") or "/"
        if method == "HEAD" and self.routes.get(path) == "GET":  # RFC 9110: a GET route answers HEAD too; the HTTP
            method = "GET"  # server (uvicorn, under Ray Serve's proxy) sends the headers alone
        if path not in self.routes:
            listed = ", ".join(f"{m} {p}" for p, m in self.routes.items())
            return error_reply(404, f"no route {cut(path, 80)}; routes: {listed}")
        if method != self.routes[path]:
            return error_reply(405, f"{method} {path}: expected {self.routes[path]}")
        self.in_flight += 1
        try:
            if path == HEALTH:
                return Reply(200, json.dumps({"status": "ok", **self.health()}).encode())
            if path == CONTRACT:
                return Reply(200, json.dumps(self.info).encode())
            return await self.work(headers, body)
        except RequestError as exc:
            return error_reply(exc.status, str(exc))
        except ContractError as exc:
            return error_reply(400, str(exc))
        except Exception as exc:  # an internal failure: one line to the client, the traceback to the replica's log
            log.exception("internal error on %s %s", method, path)
            return error_reply(500, f"internal error: {type(exc).__name__}: {first_line(exc)}")
        finally:
            self.in_flight -= 1
