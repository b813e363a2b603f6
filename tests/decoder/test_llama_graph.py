"""The Llama family's ONNX pieces (archs/llama/graph.py) in both decoder forms, against the book's own models
(llms_from_scratch's Llama3Model and Qwen3Model, seeded, every norm's weights perturbed off ones): logits of a
prompt, then decode steps with the cache; the portable form over left-padded rows (attention_mask, position_ids
counting real tokens), the in-place form over batched rows each at its own past length (GroupQueryAttention's
rotary positions per row), a prompt prefilled in two calls included."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch

from llama_book import CASES, PROMPTS, book_model, family_rows, greedy_reference
from mha_export.decoder.archs.llama.config import RotaryConfig
from mha_export.decoder.graphs.concat import concat_model
from mha_export.decoder.graphs.inplace import inplace_model
from mha_export.decoder.graphs.shared import Built
from mha_runtime.decoder.contract import (
    ATTENTION_MASK,
    INPUT_IDS,
    LOGITS,
    NEXT_LOGITS,
    PAST_TOKENS,
    POSITION_IDS,
    past_key,
    past_value,
    present_key,
    present_value,
)

TOLERANCE = 1e-4
STEPS = 5


@pytest.fixture(autouse=True)
def llama_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    family_rows(monkeypatch)


def pairs(cfg: RotaryConfig) -> list[tuple[str, str]]:
    """(past, present) names of every cache tensor."""
    return [pair for i in range(cfg.n_layers) for pair in ((past_key(i), present_key(i)),
                                                           (past_value(i), present_value(i)))]


def session(built: Built) -> ort.InferenceSession:
    return ort.InferenceSession(built.full().SerializeToString(), providers=["CPUExecutionProvider"])


def references(cfg: RotaryConfig, tied: bool) -> tuple[dict[str, torch.Tensor], list[list[int]], list[np.ndarray]]:
    model = book_model(cfg, tied=tied)
    runs = [greedy_reference(model, p, STEPS) for p in PROMPTS]
    return model.state_dict(), [r[0] for r in runs], [r[1] for r in runs]


@pytest.mark.parametrize(("cfg", "tied"), CASES)
def test_portable_form_matches_the_books_model_left_padded(cfg: RotaryConfig, tied: bool) -> None:
    state, new, expected = references(cfg, tied)
    built = concat_model(state, cfg, tied=tied)
    built.check()
    assert {n.domain for n in built.model.graph.node} <= {""}  # standard ONNX only
    run = session(built)
    width = max(map(len, PROMPTS))
    ids = np.array([[0] * (width - len(p)) + p for p in PROMPTS], np.int64)  # (2, 9) left padded
    mask = np.array([[0] * (width - len(p)) + [1] * len(p) for p in PROMPTS], np.int64)
    cache = {past: np.zeros((2, cfg.kv_heads, 0, cfg.head_dim), np.float32) for past, _ in pairs(cfg)}
    worst = 0.0
    for step in range(STEPS + 1):
        positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)[:, -ids.shape[1]:]  # real tokens before each
        outs = dict(zip([o.name for o in run.get_outputs()],
                        run.run(None, {INPUT_IDS: ids, ATTENTION_MASK: mask, POSITION_IDS: positions, **cache}),
                        strict=True))
        for r in range(len(PROMPTS)):
            worst = max(worst, float(np.abs(outs[LOGITS][r, -1] - expected[r][step]).max()))
        if step < STEPS:
            ids = np.array([[new[r][step]] for r in range(len(PROMPTS))], np.int64)
            mask = np.concatenate([mask, np.ones((len(PROMPTS), 1), np.int64)], axis=1)
            cache = {past: outs[present] for past, present in pairs(cfg)}
    assert worst <= TOLERANCE


@pytest.mark.parametrize(("cfg", "tied"), CASES)
def test_inplace_form_matches_the_books_model_in_batched_rows(cfg: RotaryConfig, tied: bool) -> None:
    state, new, expected = references(cfg, tied)
    built = inplace_model(state, cfg, tied=tied)
    built.check()
    ops = {n.op_type for n in built.model.graph.node}
    assert {"GroupQueryAttention", "SkipSimplifiedLayerNormalization"} <= ops
    run = session(built)
    buffer = (1, cfg.kv_heads, cfg.context_length, cfg.head_dim)
    names = [past for past, _ in pairs(cfg)]
    rows, worst = [], 0.0

    def call(ids: np.ndarray, past: list[int], cache: dict[str, np.ndarray]
             ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        outs = dict(zip([o.name for o in run.get_outputs()],
                        run.run(None, {INPUT_IDS: ids, PAST_TOKENS: np.array(past, np.int32), **cache}), strict=True))
        return outs[NEXT_LOGITS], {past: outs[present] for past, present in pairs(cfg)}

    for r, prompt in enumerate(PROMPTS):  # each prompt alone at batch 1: the longer one in two calls
        cache = {n: np.zeros(buffer, np.float32) for n in names}
        split = len(prompt) if r == 0 else 6
        logits, cache = call(np.array([prompt[:split]], np.int64), [0], cache)
        if split < len(prompt):  # a chunk after a past: its rotary positions continue from the past
            logits, cache = call(np.array([prompt[split:]], np.int64), [split], cache)
        worst = max(worst, float(np.abs(logits[0] - expected[r][0]).max()))
        rows.append(cache)
    cache = {n: np.concatenate([c[n] for c in rows]) for n in names}  # (2, K, C, D)
    lengths = [len(p) for p in PROMPTS]
    for step in range(STEPS):  # both rows at once, each at its own past length
        logits, cache = call(np.array([[row[step]] for row in new], np.int64), [n + step for n in lengths], cache)
        for r in range(len(PROMPTS)):
            worst = max(worst, float(np.abs(logits[r] - expected[r][step + 1]).max()))
    assert worst <= TOLERANCE
