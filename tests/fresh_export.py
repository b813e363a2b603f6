"""Whether a folder under artifacts/ is what this tree's `mha export` writes: the one rule by which the tests take
`make test`'s exports (seed, mid, gpt2-small, smollm2, gemma3) instead of exporting again, shared by conftest.py's
preset fixtures and the real models' folder fixtures (tests/smollm2_folder.py, tests/gemma3_folder.py)."""
from __future__ import annotations

import json
from importlib.metadata import version
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Versions a manifest may record beside versions()' (torch, onnx, onnxruntime): the distribution each one names.
OPTIONAL_VERSIONS = {"executorch": "executorch", "gguf": "gguf"}


def this_trees_export(folder: Path, *, pinned: bool) -> Path | None:
    """`folder` when it holds exactly its manifest's files, each as the manifest says, the manifest is newer than
    every source file of both packages (make's rule: an edit means a fresh export), and every library version it
    records that is installed here is the installed one (torch, onnx, onnxruntime always; executorch for a folder
    with gpt.pte, gguf for one with gpt.gguf); else None. With `pinned`, its artifacts must also be the bytes
    tests/data/preset_digests.json pins under the folder's name (presets only: a fresh export must equal them,
    test_golden.py). The tests that get it only read it."""
    from helpers import PRESET_DIGESTS, preset_digests
    from mha_export.pipeline.seal import versions
    from mha_runtime.artifact.errors import ArtifactError
    from mha_runtime.artifact.manifest import folder_kind, verify_all
    from mha_runtime.attention.manifest import load_manifest
    from mha_runtime.decoder.manifest import load_gpt_manifest

    try:
        manifest = load_gpt_manifest(folder) if folder_kind(folder) == "decoder" else load_manifest(folder)
        verify_all(folder, manifest)  # both kinds list their files the same way
    except (ArtifactError, OSError):
        return None
    held = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}
    if held != {*manifest.files, "manifest.json"}:
        return None
    sources = [*(REPO / "runtime" / "mha_runtime").rglob("*.py"), *(REPO / "export" / "mha_export").rglob("*.py"),
               REPO / "runtime" / "pyproject.toml", REPO / "export" / "pyproject.toml"]
    newest = max(p.stat().st_mtime for p in sources)
    installed = versions() | {k: version(d) for k, d in OPTIONAL_VERSIONS.items() if k in manifest.versions}
    fresh = (folder / "manifest.json").stat().st_mtime > newest and all(
        manifest.versions.get(k) == v for k, v in installed.items())
    if not fresh:
        return None
    if pinned and preset_digests(folder) != json.loads(PRESET_DIGESTS.read_text())[folder.name]:
        return None
    return folder
