"""Chat in JavaScript: runtime/native/common/gpt/chat.mjs with @huggingface/jinja (pinned as transformers.js 4.3.2
resolves it) renders what transformers' apply_chat_template renders, in Node.js (`mha-node generate --chat`),
onnxruntime-web in Node.js (`check.mjs generate --chat`) and the browser page's chat box (gpt.html, Debian's
chromium), and the reply ends at <|im_end|> (the end-of-turn ids the export recorded; the folder's own eos is
GPT-2's). Needs `make native-build` and `make web-build`, and /usr/bin/chromium for the page."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from test_gpt_js import NATIVE, NODE, REPO, RUNNERS, _page

import chat_sources
from chat_sources import (
    CONVERSATIONS,
    ENDOFTEXT,
    IM_END,
    REPLY_IDS,
    TEMPLATES,
    before_end_of_turn,
    chat_folder,
    chat_ids,
    chat_text,
    with_bos,
    without_template,
)

QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return chat_folder(tmp_path_factory)


@pytest.fixture(scope="module")
def reference(chat_dir: Path) -> Any:
    return chat_sources.reference(chat_dir)


def _run(command: list[str], *args: object) -> subprocess.CompletedProcess[str]:
    for folder in ("node", "web"):
        jinja = NATIVE / folder / "node_modules" / "@huggingface" / "jinja"
        assert jinja.is_dir(), f"{jinja} is missing: run `make native-build` and `make web-build` (npm ci)"
    return subprocess.run([*command, *map(str, args)], capture_output=True, text=True, timeout=600, cwd=REPO)


@pytest.mark.parametrize("package", ["node", "web"])
def test_chat_mjs_renders_what_transformers_renders(package: str, chat_dir: Path, reference: Any,
                                                    tmp_path: Path) -> None:
    request = tmp_path / "request.json"
    request.write_text(json.dumps({"conversations": CONVERSATIONS, "templates": TEMPLATES}))
    done = _run(["node", str(REPO / "tests" / "native" / "chat_render.mjs")], chat_dir, NATIVE / package, request)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    for messages, got in zip(CONVERSATIONS, doc["folder"], strict=True):
        assert got["text"] == chat_text(reference, messages)
        assert got["ids"] == chat_ids(reference, messages)
    for name, source in TEMPLATES.items():
        assert doc["templates"][name] == [chat_text(reference, m, source) for m in CONVERSATIONS], name
    assert doc["stop_ids"] == [ENDOFTEXT, IM_END]


@pytest.mark.parametrize("package", ["node", "web"])
def test_a_chat_gets_no_post_processor_bos(package: str, chat_dir: Path, tmp_path: Path) -> None:
    """A tokenizer whose post-processor puts a BOS before a prompt: the rendered chat's ids do not get it, as
    transformers' apply_chat_template's do not."""
    folder = with_bos(chat_dir, tmp_path / "bos")
    request = tmp_path / "request.json"
    request.write_text(json.dumps({"conversations": CONVERSATIONS, "templates": {}}))
    done = _run(["node", str(REPO / "tests" / "native" / "chat_render.mjs")], folder, NATIVE / package, request)
    assert done.returncode == 0, done.stderr
    tok = chat_sources.reference(folder)
    assert tok("Hi")["input_ids"][0] == ENDOFTEXT  # the post-processor is there
    assert [got["ids"] for got in json.loads(done.stdout)["folder"]] == [chat_ids(tok, m) for m in CONVERSATIONS]


@pytest.mark.parametrize("runner", sorted(RUNNERS))
def test_generate_chat_answers_and_stops_at_im_end(runner: str, chat_dir: Path, reference: Any) -> None:
    want = chat_ids(reference, [{"role": "user", "content": QUESTION}])
    for form in ("gpt.onnx", "gpt.inplace.onnx"):
        done = _run(RUNNERS[runner], "generate", chat_dir, "--chat", QUESTION, "--json", "--form", form)
        assert done.returncode == 0, done.stderr
        doc = json.loads(done.stdout)
        assert (doc["prompt_ids"], doc["ids"], doc["stop"]) == (want, REPLY_IDS, "eos")
    text = _run(RUNNERS[runner], "generate", chat_dir, "--chat", QUESTION, "--text")
    assert text.stdout == "Paris.\n" and "(stopped: eos;" in text.stderr
    on = json.loads(_run(RUNNERS[runner], "generate", chat_dir, "--chat", QUESTION, "--json", "--no-eos",
                         "--max-new-tokens", "3").stdout)
    assert on["ids"] == [*REPLY_IDS, IM_END]  # the id the reply stopped at


@pytest.mark.parametrize("runner", sorted(RUNNERS))
def test_chat_refusals_are_one_line(runner: str, chat_dir: Path, tmp_path: Path) -> None:
    both = _run(RUNNERS[runner], "generate", chat_dir, "--chat", QUESTION, "--prompt", "Hi")
    assert both.returncode == 1 and both.stderr.strip().count("\n") == 0 and not both.stdout, both.stderr
    assert "give --chat TEXT or a prompt (--prompt, --prompt-ids), not both" in both.stderr
    bare = without_template(chat_dir, tmp_path / "bare")
    none = _run(RUNNERS[runner], "generate", bare, "--chat", QUESTION)
    assert none.returncode == 1 and not none.stdout, none.stderr
    assert none.stderr == f"error: {bare}: this folder has no chat template (no chat_template in its " \
                          "tokenizer_config.json, no chat_template.jinja); give a prompt instead\n"
    plain = _run(RUNNERS[runner], "generate", bare, "--prompt", "Hi", "--max-new-tokens", "2")
    assert plain.returncode == 0, plain.stderr  # a prompt needs no template
    old = before_end_of_turn(chat_dir, tmp_path / "old")  # exported before contract.chat: Python's line
    refused = _run(RUNNERS[runner], "generate", old, "--chat", QUESTION)
    assert refused.returncode == 1 and not refused.stdout, refused.stderr
    assert refused.stderr == f"error: {old}: the manifest records no end-of-turn ids (contract.chat.end_of_turn_ids: " \
                             "the folder was exported before it); re-export it to chat with it, or give a prompt\n"
    assert _run(RUNNERS[runner], "generate", old, "--prompt", "Hi", "--max-new-tokens", "2").returncode == 0


def test_the_pages_chat_box_renders_and_answers_as_transformers(chat_dir: Path, reference: Any,
                                                                tmp_path: Path) -> None:
    """Two turns after a system message: each turn's rendered text is transformers' for the conversation so far
    (the first reply kept as the assistant's message), its ids too, and each reply ends at <|im_end|>."""
    system, first, second = "You are terse.", QUESTION, "And of Italy? Ünïcødé ✓"
    query = f"system={quote(system)}&chat={quote(first)}&chat={quote(second)}&autorun=1"
    code, doc, err = _page(chat_dir, tmp_path, query, tmp_path / "chat.png")
    assert code == 0 and "error" not in doc, err + json.dumps(doc.get("log"))
    asked = [[{"role": "system", "content": system}, {"role": "user", "content": first}],
             [{"role": "system", "content": system}, {"role": "user", "content": first},
              {"role": "assistant", "content": "Paris."}, {"role": "user", "content": second}]]
    assert doc["mode"] == "chat" and len(doc["turns"]) == 2 and doc["log"] == []
    for turn, messages in zip(doc["turns"], asked, strict=True):
        assert turn["messages"] == messages and turn["rendered"] == chat_text(reference, messages)
        assert turn["prompt_ids"] == chat_ids(reference, messages)
        assert (turn["ids"], turn["stop"], turn["text"]) == (REPLY_IDS, "eos", "Paris.")


def test_the_page_shows_no_chat_box_without_a_template(chat_dir: Path, tmp_path: Path) -> None:
    bare = without_template(chat_dir, tmp_path / "bare")
    code, doc, err = _page(bare, tmp_path, "", tmp_path / "ready.png")
    assert code == 0 and doc["mode"] == "ready" and doc["chat"] is False, err + json.dumps(doc)
    code, doc, err = _page(chat_dir, tmp_path / "with", "", tmp_path / "ready2.png")
    assert code == 0 and doc["chat"] is True, err + json.dumps(doc)
    refused = _page(bare, tmp_path / "asked", f"chat={quote(QUESTION)}&autorun=1", tmp_path / "no.png")[1]
    assert refused["error"].endswith("this folder has no chat template (no chat_template in its "
                                     "tokenizer_config.json, no chat_template.jinja); give a prompt instead")


def test_node_is_pinned_to_transformers_js_jinja() -> None:
    """The version transformers.js 4.3.2 resolves (its range ^0.5.10), exactly, in both packages and their locks."""
    for folder in ("node", "web"):
        package = json.loads((NATIVE / folder / "package.json").read_text())
        lock = json.loads((NATIVE / folder / "package-lock.json").read_text())
        assert package["dependencies"]["@huggingface/jinja"] == "0.5.13"
        assert lock["packages"]["node_modules/@huggingface/jinja"]["version"] == "0.5.13"
    assert NODE[0] == "node"
