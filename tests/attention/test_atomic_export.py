"""An export that fails or is interrupted midway leaves the previous artifacts exactly as they were."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import mha_export.attention.pipeline.export as pipeline
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
        pipeline.export_preset("seed", root, variants=())  # the core pair is enough to fail after writing
    assert _snapshot(root / "seed") == before
    assert sorted(p.name for p in root.iterdir()) == ["seed"]  # no staging or half-written folder left


def test_successful_export_replaces_the_folder(seed_dir: Path, tmp_path: Path) -> None:
    root = tmp_path / "artifacts"
    shutil.copytree(seed_dir, root / "seed")
    (root / "seed" / "stale.txt").write_text("from an older export")
    result = pipeline.export_preset("seed", root, variants=())
    assert result.folder == root / "seed"
    assert not (root / "seed" / "stale.txt").exists()
    assert sorted(p.name for p in root.iterdir()) == ["seed"]
    assert (root / "seed" / "manifest.json").exists()


def _two_sets(tmp_path: Path) -> tuple[Path, Path, dict[str, str], dict[str, str]]:
    final, new = tmp_path / "seed", tmp_path / ".seed.staging-00000001"
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


def test_two_swaps_of_one_name_take_turns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two exports of one name finishing together, where neither found a folder: the second swap waits for the
    first and then replaces it whole. It used to rename onto the folder the other had just placed and fail,
    "Directory not empty", after all of its work."""
    import threading

    import mha_runtime.artifact.atomic as atomic

    final, new, _, _ = _two_sets(tmp_path)
    shutil.rmtree(final)  # nothing there yet: both swaps see no old folder
    other = tmp_path / "other"
    (other / "golden").mkdir(parents=True)
    (other / "manifest.json").write_text("the other export's")
    other_files = _snapshot(other)
    real_rename = os.rename
    racer: list[threading.Thread] = []
    waited: list[bool] = []

    def rename(src: object, dst: object) -> None:
        if Path(str(src)) == new and not racer:  # the other export reaches its swap just before this one renames
            racer.append(threading.Thread(target=atomic.replace_folder, args=(other, final)))
            racer[0].start()
            racer[0].join(timeout=1.0)  # it waits for this swap's turn (without turns it placed its folder)
            waited.append(racer[0].is_alive())
        real_rename(src, dst)

    monkeypatch.setattr(atomic.os, "rename", rename)
    atomic.replace_folder(new, final)
    assert waited == [True]
    racer[0].join(timeout=10)
    assert not racer[0].is_alive() and _snapshot(final) == other_files  # the later swap, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["seed"]


def test_an_interrupted_swap_is_repaired_by_the_next_export(tmp_path: Path) -> None:
    """A run killed between the two renames leaves only `.seed.old-<id>` (unlocked): the next export puts it back."""
    from mha_runtime.artifact.atomic import clean_leftovers

    final, _, old_files, _ = _two_sets(tmp_path)
    os.rename(final, tmp_path / ".seed.old-abcd1234")
    assert clean_leftovers(final) == [] and _snapshot(final) == old_files


def test_leftover_staging_folders_are_removed_or_reported(tmp_path: Path) -> None:
    from mha_runtime.artifact.atomic import clean_leftovers

    final = tmp_path / "seed"
    final.mkdir()
    stale = tmp_path / ".seed.staging-0000aaaa"  # a killed writer's: no lock held
    (stale / "golden").mkdir(parents=True)
    (stale / "mha.onnx").write_bytes(b"x" * 2048)
    busy = tmp_path / ".seed.staging-0000bbbb"
    busy.mkdir()
    # Another process holds the folder's flock, as a live export does (a pid in a name proves nothing).
    holder = ("import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY); "
              "fcntl.flock(fd, fcntl.LOCK_EX); print('locked', flush=True); time.sleep(60)")
    live = subprocess.Popen([sys.executable, "-c", holder, str(busy)], stdout=subprocess.PIPE, text=True)
    try:
        assert live.stdout is not None and live.stdout.readline().strip() == "locked"
        notes = clean_leftovers(final)
        assert not stale.exists() and busy.exists()
        assert len(notes) == 1 and "is locked by a running export" in notes[0] and "MiB" in notes[0]
    finally:
        live.kill()
        live.wait()
    assert clean_leftovers(final) == [] and not busy.exists()  # the holder died: its lock went with it


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


