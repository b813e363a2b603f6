"""The Ray Serve deployment of a GPT folder: each replica holds one in-place decoder and its BatchEngine.

Imports ray at module level: only `mha_runtime.serve.launcher` (after setting Ray's environment) imports this module.
"""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import ray
from ray import serve
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from mha_runtime.gpt.decoder import InPlaceDecoder
from mha_runtime.gpt.generate import Generator
from mha_runtime.serve.gpt.engine import BatchEngine
from mha_runtime.serve.gpt.service import GenerateService, StreamReply
from mha_runtime.serve.request_body import request_body


def generator_from_files(files: dict[str, bytes], *, form: str, provider: str, threads: int | None) -> Generator:
    """A Generator from the folder's manifest and files, shipped by the driver through Ray's object store; every
    sha256 is checked again here (the session and tokenizer keep their bytes, so the folder can go)."""
    with tempfile.TemporaryDirectory(prefix="mha-serve-") as folder:
        for name, data in files.items():
            Path(folder, name).write_bytes(data)
        return Generator(folder, form=form, provider=provider, threads=threads)


@serve.deployment(ray_actor_options={"num_cpus": 0})  # Ray's default of 1 CPU each would leave replicas pending
class GenerateDeployment:
    """The HTTP ingress and the engine in one replica."""

    def __init__(self, refs: dict[str, Any], *, form: str, provider: str, threads: int | None, max_batch: int,
                 info: dict[str, Any]) -> None:
        files = {name: ray.get(ref) for name, ref in refs.items()}  # object refs: launcher._application says why
        gen = generator_from_files(files, form=form, provider=provider, threads=threads)
        del files
        decoder = gen.decoder()
        assert isinstance(decoder, InPlaceDecoder)  # launcher.prepare refused the other form
        self.engine = BatchEngine(decoder, max_batch=max_batch, eos_id=gen.manifest.eos_id, tokenizer=gen.tokenizer)
        encode = gen.tokenizer.encode if gen.tokenizer is not None else None
        self.service = GenerateService(config=gen.config, info=info, engine=self.engine, encode=encode)

    async def __call__(self, request: Request) -> Response:
        reply = await self.service.handle(request.method, request.url.path, request.headers, request_body(request))
        if isinstance(reply, StreamReply):
            return StreamingResponse(reply.chunks, media_type=reply.content_type,
                                     headers={"cache-control": "no-cache"})
        return Response(reply.body, status_code=reply.status, media_type=reply.content_type, headers=reply.headers)

    def __del__(self) -> None:
        self.engine.closed = True
