"""Atomic writes: build in a temporary sibling, then rename into place; never lose the folder that was there.

Temporary folders are named `.<name>.staging-<id>` and `.<name>.old-<id>`. A writer holds an exclusive
`fcntl.flock` on each of its temporary folders for as long as it uses them, so the next export of the same
name tells a killed run's leftovers (no lock: removed, or put back when they hold the only complete copy) from a
live one's (locked: reported with their size, left alone), across processes and containers sharing the volume.
Staged files and folders are fsynced before the swap and the parent after it, so a power cut leaves the old or
the new complete set.
"""
from __future__ import annotations

import fcntl
import os
import re
import shutil
import signal
import stat
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from mha_runtime.artifact.errors import ArtifactError, BadValueError, Interrupted

# The longest folder name an export (--name) or a Triton model (--name + _torchscript) takes: short enough for the
# staging folder's suffix to stay under the file systems' 255-byte limit.
MAX_NAME = 100


def current_umask() -> int:
    """The process umask, read without changing it (os.umask would set it process-wide, racing other threads):
    from /proc/self/status where the kernel says it, else from the mode a new file gets."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    probe = Path(tempfile.gettempdir()) / f".mha-umask-{uuid.uuid4().hex}"
    fd = os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o777)
    try:
        return 0o777 & ~os.fstat(fd).st_mode
    finally:
        os.close(fd)
        probe.unlink(missing_ok=True)


def file_mode(mode: int = 0o666) -> int:
    """`mode` as the process umask lets it be (0644 for files, 0755 for folders under the usual 022)."""
    return mode & ~current_umask()


def _apply_umask(folder: Path) -> None:
    """Tools write some files 0600 (safetensors, mkstemp): give every file and folder the umask's mode."""
    files, folders = file_mode(0o666), file_mode(0o777)
    os.chmod(folder, folders)
    for path in folder.rglob("*"):
        os.chmod(path, folders if path.is_dir() else files)


def _fsync_tree(folder: Path) -> None:
    """Every file's data, then every folder's entries (deepest first), on disk."""
    for path in sorted(folder.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if path.is_file():
            with open(path, "rb") as fh:
                os.fsync(fh.fileno())
        elif path.is_dir():
            _fsync_dir(path)
    _fsync_dir(folder)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def _signals_held() -> Iterator[None]:
    """Hold SIGINT and SIGTERM while folders are renamed, so that a Ctrl-C lands before or after, never between.

    Python-level handlers that only note the signal, restored after the renames, which then re-raise it: a
    blocked signal mask would not do, since the kernel delivers a process signal to any thread that does not block
    it (ONNX Runtime's and torch's pools), and Python then runs the handler in the main thread at once."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = {s: signal.signal(s, lambda signum, frame: caught.append(signum))
                for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    for signum in dict.fromkeys(caught):
        signal.raise_signal(signum)  # the restored handler runs now (Ctrl-C: KeyboardInterrupt)


def _temp_name(final: Path, kind: str) -> str:
    return f".{final.name}.{kind}-{uuid.uuid4().hex[:12]}"


def lock_folder(folder: Path, *, wait: bool = True) -> int | None:
    """An open descriptor of `folder` holding an exclusive flock (the lock follows the folder through renames),
    or None when another process holds it and `wait` is False. Closing the descriptor releases it."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def clean_leftovers(final: Path) -> list[str]:
    """Deal with `.<name>.staging-*` and `.<name>.old-*` beside `final`: a dead writer's staging folder is
    removed; its old folder is put back if `final` is missing (the swap was cut between its renames), else
    removed; a live writer's folders are reported. Returns one line per folder left alone."""
    pattern = re.compile(rf"\.{re.escape(final.name)}\.(staging|old)-[0-9a-f]+")
    notes = []
    for path in sorted(final.parent.glob(f".{final.name}.*")):
        match = pattern.fullmatch(path.name)
        if not match or not path.is_dir():
            continue
        fd = lock_folder(path, wait=False)
        if fd is None:
            notes.append(f"{path} ({_size(path) / 2**20:.1f} MiB) is locked by a running export; left alone")
            continue
        try:
            if match[1] == "old" and not final.exists():
                os.rename(path, final)  # the only complete copy: put it back
            else:
                shutil.rmtree(path, ignore_errors=True)
        finally:
            os.close(fd)
    return notes


def check_folder_target(final: Path) -> None:
    """`final` and its parent must be folders or not exist yet, and the nearest existing folder above them must
    take a new entry (probed with an empty folder, removed at once): refused before any work."""
    final = Path(final)
    for path in (final.parent, final):
        if path.exists() and not path.is_dir():
            raise ArtifactError(f"--out {path}: expected a folder, found a file")
    if final.is_symlink() and not final.exists():  # the swap's rename would fail on it after all of the work
        raise ArtifactError(f"--out {final}: a symbolic link to {os.readlink(final)}, which does not exist; expected "
                            "a folder, a link to one, or nothing there")
    existing = final.parent
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    probe_writable(existing, final.parent)


def probe_writable(folder: Path, named: Path) -> None:
    """`folder` takes a new entry (probed with an empty folder, removed at once); else one ArtifactError line naming
    `named` (the --out the user gave)."""
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".mha-probe-", dir=folder))
    except OSError as exc:  # read-only, no permission, or a file system that takes no new entries
        raise ArtifactError(f"--out {named}: cannot write there ({exc.strerror or exc})") from None