def test_a_ctrl_c_during_the_swap_is_reported_as_written_in_full(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The signal is held through the renames and delivered after them: the report says the folder is complete."""
    import signal

    import mha_runtime.artifact.atomic as atomic
    from mha_runtime.artifact.errors import Interrupted

    final, new, _, new_files = _two_sets(tmp_path)
    real_rename = os.rename

    def rename_then_interrupt(src: str | Path, dst: str | Path) -> None:
        real_rename(src, dst)
        if Path(dst) == final:
            os.kill(os.getpid(), signal.SIGINT)  # held: it lands once the renames are done

    monkeypatch.setattr(atomic.os, "rename", rename_then_interrupt)
    # A shell starts background jobs with SIGINT ignored, and Python keeps an inherited SIG_IGN: the test sets
    # Python's own Ctrl-C handler, which a terminal's pytest has anyway, so that the premise holds however CI runs.
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(Interrupted, match=r"interrupted after .*seed was written in full"):
            atomic.replace_folder(new, final)
    finally:
        signal.signal(signal.SIGINT, inherited)
    assert _snapshot(final) == new_files and sorted(p.name for p in tmp_path.iterdir()) == ["seed"]


def test_staged_files_and_folders_are_fsynced_before_the_swap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import mha_runtime.artifact.atomic as atomic

    events: list[str] = []
    real_fsync, real_rename = os.fsync, os.rename
    monkeypatch.setattr(atomic.os, "fsync", lambda fd: (events.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(atomic.os, "rename", lambda a, b: (events.append("rename"), real_rename(a, b))[1])
    with atomic.staged_folder(tmp_path / "seed") as stage:
        (stage / "golden").mkdir()
        for name in ("mha.onnx", "golden/cases.json"):
            (stage / name).write_text(name)
    first_rename = events.index("rename")
    assert events[:first_rename].count("fsync") == 4  # two files, golden/ and the staging folder itself
    assert events[first_rename + 1:].count("fsync") == 1  # the parent, after the rename
    assert sorted(p.name for p in (tmp_path / "seed").rglob("*")) == ["cases.json", "golden", "mha.onnx"]


def test_the_umask_is_read_without_changing_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """os.umask sets the mask process-wide while it reads it: another thread creating a file meanwhile gets 0."""
    import mha_runtime.artifact.atomic as atomic

    code = ("import os; os.umask(0o027); import mha_runtime.artifact.atomic as a; "
            "print(oct(a.current_umask()), oct(a.file_mode(0o666)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["0o27", "0o640"]

    def no_umask(mask: int) -> int:
        raise AssertionError("os.umask was called")

    monkeypatch.setattr(atomic.os, "umask", no_umask)
    assert atomic.file_mode(0o777) == 0o777 & ~atomic.current_umask()


def test_a_failed_export_leaves_no_out_folder_it_made(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The folders above the target that the export made are removed with its staging folder (an empty --out was
    left behind)."""
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("validation exploded")

    monkeypatch.setattr(pipeline, "validate", broken)
    with pytest.raises(RuntimeError):
        pipeline.export_preset("seed", tmp_path / "new" / "artifacts", variants=())
    assert list(tmp_path.iterdir()) == []


def test_a_link_to_a_folder_has_its_target_replaced(seed_dir: Path, tmp_path: Path) -> None:
    """`--out` holding a symbolic link under the folder's name: the folder it points to gets the new set and the link
    stays (the link itself was swapped out, and an .old- link was left beside it for good)."""
    shutil.copytree(seed_dir, tmp_path / "real")
    (tmp_path / "real" / "stale.txt").write_text("from an older export")
    root = tmp_path / "artifacts"
    root.mkdir()
    (root / "seed").symlink_to(tmp_path / "real")
    pipeline.export_preset("seed", root, variants=())
    assert (root / "seed").is_symlink() and sorted(p.name for p in root.iterdir()) == ["seed"]
    assert (tmp_path / "real" / "manifest.json").exists() and not (tmp_path / "real" / "stale.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["artifacts", "real"]


def test_a_dangling_link_at_the_target_is_refused_before_any_work(tmp_path: Path) -> None:
    """The swap's rename failed on it ("Not a directory") only after the whole export."""
    from mha_runtime.artifact.atomic import check_folder_target
    from mha_runtime.artifact.errors import ArtifactError

    (tmp_path / "seed").symlink_to(tmp_path / "gone")
    with pytest.raises(ArtifactError, match=r"seed: a symbolic link to .*gone, which does not exist"):
        check_folder_target(tmp_path / "seed")
