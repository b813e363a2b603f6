"""An export that fails or is interrupted midway leaves the previous artifacts exactly as they were."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import mha_export.pipeline as pipeline
from mha_runtime.manifest import sha256_file


def _snapshot(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): sha256_file(p) for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("error", [RuntimeError("validation exploded"), KeyboardInterrupt()])
def test_failed_export_keeps_previous_artifacts(seed_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                error: BaseException) -> None:
    root = tmp_path / "artifacts"
    shutil.copytree(seed_dir, root / "seed")
    before = _snapshot(root / "seed")

    def broken(*args: object, **kwargs: object) -> None:
        raise error

    monkeypatch.setattr(pipeline, "validate", broken)
    with pytest.raises(type(error)):
        pipeline.export_preset("seed", root)
    assert _snapshot(root / "seed") == before
    assert sorted(p.name for p in root.iterdir()) == ["seed"]  # no staging or half-written folder left


def test_successful_export_replaces_the_folder(seed_dir: Path, tmp_path: Path) -> None:
    root = tmp_path / "artifacts"
    shutil.copytree(seed_dir, root / "seed")
    (root / "seed" / "stale.txt").write_text("from an older export")
    result = pipeline.export_preset("seed", root)
    assert result.folder == root / "seed"
    assert not (root / "seed" / "stale.txt").exists()
    assert sorted(p.name for p in root.iterdir()) == ["seed"]
    assert (root / "seed" / "manifest.json").exists()
