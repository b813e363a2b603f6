"""What every kind's manifest.json shares (torch-free): its file records, reading it, the kind it names, and checking
files against their sha256 and size. Each kind's own records: attention/manifest.py, decoder/manifest.py."""
from __future__ import annotations

import hashlib
import json
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from mha_runtime.artifact.config_fields import file_kind, read_regular
from mha_runtime.artifact.errors import ArtifactError, ConfigError, first_line
from mha_runtime.artifact.fields import Record, record, unique_keys

MANIFEST_NAME = "manifest.json"


@dataclass(frozen=True)
class FileRecord(Record):
    size: int
    sha256: str

    @classmethod
    def from_dict(cls, data: Any, where: str) -> FileRecord:
        read = record(cls, data, where)
        if not 0 <= read.size < 2**63 or len(read.sha256) != 64:  # a file size fits 63 bits (off_t)
            shown = str(read.size) if read.size < 2**63 else "a number of more than 63 bits"
            raise ArtifactError(f"{where}: expected a size >= 0 and a 64-digit sha256, got {shown} and "
                                f"{read.sha256!r}")
        return read


def sha256_file(path: Path, sink: Callable[[bytes], object] | None = None) -> str:
    """The file's sha256, read in 1 MiB chunks (each also handed to `sink` when given)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
            if sink is not None:
                sink(chunk)
    return digest.hexdigest()


# The kinds of folder, named by the `kind` field of a manifest (an attention manifest has none: it came first).
ATTENTION_KIND, DECODER_KIND = "attention", "decoder"
# Older names of a kind, read and never written: "gpt" is what folders exported before the decoder kind was named
# for its task (issue 57) say. The one place the Python runtime maps them.
KIND_ALIASES = {"gpt": DECODER_KIND}


def kind_named(value: object) -> str | None:
    """The kind a manifest's `kind` value names (an older name mapped to today's), or None for any other value."""
    if not isinstance(value, str):
        return None
    value = KIND_ALIASES.get(value, value)
    return value if value in (ATTENTION_KIND, DECODER_KIND) else None


# A manifest lists files and figures: a larger file is not one (and is not read whole).
MAX_MANIFEST_BYTES = 1 << 22


def read_manifest_json(folder: Path, *, label: str, made_by: str) -> tuple[Path, Any]:
    """folder/manifest.json parsed, for every kind alike: the folder must exist and the manifest be a regular file
    of at most MAX_MANIFEST_BYTES holding JSON; else one ArtifactError naming what is wrong."""
    folder = Path(folder)
    path = folder / MANIFEST_NAME
    if not folder.is_dir():
        raise ArtifactError(f"{label} {folder}: expected a folder made by {made_by}, found none")
    try:
        raw = read_regular(path, MAX_MANIFEST_BYTES)
    except FileNotFoundError:
        raise ArtifactError(f"{path}: expected a manifest (made by {made_by}), found none") from None
    except ConfigError as exc:  # a FIFO, a folder, a file over the limit
        raise ArtifactError(f"{path}: {exc}") from None
    except OSError as exc:
        raise ArtifactError(f"{path}: cannot read it ({first_line(exc)})") from None
    try:
        return path, json.loads(raw, object_pairs_hook=unique_keys)
    except (ValueError, RecursionError) as exc:
        raise ArtifactError(f"{path}: expected JSON, got a parse error ({first_line(exc)})") from None


def folder_kind(folder: Path) -> str:
    """The kind of model a folder holds, read from its manifest here and nowhere else; a folder whose manifest
    cannot be read is taken for an attention folder, whose loader then names the problem."""
    try:
        _, data = read_manifest_json(folder, label="folder", made_by="`mha export`")
    except ArtifactError:
        return ATTENTION_KIND
    named = kind_named(data.get("kind")) if isinstance(data, dict) else None
    return DECODER_KIND if named == DECODER_KIND else ATTENTION_KIND


class Listed(Protocol):
    """A manifest of either kind, as far as checking its files goes."""

    @property
    def files(self) -> dict[str, FileRecord]: ...


def _listed(folder: Path, name: str, manifest: Listed) -> tuple[Path, FileRecord]:
    entry = manifest.files.get(name)
    if entry is None:
        raise ArtifactError(f"{name}: not listed in {Path(folder) / MANIFEST_NAME}")
    return Path(folder) / name, entry


def _unreadable(path: Path, exc: OSError) -> ArtifactError:
    if isinstance(exc, FileNotFoundError):
        return ArtifactError(f"{path}: listed in the manifest but missing")
    return ArtifactError(f"{path}: cannot read it ({first_line(exc)})")


def _check(path: Path, entry: FileRecord, size: int, digest: str) -> None:
    if size != entry.size:
        raise ArtifactError(f"{path}: expected {entry.size} bytes (manifest), found {size}; "
                            "file truncated or replaced: re-export it with `mha export`")
    if digest != entry.sha256:
        raise ArtifactError(f"{path}: sha256 {digest[:12]}... differs from the manifest's {entry.sha256[:12]}...; "
                            "the file was altered: re-export it with `mha export`")


def _sized(path: Path, entry: FileRecord) -> None:
    """A regular file of the listed size, before a byte of it is read: /dev/zero or a FIFO in its place would
    otherwise be read without end."""
    st = path.stat()  # OSError for the caller to word
    if not stat.S_ISREG(st.st_mode):
        raise ArtifactError(f"{path}: listed in the manifest as a file, but it is {file_kind(st.st_mode)}")
    _check(path, entry, st.st_size, entry.sha256)  # the size alone here


def read_verified(folder: Path, name: str, manifest: Listed) -> bytes:
    """Read one file listed in the manifest and check its size and sha256; return its bytes."""
    path, entry = _listed(folder, name, manifest)
    try:
        _sized(path, entry)
        with open(path, "rb") as fh:
            data = fh.read(entry.size + 1)  # a file grown since its stat is caught by the size check below
    except OSError as exc:
        raise _unreadable(path, exc) from None
    _check(path, entry, len(data), hashlib.sha256(data).hexdigest() if len(data) == entry.size else "")
    return data


def verify_listed(folder: Path, name: str, manifest: Listed, sink: Callable[[bytes], object] | None = None) -> None:
    """Check one listed file's size and sha256 without holding it (read in 1 MiB chunks: a GPT's weights and GGUF
    files are hundreds of MB); each chunk also goes to `sink` when given (a copy of exactly the bytes checked;
    an OSError it raises would be taken for the file's own)."""
    path, entry = _listed(folder, name, manifest)
    try:
        _sized(path, entry)
        digest = sha256_file(path, sink)
    except OSError as exc:
        raise _unreadable(path, exc) from None
    _check(path, entry, entry.size, digest)


def verify_all(folder: Path, manifest: Listed) -> None:
    """Check every file the manifest lists."""
    for name in manifest.files:
        verify_listed(folder, name, manifest)
