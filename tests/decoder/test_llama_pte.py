"""gpt.pte's module for the Llama family (archs/llama/cached.py's CachedLlama) against the book's own key/value
cache models (llms_from_scratch.kv_cache.llama3 / .qwen3): eagerly on both configs (a prompt prefilled in one call
and in two, decode steps, then a second sequence from position 0 over the first one's stale rows), and lowered by
the repo's ExecuTorch pipeline (XNNPACK, the allow-list's refusal) and run by ExecuTorch's runtime on the config
that has every op (q/k norms, grouped-query attention)."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch

from llama_book import CASES, PROMPTS, QWEN3, book_model, family_rows
from mha_export.decoder.archs.llama.cached import CachedLlama
from mha_export.decoder.archs.llama.config import RotaryConfig

TOLERANCE = 1e-4
STEPS = 5

Forward = Callable[[list[int], int], np.ndarray]  # ids at positions start .. -> (V,) logits of the last one


@pytest.fixture(autouse=True)
def llama_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    family_rows(monkeypatch)


def worst_against_book(cfg: RotaryConfig, tied: bool, forward: Forward) -> float:
    """The largest logit difference from the book's kv_cache model over every prompt: prefilled in one call
    (the first) or two, then STEPS greedy steps; the prompts run one after another on the same cache."""
    from llms_from_scratch.kv_cache.utils import KVCache

    book = book_model(cfg, tied=tied, cached=True)
    worst = 0.0
    for r, prompt in enumerate(PROMPTS):
        book.reset_kv_cache()
        cache = KVCache(cfg.n_layers)
        with torch.no_grad():
            expected = book(torch.tensor([prompt]), cache=cache)[0, -1].numpy()
        split = len(prompt) if r == 0 else 4
        got = forward(prompt[:split], 0)
        if split < len(prompt):
            got = forward(prompt[split:], split)
        ids = list(prompt)
        for _ in range(STEPS):
            worst = max(worst, float(np.abs(got - expected).max()))
            ids.append(int(expected.argmax()))
            with torch.no_grad():
                expected = book(torch.tensor([ids[-1:]]), cache=cache)[0, -1].numpy()
            got = forward(ids[-1:], len(ids) - 1)
        worst = max(worst, float(np.abs(got - expected).max()))
    return worst


@pytest.mark.parametrize(("cfg", "tied"), CASES)
def test_cached_module_matches_the_books_kv_cache_model(cfg: RotaryConfig, tied: bool) -> None:
    module = CachedLlama(book_model(cfg, tied=tied, cached=True), cfg).eval()

    def forward(ids: list[int], start: int) -> np.ndarray:
        with torch.no_grad():
            return module(torch.tensor([ids]), torch.tensor([start]))[0].numpy()

    assert worst_against_book(cfg, tied, forward) <= TOLERANCE


def test_lowered_program_matches_the_books_kv_cache_model() -> None:
    pytest.importorskip("executorch")
    from mha_export.executorch.decoder import pte_bytes
    from mha_export.infer.decoder_pte_runner import PteGPT
    from mha_runtime.decoder.contract import pte_bounds
    from mha_runtime.decoder.shapes import DecoderShapes

    data = pte_bytes(book_model(QWEN3, tied=True, cached=True), QWEN3)  # the allow-list refuses what XNNPACK left
    program = PteGPT(data, QWEN3.to_dict(), DecoderShapes.of(QWEN3), pte_bounds(QWEN3))
    assert worst_against_book(QWEN3, True, program.forward) <= TOLERANCE
