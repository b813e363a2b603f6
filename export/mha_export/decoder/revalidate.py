"""`mha validate` of a decoder folder: the eager model rebuilt from the folder's config and gpt.safetensors, then the
export's own validation again (decoder/validate.py): every fp32 ONNX form against eager PyTorch's logits and greedy
tokens, every lossy form's logits recorded and its quality measured again against its bar.

A lossy form's quality is measured as the export measured it, against the folder's gpt.inplace.onnx (just judged
against eager) over the folder's quality windows, through the runtime's one judge (mha_runtime.decoder.golden_check
.judge_quality: the bar, and agreement with the recorded figures). gpt.pte and the GGUF files need ExecuTorch and
llama.cpp: `mha check` runs their golden generations; here they are named, not rerun."""
from __future__ import annotations

import gc
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from mha_export.decoder.archs import arch_named
from mha_export.decoder.export import load_gpt
from mha_export.decoder.validate import references, validate_form
from mha_export.pipeline.progress import steps
from mha_runtime.artifact.errors import ArtifactError
from mha_runtime.artifact.manifest import MANIFEST_NAME, verify_all
from mha_runtime.cli.tables import table
from mha_runtime.decoder.contract import INPLACE_FORM, WEIGHTS_FILE
from mha_runtime.decoder.decoder import decoder_for, make_session
from mha_runtime.decoder.forms import FORMS, Form, folder_bar
from mha_runtime.decoder.golden_check import judge_quality
from mha_runtime.decoder.manifest import load_gpt_manifest
from mha_runtime.decoder.quality import measure


@dataclass(frozen=True)
class FormCheck:
    """One form judged again: its cases against eager (and the greedy run), its quality where it is lossy."""

    file: str
    dtype: str
    checks: int  # logits cases and the greedy run of an fp32 form; a lossy form's quality
    max_abs_error: float
    greedy_agreement: float
    mean_kl: float | None  # a lossy form's, measured here
    bar: str
    failures: tuple[str, ...]


@dataclass(frozen=True)
class Revalidated:
    forms: list[FormCheck]
    not_rerun: list[str]  # files this command does not run, each with what does

    @property
    def failures(self) -> list[str]:
        return [line for form in self.forms for line in form.failures]


def revalidate(folder: Path, *, progress: bool = False) -> Revalidated:
    """Every ONNX form of the folder against the eager model rebuilt from it (every listed file verified first)."""
    folder = Path(folder)
    manifest = load_gpt_manifest(folder)
    verify_all(folder, manifest)
    files = [f for f in FORMS if f in manifest.artifacts]
    if not files:  # "0 passed, 0 failed" would have judged nothing
        raise ArtifactError(f"{folder / MANIFEST_NAME}: 'artifacts': expected at least one ONNX form")
    if WEIGHTS_FILE not in manifest.files:
        raise ArtifactError(f"{folder}: no {WEIGHTS_FILE} listed in the manifest: nothing to rebuild eager PyTorch "
                            "from (re-export the folder)")
    config = arch_named(manifest.shapes.arch).config_from_book(manifest.config)
    model, _, _ = load_gpt(config, folder / WEIGHTS_FILE)
    refs = references(model, config)
    del model
    gc.collect()
    reference = make_session(str(folder / INPLACE_FORM), where=str(folder / INPLACE_FORM)) \
        if any(FORMS[f].lossy for f in files) else None
    checked = []
    for file in steps(files, label=f"validating {folder.name}", unit="form", enabled=progress):
        form = FORMS[file]
        # gpt.inplace.onnx is parsed once: the lossy forms' reference is that same session
        session = reference if file == INPLACE_FORM and reference is not None else \
            make_session(str(folder / file), where=str(folder / file))
        report = validate_form(session, form, refs, config, tolerance=form.tolerance, shapes=manifest.shapes)
        if not form.lossy:
            checked.append(FormCheck(file, form.dtype, report.cases + 1, report.max_abs_error,
                                     report.greedy_agreement, None, f"atol {form.tolerance.atol:g}",
                                     report.failures))
            continue
        assert reference is not None and form.max_mean_kl is not None  # a lossy form has a bar and gpt.inplace.onnx
        measured = partial(measure, decoder_for("inplace", reference, manifest.shapes, INPLACE_FORM),
                           decoder_for(form.kind, session, manifest.shapes, file))  # (windows) -> Quality, once
        quality = judge_quality(folder, manifest, file, measured)
        checked.append(FormCheck(file, form.dtype, 1, report.max_abs_error, report.greedy_agreement,
                                 None if quality.error is not None and not quality.ok else quality.max_abs,
                                 f"mean KL <= {_bar(form, manifest.artifacts[file].quality)}",
                                 () if quality.ok else (f"{file} quality: {quality.error}",)))
        del session
        gc.collect()
    others = [f for f in manifest.artifacts if f not in FORMS]
    return Revalidated(checked, [f"{f}: not rerun here (`mha check` runs its golden generations)" for f in others])


def report_lines(result: Revalidated) -> list[str]:
    """The table, then `N passed, N failed`."""
    rows = [[f.file, f.dtype, f.checks, f"{f.max_abs_error:.2e}", f"{f.greedy_agreement:.2f}",
             "-" if f.mean_kl is None else f"{f.mean_kl:.2e}", f.bar, "FAIL" if f.failures else "ok"]
            for f in result.forms]
    failed = len(result.failures)
    passed = sum(f.checks for f in result.forms) - failed
    return [table(["artifact", "dtype", "checks", "max abs err", "greedy agreement", "mean KL", "judged by",
                   "result"], rows), f"{passed} passed, {failed} failed"]


def _bar(form: Form, quality: dict[str, object] | None) -> str:
    """The folder's recorded bar for a lossy form, as the table shows it ("?" where it records none allowed)."""
    bar = folder_bar(form, (quality or {}).get("bar_mean_kl"))
    return "?" if bar is None else f"{bar:g}"
