"""The HTTP wire format of `POST /v1/generate`, defined once: the server parses requests and writes answers with
it, the load test writes requests and reads answers with it.

Request, one JSON object (unknown keys are refused):
    {"prompt": TEXT} or {"prompt_ids": [ids]}   exactly one of the three; TEXT needs the folder's tokenizer
    or {"messages": [{"role", "content"}...]}   rendered with the folder's chat template (as transformers'
                                                apply_chat_template(add_generation_prompt=True)); the reply ends
                                                at the template's end of turn too (decoder/chat/folder.py)
    "max_new_tokens": int >= 1 (default 32)     prompt + max_new_tokens must fit in context_length
    "temperature": 0 (default: greedy) or 1e-4..1e4, "top_k": int or null, "seed": int >= 0 or null, "stream": bool

Answer without "stream": one JSON object with ANSWER_KEYS (`text` only when the folder has a tokenizer).
With "stream": Server-Sent Events, `event: token` with {"id": ..., "text": ...} per new token (text: the piece
that token completes, "" while a UTF-8 character is unfinished; no text key without a tokenizer), then one
`event: done` whose data is the same object as the non-streaming answer; a failure after the stream began is one
`event: error` with {"error": line}.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from mha_runtime.artifact.errors import ContractError, RequestError, cut, first_line
from mha_runtime.decoder.chat.folder import FolderChat
from mha_runtime.decoder.contract import id_problem
from mha_runtime.decoder.sampling import TEMPERATURE_RULE, temperature_ok
from mha_runtime.decoder.shapes import DecoderShapes
from mha_runtime.serve.attention.wire import load_json

GENERATE = "/v1/generate"
DEFAULT_MAX_NEW_TOKENS = 32
REQUEST_KEYS = ("prompt", "prompt_ids", "messages", "max_new_tokens", "temperature", "top_k", "seed", "stream")
# Keys of the answer object (non-streaming body, and the data of the final `done` event).
IDS, TEXT, STOP, PROMPT_TOKENS = "ids", "text", "stop", "prompt_tokens"
TTFT, TOKENS_PER_S, SEED = "time_to_first_token_s", "tokens_per_s", "seed"
ANSWER_KEYS = (IDS, TEXT, STOP, PROMPT_TOKENS, TTFT, TOKENS_PER_S, SEED)
TOKEN_EVENT, DONE_EVENT, ERROR_EVENT = "token", "done", "error"
# The body limit: room for a prompt of context_length ids (at most 9 bytes each: 7 digits, a comma, a space) or of
# text, at most TEXT_BYTES_PER_TOKEN bytes of UTF-8 per token of context, plus HEADER_BYTES for the other keys.
TEXT_BYTES_PER_TOKEN = 32
HEADER_BYTES = 4096


@dataclass(frozen=True)
class GenerateRequest:
    """A parsed request: the prompt as ids (text already encoded) and the sampling settings."""

    prompt_ids: list[int]
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    temperature: float = 0.0
    top_k: int | None = None
    seed: int | None = None
    stream: bool = False
    # The ids this generation stops at when not the server's (the folder's eos ids): a chat's (FolderChat.stop_ids).
    stop_ids: tuple[int, ...] | None = None

    def to_json(self) -> dict[str, Any]:
        """The request body as the load test sends it (prompt as ids)."""
        return {k: v for k, v in asdict(self).items() if k != "stop_ids"}


def generate_body_limit(shapes: DecoderShapes) -> int:
    return HEADER_BYTES + shapes.context_length * TEXT_BYTES_PER_TOKEN


def limit_reason(shapes: DecoderShapes) -> str:
    return (f"context_length {shapes.context_length} x {TEXT_BYTES_PER_TOKEN} bytes of prompt per token, "
            f"plus {HEADER_BYTES}")


def shown(value: Any) -> str:
    """A client's value as JSON, cut to 40 characters: an error line never echoes a huge number or string whole."""
    return cut(json.dumps(value))


def _integer(doc: dict[str, Any], key: str, default: int | None, low: int) -> int | None:
    value = doc.get(key, default)
    if value is None and default is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise RequestError(f"{key!r}: expected an integer >= {low}{' or null' if default is None else ''}, "
                           f"got {shown(value)}")
    return value


def _chat_ids(messages: object, chat: FolderChat | None) -> list[int]:
    """The messages rendered with the folder's chat template and encoded; what is wrong with them is one line."""
    if chat is None:
        raise RequestError("'messages': this model has no chat template (none in its tokenizer_config.json); "
                           "send 'prompt'")
    try:
        return chat.encode(messages, "'messages'")
    except ContractError as exc:  # the messages' shape, the template's own refusal, text that is not Unicode
        raise RequestError(str(exc)) from None


