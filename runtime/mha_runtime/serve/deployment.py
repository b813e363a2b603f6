"""The one Ray Serve deployment every model kind is served through: each replica holds the HTTP ingress and the
kind's model (its `KindReplica`, named in the kinds table), one hop from Serve's proxy to the model.

Imports ray at module level: only `mha_runtime.serve.launcher` (after setting Ray's environment) imports this module.
"""
from __future__ import annotations

from typing import Any

import ray
from ray import serve
from starlette.requests import Request
from starlette.responses import Response

from mha_runtime.kinds import KINDS, kind_of
from mha_runtime.serve.launcher import DRAIN_TIMEOUT_S
from mha_runtime.serve.options import ServeOptions
from mha_runtime.serve.replica import KindReplica, request_body, to_response


@serve.deployment(ray_actor_options={"num_cpus": 0})  # Ray's default of 1 CPU each would leave replicas pending
class ModelDeployment:
    """One replica: the folder's files from Ray's object store, the kind's model built from them, every request
    handed to it."""

    def __init__(self, refs: dict[str, Any], *, kind: str, options: ServeOptions, info: dict[str, Any]) -> None:
        files = {name: ray.get(ref) for name, ref in refs.items()}  # object refs: application() says why
        self.model: KindReplica = KINDS[kind].replica(files, options, info)
        del files  # the model keeps the bytes it needs

    async def __call__(self, request: Request) -> Response:
        return to_response(await self.model.service.handle(request.method, request.url.path, request.headers,
                                                           request_body(request)))

    def __del__(self) -> None:
        model = getattr(self, "model", None)
        if model is not None:
            model.close()


def application(options: ServeOptions, files: dict[str, bytes], info: dict[str, Any]) -> Any:
    """The bound deployment of the folder's kind. The files go to the object store first and the replicas get their
    refs: bound as bytes they would be pickled into the application's config, which Ray refuses for a 124M model
    (650 MB). Ray's default of 5 requests in flight per replica would cap every batch at 5: the kind says how many
    a slot may have waiting."""
    refs = {name: ray.put(data) for name, data in files.items()}
    kind = kind_of(options.artifact)
    return ModelDeployment.options(
        max_ongoing_requests=max(kind.requests_per_slot * options.max_batch, 32), num_replicas=options.replicas,
        graceful_shutdown_wait_loop_s=0.2, graceful_shutdown_timeout_s=DRAIN_TIMEOUT_S,
    ).bind(refs, kind=kind.name, options=options, info=info)
