"""The ids a chat's reply ends at, found once at export and recorded in the manifest (contract.chat.end_of_turn_ids,
mha_runtime.decoder.contract); every runtime reads that list and nothing else.

They are, in this order and each once: the folder's eos ids (what transformers' generate stops at; a GGUF's
tokenizer.ggml.eos_token_id and eot_token_id, mha_export.gguf.source.gguf_ids), the id of tokenizer_config.json's
eos_token (a chat model's end-of-turn token, where it names one there), and the special token the template
closes an assistant's turn with. That last one is found from the template itself: a user turn
and an assistant turn of a marker text are rendered (no generation prompt), and the first token after the marker
that is not whitespace is taken when it is a special token of the folder's tokenizer (tests/decoder/test_chat_turns.py
renders eight template shapes). A template that refuses that conversation, or closes turns with
plain text, adds nothing. A token counts only where the tokenizer encodes its text as exactly one id.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mha_runtime.artifact.errors import MHAError
from mha_runtime.decoder.chat.template import render

# The assistant's text in the probe conversation: plain letters no template rewrites, no token merges across.
MARKER = "mhaendofturnprobe"
PROBE = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": MARKER}]


def closing_token(template: str, tokens: dict[str, str], tok: Any) -> int | None:
    """The special token id the template writes right after an assistant's turn, or None (see the docstring).
    `tok`: a tokenizers.Tokenizer of the folder."""
    try:
        text = render(template, PROBE, tokens, add_generation_prompt=False)
    except MHAError:  # a template that refuses this conversation, or that jinja2 cannot parse
        return None
    if MARKER not in text:
        return None
    special = {i for i, added in tok.get_added_tokens_decoder().items() if added.special}
    for token_id in tok.encode(text[text.rindex(MARKER) + len(MARKER):], add_special_tokens=False).ids:
        if tok.decode([token_id], skip_special_tokens=False).strip():
            return token_id if token_id in special else None
    return None


def end_of_turn_ids(template: str, tokens: dict[str, str], tokenizer_json: bytes,
                    eos_ids: Sequence[int]) -> tuple[int, ...]:
    """The folder's end-of-turn ids (see the docstring): its eos ids, its eos_token's id, the template's closing
    special token, in that order, each once."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(tokenizer_json.decode("utf-8"))

    def single(text: str | None) -> int | None:
        ids = tok.encode(text, add_special_tokens=False).ids if text else []
        return ids[0] if len(ids) == 1 else None

    found = [*eos_ids, single(tokens.get("eos_token")), closing_token(template, tokens, tok)]
    return tuple(dict.fromkeys(i for i in found if i is not None))
