"""A lossy form that meets its quality bar by construction, or is named as missing it.

The form's method (lossy/methods.py METHODS, the row its `method` names) says the plans, in order: its fast plan
(larger blocks) is measured first (mha_runtime.decoder.quality: mean KL divergence from the fp32 in-place form over
the quality windows); when it misses its bar, the fine plan (every MatMul in blocks of 32); then the matrices that
rounding moves most (quantize.weight_error, largest first) are kept at the method's higher precision in the fine
plan (fp32 in the 8-bit form, 8 bits in the 4-bit form), 1, 2, 4, ... of them up to a quarter of the MatMuls, each
plan measured in turn. The first that meets the
bar is the form, and its plan goes into the manifest with every plan tried. A model that no such plan brings
under the bar has no such form: kept any further, it would no longer be the small, fast form it is named for.

The quality windows: for a GPT-2 folder with its tokenizer, held-out English text that ships with Python (CPython's
documentation topics from character 200,000 on; the demo model trains on the first 40,000 by default), cut into
16 windows of min(128, context_length) tokens (kept so: the GPT-2 folders' quality.json stays the bytes it was).
For any other architecture with a tokenizer (a pretrained model's own, SmolLM2's), the repository's held-out text
(decoder/data/held_out.txt: the second half of the same topics, fixed across Python versions) in consecutive
windows of min(1280, context_length) tokens, as many as cover 10,240 tokens of it (the issue's >= 10,000): 8
windows for SmolLM2, 5,120 positions scored. What bounds them: the in-place decoder holds a (rows, KV,
context_length, D) cache per layer for every window at once (377 MB a row at SmolLM2's 8,192 context), and a
measurement runs one decoder step per scored position of a window, all windows together, on both models, for
every plan tried (docs/measurements/smollm2.md, "The text and the windows").
Without a tokenizer, windows of seeded random token ids.
"""
from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import numpy_helper

from mha_export.decoder.archs import arch_of
from mha_export.decoder.archs.protocol import DecoderConfig
from mha_export.decoder.lossy.embedding import TOKENS, whole_blocks
from mha_export.decoder.lossy.methods import METHODS, Method
from mha_export.decoder.lossy.quantize import QuantPlan, fit, lossy_source, matmul_weights, quantize_to, weight_error
from mha_runtime.decoder.decoder import Decoder, decoder_for, make_session
from mha_runtime.decoder.forms import Form
from mha_runtime.decoder.quality import Quality, Windows, measure

QUALITY_SEED = 13
WINDOWS = 16
WIDTH = 128
HELD_OUT_FROM = 200_000  # characters of the pydoc topics text (mha_export.decoder.corpus)
# The text's recipe as quality.json names it: the corpus module's name when folders first recorded it. Kept as
# written then (the module is mha_export.decoder.corpus now) so that a folder's files stay the bytes they were.
CORPUS_NAME = "mha_export.gpt.corpus"
# Any other architecture's text windows (module docstring): the committed excerpt, its width and scored positions.
HELD_OUT_TEXT = Path(__file__).resolve().parents[1] / "data" / "held_out.txt"
TEXT_WIDTH = 1280
TEXT_TOKENS = 10_240
KEEP_SHARE = 4  # at most 1 / KEEP_SHARE of the MatMuls kept at a higher precision


def quality_windows(cfg: DecoderConfig, encode: Callable[[str], list[int]] | None) -> Windows:
    """Held-out text where a tokenizer is given and the text is long enough (module docstring: GPT-2's pydoc
    windows, or the committed text's wide ones for any other architecture), seeded random ids otherwise: WINDOWS
    windows of min(WIDTH, context_length) tokens (at least 2)."""
    width = max(2, min(WIDTH, cfg.context_length))
    if encode is not None and cfg.arch != "gpt2":
        text = _text_windows(cfg, encode)
        if text is not None:
            return text
    elif encode is not None:
        from mha_export.decoder.corpus import pydoc_topics

        text = pydoc_topics().text[HELD_OUT_FROM:]
        ids = encode(text[: WINDOWS * width * 8])  # about 4 characters a token: twice what is needed
        if len(ids) >= WINDOWS * width:
            windows = [ids[i * width:(i + 1) * width] for i in range(WINDOWS)]
            return Windows(windows, text=True, source=f"pydoc_data.topics ({CORPUS_NAME}) from character "
                                                      f"{HELD_OUT_FROM}, {WINDOWS} windows of {width} tokens")
    rng = np.random.default_rng(QUALITY_SEED)
    return Windows(rng.integers(0, cfg.vocab_size, (WINDOWS, width)).tolist(), text=False,
                   source=f"numpy default_rng({QUALITY_SEED}) token ids, {WINDOWS} windows of {width} tokens")


