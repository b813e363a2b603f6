"""SmolLM2-135M-Instruct (issue 58) in the browser page's chat box (gpt.html in Debian's chromium, onnxruntime-web,
wasm, one thread; the folder's gpt.onnx, 538 MB of fp32 weights): the chat prompt's rendered ids are transformers'
apply_chat_template's, and the reply is "The capital of France is Paris.", transformers' greedy ids of the same GGUF
up to the end of turn, where it stops (the next greedy id is <|im_end|>). Measured 2026-12-07: 31 s in the page
(load, sha256, session, the turn), 41 s with chromium's start, 110 s with transformers' reference, on the 2-core
host at load 8. Needs `make smollm2`, `make web-build` and /usr/bin/chromium."""
from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import quote

import pytest
from test_gpt_js import _page

from smollm2_folder import CHAT, NEEDS_SMOLLM2, reference, smollm2_folder

pytestmark = NEEDS_SMOLLM2
REPLY = "The capital of France is Paris."


def test_the_pages_chat_box_answers_paris_and_stops_at_the_end_of_turn(tmp_path_factory: pytest.TempPathFactory,
                                                                       tmp_path: Path) -> None:
    folder = smollm2_folder(tmp_path_factory)
    query = f"chat={quote(CHAT)}&max_new_tokens=24&autorun=1"
    code, doc, err = _page(folder, tmp_path, query, tmp_path / "smollm2-chat.png")
    assert code == 0 and "error" not in doc, err + json.dumps(doc.get("log"))
    assert doc["mode"] == "chat" and doc["form"] == "gpt.onnx" and doc["log"] == [] and len(doc["turns"]) == 1
    turn, ref = doc["turns"][0], reference()
    assert turn["messages"] == [{"role": "user", "content": CHAT}] and turn["prompt_ids"] == ref.prompts[CHAT]
    assert (turn["text"], turn["stop"]) == (REPLY, "eos")
    im_end = ref.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert ref.greedy(ref.prompts[CHAT], len(turn["ids"]) + 1) == [*turn["ids"], im_end]
    assert turn["stop_ids"] == [im_end]
