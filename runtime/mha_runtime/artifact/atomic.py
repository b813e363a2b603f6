"""Atomic writes: build in a temporary sibling, then rename into place; never lose the folder that was there.

Temporary folders carry the writer's pid in their names (`.<name>.staging-<pid>-<id>`, `.<name>.old-<pid>-<id>`),
so the next export of the same name can tell leftovers of a killed run (removed, or put back when they hold the
only complete copy) from those of a live one (reported with their size, left alone).
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from mha_runtime.artifact.errors import ArtifactError


def file_mode(mode: int = 0o666) -> int:
    """`mode` as the process umask lets it be (0644 for files, 0755 for folders under the usual 022)."""
    mask = os.umask(0)
    os.umask(mask)
    return mode & ~mask


def _apply_umask(folder: Path) -> None:
    """Tools write some files 0600 (safetensors, mkstemp): give every file and folder the umask's mode."""
    os.chmod(folder, file_mode(0o777))
    for path in folder.rglob("*"):
        os.chmod(path, file_mode(0o777 if path.is_dir() else 0o666))


@contextmanager
def _signals_held() -> Iterator[None]:
    """Hold SIGINT and SIGTERM while folders are renamed, so that a Ctrl-C lands before or after, never between."""
    held = {signal.SIGINT, signal.SIGTERM}
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _temp_name(final: Path, kind: str) -> str:
    return f".{final.name}.{kind}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def clean_leftovers(final: Path) -> list[str]:
    """Deal with `.<name>.staging-*` and `.<name>.old-*` beside `final`: a dead writer's staging folder is
    removed; its old folder is put back if `final` is missing (the swap was cut between its renames), else
    removed; a live writer's folders are reported. Returns one line per folder left alone."""
    pattern = re.compile(rf"\.{re.escape(final.name)}\.(staging|old)-(\d+)-[0-9a-f]+")
    notes = []
    for path in sorted(final.parent.glob(f".{final.name}.*")):
        match = pattern.fullmatch(path.name)
        if not match or not path.is_dir():
            continue
        if _alive(int(match[2])) and int(match[2]) != os.getpid():
            notes.append(f"{path} ({_size(path) / 2**20:.1f} MiB) belongs to running process {match[2]}; left alone")
        elif match[1] == "old" and not final.exists():
            os.rename(path, final)  # the only complete copy: put it back
        else:
            shutil.rmtree(path, ignore_errors=True)
    return notes


def check_folder_target(final: Path) -> None:
    """`final` and its parent must be folders or not exist yet, and the nearest existing folder above them must
    take a new entry (probed with an empty folder, removed at once): refused before any work."""
    final = Path(final)
    for path in (final.parent, final):
        if path.exists() and not path.is_dir():
            raise ArtifactError(f"--out {path}: expected a folder, found a file")
    existing = final.parent
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".mha-probe-", dir=existing))
    except OSError as exc:  # read-only, no permission, or a file system that takes no new entries
        raise ArtifactError(f"--out {final.parent}: cannot write there ({exc.strerror or exc})") from None


@contextmanager
def staged_folder(final: Path) -> Iterator[Path]:
    """Yield an empty staging folder beside `final`; on success it replaces `final`, on any failure (an
    exception, Ctrl-C, SIGTERM) it is removed and `final` is left exactly as it was."""
    final = Path(final)
    check_folder_target(final)
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        for note in clean_leftovers(final):
            print(f"note: {note}", file=sys.stderr)
        stage = final.parent / _temp_name(final, "staging")
        stage.mkdir()
    except OSError as exc:
        raise ArtifactError(f"--out {final.parent}: cannot write there ({exc.strerror or exc})") from None
    try:
        yield stage
        _apply_umask(stage)
        replace_folder(stage, final)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise


def replace_folder(new: Path, final: Path) -> None:
    """Swap `new` into `final`. After any failure at any step, `final` holds the old or the new complete set:
    the old folder is renamed aside, the new one renamed in, and on failure the old one is renamed back; it is
    deleted only once the new one is in place. Signals are held during the renames."""
    old = final.with_name(_temp_name(final, "old")) if final.exists() else None
    with _signals_held():
        if old is not None:
            os.rename(final, old)
        try:
            os.rename(new, final)
        except BaseException:
            if old is not None:
                try:
                    os.rename(old, final)
                except OSError as exc:  # a second failure: say where the complete old set is
                    raise ArtifactError(f"{final}: the swap failed twice; the previous folder is intact at {old}: "
                                        f"rename it back ({exc.strerror or exc})") from None
            raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)  # a leftover here is removed by the next export (clean_leftovers)


def write_file_atomic(path: Path, data: bytes) -> None:
    """Write `data` to a unique temporary file in the same folder (mode per umask), then rename it over `path`."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, file_mode())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
