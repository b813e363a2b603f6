"""Each decoder file against the eager model: logits at prompt lengths 1, a middle one and context_length, batch 1
and 3, by prefill and by single steps, and greedy tokens; the figures go into the manifest.

The files are driven by the runtime's own decoders (mha_runtime.decoder.decoder), so what is proven here is what
`mha generate` runs.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnxruntime as ort

from mha_export.decoder.archs.protocol import DecoderConfig
from mha_export.decoder.eager import Eager, eager_at
from mha_export.decoder.golden import eager_generation
from mha_runtime.artifact.tolerance import Tolerance, compare
from mha_runtime.decoder.decoder import decoder_for
from mha_runtime.decoder.forms import Form
from mha_runtime.decoder.shapes import Shaped

VALIDATION_SEED = 7
STEPS = 4  # single steps after each prefill
GREEDY_NEW = 16


@dataclass
class Tally:
    """Comparisons against one tolerance row: how many, the worst max abs error, one line per case beyond it
    (none when `judged` is false: the figures are recorded only)."""

    file: str
    tolerance: Tolerance
    judged: bool = True
    cases: int = 0
    worst: float = 0.0
    failures: list[str] = field(default_factory=list)

    def check(self, actual: np.ndarray, expected: np.ndarray, what: str) -> None:
        result = compare(actual, expected, self.tolerance)
        self.cases += 1
        self.worst = max(self.worst, result.max_abs)
        if not result.ok and self.judged:
            self.failures.append(f"{self.file} {what}: max abs error {result.max_abs:.3g} beyond atol "
                                 f"{self.tolerance.atol:g}")


@dataclass(frozen=True)
class FormReport:
    cases: int
    max_abs_error: float
    greedy_agreement: float
    passed: bool
    failures: tuple[str, ...]


def prompt_lengths(cfg: DecoderConfig) -> list[int]:
    return sorted({1, max(1, cfg.context_length // 2), cfg.context_length})


def golden_prompts(cfg: DecoderConfig, rng: np.random.Generator) -> list[list[int]]:
    """Three prompts of different lengths with room for GREEDY_NEW new tokens (a short context repeats a length)."""
    room = max(1, cfg.context_length - GREEDY_NEW)
    lengths = sorted([1, max(1, min(room, 7)), max(1, min(room, cfg.context_length // 3))])
    return [rng.integers(0, cfg.vocab_size, n).tolist() for n in lengths]


def greedy_new(cfg: Shaped, prompts: list[list[int]]) -> int:
    """GREEDY_NEW, or fewer where the longest prompt leaves less room (a context under GREEDY_NEW + 1)."""
    return min(GREEDY_NEW, cfg.context_length - max(len(p) for p in prompts))


def agreement(a: list[int], b: list[int]) -> float:
    """Share of tokens equal up to the first difference (after it the two continue from different text)."""
    same = next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(a))
    return same / len(a) if a else 1.0


@dataclass(frozen=True)
class LengthCase:
    ids: list[list[int]]  # (B, n)
    split: int  # prefill of split tokens, then single steps to n
    expected: np.ndarray  # (B, n - split + 1, V): eager logits at split - 1 .. n - 1


@dataclass(frozen=True)
class References:
    """The eager model's answers, computed once for every form (the model can then be freed)."""

    cases: list[LengthCase]
    prompts: list[list[int]]
    first: np.ndarray  # (3, V): each mixed prompt's last-token logits
    greedy: list[list[int]]  # GREEDY_NEW greedy ids per prompt


def references(model: Eager, cfg: DecoderConfig) -> References:
    rng = np.random.default_rng(VALIDATION_SEED)
    cases = []
    for n in prompt_lengths(cfg):
        for batch in (1, 3):
            ids = rng.integers(0, cfg.vocab_size, (batch, n)).tolist()
            split = max(1, n - STEPS)
            cases.append(LengthCase(ids, split, eager_at(model, ids, list(range(split - 1, n)))))
    prompts = golden_prompts(cfg, rng)
    new = greedy_new(cfg, prompts)
    runs = [eager_generation(model, p, new, 0.0, None, None, cfg.vocab_size) for p in prompts]  # (ids, (V,) first)
    return References(cases, prompts, np.stack([first for _, first in runs]), [ids for ids, _ in runs])


def validate_form(session: ort.InferenceSession, form: Form, refs: References, cfg: DecoderConfig, *,
                  tolerance: Tolerance, shapes: Shaped | None = None) -> FormReport:
    """`shapes`: the folder's own (its manifest's), where they may differ from what `cfg` gives today (a folder
    exported before contract.shapes.cache_lengths keeps every layer's cache at the context)."""
    sized = cfg if shapes is None else shapes
    # A lossy form's logits are recorded, not judged: its quality bar is (lossy/build.py).
    tally = Tally(form.file, tolerance, judged=not form.lossy)
    check, failures = tally.check, tally.failures

    for case in refs.cases:
        ids, split, batch, n = case.ids, case.split, len(case.ids), len(case.ids[0])
        decoder = decoder_for(form.kind, session, sized, form.file)
        check(decoder.prefill(ids), case.expected[:, -1], f"prefill B={batch} T={n}")
        if split < n:  # the same sequences as a shorter prefill and single steps
            decoder = decoder_for(form.kind, session, sized, form.file)
            decoder.prefill([row[:split] for row in ids])
            for t in range(split, n):
                got = decoder.step([row[t] for row in ids], [True] * batch)
                check(got, case.expected[:, t - split + 1], f"step B={batch} at position {t}")
    # Rows of different lengths in one batch, stepped together: each against its own eager run.
    decoder = decoder_for(form.kind, session, sized, form.file)
    got = decoder.prefill(refs.prompts)
    for r, p in enumerate(refs.prompts):
        check(got[r], refs.first[r], f"mixed batch prefill row {r} (T={len(p)})")
    greedy = [[int(np.argmax(g))] for g in got]
    for _ in range(greedy_new(cfg, refs.prompts) - 1):
        step = decoder.step([g[-1] for g in greedy], [True] * len(refs.prompts))
        for r in range(len(refs.prompts)):
            greedy[r].append(int(np.argmax(step[r])))
    share = float(np.mean([agreement(g, e) for g, e in zip(greedy, refs.greedy, strict=True)]))
    if form.dtype == "fp32" and share < 1.0:
        failures.append(f"{form.file}: greedy tokens differ from eager PyTorch (agreement {share:.2f})")
    return FormReport(tally.cases, tally.worst, share, not failures, tuple(failures))
