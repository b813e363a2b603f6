"""The attention's model in a replica (serve/deployment.py): one OnnxRunner whose requests are batched with
`@serve.batch`.

Imports ray at module level: only the deployment (after the launcher has set Ray's environment) loads this module.
"""
from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
from ray import serve

from mha_runtime.artifact.errors import ContractError
from mha_runtime.attention.runner import OnnxRunner
from mha_runtime.serve.attention.batching import run_grouped, work
from mha_runtime.serve.attention.service import Answer, ContextService
from mha_runtime.serve.options import ServeOptions
from mha_runtime.serve.replica import shipped_folder


class ContextReplica:
    """The runner, its batcher and the attention's service. `@serve.batch` keeps one queue per decorated method in
    the process; a replica process holds one ContextReplica."""

    def __init__(self, files: dict[str, bytes], options: ServeOptions, info: dict[str, Any]) -> None:
        with shipped_folder(files) as folder:  # the session keeps the bytes
            self.runner = OnnxRunner(folder, model=info["model"], provider=options.provider, threads=options.threads)
        self.runner.run(np.zeros((1, 1, self.runner.config.d_in), np.float32))  # warm-up: the first request is not slow
        batch_wait_s = options.batch_wait_ms / 1000.0
        # The decorator's settings, per replica process (its arguments below are placeholders).
        self.run_batch.set_max_batch_size(options.max_batch)
        self.run_batch.set_batch_wait_timeout_s(batch_wait_s)
        self.cost = work(self.runner.config)
        # With no batch wait, a request alone in the replica skips the batcher's queue (below).
        self.bypass = batch_wait_s == 0.0
        self.service = ContextService(config=self.runner.config, info=info, max_batch=options.max_batch,
                                      infer=self.infer)

    async def infer(self, x: np.ndarray) -> Answer:
        """One checked input (B, T, d_in) -> its Answer. A request alone in the replica runs at once, on the loop,
        without `@serve.batch`'s queue and task hand-off (docs/measurements/serving.md, "The lone request skips the
        batcher"); a batcher would run it alone anyway. It first lets the loop turn once: requests already read
        come in, and then it batches with them. Without that turn, requests that queue in the sockets while one
        runs are taken one by one, each alone again, and behind HAProxy nothing was ever batched."""
        if self.bypass and self.service.in_flight == 1:
            await asyncio.sleep(0)  # one turn of the loop: requests already read get in first
            if self.service.in_flight == 1:
                out, size, tokens = run_grouped(self.runner.run, [x], self.cost)[0]  # alone: a refusal is raised
                return Answer(out, size, tokens)  # type: ignore[arg-type]
        answer = await self.run_batch(x)
        if isinstance(answer, ContractError):  # this request's own refusal; the others of its batch got answers
            raise answer
        return answer

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.0)
    async def run_batch(self, xs: list[np.ndarray]) -> list[Answer | ContractError]:
        """Requests of any lengths, padded into one ONNX Runtime call per length group (batching.py says why
        padding is exact, and when it is worth it). A batch of several runs on a thread so that this replica's
        event loop keeps accepting requests for the next batch; a lone request runs on the loop itself (the
        thread hop cost more than its own run at T=16: docs/measurements/serving.md, "Quiet runs, and the lone
        request on the loop")."""
        if len(xs) == 1:
            answers = run_grouped(self.runner.run, xs, self.cost)
        else:
            answers = await asyncio.to_thread(run_grouped, self.runner.run, xs, self.cost)
        return [out if isinstance(out, ContractError) else Answer(out, size, tokens) for out, size, tokens in answers]

    def close(self) -> None:
        """Nothing to stop: the runner goes with the process."""
