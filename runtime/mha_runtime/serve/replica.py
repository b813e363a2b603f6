"""What every kind's model in a Ray Serve replica (serve/deployment.py) is and shares: the `KindReplica` protocol,
the folder's files as shipped through Ray's object store laid out again, a request's body as the services read it,
and a service's reply as Starlette's."""
from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse

from mha_runtime.artifact.errors import RequestError
from mha_runtime.serve.http import KindService, Reply, StreamReply


class KindReplica(Protocol):
    """A kind's model in one replica (attention/replica.py, decoder/replica.py), made by the kinds table's `replica`
    from the shipped files, the server's options and /v1/contract's answer; every request goes to its service."""

    service: KindService

    def close(self) -> None: ...


@contextmanager
def shipped_folder(files: dict[str, bytes]) -> Iterator[Path]:
    """The files the driver shipped (a replica on another node needs no copy of the folder), written into a
    temporary folder for the runner to open and check again by sha256; gone once the runner holds its bytes."""
    with tempfile.TemporaryDirectory(prefix="mha-serve-") as folder:
        for name, data in files.items():
            Path(folder, name).write_bytes(data)
        yield Path(folder)


async def request_body(request: Request) -> AsyncIterator[bytes]:
    """The body's chunks; a client that leaves mid-upload is the client's doing (a 400 nobody reads, no traceback
    in the log), not an internal error."""
    try:
        async for chunk in request.stream():
            yield chunk
    except ClientDisconnect:
        raise RequestError("body: the client disconnected before sending all of it") from None


def to_response(reply: Reply | StreamReply) -> Response:
    if isinstance(reply, StreamReply):
        return StreamingResponse(reply.chunks, media_type=reply.content_type, headers={"cache-control": "no-cache"})
    return Response(reply.body, status_code=reply.status, media_type=reply.content_type, headers=reply.headers)
