"""The gguf variant's export step: gpt.gguf and, beside each lossy ONNX form the export ships, its GGUF quant type
(mha_runtime.decoder.contract.GGUF_QUANTS), each written and then run by llama.cpp itself (mha_runtime.gguf.llama_cpp).

- gpt.gguf reproduces eager PyTorch's greedy golden generations: the same new ids, the first-step logits within
  GGUF's tolerance row, a text prompt encoded by the GGUF's own tokenizer to the golden prompt ids.
- A quant type is judged as the ONNX lossy form of its width (mha_export.decoder.lossy.build): the mean KL divergence
  of its next-token distributions from gpt.gguf's over the folder's quality windows (both through llama.cpp, as
  `llama-perplexity --kl-divergence` judges a quant against its F32 file) within that form's bar. When the whole
  file misses it, the matrices its rounding moves most are kept at a higher type (F32 in Q8_0, Q8_0 in Q4_0), 1, 2,
  4, ... of them up to a quarter, each plan measured in turn; one that no plan brings under the bar is deleted and
  left out with a note ('all') or fails the export (variants named). Its greedy generations are its own
  (golden/generations.<type>.json); how far they are from eager PyTorch's is recorded, not judged.

Each file is written from the weights and run by llama.cpp here, in the build step: a plan that misses is
rewritten from the weights, which the validation step no longer holds; that step records what was found here.
"""
from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType

from mha_export.decoder.archs import arch_of
from mha_export.decoder.archs.protocol import DecoderConfig
from mha_export.decoder.lossy.build import _counts
from mha_export.decoder.plan import folder_form
from mha_export.decoder.validate import agreement
from mha_export.gguf.write import HIGHER, Written, candidates, gguf_tensors, quant_refusal, vocabulary, write_gguf
from mha_runtime.artifact.errors import MHAError, first_line
from mha_runtime.artifact.tolerance import compare
from mha_runtime.decoder.contract import GGUF_FORM
from mha_runtime.decoder.forms import GGUF, GGUF_FORMS, GGUF_QUANTS, Form
from mha_runtime.decoder.golden import GoldenGeneration
from mha_runtime.decoder.manifest import GPTArtifact
from mha_runtime.decoder.quality import Quality, Windows, score_windows
from mha_runtime.gguf import llama_cpp


