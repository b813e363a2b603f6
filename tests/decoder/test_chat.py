"""`mha generate FOLDER --chat TEXT`: the folder's chat template rendered as transformers' apply_chat_template
renders it (the reference: transformers 5.24 reading the exported folder), encoded without special tokens added,
the reply ending at the template's end of turn; the refusals in one line."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from chat_sources import (
    CHATML,
    CONVERSATIONS,
    ENDOFTEXT,
    IM_END,
    REPLY_IDS,
    TEMPLATES,
    chat_folder,
    chat_ids,
    export_chat_folder,
    reference,
    with_bos,
    without_template,
)
from helpers import reseal, reseal_json
from mha_runtime.artifact.errors import ContractError
from mha_runtime.decoder.chat.folder import FolderChat, folder_chat
from mha_runtime.decoder.chat.template import render
from mha_runtime.decoder.generate import Generator

MHA = [sys.executable, "-m", "mha_runtime"]
QUESTION = "What is the capital of France?"


def mha(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*MHA, *map(str, args)], capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return chat_folder(tmp_path_factory)


def _chat(folder: Path) -> FolderChat:
    gen = Generator(folder)
    return folder_chat(folder, gen.manifest, gen.tokenizer)


def _reference(folder: Path) -> Any:
    return reference(folder)


def test_the_export_keeps_a_save_pretrained_folders_template(chat_dir: Path) -> None:
    """--tokenizer FOLDER (save_pretrained's, the template inside tokenizer_config.json) is taken as it is."""
    saved = chat_dir.parent.parent / "tokenizer" / "tokenizer_config.json"
    assert (chat_dir / "tokenizer_config.json").read_bytes() == saved.read_bytes()
    assert json.loads(saved.read_text())["chat_template"] == CHATML


@pytest.mark.parametrize("messages", CONVERSATIONS, ids=["user", "system+user", "multi-turn"])
def test_the_rendered_text_and_ids_are_transformers(chat_dir: Path, messages: list[dict[str, str]]) -> None:
    chat, tok = _chat(chat_dir), _reference(chat_dir)
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert chat.render(messages) == text
    assert text.endswith("<|im_start|>assistant\n") and text.count("<|im_end|>") == len(messages)
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert chat.encode(messages) == list(ids)
    assert ids.count(IM_END) == len(messages)  # the special tokens are single ids, not their letters


# Python's jinja2 prints booleans as True/False and has transformers' dict(); @huggingface/jinja (chat_sources.py
# TEMPLATES, rendered by every runtime) does neither, so this one is Python's alone.
PYTHON_TEMPLATES = {**TEMPLATES, "dict-and-booleans": "{{ dict(a=1, b=[2]) | tojson }} {{ tools is none }} "
                                                      "{{ documents is none }} {{ add_generation_prompt }}"}


@pytest.mark.parametrize("name", sorted(PYTHON_TEMPLATES))
def test_transformers_environment_renders_the_same(chat_dir: Path, name: str) -> None:
    tok = _reference(chat_dir)
    tokens = {k: v for k, v in tok.special_tokens_map.items()}
    for messages in CONVERSATIONS:
        want = tok.apply_chat_template(messages, chat_template=PYTHON_TEMPLATES[name], add_generation_prompt=True,
                                       tokenize=False)
        assert render(PYTHON_TEMPLATES[name], messages, tokens) == want


def test_raise_exception_is_one_line_as_transformers_raises_it(chat_dir: Path) -> None:
    source = ("{% if messages[0].role != 'user' %}{{ raise_exception('Conversations must start with a user') }}"
              "{% endif %}")
    tok = _reference(chat_dir)
    with pytest.raises(Exception, match="Conversations must start with a user"):
        tok.apply_chat_template(CONVERSATIONS[1], chat_template=source, tokenize=False)
    with pytest.raises(ContractError, match=r"^chat template: Conversations must start with a user$"):
        render(source, CONVERSATIONS[1], {})


def test_generate_chat_prints_the_reply_and_stops_at_im_end(chat_dir: Path) -> None:
    """The folder's eos is GPT-2's <|endoftext|>; the reply ends at <|im_end|> (the template closes each turn with
    it: the export recorded it among the end-of-turn ids), not printed."""
    doc = json.loads((chat_dir / "manifest.json").read_text())
    assert doc["eos_ids"] == [ENDOFTEXT] and doc["contract"]["chat"]["end_of_turn_ids"] == [ENDOFTEXT, IM_END]
    assert _chat(chat_dir).stop_ids == (ENDOFTEXT, IM_END)
    shown = mha("generate", chat_dir, "--chat", QUESTION)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == "Paris.\n" and "(stopped: eos; greedy)" in shown.stderr
    ref = _reference(chat_dir).apply_chat_template([{"role": "user", "content": QUESTION}],
                                                   add_generation_prompt=True, return_dict=False)
    for form in ("gpt.onnx", "gpt.inplace.onnx"):
        done = json.loads(mha("generate", chat_dir, "--chat", QUESTION, "--json", "--form", form).stdout)
        assert done["prompt_ids"] == [list(ref)] and done["ids"] == [REPLY_IDS] and done["stops"] == ["eos"]
    on = json.loads(mha("generate", chat_dir, "--chat", QUESTION, "--json", "--no-eos", "--max-new-tokens", "3").stdout)
    assert on["ids"] == [[*REPLY_IDS, IM_END]] and on["stops"] == ["max_new_tokens"]  # the id it stopped at


def test_refusals_are_one_line(chat_dir: Path, tmp_path: Path) -> None:
    both = mha("generate", chat_dir, "--chat", QUESTION, "--prompt", "Hello")
    assert both.returncode == 2 and both.stderr.count("\n") == 1, both.stderr
    assert "give --chat TEXT or a prompt (--prompt, --prompt-ids), not both" in both.stderr
    bare = without_template(chat_dir, tmp_path / "bare")
    none = mha("generate", bare, "--chat", QUESTION)
    assert none.returncode == 2 and none.stderr.count("\n") == 1 and not none.stdout, none.stderr
    assert f"{bare}: this folder has no chat template" in none.stderr
    reseal_json(bare, "tokenizer_config.json", chat_template="{{ raise_exception('only system') }}")
    refused = mha("generate", bare, "--chat", QUESTION)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert refused.stderr.startswith("Error: chat template: only system (")
    reseal_json(bare, "tokenizer_config.json", chat_template="{% for %}")
    broken = mha("generate", bare, "--chat", QUESTION)
    assert broken.returncode == 1 and broken.stderr.count("\n") == 1, broken.stderr
    assert "chat template: jinja2 cannot parse it" in broken.stderr


def test_a_listed_chat_template_jinja_wins_as_in_transformers(chat_dir: Path, tmp_path: Path) -> None:
    """chat_template.jinja beside tokenizer_config.json (save_pretrained's default in transformers 5): read first,
    as AutoTokenizer reads it."""
    folder = Path(shutil.copytree(chat_dir, tmp_path / "jinja", symlinks=True))
    (folder / "chat_template.jinja").write_text("{% for m in messages %}<{{ m.content }}>{% endfor %}\n")
    reseal(folder, "chat_template.jinja")
    want = _reference(folder).apply_chat_template(CONVERSATIONS[0], add_generation_prompt=True, tokenize=False)
    assert _chat(folder).render(CONVERSATIONS[0]) == want == f"<{QUESTION}>"  # jinja2 drops one trailing newline


def test_the_export_keeps_the_template_of_transformers_default_save(tmp_path: Path) -> None:
    folder, run = export_chat_folder(tmp_path, jinja_file=True)
    assert run.returncode == 0, run.stderr
    assert _chat(folder).render(CONVERSATIONS[0]).endswith("<|im_start|>assistant\n")


def test_a_chat_gets_no_post_processor_bos(chat_dir: Path, tmp_path: Path) -> None:
    """A tokenizer whose post-processor puts a BOS before a prompt: the prompt gets it, the rendered chat does not
    (apply_chat_template encodes with add_special_tokens=False)."""
    folder = with_bos(chat_dir, tmp_path / "bos")
    gen = Generator(folder)
    assert gen.tokenizer is not None and gen.tokenizer.encode("Hi")[0] == ENDOFTEXT
    for messages in CONVERSATIONS:
        assert _chat(folder).encode(messages) == chat_ids(_reference(folder), messages)
