"""`mha check` on a GPT folder: every golden generation on every fp32 decoder form (torch-free).

A case passes when the new ids equal the golden ids exactly and the first-step logits are within the golden
tolerance; a case with a text prompt also needs the folder's tokenizer to encode it to the golden prompt ids.
The int8 form is not checked here: it is judged by its own tolerance and greedy agreement in the manifest.
gpt.pte (ExecuTorch) is checked when the folder has it, through the export package's registered runner; where
that is not installed its cases are reported as skipped, with what to install.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from mha_runtime.artifact.errors import MHAError, first_line
from mha_runtime.artifact.tolerance import Tolerance, compare
from mha_runtime.gpt.contract import FORMS, PTE_FORM
from mha_runtime.gpt.executorch import RunnerMissing
from mha_runtime.gpt.generate import Generator
from mha_runtime.gpt.golden import GoldenGeneration, first_logits, load_generations
from mha_runtime.gpt.manifest import load_gpt_manifest
from mha_runtime.infer.golden_check import CaseResult


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


def check_generations(folder: Path, *, provider: str = "cpu", threads: int | None = None) -> list[CaseResult]:
    """Every golden generation on gpt.onnx, gpt.inplace.onnx and gpt.pte (those the folder has)."""
    manifest = load_gpt_manifest(Path(folder))
    golden = load_generations(Path(folder), manifest)
    expected = {c.name: first_logits(Path(folder), manifest, c, manifest.config.vocab_size) for c in golden.cases}
    results = []
    forms = [f for f, spec in FORMS.items() if spec.dtype == "fp32"] + [PTE_FORM]
    for form in (f for f in forms if f in manifest.artifacts):
        try:
            if form == PTE_FORM and provider != "cpu":
                raise RunnerMissing(f"{PTE_FORM} runs on the CPU (XNNPACK): checked with --provider cpu")
            gen = Generator(folder, form=form, provider=provider, threads=threads)
        except RunnerMissing as exc:
            results += [CaseResult(form, c.name, (1, len(c.prompt_ids)), float("nan"), float("nan"),
                                   golden.tolerance, False, first_line(exc), skipped=True) for c in golden.cases]
            continue
        results += [check_case(gen, case, expected[case.name], golden.tolerance) for case in golden.cases]
    return results
