"""The book's own Llama-family models for the llama/qwen3 graph and gpt.pte tests: llms_from_scratch's
Llama3Model and Qwen3Model (and their kv_cache versions), seeded, in float32, on two small configs, and the rows
the builders find the family's pieces by until the architecture table has them."""
from __future__ import annotations

import types

import numpy as np
import pytest
import torch

import mha_export.decoder.archs as archs
from mha_export.decoder.archs.llama.config import LlamaConfig, Qwen3Config, RotaryConfig

# Grouped-query attention (4 query heads, 2 key/value heads); Llama 3's frequency scaling with an original
# context short enough that D = 16's wavelengths (6.3 .. 1.9e4 positions) fall on all three of its branches.
LLAMA = LlamaConfig(vocab_size=97, context_length=24, emb_dim=64, n_heads=4, n_layers=2, hidden_dim=96, n_kv_groups=2,
                    rope_base=10_000.0, rope_freq={"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                   "original_context_length": 64})
# q/k norms, head size 2 * emb_dim / n_heads (GroupQueryAttention's rotary needs a multiple of 16), tied head.
QWEN3 = Qwen3Config(vocab_size=97, context_length=24, emb_dim=32, n_heads=4, n_layers=2, hidden_dim=80, n_kv_groups=2,
                    rope_base=1_000_000.0, head_dim_=16)
CASES = [pytest.param(LLAMA, False, id="llama-gqa-rope-scaling-untied"),
         pytest.param(QWEN3, True, id="qwen3-qk-norm-wide-heads-tied")]
PROMPTS = [[5, 17, 42, 8, 61], [3, 90, 14, 14, 77, 29, 51, 2, 66]]


def family_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """The builders find the pieces through archs.arch_of; until the llama and qwen3 rows are in ARCHS, a row
    that gives only graph_pieces and pte_module."""
    if "llama" in archs.ARCHS and "qwen3" in archs.ARCHS:
        return
    from mha_export.decoder.archs.llama.cached import CachedLlama
    from mha_export.decoder.archs.llama.graph import LlamaPieces

    row = types.SimpleNamespace(graph_pieces=lambda g, w, cfg, *, fused: LlamaPieces(g, w, cfg, fused=fused),
                                pte_module=CachedLlama)
    monkeypatch.setattr(archs, "ARCHS", {**archs.ARCHS, "llama": row, "qwen3": row})


def book_model(cfg: RotaryConfig, *, tied: bool, cached: bool = False) -> torch.nn.Module:
    """The book's Llama3Model or Qwen3Model (its kv_cache version with `cached`) for cfg in float32, seeded, the
    norms' weights drawn around 1 (the book's are all ones), the head tied to the token embedding with `tied`."""
    if cfg.arch == "llama":
        from llms_from_scratch.kv_cache.llama3 import Llama3Model as Cached
        from llms_from_scratch.llama3 import Llama3Model as Plain
    else:
        from llms_from_scratch.kv_cache.qwen3 import Qwen3Model as Cached
        from llms_from_scratch.qwen3 import Qwen3Model as Plain
    book_cfg = {**cfg.to_dict(), "dtype": torch.float32}
    torch.manual_seed(123)
    model = (Cached if cached else Plain)(book_cfg).eval()
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.copy_(1 + 0.3 * torch.randn(param.shape, generator=generator))
        if tied:
            model.out_head.weight.copy_(model.tok_emb.weight)
    return model


def greedy_reference(model: torch.nn.Module, prompt: list[int], steps: int) -> tuple[list[int], np.ndarray]:
    """The book's model without a cache, over the whole sequence each time: greedy new tokens and the logits that
    chose them ((steps + 1, V): after the prompt, then after each new token)."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(steps):
            ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
        logits = model(torch.tensor([ids]))[0, len(prompt) - 1:].numpy()
    return ids[len(prompt):], logits
