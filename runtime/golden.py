"""Golden fixtures: reading `golden/cases.json` and checking an artifact against every case."""
from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from runtime.errors import ArtifactError
from runtime.tolerance import Tolerance, compare

GOLDEN_DIR = "golden"
CASES_NAME = "cases.json"
CASES_TSV = "cases.tsv"  # the same, one line per (artifact, case), for the C and C++ runners
CASES_FORMAT = 1
# The `runtime` field of an artifact entry in cases.json.
ONNX_RUNTIME = "onnxruntime"
DECODE_RUNTIME = "onnxruntime-decode"
TORCHSCRIPT_RUNTIME = "torchscript"


@dataclass(frozen=True)
class CaseResult:
    """One artifact on one golden case."""

    artifact: str
    case: str
    shape: tuple[int, ...]
    max_abs: float
    rel_l2: float
    tolerance: Tolerance
    ok: bool
    error: str | None = None

    def line(self) -> str:
        status = "ok  " if self.ok else "FAIL"
        detail = self.error or f"max_abs={self.max_abs:.3g} rel_l2={self.rel_l2:.3g} atol={self.tolerance.atol:g}"
        return f"{status} {self.artifact:<16} {self.case:<12} {list(self.shape)!s:<18} {detail}"


def load_cases(artifact_dir: Path) -> dict[str, Any]:
    """Read `golden/cases.json`; it lists the cases and, per artifact file, the tolerance to use."""
    path = Path(artifact_dir) / GOLDEN_DIR / CASES_NAME
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ArtifactError(f"{path}: expected golden fixtures (made by `mha export`), found none") from None
    except json.JSONDecodeError as exc:
        raise ArtifactError(f"{path}: expected JSON, got a parse error ({exc})") from None
    if data.get("format") != CASES_FORMAT or not data.get("cases"):
        raise ArtifactError(f"{path}: expected format {CASES_FORMAT} with at least one case")
    return data


def read_bin(path: Path, shape: list[int]) -> np.ndarray:
    """A raw little-endian float32 file of exactly `shape`."""
    try:
        raw = np.fromfile(path, dtype="<f4")
    except FileNotFoundError:
        raise ArtifactError(f"{path}: golden file missing") from None
    if raw.size != int(np.prod(shape)):
        raise ArtifactError(f"{path}: expected {int(np.prod(shape))} float32 values for shape {shape}, found {raw.size}")
    return raw.reshape(shape).astype(np.float32)


def iter_cases(artifact_dir: Path, cases: dict[str, Any]) -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
    """(name, input, expected output) for every case."""
    root = Path(artifact_dir) / GOLDEN_DIR
    for case in cases["cases"]:
        x = read_bin(root / case["input_bin"], case["input_shape"])
        y = read_bin(root / case["output_bin"], case["output_shape"])
        yield case["name"], x, y


def check_artifact(name: str, run: Callable[[np.ndarray], np.ndarray], tolerance: Tolerance,
                   artifact_dir: Path, cases: dict[str, Any]) -> list[CaseResult]:
    """Run `run` on every golden case; an exception in one case is that case's failure, not the end."""
    results = []
    for case, x, expected in iter_cases(artifact_dir, cases):
        try:
            got = run(x)
        except Exception as exc:  # noqa: BLE001 - every case is reported, whatever broke
            results.append(CaseResult(name, case, x.shape, float("inf"), float("inf"), tolerance, False,
                                      error=f"{type(exc).__name__}: {exc}".splitlines()[0]))
            continue
        cmp = compare(np.asarray(got), expected, tolerance)
        results.append(CaseResult(name, case, x.shape, cmp.max_abs, cmp.rel_l2, tolerance, cmp.ok))
    return results


def check_onnx_artifacts(artifact_dir: Path, *, provider: str = "cpu", threads: int | None = None) -> list[CaseResult]:
    """Every ONNX Runtime artifact that `cases.json` lists, on every case, with its own tolerance."""
    from runtime.runner import OnnxRunner  # local: keeps `import runtime.golden` light

    from runtime.decode import DecodeSession, golden_schedule, run_chunked

    cases = load_cases(artifact_dir)
    results: list[CaseResult] = []
    for entry in cases["artifacts"]:
        run: Callable[[np.ndarray], np.ndarray]
        if entry["runtime"] == ONNX_RUNTIME:
            run = OnnxRunner(artifact_dir, model=entry["file"], provider=provider, threads=threads).run
        elif entry["runtime"] == DECODE_RUNTIME:  # a prefill of ceil(T/2) tokens, then one token per step
            session = DecodeSession(artifact_dir, model=entry["file"], provider=provider, threads=threads)
            run = lambda x, s=session: run_chunked(s, x, golden_schedule(x.shape[1]))  # noqa: E731
        else:
            continue
        results += check_artifact(entry["file"], run, Tolerance.from_dict(entry["tolerance"]), artifact_dir, cases)
    return results


def summary_line(results: list[CaseResult]) -> str:
    passed = sum(r.ok for r in results)
    return f"{passed} passed, {len(results) - passed} failed"
