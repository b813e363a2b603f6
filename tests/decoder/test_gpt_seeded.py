"""Focused checks written for seeded bugs (tools/seed_bugs.py) that no fast test caught: the load test's judge of
served answers, the room a generate request may fill, and what a served answer reports. Each expected value is
written out by hand or computed here from the documented rule, never by the module under test."""
from __future__ import annotations

import json

import numpy as np
import pytest

from mha_export.decoder.archs.gpt2.config import gpt_preset
from mha_runtime.artifact.errors import RequestError
from mha_runtime.decoder.generate import Generation
from mha_runtime.decoder.sampling import Sampler
from mha_runtime.serve.decoder.answers import GenOutcome, check_generations
from mha_runtime.serve.decoder.job import Job
from mha_runtime.serve.decoder.wire import GenerateRequest, parse_generate

PROMPT = [464, 318, 257]
IDS = [11, 22, 33]


def _event(name: str, data: dict[str, object]) -> bytes:
    """One Server-Sent Event as the wire format documents it, written out here."""
    return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()


def _done(**changes: object) -> dict[str, object]:
    return {"ids": IDS, "stop": "max_new_tokens", "prompt_tokens": len(PROMPT), "time_to_first_token_s": 0.01,
            "tokens_per_s": 100.0, "seed": 5} | changes


def _judged(outcome: GenOutcome, request: GenerateRequest) -> str | None:
    expected = Generation(prompt_ids=[PROMPT], ids=[list(IDS)], stops=["max_new_tokens"], seed=5)
    check_generations([outcome], lambda _: request, lambda _: expected, None)
    return outcome.problem


def _stream(token_ids: list[int], done: dict[str, object]) -> GenOutcome:
    events = [(0.1 * i, _event("token", {"id": t})) for i, t in enumerate(token_ids)]
    return GenOutcome(0, 200, 1.0, True, events=[*events, (0.5, _event("done", done))])


def test_loadtest_judge_flags_each_tampered_answer() -> None:
    """The right answer passes, streamed and whole; a token event's id, the stop reason, the seed or an id of the
    answer changed each make it a wrong answer."""
    streamed = GenerateRequest(PROMPT, 3, 0.9, None, 5, stream=True)
    whole = GenerateRequest(PROMPT, 3, 0.9, None, 5, stream=False)

    def body(**changes: object) -> GenOutcome:
        return GenOutcome(0, 200, 1.0, False, body=json.dumps(_done(**changes)).encode())

    assert _judged(_stream(IDS, _done()), streamed) is None
    assert _judged(body(), whole) is None
    assert "token events' ids" in str(_judged(_stream([11, 23, 33], _done()), streamed))
    assert "stop 'eos'" in str(_judged(body(stop="eos"), whole))
    assert "seed 6" in str(_judged(body(seed=6), whole))
    assert "ids differ from the local generation from new token 2" in str(_judged(body(ids=[11, 22, 34]), whole))


def test_a_request_that_exactly_fills_context_length_is_taken() -> None:
    """gpt-mini's context_length is 256: 250 prompt ids + 6 new tokens fit exactly, 7 do not; 255 + 1 fit."""
    config = gpt_preset("gpt-mini")
    assert config.context_length == 256
    for n, new in ((250, 6), (255, 1), (1, 255)):
        r = parse_generate(json.dumps({"prompt_ids": [1] * n, "max_new_tokens": new}).encode(), None, config)
        assert (len(r.prompt_ids), r.max_new_tokens) == (n, new)
    with pytest.raises(RequestError, match="ask for at most 6"):
        parse_generate(json.dumps({"prompt_ids": [1] * 250, "max_new_tokens": 7}).encode(), None, config)


def test_a_served_answer_reports_the_seed_that_reproduces_it_and_its_counts() -> None:
    """An unseeded sampled generation reports the seed it drew: PCG64(seed) under the documented rule (the
    first id whose cumulative probability exceeds u * total, u = PCG64(seed).random()) gives its ids again. The
    counts: prompt_tokens is the prompt's length, tokens_per_s counts the tokens after the first over the time
    after the first."""
    logits = np.array([[0.0, 1.0, 2.0, 0.5, -1.0]], np.float32)
    request = GenerateRequest([7, 8, 9, 10], 6, temperature=1.0)
    job = Job(request, lambda event: None, arrived=10.0)
    job.sampler = Sampler(1, temperature=1.0, top_k=None, seed=None, vocab_size=5)
    job.ids = [job.sampler.next_ids(logits)[0] for _ in range(6)]
    job.first = 10.25
    answer = job.answer(12.25, None)
    seed = answer["seed"]
    assert isinstance(seed, int) and not isinstance(seed, bool)
    rng = np.random.Generator(np.random.PCG64(seed))
    p = np.exp(logits[0].astype(np.float64) - logits[0].max())
    cdf = np.cumsum(p / p.sum())
    assert [int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right")) for _ in range(6)] == job.ids
    assert answer["prompt_tokens"] == 4 and answer["ids"] == job.ids and "text" not in answer
    assert answer["time_to_first_token_s"] == 0.25 and answer["tokens_per_s"] == 2.5  # 5 tokens in 2 s
