"""Golden fixtures: `golden/cases.json` as typed records, and reading its raw float32 files."""
from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mha_runtime.artifact.config_fields import read_regular
from mha_runtime.artifact.errors import ArtifactError, ConfigError, cut, first_line
from mha_runtime.artifact.fields import get, obj, plain_name, shape3
from mha_runtime.artifact.manifest import MAX_MANIFEST_BYTES
from mha_runtime.artifact.tolerance import Tolerance
from mha_runtime.attention.config import MHAConfig
from mha_runtime.attention.registry import (
    DECODE_INPLACE_RUNTIME,
    DECODE_RUNTIME,
    EXECUTORCH_RUNTIME,
    ONNX_RUNTIME,
    TORCHSCRIPT_RUNTIME,
)

GOLDEN_DIR = "golden"
CASES_NAME = "cases.json"
CASES_FORMAT = 1
# Who loads each file (the `runtime` of an artifact's line): every one `mha check` knows.
RUNTIMES = (ONNX_RUNTIME, DECODE_RUNTIME, DECODE_INPLACE_RUNTIME, TORCHSCRIPT_RUNTIME, EXECUTORCH_RUNTIME)


@dataclass(frozen=True)
class GoldenCase:
    """One input and its eager output, as raw little-endian float32 (.bin) and .npy."""

    name: str
    input_shape: tuple[int, int, int]
    output_shape: tuple[int, int, int]
    input_bin: str
    output_bin: str
    input_npy: str
    output_npy: str

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "input_shape": list(self.input_shape), "output_shape": list(self.output_shape)}

    @classmethod
    def from_dict(cls, data: Any, where: str) -> GoldenCase:
        data = obj(data, where)
        names = {k: plain_name(get(data, k, str, where), f"{where}.{k}")
                 for k in ("input_bin", "output_bin", "input_npy", "output_npy")}
        name = get(data, "name", str, where)
        if not name or not name.isprintable():  # it is printed in every result line (the C runner refuses it too)
            raise ArtifactError(f"{where}.name: expected printable text, got {name!r}")
        case = cls(name=name, input_shape=shape3(get(data, "input_shape", list, where),
                   f"{where}.input_shape"), output_shape=shape3(get(data, "output_shape", list, where),
                   f"{where}.output_shape"), **names)
        if case.input_shape[:2] != case.output_shape[:2]:
            raise ArtifactError(f"{where}: input shape {list(case.input_shape)} and output shape "
                                f"{list(case.output_shape)} disagree on [batch, tokens]")
        return case


@dataclass(frozen=True)
class CaseArtifact:
    """cases.json's line for one artifact file; the decode form also says how each case is fed."""

    file: str
    kind: str
    runtime: str
    tolerance: Tolerance
    schedule: str | None = None
    schedules: dict[str, list[int]] | None = None
    batch_max: int | None = None

    def to_dict(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"file": self.file, "kind": self.kind, "runtime": self.runtime,
                                 "tolerance": self.tolerance.to_dict()}
        if self.schedules is not None:
            entry["schedule"], entry["schedules"] = self.schedule, self.schedules
        if self.batch_max is not None:
            entry["batch_max"] = self.batch_max
        return entry

    @classmethod
    def from_dict(cls, data: Any, where: str) -> CaseArtifact:
        data = obj(data, where)
        schedules = get(data, "schedules", dict, where, optional=True)
        if schedules is not None:
            for name, chunks in schedules.items():
                if (not isinstance(chunks, list) or not chunks
                        or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 1 for c in chunks)):
                    raise ArtifactError(
                        f"{where}.schedules.{name}: expected a list of positive chunk sizes, got {chunks!r}")
        runtime = get(data, "runtime", str, where)
        if runtime not in RUNTIMES:  # `mha check` runs each file by it: an unknown one was left out without a word
            raise ArtifactError(f"{where}.runtime: expected one of {', '.join(RUNTIMES)}, got {cut(runtime)!r}")
        return cls(file=plain_name(get(data, "file", str, where), f"{where}.file"), kind=get(data, "kind", str, where),
                   runtime=runtime,
                   tolerance=Tolerance.from_dict(get(data, "tolerance", dict, where), f"{where}.tolerance"),
                   schedule=get(data, "schedule", str, where, optional=True), schedules=schedules,
                   batch_max=get(data, "batch_max", int, where, optional=True))


