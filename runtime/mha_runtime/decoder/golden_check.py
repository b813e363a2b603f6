"""`mha check` on a GPT folder: every golden generation on every decoder form, and each lossy form's quality
(torch-free).

A case passes when the new ids equal the golden ids exactly and the first-step logits are within the golden
tolerance; a case with a text prompt also needs the folder's tokenizer to encode it to the golden prompt ids.
The fp32 forms reproduce eager PyTorch's generations (golden/generations.json); a lossy form (int8, int4) its own,
recorded at export (its manifest entry's "generations"), and its quality is measured again over the folder's
quality windows against gpt.inplace.onnx: the case passes when it reproduces the recorded figures
(Quality.disagreements: every recorded figure) and is within the form's bar.
Tolerances and bars are the contract's (mha_runtime.decoder.contract), never a file's: a golden file or manifest entry
that records another tolerance, bar, dtype or quantization plan than the contract's and the graph's is a failed
line of its own (mha_runtime.decoder.record_check), and the cases are compared with the contract's rows.
gpt.pte (ExecuTorch) is checked when the folder has it, through the export package's registered runner; where
that is not installed its cases are reported as skipped, with what to install.
The GGUF files (gpt.gguf, gpt.q8_0.gguf, gpt.q4_0.gguf) are checked by llama.cpp itself
(mha_runtime.gguf.llama_cpp) on their greedy cases, from a copy whose sha256 is checked on the bytes llama.cpp
is handed; where llama.cpp is not built the sha256 is still checked and the cases are reported as skipped, with
how to build it.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import numpy as np

from mha_runtime.artifact.errors import MHAError, first_line
from mha_runtime.artifact.manifest import verify_all
from mha_runtime.artifact.results import CaseResult
from mha_runtime.artifact.tolerance import Tolerance, compare
from mha_runtime.decoder.contract import GGUF_FORM, INPLACE_FORM, PTE_FORM
from mha_runtime.decoder.forms import FORMS, GGUF_FORMS, PTE, folder_bar
from mha_runtime.decoder.generate import Generator
from mha_runtime.decoder.golden import (
    GENERATIONS_FILE,
    GoldenGeneration,
    GoldenGenerations,
    first_logits,
    golden_form,
    load_generations,
)
from mha_runtime.decoder.manifest import GPTManifest, load_gpt_manifest
from mha_runtime.decoder.quality import Quality, Windows, load_windows, measure
from mha_runtime.decoder.record_check import entry_problems, tolerance_words
from mha_runtime.executorch.decoder import RunnerMissing
from mha_runtime.gguf.check import check_gguf, gguf_reference
from mha_runtime.infer.providers import resolve_provider

# A lossy form's golden ids and first-step logits are those of ONNX Runtime's CPU MatMulNBits kernels; the CUDA
# kernels round differently (logits 0.014 apart on an H200, docs/measurements/cuda.md), so there it is judged by
# its quality bar alone.
LOSSY_ON_CUDA = ("recorded with the CPU kernels (CUDA's MatMulNBits rounds differently): judged on CUDA by its "
                 "quality bar")


def every_case(form: str, cases: list[GoldenGeneration], tolerance: Tolerance, error: str, *,
               skipped: bool = False) -> list[CaseResult]:
    """One result per case, each with the same `error` (a form that could not run, or was not run)."""
    return [CaseResult(form, c.name, (1, len(c.prompt_ids)), float("nan"), float("nan"), tolerance, False, error,
                       skipped=skipped) for c in cases]


def check_case(gen: Generator, case: GoldenGeneration, expected: np.ndarray, tolerance: Tolerance) -> CaseResult:
    shape = (1, len(case.prompt_ids))
    try:
        if case.prompt_text is not None and gen.tokenizer is not None:
            encoded = gen.tokenizer.encode(case.prompt_text)
            if encoded != case.prompt_ids:
                raise MHAError(f"the tokenizer encodes {case.prompt_text!r} to {encoded}, golden {case.prompt_ids}")
        logits = gen.decoder().prefill([case.prompt_ids])[0]  # (V,) first step
        result = compare(logits, expected, tolerance)
        ids = gen.generate([case.prompt_ids], max_new_tokens=case.max_new_tokens, temperature=case.temperature,
                           top_k=case.top_k, seed=case.seed, eos_id=None).ids[0]
    except Exception as exc:
        return CaseResult(gen.form, case.name, shape, float("nan"), float("nan"), tolerance, False,
                          first_line(exc))
    error = None
    if ids != case.ids:
        at = next(i for i, (a, b) in enumerate(zip([*ids, -1], [*case.ids, -2], strict=False)) if a != b)
        error = f"ids differ from token {at}: got {ids[at:at + 4]}, golden {case.ids[at:at + 4]}"
    elif not result.ok:
        error = f"first-step logits beyond tolerance (max abs {result.max_abs:.3g})"
    return CaseResult(gen.form, case.name, shape, result.max_abs, result.rel_l2, tolerance, error is None, error)


def check_quality(gen: Generator, reference: Generator, manifest: GPTManifest, folder: Path, *,
                  recorded_here: bool = True) -> CaseResult:
    """The lossy form `gen` measured again against the fp32 in-place form: within its bar, and beside its recorded
    figures where they were measured with these kernels (`recorded_here`: the CPU provider's)."""
    return judge_quality(folder, manifest, gen.form, lambda windows: measure(reference.decoder(), gen.decoder(),
                                                                             windows), recorded_here=recorded_here)


def judge_quality(folder: Path, manifest: GPTManifest, form: str, measured: Callable[[Windows], Quality], *,
                  recorded_here: bool = True) -> CaseResult:
    """The quality case of a lossy form (an ONNX form or a GGUF quant type): its recorded figures possible and of
    the folder's windows, then `measured` on them within the contract's bar and beside the record."""
    spec, record = (FORMS | GGUF_FORMS)[form], manifest.artifacts[form]
    tolerance = Tolerance(atol=0.0, rtol=0.0)
    try:
        windows = load_windows(folder, manifest)
        shape = (len(windows.ids), len(windows.ids[0]))
        if record.quality is None:
            raise MHAError(f"{form}: the manifest records no quality figures (re-export with this version)")
        where = f"manifest: artifacts.{form}.quality"
        recorded = Quality.from_dict(record.quality, where)  # a non-finite or impossible figure: one line
        mismatch = windows.mismatch(recorded)
        if mismatch is not None:
            raise MHAError(f"{where}: {mismatch}")
        got = measured(windows)
    except Exception as exc:
        return CaseResult(form, "quality", (0, 0), float("nan"), float("nan"), tolerance, False, first_line(exc))
    error = None
    differs = got.disagreements(recorded) if recorded_here else []
    bar = folder_bar(spec, record.quality.get("bar_mean_kl"))
    if bar is None or got.mean_kl > bar:
        error = (f"mean KL divergence {got.mean_kl:.3g} above the bar {bar:g}" if bar is not None else
                 f"quality.bar_mean_kl {record.quality.get('bar_mean_kl')!r} is not a bar the contract allows")
    elif differs:
        error = f"quality differs from the recorded figures: {'; '.join(differs)}"
    return CaseResult(form, "quality", shape, got.mean_kl, float("nan"), tolerance, error is None, error,
                      detail=got.line())


def record_results(folder: Path, manifest: GPTManifest, golden: dict[str, Tolerance]) -> list[CaseResult]:
    """One failed line per manifest entry field, or golden file's recorded tolerance (file -> it), that is not the
    contract's (or, for a plan, the graph's); none when all are."""
    none = Tolerance(atol=0.0, rtol=0.0)
    out = [CaseResult(file, "manifest", (0, 0), float("nan"), float("nan"), none, False,
                      f"manifest: artifacts.{file}: {problem}")
           for file, entry in manifest.artifacts.items() for problem in entry_problems(folder, file, entry)]
    for file, recorded in golden.items():
        form = golden_form(file)
        if recorded != form.tolerance:
            out.append(CaseResult(file, "tolerance", (0, 0), float("nan"), float("nan"), form.tolerance, False,
                                  f"{folder / file}: expected the contract's tolerance for {form.file} "
                                  f"{tolerance_words(form.tolerance)}, got {tolerance_words(recorded)}"))
    return out


def _golden_for(manifest: GPTManifest, form: str) -> str:
    """The generations file a form reproduces: its own (a lossy form), else golden/generations.json."""
    record = manifest.artifacts.get(form)
    return GENERATIONS_FILE if record is None or record.generations is None else record.generations


def _load(folder: Path, manifest: GPTManifest, file: str) -> tuple[GoldenGenerations, dict[str, np.ndarray]]:
    golden = load_generations(folder, manifest, file)
    return golden, {c.name: first_logits(folder, manifest, c, manifest.shapes.vocab_size) for c in golden.cases}


def check_generations(folder: Path, *, provider: str = "cpu", threads: int | None = None) -> list[CaseResult]:
    """Every golden generation on gpt.onnx, gpt.inplace.onnx, the lossy forms and gpt.pte (those the folder has);
    each lossy form's quality; the greedy ones on the GGUF files."""
    folder = Path(folder)
    manifest = load_gpt_manifest(folder)
    # Every listed file first, as for the attention: also those no runner here reads (config.json,
    # generation_config.json, genai_config.json, onnx/model.onnx), which other clients load as they are.
    verify_all(folder, manifest)
    golden_of = functools.cache(lambda file: _load(folder, manifest, file))  # each file read and hashed once
    golden_of(GENERATIONS_FILE)  # first, whichever forms the folder has: a broken file is the first line
    on_cpu = resolve_provider(provider) == "cpu"
    files = {GENERATIONS_FILE, *(_golden_for(manifest, f) for f in manifest.artifacts)}
    results = record_results(folder, manifest, {f: golden_of(f)[0].tolerance for f in sorted(files)})
    reference: Generator | None = None
    for form in (f for f in [*FORMS, PTE_FORM] if f in manifest.artifacts):
        golden, expected = golden_of(_golden_for(manifest, form))
        row = FORMS[form].tolerance if form in FORMS else PTE.tolerance
        try:
            if form == PTE_FORM and provider != "cpu":
                raise RunnerMissing(f"{PTE_FORM} runs on the CPU (XNNPACK): checked with --provider cpu")
            gen = Generator(folder, form=form, provider=provider, threads=threads)
        except RunnerMissing as exc:
            results += every_case(form, golden.cases, row, first_line(exc), skipped=True)
            continue
        if form == INPLACE_FORM:
            reference = gen
        lossy = form in FORMS and FORMS[form].lossy
        if lossy and not on_cpu:  # its ids and logits are the CPU kernels'; its bar holds everywhere
            results += every_case(form, golden.cases, row, LOSSY_ON_CUDA, skipped=True)
        else:  # the contract's row: the file's own is a record, checked in record_results
            results += [check_case(gen, case, expected[case.name], row) for case in golden.cases]
        if lossy:
            if reference is None:
                reference = Generator(folder, form=INPLACE_FORM, provider=provider, threads=threads)
            results.append(check_quality(gen, reference, manifest, folder, recorded_here=on_cpu))
    ggufs = [f for f in GGUF_FORMS if f in manifest.artifacts]
    memo: dict[str, np.ndarray] = {}  # gpt.gguf's logits over the windows: one llama.cpp run for every quant type

    def reference_logits(windows: Windows) -> np.ndarray:
        if GGUF_FORM not in memo:
            memo[GGUF_FORM] = gguf_reference(folder, manifest, windows)
        return memo[GGUF_FORM]

    for form in ggufs:
        results += check_gguf(folder, manifest, form, *golden_of(_golden_for(manifest, form)),
                              judge=functools.partial(judge_quality, folder, manifest, form),
                              reference=reference_logits)
    return results
