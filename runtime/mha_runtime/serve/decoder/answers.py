"""How `mha loadtest --generate` judges an answer: what happened to each request (`GenOutcome`) and the check of
a body or an event stream against the local generation of the same request (ids, stop, seed, text, event order)."""
from __future__ import annotations

import itertools
import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mha_runtime.artifact.errors import RequestError, first_line
from mha_runtime.decoder.generate import Generation, Generator
from mha_runtime.serve.decoder.wire import (
    ANSWER_KEYS,
    DONE_EVENT,
    ERROR_EVENT,
    IDS,
    PROMPT_TOKENS,
    SEED,
    STOP,
    TEXT,
    TOKEN_EVENT,
    TTFT,
    GenerateRequest,
    parse_sse,
)

TOKEN_ID = "id"  # the key of a token event's id


@dataclass
class GenOutcome:
    """What happened to request `index`. Until check_generations has judged it, a 200 answer is kept raw: the
    body, or for a stream each event's bytes with its arrival (seconds after sending)."""

    index: int
    status: int | None
    seconds: float
    stream: bool
    problem: str | None = None
    body: bytes | None = None
    events: list[tuple[float, bytes]] = field(default_factory=list)
    new_tokens: int = 0
    stop: str | None = None
    ttft_s: float | None = None  # client side, streamed requests only
    server_ttft_s: float | None = None
    gaps_s: list[float] = field(default_factory=list)


def reference_for(generator: Generator) -> Callable[[GenerateRequest], Generation]:
    """The local generation of a request, stopping at the folder's eos ids as the server does."""
    def reference(request: GenerateRequest) -> Generation:
        return generator.generate([request.prompt_ids], max_new_tokens=request.max_new_tokens,
                                  temperature=request.temperature, top_k=request.top_k, seed=request.seed,
                                  eos_id=generator.manifest.stop_ids)
    return reference


def _answer_problem(doc: Any, request: GenerateRequest, expected: Generation, decode: Callable[[list[int]], str]
                    | None) -> str | None:
    """None if an answer object (the body, or a `done` event's data) is the reference's generation."""
    if not isinstance(doc, dict):
        return f"expected a JSON object, got {type(doc).__name__}"
    wanted = [k for k in ANSWER_KEYS if k != TEXT or decode is not None]
    missing = [k for k in wanted if k not in doc]
    if missing:
        return f"answer keys {sorted(doc)} lack {missing}"
    ids, want = doc[IDS], expected.ids[0]
    if ids != want:
        if not isinstance(ids, list):
            return f"ids: expected a list, got {json.dumps(ids)[:40]}"
        at = next((j for j, (a, b) in enumerate(zip(ids, want, strict=False)) if a != b), min(len(ids), len(want)))
        return f"ids differ from the local generation from new token {at} on ({len(ids)} ids, expected {len(want)})"
    if doc[STOP] != expected.stops[0]:
        return f"stop {doc[STOP]!r}, expected {expected.stops[0]!r}"
    if doc[PROMPT_TOKENS] != len(request.prompt_ids):
        return f"prompt_tokens {doc[PROMPT_TOKENS]!r}, expected {len(request.prompt_ids)}"
    if request.seed is not None and doc[SEED] != request.seed:
        return f"seed {doc[SEED]!r}, expected the request's {request.seed}"
    if decode is not None and doc[TEXT] != decode(want):
        return f"text {str(doc[TEXT])[:40]!r} is not the tokenizer's text of the ids"
    return None


def _stream_problem(outcome: GenOutcome, request: GenerateRequest, expected: Generation,
                    decode: Callable[[list[int]], str] | None) -> tuple[str, str] | None:
    """None if a stream is token events with the reference's ids, then one `done` event with its answer (and
    the outcome's timings filled); else (kind, line): an `error` event is unexpected, anything else wrong."""
    try:
        events = [(at, *parse_sse(raw.decode())[0]) for at, raw in outcome.events]
    except (RequestError, UnicodeDecodeError, IndexError) as exc:
        return "wrong", first_line(exc)
    errors = [data for _, name, data in events if name == ERROR_EVENT]
    if errors:
        error = errors[0].get("error") if isinstance(errors[0], dict) else errors[0]
        return "unexpected", f"an error event in the stream: {str(error)[:160]}"
    names = [name for _, name, _ in events]
    if not names or names[-1] != DONE_EVENT or names.count(DONE_EVENT) != 1 \
            or any(n != TOKEN_EVENT for n in names[:-1]):
        return "wrong", f"expected token events then one done event, got {Counter(names).most_common()}"
    tokens = [(at, data) for at, _, data in events[:-1]]
    done = events[-1][2]
    problem = _answer_problem(done, request, expected, decode)
    if problem:
        return "wrong", f"done event: {problem}"
    streamed = [data.get(TOKEN_ID) if isinstance(data, dict) else None for _, data in tokens]
    if streamed != done[IDS]:
        return "wrong", f"the token events' ids {streamed[:8]} are not the done event's ids {done[IDS][:8]}"
    if decode is not None:
        pieces = [data.get(TEXT) if isinstance(data, dict) else None for _, data in tokens]
        joined, whole = "".join(p for p in pieces if isinstance(p, str)), done[TEXT]
        # A text that ends inside a UTF-8 character shows U+FFFD in `done` that no piece has sent.
        if None in pieces or not (joined == whole or (whole.endswith("\ufffd") and whole.startswith(joined))):
            return "wrong", "the token events' text pieces do not make the done event's text"
    if tokens:
        outcome.ttft_s = tokens[0][0]
        outcome.gaps_s = [b - a for (a, _), (b, _) in itertools.pairwise(tokens)]
    outcome.server_ttft_s = done[TTFT] if isinstance(done[TTFT], (int, float)) else None
    outcome.new_tokens, outcome.stop = len(done[IDS]), done[STOP]
    return None


def _body_problem(outcome: GenOutcome, request: GenerateRequest, expected: Generation,
                  decode: Callable[[list[int]], str] | None) -> tuple[str, str] | None:
    """None if a non-streamed body is the reference's answer (and the outcome's figures filled); else why."""
    try:
        doc = json.loads(outcome.body or b"")
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return "wrong", f"body is not JSON ({first_line(exc)})"
    problem = _answer_problem(doc, request, expected, decode)
    if problem:
        return "wrong", problem
    outcome.new_tokens, outcome.stop = len(doc[IDS]), doc[STOP]
    outcome.server_ttft_s = doc[TTFT] if isinstance(doc[TTFT], (int, float)) else None
    return None


def check_generations(outcomes: list[GenOutcome], requests: Callable[[int], GenerateRequest],
                      reference: Callable[[GenerateRequest], Generation],
                      decode: Callable[[list[int]], str] | None) -> None:
    """Judge every kept answer against `reference` on the same request (made again); frees what was kept."""
    for outcome in outcomes:
        if outcome.problem is not None or outcome.status != 200:
            continue
        request = requests(outcome.index)
        judge = _stream_problem if outcome.stream else _body_problem
        found = judge(outcome, request, reference(request), decode)
        if found is not None:
            kind, line = found
            mode = "streamed" if outcome.stream else "not streamed"
            sampling = "greedy" if request.temperature == 0 else f"seed {request.seed}"
            outcome.problem = f"{kind}: request {outcome.index} ({mode}, {sampling}): {line}"
        outcome.body, outcome.events = None, []
