"""The one export pipeline every model kind goes through: name check, the kind's refusals, its weights, then in a
staging folder its build, its validation and the sealed manifest, moved into place only when all of it passed.

A kind supplies the steps (`KindExport`: the attention in pipeline/export.py, the GPT in gpt/export.py); the order,
the staging, the announcement and the one manifest writer are here.
"""
from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from mha_runtime.artifact.atomic import MAX_NAME, staged_folder
from mha_runtime.artifact.errors import BadValueError, cut
from mha_runtime.artifact.manifest import MANIFEST_NAME

# A folder name under --out: one path part, never '.' or '..', at most MAX_NAME characters.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def check_folder_name(name: str) -> None:
    """Refuse a --name that is not one plain folder name (a usage error)."""
    if not _NAME.fullmatch(name) or len(name) > MAX_NAME:
        raise BadValueError(f"--name: expected a folder name of 1 to {MAX_NAME} letters, digits, '.', '_' or '-' "
                            f"that starts with a letter or digit, got {cut(name)!r}"
                            + (f" ({len(name)} characters)" if len(name) > MAX_NAME else ""))


class SealedManifest(Protocol):
    """Either kind's manifest: what the pipeline writes as manifest.json."""

    def to_dict(self) -> dict[str, Any]: ...


class KindExport(Protocol):
    """One model kind's export of one folder, step by step in the order `run_export` calls them."""

    notes: tuple[str, ...]  # what the default set left out, and why

    def check(self) -> None:
        """Refuse, before any work, every value this kind cannot export (variants, budget, forms, inputs)."""

    def load(self) -> None:
        """Read the weights and make what every file is judged against; the work starts after this."""

    def build(self, stage: Path, *, progress: bool, label: str) -> None:
        """Write every file of the folder into `stage`."""

    def validate(self, stage: Path, *, progress: bool, label: str) -> None:
        """Judge every staged file; raise ValidationError (nothing is placed) if one fails."""

    def seal(self, stage: Path) -> SealedManifest:
        """The manifest of the staged folder (its files hashed)."""


@dataclass(frozen=True)
class ExportResult:
    name: str
    folder: Path
    manifest: Any  # the kind's manifest (Manifest or GPTManifest)
    seconds: float
    notes: tuple[str, ...] = ()  # variants of the default set this config cannot have, and why


def run_export(name: str, out_root: Path, kind: KindExport, *, progress: bool = False,
               announce: Callable[[], None] | None = None) -> ExportResult:
    """Export `kind` into `out_root/name`: everything that can be refused is refused before any file is written,
    and nothing under `out_root/name` changes unless every file was written and validated. `announce` is called
    once the weights are read: the work starts."""
    start = time.perf_counter()
    check_folder_name(name)
    kind.check()
    kind.load()
    if announce is not None:
        announce()
    with staged_folder(Path(out_root) / name) as stage:
        kind.build(stage, progress=progress, label=f"building {name}")
        kind.validate(stage, progress=progress, label=f"validating {name}")
        manifest = kind.seal(stage)
        (stage / MANIFEST_NAME).write_text(json.dumps(manifest.to_dict(), indent=2) + "\n")  # the last file
    return ExportResult(name, Path(out_root) / name, manifest, time.perf_counter() - start, kind.notes)
