"""`mha check` and `mha validate` as plain functions: golden fixtures and the full sweep, from a folder.

`check_golden` needs only the runtime; TorchScript cases run when torch is installed and are reported
as skipped otherwise (the base install has no torch).
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from mha_runtime.golden import CaseResult, check_artifact, check_onnx_artifacts, load_cases, skipped
from mha_runtime.manifest import load_manifest, verify_all
from mha_runtime.variants import EXECUTORCH_RUNTIME, TORCHSCRIPT_RUNTIME, spec_for

if TYPE_CHECKING:
    from mha_export.validate import ArtifactReport

NEEDS_TORCH = "needs torch: pip install 'mha-export[export]'"
NEEDS_EXECUTORCH = "needs ExecuTorch: pip install 'mha-export[executorch]'"


def check_golden(folder: Path, *, provider: str = "cpu", threads: int | None = None) -> list[CaseResult]:
    """Every golden case on every artifact in `golden/cases.json` (files verified against the manifest first)."""
    verify_all(folder, load_manifest(folder))
    results = check_onnx_artifacts(folder, provider=provider, threads=threads)
    cases = load_cases(folder)
    for entry in cases.artifacts:
        if entry.runtime not in (TORCHSCRIPT_RUNTIME, EXECUTORCH_RUNTIME):
            continue
        try:
            run = _torch_side_runner(Path(folder), entry.file, entry.runtime)
        except ImportError as exc:
            results += skipped(entry, cases, NEEDS_EXECUTORCH if "executorch" in str(exc.name) else NEEDS_TORCH)
            continue
        results += check_artifact(entry.file, run, entry.tolerance, folder, cases)
    return results


def _torch_side_runner(folder: Path, file: str, runtime: str) -> Callable[[np.ndarray], np.ndarray]:
    """TorchScript through torch.jit, the .pte through ExecuTorch; ImportError when that runtime is missing."""
    if runtime == EXECUTORCH_RUNTIME:
        import executorch  # noqa: F401 - the check that it is installed

        from mha_export.pte import PteRunner

        return PteRunner(folder / file).run
    from mha_export.torchscript import torchscript_runner

    return torchscript_runner(folder / file)


def revalidate(folder: Path, *, progress: bool = False) -> dict[str, ArtifactReport]:
    """Rebuild the eager wrapper from the folder's config and weights, then rerun the whole sweep."""
    from mha_export.validate import validate
    from mha_export.weights import load_artifact_model

    manifest = load_manifest(folder)
    verify_all(folder, manifest)
    model, config = load_artifact_model(folder, manifest)
    specs = [spec_for(file) for file in manifest.artifacts]
    return validate(folder, model, config, specs, progress=progress, label=f"validating {Path(folder).name}")
