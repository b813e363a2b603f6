"""The Ray Serve deployment: each replica holds one OnnxRunner and batches requests with `@serve.batch`.

Imports ray at module level: only `mha_runtime.serve.launcher` (after setting Ray's environment) imports this module.
"""
from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
from ray import serve
from starlette.requests import Request
from starlette.responses import Response

from mha_runtime.infer.runner import OnnxRunner
from mha_runtime.serve.attention.batching import run_grouped, work
from mha_runtime.serve.attention.service import Answer, ContextService
from mha_runtime.serve.options import ServeOptions
from mha_runtime.serve.replica import request_body, shipped_folder, to_response


def runner_from_files(files: dict[str, bytes], *, model: str, provider: str, threads: int | None) -> OnnxRunner:
    """An OnnxRunner from the artifact's manifest and model bytes, shipped by the driver (replica.py)."""
    with shipped_folder(files) as folder:
        return OnnxRunner(folder, model=model, provider=provider, threads=threads)  # the session keeps the bytes


@serve.deployment(ray_actor_options={"num_cpus": 0})  # Ray's default of 1 CPU each would leave replicas pending
class ContextDeployment:
    """The HTTP ingress and the model in one replica: one hop from Serve's proxy to the runner."""

    def __init__(self, files: dict[str, bytes], *, model: str, provider: str, threads: int | None, max_batch: int,
                 batch_wait_s: float, info: dict[str, Any]) -> None:
        self.runner = runner_from_files(files, model=model, provider=provider, threads=threads)
        self.runner.run(np.zeros((1, 1, self.runner.config.d_in), np.float32))  # warm-up: the first request is not slow
        # The decorator's settings, per replica process (its arguments below are placeholders).
        self.run_batch.set_max_batch_size(max_batch)
        self.run_batch.set_batch_wait_timeout_s(batch_wait_s)
        self.cost = work(self.runner.config)
        # With no batch wait, a request alone in the replica skips the batcher's queue (below).
        self.bypass = batch_wait_s == 0.0
        self.in_flight = 0  # HTTP requests inside this replica's __call__
        self.service = ContextService(config=self.runner.config, info=info, max_batch=max_batch,
                                      infer=self.infer)

    async def infer(self, x: np.ndarray) -> Answer:
        """One checked input (B, T, d_in) -> its Answer. A request alone in the replica runs at once, on the loop,
        without `@serve.batch`'s queue and task hand-off (docs/measurements/serving.md, "The lone request skips the
        batcher"); a batcher would run it alone anyway. It first lets the loop turn once: requests already read
        come in, and then it batches with them. Without that turn, requests that queue in the sockets while one
        runs are taken one by one, each alone again, and behind HAProxy nothing was ever batched."""
        if self.bypass and self.in_flight == 1:
            await asyncio.sleep(0)  # one turn of the loop: requests already read get in first
            if self.in_flight == 1:
                out, size, tokens = run_grouped(self.runner.run, [x], self.cost)[0]
                return Answer(out, size, tokens)
        return await self.run_batch(x)

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.0)
    async def run_batch(self, xs: list[np.ndarray]) -> list[Answer]:
        """Requests of any lengths, padded into one ONNX Runtime call per length group (batching.py says why
        padding is exact, and when it is worth it). A batch of several runs on a thread so that this replica's
        event loop keeps accepting requests for the next batch; a lone request runs on the loop itself (the
        thread hop cost more than its own run at T=16: docs/measurements/serving.md, "Quiet runs, and the lone
        request on the loop")."""
        if len(xs) == 1:
            answers = run_grouped(self.runner.run, xs, self.cost)
        else:
            answers = await asyncio.to_thread(run_grouped, self.runner.run, xs, self.cost)
        return [Answer(out, size, tokens) for out, size, tokens in answers]

    async def __call__(self, request: Request) -> Response:
        self.in_flight += 1
        try:
            reply = await self.service.handle(request.method, request.url.path, request.headers, request_body(request))
        finally:
            self.in_flight -= 1
        return to_response(reply)


def application(options: ServeOptions, files: dict[str, bytes], info: dict[str, Any], settings: dict[str, Any]) -> Any:
    """The attention's bound deployment: Ray's default of 5 requests in flight would cap every batch at 5."""
    return ContextDeployment.options(max_ongoing_requests=max(2 * options.max_batch, 32), **settings).bind(
        files, model=info["model"], provider=options.provider, threads=options.threads, max_batch=options.max_batch,
        batch_wait_s=options.batch_wait_ms / 1000.0, info=info)
