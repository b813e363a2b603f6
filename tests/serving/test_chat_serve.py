"""`POST /v1/generate` with "messages": rendered with the folder's chat template as transformers'
apply_chat_template renders them, the reply ending at the folder's recorded end of turn (<|im_end|> of a ChatML
template whose folder's own eos is GPT-2's); a prompt beside messages, or neither, is a 400 of one line; a folder
exported before its end-of-turn ids were recorded is refused before Ray starts. The wire format on its own, then a
real Ray Serve server on loopback."""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from benchmarks.process import ServerProcess
from chat_sources import (
    CONVERSATIONS,
    ENDOFTEXT,
    IM_END,
    REPLY_IDS,
    before_end_of_turn,
    chat_folder,
    chat_ids,
    reference,
)
from gpt_serving import call, served_answer
from mha_runtime.artifact.errors import ArtifactError, RequestError
from mha_runtime.decoder.chat.folder import FolderChat, folder_chat
from mha_runtime.decoder.generate import Generator
from mha_runtime.serve.decoder.prepare import prepare_gpt
from mha_runtime.serve.decoder.wire import generate_body_limit, parse_generate
from mha_runtime.serve.options import ServeOptions


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return chat_folder(tmp_path_factory)


@pytest.fixture(scope="module")
def gen_chat(chat_dir: Path) -> tuple[Generator, FolderChat]:
    gen = Generator(chat_dir)
    return gen, folder_chat(chat_dir, gen.manifest, gen.tokenizer)


def _parse(doc: Any, gen: Generator, chat: FolderChat | None) -> Any:
    assert gen.tokenizer is not None
    return parse_generate(json.dumps(doc).encode(), gen.tokenizer.encode, gen.shapes, chat)


def test_messages_are_the_templates_ids_and_stop_at_its_end_of_turn(chat_dir: Path,
                                                                    gen_chat: tuple[Generator, FolderChat]) -> None:
    gen, chat = gen_chat
    for messages in CONVERSATIONS:
        request = _parse({"messages": messages, "max_new_tokens": 4}, gen, chat)
        assert request.prompt_ids == chat_ids(reference(chat_dir), messages)
        assert request.stop_ids == (ENDOFTEXT, IM_END)
    plain = _parse({"prompt": "Hello"}, gen, chat)
    assert plain.stop_ids is None and "stop_ids" not in plain.to_json()  # the server's own eos; the load test's body


@pytest.mark.parametrize(("doc", "says"), [
    ({"messages": CONVERSATIONS[0], "prompt": "x"}, "(exactly one of them, got 'prompt' and 'messages')"),
    ({"messages": CONVERSATIONS[0], "prompt_ids": [1]}, "(exactly one of them, got 'prompt_ids' and 'messages')"),
    ({"max_new_tokens": 3}, "(exactly one of them, got none)"),
    ({"messages": []}, "'messages': expected a non-empty list of"),
    ({"messages": "hi"}, "'messages': expected a non-empty list of"),
    ({"messages": [{"role": "user"}]}, "'messages'[0]: expected an object of a 'role' string and a 'content' string"),
    ({"messages": [{"role": "user", "content": 3}]}, "'messages'[0]: expected an object of a 'role' string"),
    ({"messages": [{"role": "user", "content": "\ud800"}]}, "'messages': expected text (valid Unicode)"),
])
def test_bad_messages_are_one_line_each(doc: Any, says: str, gen_chat: tuple[Generator, FolderChat]) -> None:
    with pytest.raises(RequestError) as caught:
        _parse(doc, *gen_chat)
    line = str(caught.value)
    assert says in line and "\n" not in line and caught.value.status == 400, line


def test_messages_without_a_template_and_a_template_that_refuses(gen_chat: tuple[Generator, FolderChat]) -> None:
    gen, chat = gen_chat
    with pytest.raises(RequestError, match=r"^'messages': this model has no chat template .*; send 'prompt'$"):
        _parse({"messages": CONVERSATIONS[0]}, gen, None)
    strict = FolderChat("{{ raise_exception('roles must alternate') }}", chat.tokens, chat.stop_ids, chat.tokenizer)
    with pytest.raises(RequestError, match=r"^chat template: roles must alternate$"):
        _parse({"messages": CONVERSATIONS[0]}, gen, strict)
    assert generate_body_limit(gen.shapes) > len(json.dumps({"messages": CONVERSATIONS[2]}))


def test_a_folder_made_before_the_end_of_turn_ids_is_refused_before_ray(chat_dir: Path, tmp_path: Path) -> None:
    old = before_end_of_turn(chat_dir, tmp_path / "old")
    options = ServeOptions(artifact=old, max_batch=2)
    with pytest.raises(ArtifactError, match=r"the manifest records no end-of-turn ids \(contract\.chat\."
                                            r"end_of_turn_ids: the folder was exported before it\)"):
        prepare_gpt(options)


@pytest.fixture(scope="module")
def chat_server(chat_dir: Path, ray_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    process = ServerProcess(chat_dir, tmp_path_factory.mktemp("chat-server-log"), "--max-batch", "2", home=ray_home)
    with process:
        yield process
    assert process.returncode == 0, process.stderr()


def test_a_served_chat_answers_and_stops_at_im_end(chat_server: ServerProcess) -> None:
    port = chat_server.port
    status, _, text = call(port, "GET", "/v1/contract")
    contract = json.loads(text)
    assert status == 200 and contract["chat"] is True and "messages" in contract["generate"]["keys"]
    for stream in (False, True):
        body = json.dumps({"messages": CONVERSATIONS[1], "stream": stream, "max_new_tokens": 8}).encode()
        answer = served_answer(*call(port, "POST", "/v1/generate", body))
        assert answer["ids"] == REPLY_IDS and answer["stop"] == "eos" and answer["text"] == "Paris."
    # The same rendered text sent as a prompt stops at the folder's eos only: the chat's stop is the request's.
    prompt = json.dumps({"prompt": "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", "max_new_tokens": 3})
    plain = served_answer(*call(port, "POST", "/v1/generate", prompt.encode()))
    assert plain["ids"] == [*REPLY_IDS, IM_END] and plain["stop"] == "max_new_tokens"
    both = json.dumps({"messages": CONVERSATIONS[0], "prompt": "Hi"}).encode()
    status, _, text = call(port, "POST", "/v1/generate", both)
    assert status == 400 and "exactly one of them, got 'prompt' and 'messages'" in json.loads(text)["error"]
    assert "\n" not in json.loads(text)["error"]
