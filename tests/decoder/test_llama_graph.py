"""The Llama family's ONNX pieces (archs/llama/graph.py) in both decoder forms, against the book's own models
(llms_from_scratch's Llama3Model and Qwen3Model, seeded, every norm's weights perturbed off ones): logits of a
prompt, then decode steps with the cache; the portable form over left-padded rows (attention_mask, position_ids
counting real tokens), the in-place form over batched rows each at its own past length (GroupQueryAttention's
rotary positions per row), a prompt prefilled in two calls included."""
from __future__ import annotations

import types

import numpy as np
import onnxruntime as ort
import pytest
import torch

import mha_export.decoder.archs as archs
from mha_export.decoder.archs.llama.config import LlamaConfig, Qwen3Config, RotaryConfig
from mha_export.decoder.archs.llama.graph import LlamaPieces
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


@pytest.fixture(autouse=True)
def llama_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """The builders find the pieces through archs.arch_of; until the llama and qwen3 rows are in ARCHS, a row
    that gives only graph_pieces."""
    if "llama" not in archs.ARCHS or "qwen3" not in archs.ARCHS:
        row = types.SimpleNamespace(graph_pieces=lambda g, w, cfg, *, fused: LlamaPieces(g, w, cfg, fused=fused))
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
