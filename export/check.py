"""`mha check` and `mha validate` as plain functions: golden fixtures and the full sweep, from a folder."""
from __future__ import annotations

from pathlib import Path

from export.artifacts import TORCHSCRIPT_RUNTIME, ArtifactSpec
from export.validate import ArtifactReport, artifact_runner, validate
from export.weights import load_artifact_model
from runtime.golden import CaseResult, check_artifact, check_onnx_artifacts, load_cases
from runtime.manifest import load_manifest, verify_all
from runtime.tolerance import Tolerance


def check_golden(folder: Path, *, provider: str = "cpu", threads: int | None = None) -> list[CaseResult]:
    """Every golden case on every artifact in `golden/cases.json` (files verified against the manifest first)."""
    verify_all(folder, load_manifest(folder))
    results = check_onnx_artifacts(folder, provider=provider, threads=threads)
    cases = load_cases(folder)
    for entry in cases["artifacts"]:
        if entry["runtime"] == TORCHSCRIPT_RUNTIME:
            spec = ArtifactSpec(entry["file"], entry["kind"], entry["runtime"])
            results += check_artifact(spec.file, artifact_runner(folder, spec), Tolerance.from_dict(entry["tolerance"]),
                                      folder, cases)
    return results


def revalidate(folder: Path, *, progress: bool = False) -> dict[str, ArtifactReport]:
    """Rebuild the eager wrapper from the folder's config and weights, then rerun the whole sweep."""
    manifest = load_manifest(folder)
    verify_all(folder, manifest)
    model, config = load_artifact_model(folder, manifest)
    specs = [ArtifactSpec(file, info["kind"], info["runtime"]) for file, info in manifest["artifacts"].items()]
    return validate(folder, model, config, specs, progress=progress, label=f"validating {Path(folder).name}")
