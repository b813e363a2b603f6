"""How far a lossy form moves the next-token distribution from the fp32 model's (torch-free).

The measure llama.cpp judges its quants by (`llama-perplexity --kl-divergence`): over token windows, each window's
first half is the context and every position of its second half is scored: the KL divergence KL(P_fp32 || P_form)
of the two next-token distributions (mean, p99, max over positions), the share of positions whose top token is the
same, and, where the windows are text (the next token is real), the perplexity of each model on it. Both models
are driven by the runtime's own decoders: prefill the first half, then one step per scored token, all windows at
once, so what is measured is what `mha generate` runs. Softmax and KL in float64.

`golden/quality.json` (listed in the manifest with its sha256) holds the windows, so `mha check` measures again on
the same tokens and compares with the figures each lossy form's manifest entry records:

    {"format": 1, "kind": "gpt-quality-windows", "source": "...", "text": bool, "windows": [[ids], ...]}
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mha_runtime.artifact.errors import ArtifactError
from mha_runtime.artifact.fields import get, record
from mha_runtime.decoder.decoder import Decoder
from mha_runtime.decoder.manifest import GPTManifest, read_listed_json

QUALITY_FILE = "golden/quality.json"
QUALITY_KIND = "gpt-quality-windows"
QUALITY_FORMAT = 1
# How a re-measurement must agree with each recorded figure. On one host the same tokens through the same kernels
# give the same figures; another CPU's int8 kernels (VNNI, AVX-512) sum in another order, which moves logits by
# float rounding only (docs/measurements/gpt.md, "Quality of the lossy forms"). So: the three KL figures within
# KL_AGREEMENT of the recorded one (plus KL_FLOOR, for a form as good as fp32), relative to it both ways (an edit
# up fails as an edit down does); the same-top share within TOP_AGREEMENT (a top token flips only at a near-tie);
# each perplexity within PPL_AGREEMENT (an exponent of a mean over every position: rounding moves it far less
# than the KL figures); the position count exactly (it is the windows' count: nothing rounds it).
KL_AGREEMENT = 0.1
KL_FLOOR = 1e-9
TOP_AGREEMENT = 0.02  # the same-top-token share, re-measured, within 2 points
PPL_AGREEMENT = 0.01
_KL_FIGURES = ("mean_kl", "p99_kl", "max_kl")
_PERPLEXITIES = ("perplexity", "reference_perplexity")


@dataclass(frozen=True)
class Quality:
    """One lossy form against fp32 over the quality windows."""

    positions: int
    mean_kl: float
    p99_kl: float
    max_kl: float
    same_top: float  # share of positions whose top token equals fp32's
    perplexity: float | None  # the form's, where the windows are text
    reference_perplexity: float | None  # fp32's, on the same positions

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, data: Any, where: str) -> Quality:
        """The recorded figures, refused in one line naming the field when one is not a possible measurement."""
        read = record(cls, data, where)
        problem = read.problem()
        if problem is not None:
            raise ArtifactError(f"{where}: {problem}")
        return read

    def problem(self) -> str | None:
        """What makes these figures impossible as a measurement (non-finite, negative, out of order), or None."""
        for name in _KL_FIGURES:
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                return f"{name}: expected a finite KL divergence >= 0, got {value!r}"
        if self.p99_kl > self.max_kl or self.mean_kl > self.max_kl:
            return (f"expected mean_kl and p99_kl <= max_kl, got mean {self.mean_kl!r}, p99 {self.p99_kl!r}, "
                    f"max {self.max_kl!r}")
        if not 0 <= self.same_top <= 1:  # a NaN is neither
            return f"same_top: expected a share in [0, 1], got {self.same_top!r}"
        if self.positions < 1:
            return f"positions: expected a positive count, got {self.positions}"
        if (self.perplexity is None) != (self.reference_perplexity is None):
            return "expected perplexity and reference_perplexity both numbers (text windows) or both null"
        for name in _PERPLEXITIES:
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                return f"{name}: expected a finite perplexity > 0, got {value!r}"
        return None

    def line(self) -> str:
        ppl = "" if self.perplexity is None else f", perplexity {self.perplexity:.4g} (fp32 " \
                                                 f"{self.reference_perplexity:.4g})"
        return (f"mean KL {self.mean_kl:.3g} (p99 {self.p99_kl:.3g}, max {self.max_kl:.3g}), same top token "
                f"{100 * self.same_top:.1f}% of {self.positions} positions{ppl}")

    def disagreements(self, recorded: Quality) -> list[str]:
        """Each recorded figure this re-measurement does not reproduce (the rules above), in words."""
        out = [f"positions: measured {self.positions}, recorded {recorded.positions}"] \
            if self.positions != recorded.positions else []
        for name in _KL_FIGURES:
            got, was = getattr(self, name), getattr(recorded, name)
            if not abs(got - was) <= KL_AGREEMENT * was + KL_FLOOR:
                out.append(f"{name}: measured {got:.3g}, recorded {was:.3g} (agreement {KL_AGREEMENT:g} of it)")
        if not abs(self.same_top - recorded.same_top) <= TOP_AGREEMENT:
            out.append(f"same_top: measured {self.same_top:.4f}, recorded {recorded.same_top:.4f} (agreement "
                       f"{TOP_AGREEMENT:g})")
        for name in _PERPLEXITIES:
            got, was = getattr(self, name), getattr(recorded, name)
            if (got is None) != (was is None):
                out.append(f"{name}: measured {got}, recorded {was} (the windows are "
                           f"{'' if got is not None else 'not '}text)")
            elif got is not None and was is not None and not abs(got - was) <= PPL_AGREEMENT * was:
                out.append(f"{name}: measured {got:.6g}, recorded {was:.6g} (agreement {PPL_AGREEMENT:g} of it)")
        return out


@dataclass(frozen=True)
class Windows:
    """The token windows a form is measured on; `text`: real text, so the next token is known (perplexity)."""

    ids: list[list[int]]
    text: bool
    source: str

    def to_json(self) -> bytes:
        return (json.dumps({"format": QUALITY_FORMAT, "kind": QUALITY_KIND, "source": self.source, "text": self.text,
                            "windows": self.ids}) + "\n").encode()

    @property
    def half(self) -> int:
        """Where each window's scored second half starts: its tokens half .. width - 1 are predicted."""
        return max(1, len(self.ids[0]) // 2)

    @property
    def positions(self) -> int:
        """How many positions a measurement over these windows scores."""
        return len(self.ids) * (len(self.ids[0]) - self.half)

    def mismatch(self, recorded: Quality) -> str | None:
        """Where recorded figures cannot be of these windows (their position count, perplexities without text or
        none with it), in words, or None: found before anything is measured."""
        if recorded.positions != self.positions:
            return f"positions: expected {self.positions} (the quality windows' scored count), got {recorded.positions}"
        if (recorded.perplexity is None) == self.text:
            return (f"perplexity: expected {'a number' if self.text else 'null'} (the windows are "
                    f"{'' if self.text else 'not '}text), got {recorded.perplexity!r}")
        return None


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """(N, V) -> (N, V) float64 log-probabilities."""
    x = logits.astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def kl_divergence(reference: np.ndarray, other: np.ndarray) -> np.ndarray:
    """(N, V) logits each -> (N,) KL(softmax(reference) || softmax(other)) in nats."""
    lp, lq = log_softmax(reference), log_softmax(other)
    return np.sum(np.exp(lp) * (lp - lq), axis=-1)


def position_scores(reference: np.ndarray, other: np.ndarray, targets: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(N, V) logits each and the (N,) tokens they predict -> (N,) each: KL(reference || other), whether the top
    tokens are the same, and `other`'s and `reference`'s negative log-likelihoods of the tokens."""
    rows = np.arange(len(targets))
    return (kl_divergence(reference, other), np.argmax(reference, axis=-1) == np.argmax(other, axis=-1),
            -log_softmax(other)[rows, targets], -log_softmax(reference)[rows, targets])


def summarize(scores: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]], text: bool) -> Quality:
    """position_scores of each group of positions, in order -> Quality (perplexities where the windows are text)."""
    kl, same, nll, reference_nll = (np.concatenate(column) for column in zip(*scores, strict=True))

    def ppl(x: np.ndarray) -> float | None:
        return float(math.exp(float(np.mean(x)))) if text else None

    return Quality(positions=int(kl.size), mean_kl=float(np.mean(kl)), p99_kl=float(np.quantile(kl, 0.99)),
                   max_kl=float(np.max(kl)), same_top=float(np.mean(same)), perplexity=ppl(nll),
                   reference_perplexity=ppl(reference_nll))


def score_windows(reference: np.ndarray, other: np.ndarray, windows: Windows) -> Quality:
    """Two models' logits over the windows, each (windows, width - half, V) predicting tokens half .. width - 1 (as
    llama.cpp's `score` answers them) -> Quality of `other` against `reference`, window by window."""
    return summarize([position_scores(ref, got, np.array(w[windows.half:]))
                      for ref, got, w in zip(reference, other, windows.ids, strict=True)], windows.text)


def measure(reference: Decoder, form: Decoder, windows: Windows) -> Quality:
    """Score the second half of every window (all of equal length W >= 2) on both decoders."""
    width, half = len(windows.ids[0]), windows.half
    rows = len(windows.ids)
    scores = []
    ref, got = reference.prefill([w[:half] for w in windows.ids]), form.prefill([w[:half] for w in windows.ids])
    for t in range(half, width):  # ref/got: (B, V) predicting token t of each window
        tokens = [w[t] for w in windows.ids]
        scores.append(position_scores(ref, got, np.array(tokens)))
        if t + 1 < width:
            ref, got = reference.step(tokens, [True] * rows), form.step(tokens, [True] * rows)
    return summarize(scores, windows.text)


def load_windows(folder: Path, manifest: GPTManifest) -> Windows:
    """The folder's quality windows after the sha256 check (ArtifactError if none or broken)."""
    where, doc = read_listed_json(folder, manifest, QUALITY_FILE, kind=QUALITY_KIND, fmt=QUALITY_FORMAT,
                                  what="quality windows")
    ids = get(doc, "windows", list, where)
    vocab, context = manifest.shapes.vocab_size, manifest.shapes.context_length
    width = len(ids[0]) if ids and isinstance(ids[0], list) else 0
    good = width >= 2 and width <= context and all(
        isinstance(w, list) and len(w) == width
        and all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in w) for w in ids)
    if not good:
        raise ArtifactError(f"{where}: expected windows of one length 2..{context} of token ids below {vocab}")
    return Windows(ids=ids, text=get(doc, "text", bool, where), source=get(doc, "source", str, where))
