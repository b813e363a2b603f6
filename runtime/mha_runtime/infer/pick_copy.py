"""Which file a runner parses: the folder's offline-optimized copy where this machine can use it, else the plain one.

ONNX Runtime documents that an optimized graph saved offline and loaded with graph optimizations disabled starts
faster, and that one saved with layout optimizations (level `all`) needs hardware like the machine that saved it.
So the copy is used only where the manifest's record for the provider names this ONNX Runtime version and this
machine's CPU fingerprint. Otherwise the runner takes the plain file and says why, once per process and reason,
as a `logging` warning (shown on stderr as one line when the application configures no logging). A copy that is
listed but altered is refused like any file (its sha256 is checked before any parser sees it): it never falls
back. A copy that is absent (a folder shipped with only the plain model) falls back, with the note.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import onnxruntime as ort

from mha_runtime.attention.manifest import Manifest
from mha_runtime.attention.optimized_records import Fingerprint, OptimizedSet
from mha_runtime.infer.cpu_features import cpu_fingerprint

log = logging.getLogger("mha_runtime")
_said: set[str] = set()
# The providers whose copies this runtime can match to the machine (CUDA would need a GPU fingerprint).
CHECKED_PROVIDERS = ("cpu",)


@dataclass(frozen=True)
class Choice:
    """The file to read, verify and parse; whether it is a preoptimized copy; why a listed copy was not taken."""

    file: str
    preoptimized: bool = False
    note: str | None = None


def choose(folder: Path, model: str, manifest: Manifest, provider: str) -> Choice:
    """The optimized copy of `model` for `provider` when the manifest has one this machine can use, else `model`
    (with a note when a copy exists but cannot be used here)."""
    entry = manifest.optimized.get(provider)
    record = entry.files.get(model) if entry is not None else None
    if entry is None or record is None:
        return Choice(model)  # nothing to fall back from: no note
    reason = unusable_here(entry, provider)
    if reason is None and not (Path(folder) / record.file).exists():
        reason = f"{record.file} is not in the folder"
    if reason is None:
        return Choice(record.file, preoptimized=True)
    return Choice(model, note=f"note: {model}: not using its optimized copy for {provider} ({reason}); "
                              "loading the plain file, whose session start is slower")


def unusable_here(entry: OptimizedSet, provider: str) -> str | None:
    """Why this machine cannot use the copies of `entry`, or None."""
    if provider not in CHECKED_PROVIDERS:
        return f"this runtime checks only {', '.join(CHECKED_PROVIDERS)} copies"
    if entry.onnxruntime != ort.__version__:
        return f"made by onnxruntime {entry.onnxruntime}, this is {ort.__version__}"
    return fingerprint_mismatch(entry.fingerprint, cpu_fingerprint())


def fingerprint_mismatch(export: Fingerprint, here: Fingerprint) -> str | None:
    """How the export machine's CPU differs from this one, or None when the fingerprints match."""
    if export.cpu_flags is None or here.cpu_flags is None:
        return f"CPU features unknown (export {export.describe()}; here {here.describe()})"
    if export.machine != here.machine:
        return f"made on {export.machine}, this is {here.machine}"
    only_export = sorted(set(export.cpu_flags) - set(here.cpu_flags))
    only_here = sorted(set(here.cpu_flags) - set(export.cpu_flags))
    if not only_export and not only_here:
        return None
    parts = [f"only the export CPU has {' '.join(only_export)}" if only_export else "",
             f"only this CPU has {' '.join(only_here)}" if only_here else ""]
    return "CPU features differ: " + "; ".join(p for p in parts if p)


def say_once(note: str) -> None:
    """Log `note` as a warning the first time this process meets it (a runner per request must not repeat it)."""
    if note not in _said:
        _said.add(note)
        log.warning(note)


def session_options(threads: int | None, *, preoptimized: bool) -> ort.SessionOptions:
    """The runner's session options; a preoptimized copy is loaded with graph optimizations disabled."""
    options = ort.SessionOptions()
    # Fatal only: ORT's warnings are not the user's business, and its error log of a failed run is a second, raw
    # (coloured, multi-line) copy of the exception the caller turns into one line.
    options.log_severity_level = 4
    if threads is not None:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    if preoptimized:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return options
