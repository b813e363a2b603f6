"""`mha validate`: rebuild the eager wrapper from a folder's config and weights, then rerun the whole sweep."""
from __future__ import annotations

from pathlib import Path

from mha_export.attention.pipeline.validate import ArtifactReport, validate
from mha_export.attention.weights.load import load_artifact_model
from mha_runtime.artifact.errors import ArtifactError
from mha_runtime.artifact.manifest import MANIFEST_NAME, verify_all
from mha_runtime.attention.manifest import load_manifest
from mha_runtime.attention.registry import ArtifactSpec, spec_for
from mha_runtime.infer.pick_copy import choose


def revalidate(folder: Path, *, progress: bool = False) -> dict[str, ArtifactReport]:
    """Every artifact of the folder against the eager wrapper rebuilt from it, over the export's sweep; and every
    optimized copy the runtime would load on this machine (a copy it would not load is not judged here)."""
    manifest = load_manifest(folder)
    if not manifest.artifacts:  # an export lists its core pair at least: "0 passed, 0 failed" judged nothing
        raise ArtifactError(f"{Path(folder) / MANIFEST_NAME}: 'artifacts': expected at least one artifact")
    verify_all(folder, manifest)
    model, config = load_artifact_model(folder, manifest)
    specs = [spec_for(file) for file in manifest.artifacts]
    copies = [ArtifactSpec(choice.file, spec.kind, spec.runtime) for spec in specs
              if (choice := choose(folder, spec.file, manifest, "cpu")).preoptimized]
    return validate(folder, model, config, [*specs, *copies], progress=progress,
                    label=f"validating {Path(folder).name}")
