"""The attention's HTTP route in the one skeleton (http.py: health, contract, refusals, the 500 line). Ray
Serve wraps it (attention/replica.py); tests drive it directly.

    POST /v1/context   {"x": [[[...]]]} or a .npy body -> the context in the same format
    GET  /v1/health    {"status": "ok"}
    GET  /v1/contract  the model's name, file, sha256, config, I/O contract, tolerance and server limits

A contract violation, a malformed body or an unknown JSON key is 400; a body over its format's limit, or a batch
over the server's max batch, 413 (well-formed, but more than this server takes at once: split it); anything else
500. The body of every refusal is {"error": "<one line>"}.
"""
from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from mha_runtime.artifact.errors import RequestError
from mha_runtime.attention.config import MHAConfig
from mha_runtime.attention.contract import INPUT_NAME, check_input
from mha_runtime.serve.attention.wire import body_limit, decode_request, encode_answer, limit_reason, request_format
from mha_runtime.serve.http import KindService, Reply, read_limited

CONTEXT = "/v1/context"
# Response headers that say how the request was batched (the load test counts them).
BATCH_REQUESTS, BATCH_TOKENS = "x-mha-batch-requests", "x-mha-batch-tokens"


@dataclass(frozen=True)
class Answer:
    """One request's output and the batch it rode in: how many requests, padded to how many tokens."""

    context: np.ndarray
    batch_requests: int
    batch_tokens: int


class ContextService(KindService):
    """The attention's route in the HTTP skeleton (http.py); `infer` runs one checked input (B, T, d_in) and may
    batch it with others. `max_batch` bounds each request's batch and, through attention/wire.body_limit, its body."""

    route = CONTEXT

    def __init__(self, *, config: MHAConfig, info: dict[str, Any], max_batch: int,
                 infer: Callable[[np.ndarray], Awaitable[Answer]]) -> None:
        super().__init__(info)
        self.config = config
        self.max_batch = max_batch
        self.infer = infer

    async def work(self, headers: Mapping[str, str], body: AsyncIterator[bytes]) -> Reply:
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
