"""An export that fails or is interrupted midway leaves the previous artifacts exactly as they were."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import mha_export.pipeline.export as pipeline
from mha_runtime.artifact.manifest import sha256_file


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


def _two_sets(tmp_path: Path) -> tuple[Path, Path, dict[str, str], dict[str, str]]:
    final, new = tmp_path / "seed", tmp_path / ".seed.staging-1-x"
    for folder, text in ((final, "old"), (new, "new")):
        (folder / "golden").mkdir(parents=True)
        for name in ("mha.onnx", "manifest.json", "golden/cases.json"):
            (folder / name).write_text(f"{text} {name}")
    return final, new, _snapshot(final), _snapshot(new)


class _Fault(Exception):
    pass


@pytest.mark.parametrize("step", [0, 1, 2])
@pytest.mark.parametrize("fault", [_Fault, KeyboardInterrupt, OSError])
def test_replace_folder_leaves_a_complete_set_whatever_step_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  step: int, fault: type[BaseException]) -> None:
    """Each filesystem call in turn (rename aside, rename in, remove the old) fails: the folder is old or new."""
    import mha_runtime.artifact.atomic as atomic

    final, new, old_files, new_files = _two_sets(tmp_path)
    calls = []
    real_rename, real_rmtree = os.rename, shutil.rmtree

    def rename(src: object, dst: object) -> None:
        calls.append("rename")
        if len(calls) - 1 == step:
            raise fault("injected")
        real_rename(src, dst)

    def rmtree(path: object, ignore_errors: bool = False) -> None:
        calls.append("rmtree")
        if len(calls) - 1 == step:
            if ignore_errors:
                return  # rmtree(ignore_errors=True) swallows its own errors
            raise fault("injected")
        real_rmtree(path, ignore_errors=ignore_errors)

    monkeypatch.setattr(atomic.os, "rename", rename)
    monkeypatch.setattr(atomic.shutil, "rmtree", rmtree)
    try:
        atomic.replace_folder(new, final)
    except (_Fault, KeyboardInterrupt, OSError):
        pass
    assert _snapshot(final) in (old_files, new_files), calls
    if step == 0:  # nothing happened yet: the old set stays, the staged one is the caller's to remove
        assert _snapshot(final) == old_files


def test_an_interrupted_swap_is_repaired_by_the_next_export(tmp_path: Path) -> None:
    """A run killed between the two renames leaves only `.seed.old-<pid>-*`: the next export puts it back."""
    from mha_runtime.artifact.atomic import clean_leftovers

    final, _, old_files, _ = _two_sets(tmp_path)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    os.rename(final, tmp_path / f".seed.old-{dead.stdout.strip()}-abcd1234")
    assert clean_leftovers(final) == [] and _snapshot(final) == old_files


def test_leftover_staging_folders_are_removed_or_reported(tmp_path: Path) -> None:
    from mha_runtime.artifact.atomic import clean_leftovers

    final = tmp_path / "seed"
    final.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f".seed.staging-{dead.stdout.strip()}-0000aaaa"
    (stale / "golden").mkdir(parents=True)
    (stale / "mha.onnx").write_bytes(b"x" * 2048)
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        busy = tmp_path / f".seed.staging-{live.pid}-0000bbbb"
        busy.mkdir()
        notes = clean_leftovers(final)
        assert not stale.exists() and busy.exists()
        assert len(notes) == 1 and f"belongs to running process {live.pid}" in notes[0] and "MiB" in notes[0]
    finally:
        live.kill()
        live.wait()


def test_sigterm_during_export_removes_the_staging_folder(tmp_path: Path) -> None:
    """The installed command turns SIGTERM into the same unwinding as Ctrl-C."""
    import signal
    import time

    mha = Path(sys.executable).parent / "mha"
    proc = subprocess.Popen([str(mha), "export", "--preset", "seed", "--out", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob(".seed.staging-*")) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert list(tmp_path.glob(".seed.staging-*")), "the export never started staging"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "interrupted" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []
