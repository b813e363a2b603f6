"""The golden generations, from the eager model at export (the contract is mha_runtime.decoder.golden): prompts of
three lengths and, with a tokenizer, one text prompt, greedy; two of them also sampled with a seed."""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from mha_export.decoder.archs import arch_of
from mha_export.decoder.archs.protocol import DecoderConfig
from mha_export.decoder.eager import Eager, eager_at
from mha_export.decoder.tokenizer import TEXT_PROMPT
from mha_runtime.artifact.tolerance import Tolerance
from mha_runtime.decoder.decoder import Decoder
from mha_runtime.decoder.golden import (
    GENERATIONS_FILE,
    GENERATIONS_FORMAT,
    GENERATIONS_KIND,
    SAMPLING_RULE,
    GoldenGeneration,
    generations_file,
)
from mha_runtime.decoder.sampling import Sampler

GOLDEN_SEED = 11
GOLDEN_NEW = 16
# (temperature, top_k, seed) of the sampled cases.
SAMPLED = ((0.8, 40, 123), (1.0, None, 7))


def eager_generation(model: Eager, prompt: list[int], new: int, temperature: float, top_k: int | None,
                     seed: int | None, vocab_size: int) -> tuple[list[int], np.ndarray]:
    """New ids from eager logits recomputed over the whole sequence each step (no cache, as the book's
    generate_text_simple), and the (V,) logits of the first step."""
    sampler = Sampler(1, temperature=temperature, top_k=top_k, seed=seed, vocab_size=vocab_size)
    ids, first = list(prompt), None
    for _ in range(new):
        logits = eager_at(model, [ids], [len(ids) - 1])[0]  # (1, V)
        first = logits[0] if first is None else first
        ids.append(sampler.next_ids(logits)[0])
    assert first is not None
    return ids[len(prompt):], first


def golden_generations(model: Eager, cfg: DecoderConfig, encode: Callable[[str], list[int]] | None
                       ) -> tuple[list[GoldenGeneration], dict[str, np.ndarray]]:
    """The cases and their first-step logits by file name (written by write_generations)."""
    new = min(GOLDEN_NEW, cfg.context_length - 1)
    room = cfg.context_length - new
    rng = np.random.default_rng(GOLDEN_SEED)
    prompts: list[tuple[str, list[int], str | None]] = [
        (f"greedy_t{n}", rng.integers(0, cfg.vocab_size, n).tolist(), None)
        for n in sorted({1, min(7, room), min(48, max(1, cfg.context_length // 4), room)})]
    if encode is not None:
        ids = encode(TEXT_PROMPT)
        if len(ids) <= room:  # a cut prompt would no longer be the text's encoding
            prompts.append(("greedy_text", ids, TEXT_PROMPT))
    settings = [(name, p, text, 0.0, None, None) for name, p, text in prompts]
    for (temperature, top_k, seed), (_, p, text) in zip(SAMPLED, prompts[1::-1], strict=False):
        top_k = None if top_k is None else min(top_k, cfg.vocab_size)  # a vocabulary under 40 ids
        settings.append((f"sampled_t{len(p)}_s{seed}", p, text, temperature, top_k, seed))
    cases, logits = [], {}
    for name, prompt, text, temperature, top_k, seed in settings:
        ids, first = eager_generation(model, prompt, new, temperature, top_k, seed, cfg.vocab_size)
        cases.append(GoldenGeneration(name=name, prompt_ids=prompt, prompt_text=text, max_new_tokens=new,
                                      temperature=temperature, top_k=top_k, seed=seed, ids=ids,
                                      first_logits_bin=f"{name}.logits.bin", first_logits_npy=f"{name}.logits.npy"))
        logits[name] = first.astype("<f4")
    return cases, logits


def form_generations(decoder: Callable[[], Decoder], cases: list[GoldenGeneration], *, prefix: str
                     ) -> tuple[list[GoldenGeneration], dict[str, np.ndarray]]:
    """A form's own golden generations (a lossy form's reference; gpt.pte's, checked against the golden): the same
    prompts and sampling settings, the ids and first-step logits the form itself gives through its decoder (its
    logits files named `prefix.` + the case's)."""
    out, logits = [], {}
    for case in cases:
        d = decoder()
        step = d.prefill([case.prompt_ids])  # (1, V)
        first = step[0]
        sampler = Sampler(1, temperature=case.temperature, top_k=case.top_k, seed=case.seed,
                          vocab_size=first.shape[0])
        ids: list[int] = []
        for _ in range(case.max_new_tokens):
            ids.append(sampler.next_ids(step)[0])
            if len(ids) < case.max_new_tokens:
                step = d.step([ids[-1]], [True])
        name = f"{prefix}.{case.name}"
        out.append(replace(case, ids=ids, first_logits_bin=f"{name}.logits.bin", first_logits_npy=f"{name}.logits.npy"))
        logits[case.name] = first.astype("<f4")
    return out, logits


def write_generations(stage: Path, cases: list[GoldenGeneration], logits: dict[str, np.ndarray],
                      cfg: DecoderConfig, tolerance: Tolerance, *, form: str | None = None) -> str:
    """golden/generations.json (a lossy form's: golden/generations.FORM.json, its reference that form) and each
    case's logits as raw little-endian float32 and as .npy; returns the generations file's name."""
    file = GENERATIONS_FILE if form is None else generations_file(form)
    folder = stage / Path(GENERATIONS_FILE).parent
    folder.mkdir(parents=True, exist_ok=True)
    for case in cases:
        (folder / case.first_logits_bin).write_bytes(logits[case.name].tobytes())
        np.save(folder / case.first_logits_npy, logits[case.name], allow_pickle=False)
    reference = (f"eager PyTorch: {arch_of(cfg).REFERENCE}, no cache, float32" if form is None
                 else f"{form} through {'llama.cpp' if form.endswith('.gguf') else 'ONNX Runtime'} (CPU) at export: a "
                      "lossy form reproduces its own generations")
    doc: dict[str, Any] = {
        "format": GENERATIONS_FORMAT, "kind": GENERATIONS_KIND, "reference": reference,
        "vocab_size": cfg.vocab_size, "context_length": cfg.context_length, "eos_applied": False,
        "tolerance": tolerance.to_dict(), "sampling": SAMPLING_RULE,
        "cases": [dict(c.to_dict(), first_logits_shape=[cfg.vocab_size]) for c in cases]}
    (stage / file).write_text(json.dumps(doc, indent=1) + "\n")
    return file
