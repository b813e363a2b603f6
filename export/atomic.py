"""Atomic writes: build in a temporary sibling, then rename into place."""
from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def staged_folder(final: Path) -> Iterator[Path]:
    """Yield an empty staging folder beside `final`; on success it replaces `final`, on any
    failure (an exception or Ctrl-C) it is removed and `final` is left exactly as it was."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{final.name}.staging-", dir=final.parent))
    try:
        yield stage
        os.chmod(stage, 0o755)
        replace_folder(stage, final)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise


def replace_folder(new: Path, final: Path) -> None:
    """Swap `new` into `final` with two renames; the old folder is deleted only once the new one is in place."""
    old = None
    if final.exists():
        old = final.with_name(f".{final.name}.old-{uuid.uuid4().hex[:8]}")
        os.rename(final, old)
    os.rename(new, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def write_file_atomic(path: Path, data: bytes) -> None:
    """Write `data` to a temporary file in the same folder, then rename it over `path`."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