def _text_windows(cfg: DecoderConfig, encode: Callable[[str], list[int]]) -> Windows | None:
    """The committed held-out text cut from its start into consecutive windows of min(TEXT_WIDTH, context_length)
    tokens, as many as cover TEXT_TOKENS, as `llama-perplexity -f held_out.txt -c WIDTH --chunks N` cuts it; where
    the tokenizer puts a BOS first (Gemma's), every window starts with it, as llama-perplexity overwrites each
    chunk's first token with BOS for a GGUF that adds one (a window cut mid-text is otherwise a prompt with no BOS,
    which Gemma never sees). None if the text is too short in this tokenizer."""
    width = max(2, min(TEXT_WIDTH, cfg.context_length))
    count = -(-TEXT_TOKENS // width)
    ids = encode(HELD_OUT_TEXT.read_text(encoding="utf-8").removesuffix("\n"))  # llama.cpp's -f drops one "\n"
    if len(ids) < count * width:
        return None
    windows = [ids[i * width:(i + 1) * width] for i in range(count)]
    bos = encode("")  # what the tokenizer puts around any text: [<bos>] for Gemma, nothing for SmolLM2
    if len(bos) == 1 and ids[:1] == bos:
        windows = [[*bos, *w[1:]] for w in windows]
    return Windows(windows, text=True,
                   source=f"{HELD_OUT_TEXT.name} (pydoc_data.topics' second half, PSF licence), {count} windows of "
                          f"{width} tokens")


@dataclass
class LossyOutcome:
    """What building one lossy form came to: the accepted plan and its quality, or the best miss."""

    form: Form
    plan: QuantPlan
    quality: Quality
    tries: list[dict[str, object]] = field(default_factory=list)

    @property
    def method(self) -> Method:
        assert self.form.method is not None
        return METHODS[self.form.method]

    @property
    def ok(self) -> bool:
        return self.form.meets_bar(self.quality.mean_kl)

    def miss_line(self) -> str:
        """One line: the figure, the bar, and what was tried."""
        return (f"{self.form.file}: mean KL divergence from fp32 {self.quality.mean_kl:.3g} is above its bar "
                f"{self.form.max_mean_kl:g} with every plan tried (blocks of {self.method.fast().block_size} and "
                f"{self.plan.block_size}, up to {len(self.plan.kept)} of the matrices kept at a higher precision)")


def ranking(source: onnx.ModelProto, method: Method, *, tied: bool) -> list[str]:
    """The quantized weights, the one rounding moves most at the method's bits first (one matrix copied out at a
    time). Where the method ranks the embedding (the 4-bit one), an untied token embedding is among them, its
    blocks along E as it is stored (a tied one is the head): at 4 bits it was most of the trained demo model's loss
    (mean KL 0.026 with it at 8 bits, 0.043 at 4), at 8 bits a small share (gpt-mini 8.2e-6 fp32, 1.1e-5 int8), and
    keeping it at fp32 there doubled the demo's int8 file for what four small matrices kept gave
    (docs/measurements/gpt.md, "The embedding quantized")."""
    bits, names = method.bits, matmul_weights(source)
    errors = {t.name: weight_error(numpy_helper.to_array(t), bits) for t in source.graph.initializer
              if t.name in names}
    table = None if tied or not method.ranks_embedding else next(t for t in source.graph.initializer
                                                                 if t.name == TOKENS)
    if table is not None and whole_blocks(table.dims[1], 16):  # quantizable at all (lossy/embedding.py)
        errors[TOKENS] = weight_error(numpy_helper.to_array(table).T, bits)  # (E, V)
    return sorted(errors, key=lambda n: -errors[n])


def _ranking(source: onnx.ModelProto, bits: int, *, tied: bool) -> list[str]:
    """ranking() by the method of the lossy form of width `bits` (the tests' view by width, as quantize.FAST)."""
    from mha_runtime.decoder.forms import FORMS

    method = next(METHODS[f.method] for f in FORMS.values() if f.bits == bits and f.method is not None)
    return ranking(source, method, tied=tied)


def _counts(n: int) -> list[int]:
    """0, 1, 2, 4, ... up to n // KEEP_SHARE (at least 1), that last included."""
    cap = max(1, n // KEEP_SHARE)
    out, k = [0], 1
    while k < cap:
        out.append(k)
        k *= 2
    return [*out, cap]


def build_lossy(form: Form, state: dict[str, torch.Tensor], cfg: DecoderConfig, path: Path, *, tied: bool,
                reference: Callable[[], Decoder], windows: Windows) -> LossyOutcome:
    """Write the first plan that meets the form's bar to `path` (or, when none does, the last tried: the caller
    deletes it)."""
    assert form.method is not None
    method = METHODS[form.method]
    source = lossy_source(state, cfg, tied=tied)
    ranked = ranking(source, method, tied=tied)
    weights = [*matmul_weights(source), *([] if tied else [TOKENS])]  # what the plans' roles may name
    tries: list[dict[str, object]] = []
    stored = arch_of(cfg).LOSSY_SCALES  # the block scales' storage the architecture asks for (lossy/scales.py)
    plans = method.plans(ranked, _counts(len(ranked)), weights=weights)
    for plan in [fit(replace(p, scales=stored), source, tied=tied) for p in plans]:
        if source is None:
            source = lossy_source(state, cfg, tied=tied)
        quantize_to(source, path, plan, tied=tied)
        source = None
        gc.collect()
        session = make_session(str(path), where=str(path))
        quality = measure(reference(), decoder_for(form.kind, session, cfg, path), windows)
        del session
        tries.append({"plan": plan.label(), "kept": len(plan.kept), "mean_kl": quality.mean_kl})
        outcome = LossyOutcome(form, plan, quality, tries)
        if outcome.ok:
            break
    return outcome
