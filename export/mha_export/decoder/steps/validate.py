"""The decoder export's validation step: every ONNX form against eager PyTorch's references (a lossy form also
writes its own golden generations), the GGUF files as llama.cpp ran them in the build step, gpt.pte as ExecuTorch's
runtime ran it in the load step; every failure collected, then raised."""
from __future__ import annotations

import dataclasses
import gc
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import MappingProxyType

from mha_export.decoder.golden import form_generations, write_generations
from mha_export.decoder.plan import folder_form
from mha_export.decoder.steps.files import Built
from mha_export.decoder.validate import validate_form
from mha_export.gguf.build import GGUFOutcome
from mha_export.pipeline.progress import steps
from mha_export.pipeline.run import Stage
from mha_runtime.artifact.errors import ValidationError
from mha_runtime.decoder.contract import PTE_FORM
from mha_runtime.decoder.decoder import decoder_for, make_session
from mha_runtime.decoder.forms import GGUF_FORMS
from mha_runtime.decoder.manifest import GPTArtifact


@dataclass(frozen=True)
class Validated:
    """The built folder and every file's manifest entry, each judged and passed."""

    built: Built
    artifacts: Mapping[str, GPTArtifact]


def validate(built: Built, stage: Stage) -> Validated:
    """Judge every built file; raise ValidationError with every failure (the build's named misses first)."""
    artifacts: dict[str, GPTArtifact] = {}
    failures = list(built.failures)
    for file in steps(built.files, label=stage.label, unit="form", enabled=stage.progress):
        artifact, lines = _judge_form(built, file, stage.folder)
        artifacts[file] = artifact
        failures += lines
    if built.gguf is not None:  # run by llama.cpp itself in the build step
        ggufs, lines = _judged_ggufs(built, built.gguf, stage.folder)
        artifacts |= ggufs
        failures += lines
    pte = built.eager.pte
    if pte is not None:
        artifacts[PTE_FORM] = pte.artifact
        failures += pte.failures
    if failures:
        raise _failed(failures)
    return Validated(built, MappingProxyType(artifacts))


def _judge_form(built: Built, file: str, folder: Path) -> tuple[GPTArtifact, list[str]]:
    """One ONNX form's manifest entry and failures; a lossy form's own golden generations written beside eager's,
    with how it was made and measured."""
    config, eager = built.plan.config, built.eager
    form = folder_form(file, config)
    assert eager.refs is not None
    # From the path: ONNX Runtime reads the file itself (from bytes, a second copy of the weights would be held
    # while it parses them).
    session = make_session(str(folder / file), where=str(folder / file))
    report = validate_form(session, form, eager.refs, config, tolerance=form.tolerance)
    extra: dict[str, object] = {}
    if file in built.lossy:
        own = form_generations(partial(decoder_for, form.kind, session, config, file), eager.golden[0],
                               prefix=form.dtype)
        generations = write_generations(folder, *own, config, form.tolerance, form=file)
        outcome = built.lossy[file]
        extra = {"quality": outcome.quality.to_dict() | {"bar_mean_kl": form.max_mean_kl},
                 "quantization": outcome.plan.to_dict() | {"tries": outcome.tries},
                 "generations": generations}
    artifact = GPTArtifact(
        kind=form.kind, dtype=form.dtype, tolerance=form.tolerance.to_dict(), cases=report.cases,
        max_abs_error=report.max_abs_error, greedy_agreement=report.greedy_agreement,
        passed=report.passed, export_seconds=round(built.seconds[file], 3), **extra)  # type: ignore[arg-type]
    del session
    gc.collect()
    return artifact, list(report.failures)


def _judged_ggufs(built: Built, outcome: GGUFOutcome, folder: Path) -> tuple[dict[str, GPTArtifact], list[str]]:
    """What llama.cpp made of the GGUF files; a quant type's own generations written beside eager's."""
    artifacts = {}
    for file, artifact in outcome.artifacts.items():
        if file in outcome.own:
            generations = write_generations(folder, *outcome.own[file], built.plan.config,
                                            GGUF_FORMS[file].tolerance, form=file)
            artifact = dataclasses.replace(artifact, generations=generations)
        artifacts[file] = artifact
    return artifacts, list(outcome.failures)


def _failed(failures: list[str]) -> ValidationError:
    """The error of failed forms: one failure is one line (a named lossy form's miss: the figure and the bar), not a
    count and then that line; several keep the count and a line each."""
    error = ValidationError(failures)
    if len(failures) == 1:
        error.args = (f"validation failed: {failures[0]}",)
    return error