def parse_generate(body: bytes, encode: Any, shapes: DecoderShapes,
                   chat: FolderChat | None = None) -> GenerateRequest:
    """A request body -> GenerateRequest, or RequestError (400) naming the first thing wrong. `encode` turns text
    into ids (None: the folder has no tokenizer); `chat` renders messages (None: the folder has no template). Ids,
    lengths and sampling settings are all checked here."""
    doc = load_json(body, "body")
    expected = ('body: expected a JSON object {"prompt": TEXT}, {"prompt_ids": [ids]} or {"messages": [{"role", '
                '"content"}, ...]}')
    if not isinstance(doc, dict):
        raise RequestError(expected)
    unknown = sorted(set(doc) - set(REQUEST_KEYS))
    if unknown:
        listed = ", ".join(repr(cut(k)) for k in unknown[:5])
        raise RequestError(f"body: unknown key{'s' if len(unknown) > 1 else ''} {listed}; "
                           f"expected only {', '.join(REQUEST_KEYS)}")
    given = [k for k in ("prompt", "prompt_ids", "messages") if k in doc]
    if len(given) != 1:
        raise RequestError(f"{expected} (exactly one of them, got {' and '.join(map(repr, given)) or 'none'})")
    if "messages" in doc:
        ids = _chat_ids(doc["messages"], chat)
        if not ids:
            raise RequestError("'messages': the chat template renders them to no tokens")
    elif "prompt" in doc:
        if not isinstance(doc["prompt"], str) or not doc["prompt"]:
            raise RequestError(f"'prompt': expected a non-empty string, got {shown(doc['prompt'])}")
        if encode is None:
            raise RequestError("'prompt': this model has no tokenizer (exported without --tokenizer); "
                               "send 'prompt_ids'")
        try:
            doc["prompt"].encode("utf-8")
        except UnicodeEncodeError:  # JSON may spell a lone surrogate (\ud800), which is no text to tokenize
            raise RequestError("'prompt': expected valid Unicode text, got a lone surrogate (a \\ud800-\\udfff "
                               "escape without its pair)") from None
        ids = list(encode(doc["prompt"]))
        if not ids:
            raise RequestError("'prompt': the text encodes to no tokens")
    else:
        ids = doc["prompt_ids"]
        if not isinstance(ids, list) or not ids:
            raise RequestError(f"'prompt_ids': expected a non-empty list of token ids, got {shown(ids)}")
        problem = id_problem(ids, shapes.vocab_size, shown)
        if problem is not None:
            raise RequestError(f"'prompt_ids': {problem}")
    context = shapes.context_length
    if len(ids) > context:
        raise RequestError(f"prompt: {len(ids)} tokens, longer than context_length {context}")
    if len(ids) == context:
        raise RequestError(f"prompt: {len(ids)} tokens fill context_length {context}, leaving no room for a new "
                           f"token; send at most {context - 1}")
    max_new = _integer(doc, "max_new_tokens", DEFAULT_MAX_NEW_TOKENS, 1)
    assert max_new is not None
    if len(ids) + max_new > context:
        raise RequestError(f"'max_new_tokens': {shown(max_new)} after a prompt of {len(ids)} tokens runs past "
                           f"context_length {context}; ask for at most {context - len(ids)}")
    temperature = doc.get("temperature", 0.0)
    if not temperature_ok(temperature):
        raise RequestError(f"'temperature': expected {TEMPERATURE_RULE}, got {shown(temperature)}")
    top_k = _integer(doc, "top_k", None, 1)
    if top_k is not None and top_k > shapes.vocab_size:
        raise RequestError(f"'top_k': expected an integer in 1..{shapes.vocab_size}, got {shown(top_k)}")
    seed = _integer(doc, "seed", None, 0)
    if seed is not None and seed >= 1 << 63:
        raise RequestError(f"'seed': expected an integer below 2**63, got {shown(seed)}")
    stream = doc.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError(f"'stream': expected true or false, got {shown(stream)}")
    return GenerateRequest(ids, max_new, float(temperature), top_k, seed, stream,
                           chat.stop_ids if chat is not None and "messages" in doc else None)


def sse_event(event: str, data: dict[str, Any]) -> bytes:
    """One Server-Sent Event: `event: NAME`, one `data:` line of JSON, a blank line."""
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def parse_sse(text: str) -> list[tuple[str, dict[str, Any]]]:
    """A whole event stream -> [(event, data)]; RequestError for a malformed one (the load test's check)."""
    events = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        if not block.strip():
            continue
        fields = dict(line.split(": ", 1) for line in block.split("\n") if ": " in line)
        if "event" not in fields or "data" not in fields:
            raise RequestError(f"event stream: expected 'event:' and 'data:' lines, got {block[:80]!r}")
        try:
            events.append((fields["event"], json.loads(fields["data"])))
        except json.JSONDecodeError as exc:
            raise RequestError(f"event stream: data is not JSON ({first_line(exc)})") from None
    return events
