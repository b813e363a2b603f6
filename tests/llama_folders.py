"""The Llama-family folders of the end-to-end proofs (tests/decoder/test_llama_export.py, test_llama_dropin.py),
each source made by the library that defines it and exported once per session:

- hf-llama: transformers' LlamaForCausalLM (llama_sources.HF_LLAMA: grouped-query attention, Llama 3's RoPE
  scaling, an untied head), save_pretrained; exported by the CLI, `mha export --gpt --weights model.safetensors`
  with nothing else (the default forms; config.json beside the weights names the architecture). The drop-in folder.
- hf-qwen3: transformers' Qwen3ForCausalLM (HF_QWEN3: q/k norms, head_dim 16 = 2 x hidden / heads, tied head),
  save_pretrained; export_gpt with the default forms and gpt.gguf (where llama.cpp is built).
- book-llama, book-qwen3: the book's Llama3Model and Qwen3Model (llama_book's configs, Qwen3's feed-forward 96),
  torch.save(state_dict) and the book's config keys as JSON with "dtype" a string, read as `mha export --gpt
  --config` reads it; export_gpt with the default forms, gpt.gguf (where llama.cpp is built) and (book-llama, where
  ExecuTorch is installed) gpt.pte. Their reference is the book's kv_cache model of the same weights.

The folders are shared by the test modules through one cache per session (`made`): a session fixture defined here
and imported into two modules would be two fixtures, two exports."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from llama_book import LLAMA, QWEN3, book_model
from llama_sources import hf_family, save_family
from mha_runtime.gguf import llama_cpp

SOURCES = ("hf-llama", "hf-qwen3", "book-llama", "book-qwen3")
# Three lengths (one token alone; a left-padded batch), every id below both vocabularies (89 and 97).
PROMPTS = [[5, 17, 42, 8, 61], [3, 80, 14, 14, 77, 29, 51, 2, 66], [7]]
NEW = 12  # the longest prompt and its new tokens fit the book configs' context of 24
HAS_PTE = importlib.util.find_spec("executorch") is not None
HAS_LLAMA_CPP = llama_cpp.program() is not None
GGUF = ("gguf",) if HAS_LLAMA_CPP else ()  # named without llama.cpp, the export refuses before any work
# llama_book's Qwen3 with a feed-forward width of 96, a multiple of the Q8_0 / Q4_0 block of 32: at its 80,
# gpt.q8_0.gguf fails the export instead of being left out (test_llama_export's strict xfail).
BOOK_QWEN3 = replace(QWEN3, hidden_dim=96)
# The book's own keys (LLAMA32_CONFIG_1B's, QWEN_CONFIG_06_B's): not the epsilon, which the book hard-codes.
BOOK_ONLY = ("rms_norm_eps",)


@dataclass(frozen=True)
class Made:
    """One source and its exported folder: `reference` gives logits (the HF model, or the book's plain model),
    `generator` greedy ids (the same HF model, or the book's kv_cache model of the same weights)."""

    source: str
    arch: str
    reference: torch.nn.Module
    generator: torch.nn.Module
    folder: Path
    notes: tuple[str, ...]
    seconds: float

    def greedy(self, prompt: list[int], new: int = NEW) -> list[int]:
        """transformers' generate (do_sample False, no eos) or the book's kv_cache generate_text_simple."""
        with torch.no_grad():
            if self.source.startswith("hf"):
                out = self.generator.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=new,
                                              min_new_tokens=0, eos_token_id=None, pad_token_id=0)
            else:
                from llms_from_scratch.kv_cache.generate import generate_text_simple

                out = generate_text_simple(self.generator, torch.tensor([prompt]), max_new_tokens=new)
        return [int(i) for i in out[0, len(prompt):]]

    def first_logits(self, prompt: list[int]) -> np.ndarray:
        """(V,) the next-token logits after the prompt, from the defining library's forward pass."""
        with torch.no_grad():
            out = self.reference(torch.tensor([prompt]))
        return (out.logits if hasattr(out, "logits") else out)[0, -1].numpy()


_MADE: dict[str, Made] = {}


def made(source: str, factory: pytest.TempPathFactory) -> Made:
    """The session's export of `source` (made on first use)."""
    if source not in _MADE:
        _MADE[source] = _make(source, factory.mktemp(source))
    return _MADE[source]


def _make(source: str, root: Path) -> Made:
    start = time.perf_counter()
    if source.startswith("hf"):
        arch = source.removeprefix("hf-")
        model = hf_family(arch)
        weights = save_family(model, root / "hf")
        folder, notes = (_cli_export(source, weights, root) if arch == "llama" else _export(
            source, root, weights, None, ("all", *GGUF)))
        return Made(source, arch, model, model, folder, notes, time.perf_counter() - start)
    arch = source.removeprefix("book-")
    cfg, tied = (LLAMA, False) if arch == "llama" else (BOOK_QWEN3, True)
    plain = book_model(cfg, tied=tied)
    (root / "ckpt").mkdir()
    weights = root / "ckpt" / "model.pth"
    torch.save(plain.state_dict(), weights)
    config = root / "ckpt" / f"{arch}.json"
    config.write_text(json.dumps({k: v for k, v in cfg.to_dict().items() if k not in BOOK_ONLY}))
    cached = book_model(cfg, tied=tied, cached=True)
    cached.load_state_dict(plain.state_dict())
    variants = ("all", *GGUF, *(("pte",) if arch == "llama" and HAS_PTE else ()))
    folder, notes = _export(source, root, weights, config, variants)
    return Made(source, arch, plain, cached.eval(), folder, notes, time.perf_counter() - start)


def _export(name: str, root: Path, weights: Path, config: Path | None, variants: tuple[str, ...]
            ) -> tuple[Path, tuple[str, ...]]:
    """export_gpt in-process into root/out/name, its config resolved as the CLI resolves it (--config, or
    config.json beside the weights)."""
    from mha_export.decoder.command import resolve_config
    from mha_export.decoder.export import export_gpt

    [(name, cfg)] = resolve_config((), config, name, weights)
    result = export_gpt(name, root / "out", config=cfg, weights=weights, variants=variants)
    return result.folder, result.notes


def _cli_export(name: str, weights: Path, root: Path) -> tuple[Path, tuple[str, ...]]:
    """`mha export --gpt --weights WEIGHTS` (and where to put it: root/out/name), in a process of its own; its
    notes are the 'note: left out ' lines it printed, as ExportResult.notes holds them ('FILE: why')."""
    done = subprocess.run([sys.executable, "-m", "mha_runtime", "export", "--gpt", "--weights", str(weights),
                           "--name", name, "--out", str(root / "out")], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    said = "note: left out "
    notes = tuple(line.removeprefix(said) for line in done.stderr.splitlines() if line.startswith(said))
    return root / "out" / name, notes


def max_diff(got: Any, want: np.ndarray) -> float:
    return float(np.abs(np.asarray(got, dtype=np.float64) - want).max())