def check_file_target(path: Path, flag: str) -> None:
    """A file a flag names for output (`--json PATH`): not a folder, in an existing folder that takes a new entry
    (through a link, its target's); refused before any work, as a usage error. A FIFO or a device is taken as it
    is: write_file_atomic writes through it."""
    if _stream(path):
        return
    target = Path(os.path.realpath(path))  # a link's target is written, not the link
    if target.is_dir():
        raise BadValueError(f"{flag} {path}: expected a file name, got a folder")
    if not target.parent.is_dir():
        raise BadValueError(f"{flag} {path}: expected a file in an existing folder; {Path(path).parent} is not one")
    if not os.access(target.parent, os.W_OK | os.X_OK):
        raise BadValueError(f"{flag} {path}: cannot write in {Path(path).parent} (permission denied)")


@contextmanager
def staged_folder(final: Path) -> Iterator[Path]:
    """Yield an empty staging folder beside `final`; on success it replaces `final`, on any failure (an
    exception, Ctrl-C, SIGTERM) it is removed and `final` is left exactly as it was, and so are the folders above
    it (those this call made are removed again). A symbolic link to a folder has its target replaced, not the link
    (as write_file_atomic replaces a link's target)."""
    final = Path(final)
    check_folder_target(final)
    if final.is_symlink():  # renamed aside, the link itself would be swapped out and left as an .old- link
        final = Path(os.path.realpath(final))
    made = [p for p in (final.parent, *final.parent.parents) if not p.exists()]  # deepest first
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        for note in clean_leftovers(final):
            print(f"note: {note}", file=sys.stderr)
        stage = final.parent / _temp_name(final, "staging")
        stage.mkdir()
        lock = lock_folder(stage)
    except OSError as exc:
        raise ArtifactError(f"--out {final.parent}: cannot write there ({exc.strerror or exc})") from None
    try:
        yield stage
        _apply_umask(stage)
        _fsync_tree(stage)
        replace_folder(stage, final)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        for folder in made:
            with suppress(OSError):  # one another process has put something in meanwhile stays
                folder.rmdir()
        raise
    finally:
        if lock is not None:
            os.close(lock)


def replace_folder(new: Path, final: Path) -> None:
    """Swap `new` into `final`. After any failure at any step, `final` holds the old or the new complete set:
    the old folder is renamed aside, the new one renamed in, and on failure the old one is renamed back; it is
    deleted only once the new one is in place. Signals are held during the renames; one that came meanwhile is
    raised after them as `Interrupted`, which says the new folder was written in full.

    Swaps beside `final` take turns (an flock on its parent): of two exports of one name that finish together,
    each places its whole folder and the later one stays. Without turns, one could find no folder, then fail its
    rename on the folder the other had just placed ("Directory not empty", after all of its work)."""
    try:
        turn: int | None = lock_folder(final.parent)
    except OSError:  # a folder this process may write in but not open (mode 0333): the swap goes without turns
        turn = None
    try:
        _swap(new, final)
    finally:
        if turn is not None:
            os.close(turn)


def _swap(new: Path, final: Path) -> None:
    """replace_folder's renames, once it is this export's turn."""
    old = final.with_name(_temp_name(final, "old")) if final.exists() else None
    old_lock = lock_folder(final) if old is not None else None  # the old set stays locked while aside
    swapped = False
    try:
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
                        raise ArtifactError(f"{final}: the swap failed twice; the previous folder is intact at "
                                            f"{old}: rename it back ({exc.strerror or exc})") from None
                raise
            swapped = True
            _fsync_dir(final.parent)
    except KeyboardInterrupt:
        if swapped:  # the held Ctrl-C or SIGTERM, delivered once the new set was in place
            raise Interrupted(f"interrupted after {final} was written in full") from None
        raise
    finally:
        if swapped and old is not None:
            shutil.rmtree(old, ignore_errors=True)  # a leftover here is removed by the next export (clean_leftovers)
        if old_lock is not None:
            os.close(old_lock)


def _stream(path: Path) -> bool:
    """Whether `path` is (or links to) a FIFO or a device (/dev/stdout, a pipe): written through, never replaced."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)


def write_file_atomic(path: Path, data: bytes) -> None:
    """Write `data` to a unique temporary file in the same folder (mode per umask), then rename it over `path`
    (over a link's target, not the link). A FIFO or a device is written through: its reader gets the bytes."""
    if _stream(path):
        try:
            with open(path, "wb") as fh:
                fh.write(data)
        except OSError as exc:  # a full device, a reader gone: named with the path
            raise OSError(exc.errno, exc.strerror, str(path)) from None
        return
    path = Path(os.path.realpath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, file_mode())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
