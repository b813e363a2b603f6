"""The one export pipeline every model kind goes through: name check, the kind's refusals, its weights, then in a
staging folder its build, its validation and the sealed manifest, moved into place only when all of it passed.

A kind supplies its steps (`KindSteps`: the attention in attention/pipeline/export.py, the decoder in
decoder/export.py), each a function of the value the step before it returned: plan -> loaded -> built ->
validated -> sealed. A step reads nothing but its argument, so a reader sees what each needs and makes; the order,
the staging, the announcement and the one manifest writer are here.
"""
from __future__ import annotations

import gc
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from mha_runtime.artifact.atomic import MAX_NAME, staged_folder
from mha_runtime.artifact.errors import BadValueError, cut
from mha_runtime.artifact.manifest import MANIFEST_NAME

# A folder name under --out: one path part, never '.' or '..', at most MAX_NAME characters.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")

P = TypeVar("P")  # the plan: what will be built, every refusal passed
L = TypeVar("L")  # the loaded weights and what every file is judged against
B = TypeVar("B")  # the files written into the staging folder
V = TypeVar("V")  # the files judged


def check_folder_name(name: str) -> None:
    """Refuse a --name that is not one plain folder name (a usage error)."""
    if not _NAME.fullmatch(name) or len(name) > MAX_NAME:
        raise BadValueError(f"--name: expected a folder name of 1 to {MAX_NAME} letters, digits, '.', '_' or '-' "
                            f"that starts with a letter or digit, got {cut(name)!r}"
                            + (f" ({len(name)} characters)" if len(name) > MAX_NAME else ""))


class SealedManifest(Protocol):
    """Either kind's manifest: what the pipeline writes as manifest.json."""

    def to_dict(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Stage:
    """The staging folder a step writes into, and how it shows its progress."""

    folder: Path
    progress: bool  # a bar on a terminal (mha_export.pipeline.progress)
    label: str  # the bar's label: "building NAME", "validating NAME"


@dataclass(frozen=True)
class Sealed:
    """The last step's value: the staged folder's manifest (its files hashed) and the export's notes."""

    manifest: SealedManifest
    notes: tuple[str, ...]  # what the default set left out, and why


class KindSteps(Protocol[P, L, B, V]):
    """One model kind's export of one folder, step by step in the order `run_export` calls them; each step takes
    the value the one before returned."""

    def plan(self) -> P:
        """Refuse, before any work, every value this kind cannot export (variants, budget, forms, inputs)."""
        ...

    def load(self, plan: P) -> L:
        """Read the weights and make what every file is judged against; the work starts after this."""
        ...

    def build(self, loaded: L, stage: Stage) -> B:
        """Write every file of the folder into `stage.folder`."""
        ...

    def validate(self, built: B, stage: Stage) -> V:
        """Judge every staged file; raise ValidationError (nothing is placed) if one fails."""
        ...

    def seal(self, validated: V, folder: Path) -> Sealed:
        """The manifest of the staged `folder` (its files hashed) and the notes."""
        ...


@dataclass(frozen=True)
class ExportResult:
    name: str
    folder: Path
    manifest: Any  # the kind's manifest (Manifest or GPTManifest)
    seconds: float
    notes: tuple[str, ...] = ()  # variants of the default set this config cannot have, and why


def run_export(name: str, out_root: Path, kind: KindSteps[P, L, B, V], *, progress: bool = False,
               announce: Callable[[], None] | None = None) -> ExportResult:
    """Export `kind` into `out_root/name`: everything that can be refused is refused before any file is written,
    and nothing under `out_root/name` changes unless every file was written and validated. `announce` is called
    once the weights are read: the work starts."""
    start = time.perf_counter()
    check_folder_name(name)
    loaded = kind.load(kind.plan())
    if announce is not None:
        announce()
    with staged_folder(Path(out_root) / name) as folder:
        built = kind.build(loaded, Stage(folder, progress, f"building {name}"))
        # Validation runs on the files: the loaded value goes before it, and with it the decoder's weights (its built
        # value holds none; the attention's keeps its small eager wrapper).
        del loaded
        gc.collect()
        validated = kind.validate(built, Stage(folder, progress, f"validating {name}"))
        sealed = kind.seal(validated, folder)
        (folder / MANIFEST_NAME).write_text(json.dumps(sealed.manifest.to_dict(), indent=2) + "\n")  # the last file
    return ExportResult(name, Path(out_root) / name, sealed.manifest, time.perf_counter() - start, sealed.notes)
