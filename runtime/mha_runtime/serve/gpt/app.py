"""The Ray Serve deployment of a GPT folder: each replica holds one in-place decoder and its BatchEngine.

Imports ray at module level: only `mha_runtime.serve.launcher` (after setting Ray's environment) imports this module.
"""
from __future__ import annotations

from typing import Any

import ray
from ray import serve
from starlette.requests import Request
from starlette.responses import Response

from mha_runtime.gpt.decoder import InPlaceDecoder
from mha_runtime.gpt.generate import Generator
from mha_runtime.serve.gpt.engine import BatchEngine
from mha_runtime.serve.gpt.service import GenerateService
from mha_runtime.serve.options import ServeOptions
from mha_runtime.serve.replica import request_body, shipped_folder, to_response


def generator_from_files(files: dict[str, bytes], *, form: str, provider: str, threads: int | None) -> Generator:
    """A Generator from the folder's manifest and files, shipped by the driver through Ray's object store; every
    sha256 is checked again here (the session and tokenizer keep their bytes, so the folder can go)."""
    with shipped_folder(files) as folder:
        return Generator(folder, form=form, provider=provider, threads=threads)


@serve.deployment(ray_actor_options={"num_cpus": 0})  # Ray's default of 1 CPU each would leave replicas pending
class GenerateDeployment:
    """The HTTP ingress and the engine in one replica."""

    def __init__(self, refs: dict[str, Any], *, form: str, provider: str, threads: int | None, max_batch: int,
                 info: dict[str, Any]) -> None:
        files = {name: ray.get(ref) for name, ref in refs.items()}  # object refs: application() says why
        gen = generator_from_files(files, form=form, provider=provider, threads=threads)
        del files
        decoder = gen.decoder()
        assert isinstance(decoder, InPlaceDecoder)  # prepare_gpt refused the other form
        self.engine = BatchEngine(decoder, max_batch=max_batch, eos_id=gen.manifest.eos_id, tokenizer=gen.tokenizer)
        encode = gen.tokenizer.encode if gen.tokenizer is not None else None
        self.service = GenerateService(config=gen.config, info=info, engine=self.engine, encode=encode)

    async def __call__(self, request: Request) -> Response:
        reply = await self.service.handle(request.method, request.url.path, request.headers, request_body(request))
        return to_response(reply)

    def __del__(self) -> None:
        self.engine.closed = True


def application(options: ServeOptions, files: dict[str, bytes], info: dict[str, Any], settings: dict[str, Any]) -> Any:
    """The GPT's bound deployment. Requests past the slots wait in the replica's engine queue (they join at the next
    free slot), so Serve may hand a replica more than max_batch at once; Ray's default 5 would queue them in the
    proxy instead. The files go to the object store first and the deployment gets their refs: bound as bytes they
    would be pickled into the application's config, which Ray refuses for a 124M model (650 MB)."""
    refs = {name: ray.put(data) for name, data in files.items()}
    return GenerateDeployment.options(max_ongoing_requests=max(4 * options.max_batch, 32), **settings).bind(
        refs, form=info["model"], provider=options.provider, threads=options.threads, max_batch=options.max_batch,
        info=info)