@dataclass
class GGUFOutcome:
    """What the GGUF files came to: their manifest entries, each quant type's own greedy generations and
    first-step logits, the failures, the notes (what this config cannot have) and the misses (quant types over
    their bar with every plan, deleted)."""

    artifacts: dict[str, GPTArtifact] = field(default_factory=dict)
    own: dict[str, tuple[list[GoldenGeneration], dict[str, np.ndarray]]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    misses: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Ran:
    written: Written
    got: llama_cpp.Greedy
    logits: np.ndarray | None  # (windows, width - half, V), where windows were scored
    seconds: float
    quality: Quality | None = None
    tries: tuple[dict[str, object], ...] = ()


def build_ggufs(stage: Path, state: dict[str, torch.Tensor], cfg: DecoderConfig, *, tied: bool, name: str,
                tokenizer_json: bytes | None, lossy: list[str], cases: list[GoldenGeneration],
                eager: dict[str, np.ndarray], windows: Windows | None, eos_ids: tuple[int, ...] | None = None,
                bos_id: int | None = None, tokenizer_config: bytes | None = None,
                tokenizer_gguf: Path | None = None) -> GGUFOutcome:
    """Write and run gpt.gguf, then the quant types of the lossy forms built (`lossy`), in the folder `stage`; bos
    and eos the folder's (`eos_ids`, `bos_id`); the tokenizer's keys those of `tokenizer_gguf` where the folder's
    tokenizer came from that GGUF, its chat template `tokenizer_config`'s (gguf.write.vocabulary)."""
    out = GGUFOutcome()
    tensors = gguf_tensors(state, cfg, tied=tied)
    vocab = None if tokenizer_json is None else vocabulary(tokenizer_json, cfg.vocab_size, eos_ids=eos_ids,
                                                            bos_id=bos_id, config_json=tokenizer_config,
                                                            source=tokenizer_gguf)
    chosen = llama_cpp.greedy_cases(cases)
    quants = [GGUF_QUANTS[f] for f in GGUF_QUANTS if f in lossy]
    arch = arch_of(cfg)
    refused = {file: quant_refusal(cfg) or arch.refusal(cfg, file) for file in quants}  # the block's rule, then
    out.notes += [f"{file}: {why}" for file, why in refused.items() if why is not None]  # the architecture's
    quants = [file for file in quants if refused[file] is None]
    scored = windows if quants else None

    def write_and_run(file: str, keep: dict[str, GGMLQuantizationType] | None = None) -> _Ran:
        begin = time.perf_counter()
        written = write_gguf(stage / file, tensors, cfg, dtype=GGUF_FORMS[file].dtype, name=name, vocab=vocab,
                             keep=keep)
        got, logits = _run(stage / file, chosen, scored)
        return _Ran(written, got, logits, time.perf_counter() - begin)

    try:
        reference = write_and_run(GGUF_FORM)
    except (MHAError, OSError, ValueError, subprocess.SubprocessError) as exc:  # llama.cpp could not run it
        out.failures.append(f"{GGUF_FORM}: {first_line(exc)}")
        return out
    ran = {GGUF_FORM: reference}
    for file in quants:
        form = folder_form(file, cfg)
        try:
            assert scored is not None
            found = _search(file, form, tensors, reference, scored, write_and_run)
        except (MHAError, OSError, ValueError, subprocess.SubprocessError) as exc:
            out.failures.append(f"{file}: {first_line(exc)}")
            continue
        assert found.quality is not None
        if not form.meets_bar(found.quality.mean_kl):
            out.misses.append(f"{file}: mean KL divergence from {GGUF_FORM} {found.quality.mean_kl:.3g} is above its "
                              f"bar {form.max_mean_kl:g} with every plan tried (up to "
                              f"{found.tries[-1]['kept']} of its matrices kept at a higher type)")
            (stage / file).unlink()
            continue
        ran[file] = found
    for file, r in ran.items():
        form = folder_form(file, cfg)
        artifact, failures = _judged(form, r, chosen, eager)
        out.artifacts[file] = artifact
        out.failures += failures
        if form.lossy:
            out.own[file] = _own(form, chosen, r.got)
    return out


def _search(file: str, form: Form, tensors: dict[str, np.ndarray], reference: _Ran, windows: Windows,
            write_and_run: Callable[[str, dict[str, GGMLQuantizationType]], _Ran]) -> _Ran:
    """The first plan that meets the form's bar (or, when none does, the last tried)."""
    assert reference.logits is not None
    ranking = candidates(tensors, form.dtype)
    tries: list[dict[str, object]] = []
    seconds = 0.0
    for count in _counts(len(ranking)):
        r = write_and_run(file, {n: HIGHER[form.dtype] for n in ranking[:count]})
        assert r.logits is not None
        quality = score_windows(reference.logits, r.logits, windows)  # KL(P_gpt.gguf || P_quant), top, ppl
        seconds += r.seconds
        tries.append({"kept": count, "mean_kl": quality.mean_kl})
        if form.meets_bar(quality.mean_kl):
            break
    return _Ran(r.written, r.got, None, seconds, quality, tuple(tries))


def _run(path: Path, cases: list[GoldenGeneration], windows: Windows | None
         ) -> tuple[llama_cpp.Greedy, np.ndarray | None]:
    """One llama.cpp run of the greedy cases and (windows given) the windows' logits: llama_cpp.run_scored, the
    one the check runs too."""
    return llama_cpp.run_scored(path, cases, windows)


def _judged(form: Form, r: _Ran, cases: list[GoldenGeneration], eager: dict[str, np.ndarray]
            ) -> tuple[GPTArtifact, list[str]]:
    """gpt.gguf: each case must pass (llama_cpp.judge_case). A quant type: its distance from eager is recorded, not
    judged (its quality bar judges it), but a text prompt must still encode to the golden ids."""
    failures: list[str] = []
    worst = 0.0
    for case in cases:
        if form.lossy:
            worst = max(worst, compare(r.got.first[case.name], eager[case.name], GGUF.tolerance).max_abs)
            error = None
            if case.name in r.got.encoded and r.got.encoded[case.name] != case.prompt_ids:
                error = f"llama.cpp's tokenizer encodes {case.prompt_text!r} to {r.got.encoded[case.name]}"
        else:
            result, error = llama_cpp.judge_case(r.got, case, eager[case.name], form.tolerance)
            worst = max(worst, result.max_abs)
        if error is not None:
            failures.append(f"{form.file} {case.name}: {error}")
    extra: dict[str, object] = {}
    if r.quality is not None:
        extra = {"quality": r.quality.to_dict() | {"bar_mean_kl": form.max_mean_kl},
                 "quantization": r.written.plan(form) | {"tries": list(r.tries)}}
    shares = [agreement(r.got.ids[c.name], c.ids) for c in cases]
    return GPTArtifact(kind=form.kind, dtype=form.dtype, tolerance=form.tolerance.to_dict(), cases=len(cases),
                       max_abs_error=float(worst), greedy_agreement=float(np.mean(shares)) if shares else 0.0,
                       passed=not failures, export_seconds=round(r.seconds, 3),
                       **extra), failures  # type: ignore[arg-type]


def _own(form: Form, cases: list[GoldenGeneration], got: llama_cpp.Greedy
         ) -> tuple[list[GoldenGeneration], dict[str, np.ndarray]]:
    """A quant type's own greedy generations: the golden prompts, the ids and first-step logits llama.cpp gave."""
    return ([replace(c, temperature=0.0, top_k=None, seed=None, ids=got.ids[c.name],
                     first_logits_bin=f"{form.dtype}.{c.name}.logits.bin",
                     first_logits_npy=f"{form.dtype}.{c.name}.logits.npy") for c in cases],
            {c.name: got.first[c.name].astype("<f4") for c in cases})
