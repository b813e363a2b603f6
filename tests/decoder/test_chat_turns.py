"""The end-of-turn ids a folder with a chat template records (contract.chat.end_of_turn_ids): the eos ids, the
eos_token's id and the special token the template closes an assistant's turn with, found from the template whatever
its family; a folder without a template has no chat entry (its manifest as before); a folder made before the field
is refused for a chat in one line and still takes a prompt."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from chat_sources import CHATML, ENDOFTEXT, IM_END, IM_START, before_end_of_turn, chat_folder
from gpt_sources import vocab_dir
from mha_export.decoder.checkpoint import Origin
from mha_export.decoder.steps.seal import chat_ends
from mha_export.decoder.tokenizer import read_tokenizer
from mha_runtime.decoder.chat.turns import closing_token, end_of_turn_ids

QUESTION = "What is the capital of France?"
EACH = "{% for m in messages %}"
# Templates of several families' shapes over the chat folder's tokenizer (GPT-2's with <|im_start|>, <|im_end|>),
# and the id each closes an assistant's turn with.
CLOSINGS = {
    "chatml": (CHATML, IM_END),
    "llama3-like": (EACH + "<|im_start|>{{ m.role }}\n\n{{ m.content | trim }}<|im_end|>{% endfor %}"
                    "{% if add_generation_prompt %}<|im_start|>assistant\n\n{% endif %}", IM_END),
    "mistral-like (a space, then eos)": ("{{ bos_token }}" + EACH + "{% if m.role == 'user' %}[INST] {{ m.content }} "
                                         "[/INST]{% else %} {{ m.content }} {{ eos_token }}{% endif %}{% endfor %}",
                                         ENDOFTEXT),
    "newline, then the token": (EACH + "{{ m.role }}: {{ m.content }}\n<|im_start|>{% endfor %}", IM_START),
    "plain text": (EACH + "{{ m.role }}: {{ m.content }}\n\n{% endfor %}", None),
    "text before the token": (EACH + "{{ m.content }}</turn><|im_end|>{% endfor %}", None),
    "refuses the probe": ("{{ raise_exception('system first') }}", None),
    "cannot be parsed": ("{% for %}", None),
}


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return chat_folder(tmp_path_factory)


@pytest.mark.parametrize("name", sorted(CLOSINGS))
def test_the_templates_closing_token_is_found_whatever_its_family(name: str, chat_dir: Path) -> None:
    from tokenizers import Tokenizer

    template, want = CLOSINGS[name]
    tok = Tokenizer.from_file(str(chat_dir / "tokenizer.json"))
    assert closing_token(template, {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"}, tok) == want


def test_the_ids_are_eos_then_eos_token_then_the_closing_token_each_once(chat_dir: Path) -> None:
    data = (chat_dir / "tokenizer.json").read_bytes()
    assert end_of_turn_ids(CHATML, {"eos_token": "<|endoftext|>"}, data, [ENDOFTEXT]) == (ENDOFTEXT, IM_END)
    assert end_of_turn_ids(CHATML, {"eos_token": "<|im_end|>"}, data, [7]) == (7, IM_END)
    assert end_of_turn_ids(CHATML, {"eos_token": "two tokens"}, data, []) == (IM_END,)  # not one id: not a stop
    plain = CLOSINGS["plain text"][0]
    assert end_of_turn_ids(plain, {"eos_token": "<|im_start|>"}, data, [ENDOFTEXT]) == (ENDOFTEXT, IM_START)


def test_a_folder_without_a_template_has_no_chat_entry() -> None:
    """GPT-2's tokenizer files (no chat_template): no contract.chat, so the manifest is what it was before."""
    files = read_tokenizer(vocab_dir(), vocab_size=50257, context_length=64)
    assert "chat_template" not in json.loads(files.config_json)
    assert chat_ends(files, Origin(eos_ids=(ENDOFTEXT,), bos_id=ENDOFTEXT)) is None
    assert chat_ends(None, Origin(eos_ids=(), bos_id=None)) is None


def _mha(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mha_runtime", *map(str, args)], capture_output=True, text=True,
                          timeout=600)


def test_a_folder_made_before_the_field_is_one_line_for_a_chat(chat_dir: Path, tmp_path: Path) -> None:
    old = before_end_of_turn(chat_dir, tmp_path / "old")
    refused = _mha("generate", old, "--chat", QUESTION)
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1 and not refused.stdout, refused.stderr
    assert f"{old}: the manifest records no end-of-turn ids (contract.chat.end_of_turn_ids: the folder was " \
           "exported before it); re-export it to chat with it, or give a prompt" in refused.stderr
    plain = _mha("generate", old, "--prompt", "Hi", "--max-new-tokens", "2")
    assert plain.returncode == 0, plain.stderr


@pytest.mark.parametrize("ids", [[IM_END, 50259], "2", [True], [-1]], ids=["outside", "string", "bool", "negative"])
def test_a_bad_field_is_one_line(ids: object, chat_dir: Path, tmp_path: Path) -> None:
    old = before_end_of_turn(chat_dir, tmp_path / "bad")
    doc = json.loads((old / "manifest.json").read_text())
    doc["contract"]["chat"] = {"end_of_turn_ids": ids}
    (old / "manifest.json").write_text(json.dumps(doc))
    refused = _mha("generate", old, "--chat", QUESTION)
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1, refused.stderr
    assert f"{old / 'manifest.json'}: contract.chat.end_of_turn_ids: expected a list of token ids below vocab_size " \
           f"50259, got {json.dumps(ids)}" in refused.stderr
