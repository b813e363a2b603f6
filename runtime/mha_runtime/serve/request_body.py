"""A request's body as the services read it: chunks from Starlette, where a client that leaves mid-upload is the
client's doing (a 400 nobody reads, no traceback in the log), not an internal error."""
from __future__ import annotations

from collections.abc import AsyncIterator

from starlette.requests import ClientDisconnect, Request

from mha_runtime.artifact.errors import RequestError


async def request_body(request: Request) -> AsyncIterator[bytes]:
    try:
        async for chunk in request.stream():
            yield chunk
    except ClientDisconnect:
        raise RequestError("body: the client disconnected before sending all of it") from None
