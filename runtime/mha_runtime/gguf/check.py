"""`mha check` of a folder's GGUF files, by llama.cpp itself (torch-free): each on its greedy golden cases, and
each quant type (gpt.q8_0.gguf, gpt.q4_0.gguf), in the same llama.cpp run, on its quality again, as at export:
KL(P_gpt.gguf || P_quant) over the folder's quality windows (mha_runtime.decoder.quality.score_windows), judged by
the contract's bar and beside the recorded figures (golden_check.judge_quality). Every file is copied and its
sha256 checked on the bytes llama.cpp is handed (llama_cpp.verified_copy); where llama.cpp is not built the cases
are reported as skipped, with how to build it.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from mha_runtime.artifact.errors import MHAError, first_line
from mha_runtime.artifact.results import CaseResult
from mha_runtime.artifact.tolerance import Tolerance
from mha_runtime.decoder.contract import GGUF_FORM
from mha_runtime.decoder.forms import GGUF_FORMS
from mha_runtime.decoder.golden import GoldenGenerations
from mha_runtime.decoder.manifest import GPTManifest
from mha_runtime.decoder.quality import Quality, Windows, load_windows, score_windows
from mha_runtime.gguf import llama_cpp

Judge = Callable[[Callable[[Windows], Quality]], CaseResult]  # golden_check.judge_quality of one form


def gguf_reference(folder: Path, manifest: GPTManifest, windows: Windows) -> np.ndarray:
    """gpt.gguf's logits over the windows, (windows, width - half, V): what the quant types are measured against,
    at export and here."""
    with llama_cpp.verified_copy(folder, GGUF_FORM, manifest) as copy:  # ArtifactError before llama.cpp reads it
        _, logits = llama_cpp.run_scored(copy, [], windows, where=folder / GGUF_FORM)
    assert logits is not None
    return logits


def _windows(folder: Path, manifest: GPTManifest) -> Windows | None:
    """The quality windows, or None when they cannot be read (judge_quality reads them again and names why)."""
    try:
        return load_windows(folder, manifest)
    except MHAError:
        return None


def _skipped(file: str, names: list[str], tolerance: Tolerance, error: str) -> list[CaseResult]:
    return [CaseResult(file, name, (0, 0), float("nan"), float("nan"), tolerance, False, error, skipped=True)
            for name in names]


def check_gguf(folder: Path, manifest: GPTManifest, file: str, golden: GoldenGenerations,
               expected: dict[str, np.ndarray], *, judge: Judge,
               reference: Callable[[Windows], np.ndarray]) -> list[CaseResult]:
    """A GGUF file on its greedy golden cases through llama.cpp, after its size and sha256 check (ArtifactError
    when that fails, as for every file: llama.cpp never sees it); a quant type's quality too (`judge`, against
    `reference`: gpt.gguf's logits over the windows)."""
    cases = llama_cpp.greedy_cases(golden.cases)
    form = GGUF_FORMS[file]
    tolerance = form.tolerance
    names = [c.name for c in cases] + (["quality"] if form.lossy else [])
    if llama_cpp.program() is None:
        return _skipped(file, names, tolerance, llama_cpp.BUILD_HINT)
    windows = _windows(folder, manifest) if form.lossy else None
    with llama_cpp.verified_copy(folder, file, manifest) as copy:
        try:  # the greedy cases and (a quant type) the windows' scores in one llama.cpp run
            got, logits = llama_cpp.run_scored(copy, cases, windows, where=folder / file)
        except Exception as exc:
            return [CaseResult(file, c.name, (1, len(c.prompt_ids)), float("nan"), float("nan"), tolerance, False,
                               first_line(exc)) for c in cases]
    results = []
    for case in cases:
        result, error = llama_cpp.judge_case(got, case, expected[case.name], tolerance)
        results.append(CaseResult(file, case.name, (1, len(case.prompt_ids)), result.max_abs, result.rel_l2,
                                  tolerance, error is None, error))
    if form.lossy:
        def measured(w: Windows) -> Quality:
            assert logits is not None  # judge_quality read the windows: so did _windows
            return score_windows(reference(w), logits, w)

        results.append(judge(measured))
    return results
