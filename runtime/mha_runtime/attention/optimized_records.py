"""The manifest's `optimized` records: ONNX Runtime's offline-optimized copy of a plain ONNX artifact, per provider.

An export saves, for each artifact its variant marks `offline_optimized`, the graph ONNX Runtime builds from it
(`SessionOptions.optimized_model_filepath`) under `optimized/<provider>/<file>`. The copy is listed in `files` with
its sha256 like every file; this record says which plain file it optimizes, with which ONNX Runtime and level, on
which CPU (its fingerprint), and how it did over the validation sweep. A runner loads it only where the ONNX Runtime
version and the CPU fingerprint are the export's (mha_runtime.infer.pick_copy).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mha_runtime.artifact.errors import ArtifactError
from mha_runtime.artifact.fields import Record, get, keyed, obj, plain_name, record

OPTIMIZED_DIR = "optimized"
# ORT's default for an online session; the fingerprint guards its hardware-specific (layout) passes.
LEVEL = "all"


def optimized_name(file: str, provider: str) -> str:
    """Where the optimized copy of `file` for `provider` lives inside the artifact folder."""
    return f"{OPTIMIZED_DIR}/{provider}/{file}"


def is_copy(file: str) -> bool:
    """Whether `file` (a name inside the folder) is an optimized copy rather than an artifact."""
    return file.startswith(f"{OPTIMIZED_DIR}/")


@dataclass(frozen=True)
class Fingerprint:
    """The CPU features an optimized graph may depend on: the architecture and the SIMD flags MLAS dispatches on
    (None: this machine's flags cannot be read, so nothing is trusted to match)."""

    machine: str
    cpu_flags: tuple[str, ...] | None

    def to_dict(self) -> dict[str, Any]:
        return {"machine": self.machine, "cpu_flags": None if self.cpu_flags is None else list(self.cpu_flags)}

    @classmethod
    def from_dict(cls, data: Any, where: str) -> Fingerprint:
        data = obj(data, where)
        flags = get(data, "cpu_flags", list, where, optional=True)
        if flags is not None and not all(isinstance(f, str) for f in flags):
            raise ArtifactError(f"{where}: field 'cpu_flags' expected an array of strings, got {flags!r}"[:200])
        return cls(machine=get(data, "machine", str, where), cpu_flags=None if flags is None else tuple(flags))

    def describe(self) -> str:
        flags = "unknown flags" if self.cpu_flags is None else " ".join(self.cpu_flags) or "no SIMD flags"
        return f"{self.machine}: {flags}"


@dataclass(frozen=True)
class OptimizedFile(Record):
    """One optimized copy and its figures over the export's sweep (the plain file's tolerance row)."""

    file: str
    cases: int
    max_abs_error: float
    rel_l2_error: float
    passed: bool

    @classmethod
    def from_dict(cls, data: Any, where: str) -> OptimizedFile:
        return record(cls, data, where, file=lambda f: plain_name(f, f"{where}.file"))


@dataclass(frozen=True)
class OptimizedSet(Record):
    """Every optimized copy made for one provider, with what they were made by: keyed by the plain file."""

    onnxruntime: str
    level: str
    fingerprint: Fingerprint
    files: dict[str, OptimizedFile] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: Any, where: str) -> OptimizedSet:
        data = obj(data, where)
        files = get(data, "files", dict, where)
        return cls(onnxruntime=get(data, "onnxruntime", str, where), level=get(data, "level", str, where),
                   fingerprint=Fingerprint.from_dict(get(data, "fingerprint", dict, where), f"{where}.fingerprint"),
                   files=keyed(files, f"{where}.files", OptimizedFile.from_dict))


def optimized_from_dict(data: Any, where: str) -> dict[str, OptimizedSet]:
    """The manifest's `optimized` object (absent in folders exported before it: no copies)."""
    if data is None:
        return {}
    sets = {provider: OptimizedSet.from_dict(s, f"{where}.{provider}") for provider, s in obj(data, where).items()}
    for provider, entry in sets.items():
        for plain, copy in entry.files.items():  # an edited record would run another listed graph under its name
            if copy.file != optimized_name(plain, provider):
                raise ArtifactError(f"{where}.{provider}.files.{plain}.file: expected "
                                    f"{optimized_name(plain, provider)!r}, got {copy.file!r}")
    return sets
