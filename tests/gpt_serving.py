"""What the GPT serving tests share: the solo reference every served answer meets, and one HTTP call."""
from __future__ import annotations

import http.client
import json
from typing import Any

from mha_runtime.decoder.generate import Generator
from mha_runtime.serve.decoder.wire import GenerateRequest, parse_sse


def solo(gen: Generator, r: GenerateRequest, eos_id: int | None) -> tuple[list[int], str]:
    """The same request generated alone by the runtime's Generator: the reference every served answer meets."""
    g = gen.generate([r.prompt_ids], max_new_tokens=r.max_new_tokens, temperature=r.temperature, top_k=r.top_k,
                     seed=r.seed, eos_id=eos_id)
    return g.ids[0], g.stops[0]


def call(port: int, method: str, path: str, body: bytes | None = None,
         headers: dict[str, str] | None = None) -> tuple[int, str, str]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        connection.request(method, path, body=body, headers=headers or {"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, response.getheader("content-type") or "", response.read().decode()
    finally:
        connection.close()


def served_answer(status: int, kind: str, text: str) -> dict[str, Any]:
    """The answer object of a 200, streamed or not (a stream's token events must spell the same ids)."""
    assert status == 200, text
    if kind.startswith("text/event-stream"):
        events = parse_sse(text)
        assert events[-1][0] == "done", events[-1]
        assert [d["id"] for e, d in events if e == "token"] == events[-1][1]["ids"]
        return events[-1][1]
    return json.loads(text)  # type: ignore[no-any-return]