@dataclass(frozen=True)
class GoldenCases:
    """The whole of cases.json."""

    config: MHAConfig
    cases: tuple[GoldenCase, ...]
    artifacts: tuple[CaseArtifact, ...]
    input: str = "x"
    output: str = "context"

    def to_dict(self) -> dict[str, Any]:
        return {"format": CASES_FORMAT, "input": self.input, "output": self.output, "dtype": "float32",
                "byte_order": "little", "config": self.config.to_dict(), "cases": [c.to_dict() for c in self.cases],
                "artifacts": [a.to_dict() for a in self.artifacts]}

    @classmethod
    def from_dict(cls, data: Any, where: str) -> GoldenCases:
        data = obj(data, where)
        if data.get("format") != CASES_FORMAT or isinstance(data.get("format"), bool):  # true == 1
            raise ArtifactError(f"{where}: expected format {CASES_FORMAT}, got {data.get('format')!r}")
        config = MHAConfig.from_document(data, where)
        cases = tuple(GoldenCase.from_dict(c, f"{where}: cases[{i}]")
                      for i, c in enumerate(get(data, "cases", list, where)))
        if not cases:
            raise ArtifactError(f"{where}: expected at least one case")
        artifacts = tuple(CaseArtifact.from_dict(a, f"{where}: artifacts[{i}]")
                          for i, a in enumerate(get(data, "artifacts", list, where)))
        for artifact in artifacts:
            for case in cases:
                chunks = (artifact.schedules or {}).get(case.name)
                if artifact.schedules is not None and (chunks is None or sum(chunks) != case.input_shape[1]):
                    raise ArtifactError(f"{where}: {artifact.file} schedule for {case.name} is {chunks}, expected "
                                        f"chunks adding up to its {case.input_shape[1]} tokens")
        return cls(config=config, cases=cases, artifacts=artifacts, input=get(data, "input", str, where),
                   output=get(data, "output", str, where))


def load_cases(artifact_dir: Path) -> GoldenCases:
    """Read `golden/cases.json`; it lists the cases and, per artifact file, the tolerance to use."""
    path = Path(artifact_dir) / GOLDEN_DIR / CASES_NAME
    try:
        data = json.loads(read_regular(path, MAX_MANIFEST_BYTES).decode())
    except FileNotFoundError:
        raise ArtifactError(f"{path}: expected golden fixtures (made by `mha export`), found none") from None
    except ConfigError as exc:  # a FIFO, a device, a folder, a file over the limit: never read
        raise ArtifactError(f"{path}: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ArtifactError(f"{path}: expected a readable JSON file ({first_line(exc)})") from None
    except (ValueError, RecursionError) as exc:  # ValueError: also an integer past 4300 digits
        raise ArtifactError(f"{path}: expected JSON, got a parse error ({first_line(exc)})") from None
    return GoldenCases.from_dict(data, str(path))


def read_bin(path: Path, shape: tuple[int, ...]) -> np.ndarray:
    """A raw little-endian float32 file of exactly `shape`."""
    expected = math.prod(shape)  # Python's integers: np.prod wraps [2**32, 2**32, 1] round to 0 in int64
    try:
        size = path.stat().st_size
        if size != 4 * expected:
            raise ArtifactError(
                f"{path}: expected {expected} float32 values for shape {list(shape)}, found {size / 4:g}")
        raw = np.fromfile(path, dtype="<f4")
    except FileNotFoundError:
        raise ArtifactError(f"{path}: golden file missing") from None
    except OSError as exc:
        raise ArtifactError(f"{path}: cannot read it ({first_line(exc)})") from None
    return raw.reshape(shape).astype(np.float32)


def iter_cases(artifact_dir: Path, cases: GoldenCases) -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
    """(name, input, expected output) for every case."""
    root = Path(artifact_dir) / GOLDEN_DIR
    for case in cases.cases:
        yield case.name, read_bin(root / case.input_bin, case.input_shape), read_bin(root / case.output_bin,
                                                                                      case.output_shape)
