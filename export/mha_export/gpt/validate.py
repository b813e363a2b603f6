"""Each decoder file against the eager model: logits at prompt lengths 1, a middle one and context_length, batch 1
and 3, by prefill and by single steps, and greedy tokens; the figures go into the manifest.

The files are driven by the runtime's own decoders (mha_runtime.gpt.decoder), so what is proven here is what
`mha generate` runs.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnxruntime as ort
import torch

from mha_export.gpt.eager import GPTModel
from mha_runtime.artifact.tolerance import Tolerance, compare
from mha_runtime.gpt.config import GPTConfig
from mha_runtime.gpt.contract import Form
from mha_runtime.gpt.decoder import decoder_for

VALIDATION_SEED = 7
STEPS = 4  # single steps after each prefill
GREEDY_NEW = 16


@dataclass(frozen=True)
class FormReport:
    cases: int
    max_abs_error: float
    greedy_agreement: float
    passed: bool
    failures: tuple[str, ...]


def prompt_lengths(cfg: GPTConfig) -> list[int]:
    return sorted({1, max(1, cfg.context_length // 2), cfg.context_length})


def golden_prompts(cfg: GPTConfig, rng: np.random.Generator) -> list[list[int]]:
    """Three prompts of different lengths with room for GREEDY_NEW new tokens."""
    room = max(1, cfg.context_length - GREEDY_NEW)
    lengths = sorted({1, max(1, min(room, 7)), max(1, min(room, cfg.context_length // 3))})
    while len(lengths) < 3:
        lengths.append(lengths[-1])
    return [rng.integers(0, cfg.vocab_size, n).tolist() for n in lengths]


def eager_logits(model: GPTModel, ids: list[list[int]]) -> np.ndarray:
    """(B, T, V) logits of equal-length rows."""
    with torch.no_grad():
        return model(torch.tensor(ids, dtype=torch.int64)).numpy()


def eager_greedy(model: GPTModel, prompt: list[int], new: int) -> list[int]:
    ids = list(prompt)
    for _ in range(new):
        ids.append(int(np.argmax(eager_logits(model, [ids])[0, -1])))
    return ids[len(prompt):]


def agreement(a: list[int], b: list[int]) -> float:
    """Share of tokens equal up to the first difference (after it the two continue from different text)."""
    same = next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(a))
    return same / len(a) if a else 1.0


def validate_form(session: ort.InferenceSession, form: Form, model: GPTModel, cfg: GPTConfig, *,
                  tolerance: Tolerance) -> FormReport:
    rng = np.random.default_rng(VALIDATION_SEED)
    failures: list[str] = []
    cases, worst = 0, 0.0

    def check(actual: np.ndarray, expected: np.ndarray, what: str) -> None:
        nonlocal cases, worst
        result = compare(actual, expected, tolerance)
        cases += 1
        worst = max(worst, result.max_abs)
        if not result.ok:
            failures.append(f"{form.file} {what}: max abs error {result.max_abs:.3g} beyond atol {tolerance.atol:g}")

    for n in prompt_lengths(cfg):
        for batch in (1, 3):
            ids = rng.integers(0, cfg.vocab_size, (batch, n)).tolist()
            ref = eager_logits(model, ids)  # (B, n, V)
            decoder = decoder_for(form.kind, session, cfg, form.file)
            check(decoder.prefill(ids), ref[:, -1], f"prefill B={batch} T={n}")
            split = max(1, n - STEPS)
            if split < n:  # the same sequences as a shorter prefill and single steps
                decoder = decoder_for(form.kind, session, cfg, form.file)
                decoder.prefill([row[:split] for row in ids])
                for t in range(split, n):
                    got = decoder.step([row[t] for row in ids], [True] * batch)
                    check(got, ref[:, t], f"step B={batch} at position {t}")
    # Rows of different lengths in one batch, stepped together: each against its own eager run.
    prompts = golden_prompts(cfg, rng)
    decoder = decoder_for(form.kind, session, cfg, form.file)
    got = decoder.prefill(prompts)
    for r, p in enumerate(prompts):
        check(got[r], eager_logits(model, [p])[0, -1], f"mixed batch prefill row {r} (T={len(p)})")
    greedy = [[int(np.argmax(g))] for g in got]
    for _ in range(GREEDY_NEW - 1):
        step = decoder.step([g[-1] for g in greedy], [True] * len(prompts))
        for r in range(len(prompts)):
            greedy[r].append(int(np.argmax(step[r])))
    expected = [eager_greedy(model, p, GREEDY_NEW) for p in prompts]
    share = float(np.mean([agreement(g, e) for g, e in zip(greedy, expected, strict=True)]))
    if form.dtype == "fp32" and share < 1.0:
        failures.append(f"{form.file}: greedy tokens differ from eager PyTorch (agreement {share:.2f})")
    return FormReport(cases, worst, share, not failures, tuple(failures))
