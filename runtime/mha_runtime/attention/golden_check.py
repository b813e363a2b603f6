"""`mha check`: every golden case of `golden/cases.json` on every artifact, each with its tolerance row.

The ONNX Runtime files run here; the formats that need torch or ExecuTorch run through the runners that the
export package registers under the `mha.runners` entry-point group, and are reported as skipped when it is not
installed.
"""
from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import entry_points
from importlib.util import find_spec
from pathlib import Path

import numpy as np

from mha_runtime.artifact.errors import first_line
from mha_runtime.artifact.manifest import verify_all
from mha_runtime.artifact.results import CaseResult
from mha_runtime.artifact.tolerance import Tolerance, compare
from mha_runtime.attention.decode_session import DecodeSession, run_chunked
from mha_runtime.attention.golden import CaseArtifact, GoldenCases, iter_cases, load_cases
from mha_runtime.attention.inplace_session import InPlaceDecodeSession
from mha_runtime.attention.manifest import load_manifest
from mha_runtime.attention.registry import (
    DECODE_INPLACE_RUNTIME,
    DECODE_RUNTIME,
    EXECUTORCH_RUNTIME,
    ONNX_RUNTIME,
    TORCHSCRIPT_RUNTIME,
    cpu_only,
    tolerance_for,
)
from mha_runtime.attention.runner import OnnxRunner
from mha_runtime.infer.providers import resolve_provider

RUNNERS_GROUP = "mha.runners"
# What to install for a runtime whose runner is not registered.
NEEDS = {TORCHSCRIPT_RUNTIME: "needs torch: pip install ./export (the mha-export package)",
         EXECUTORCH_RUNTIME: "needs ExecuTorch: pip install './export[executorch]'"}
Run = Callable[[np.ndarray], np.ndarray]


def torch_side_runner(runtime: str) -> Callable[[Path], Run] | str:
    """The registered runner factory for a torch-side runtime, or why there is none (what to install)."""
    found = [ep for ep in entry_points(group=RUNNERS_GROUP) if ep.name == runtime]
    if not found:
        return NEEDS[runtime]
    try:
        factory: Callable[[Path], Run] = found[0].load()
        if runtime == EXECUTORCH_RUNTIME and find_spec("executorch") is None:  # registered, the extra missing
            raise ModuleNotFoundError(name="executorch")
    except ImportError as exc:
        return f"{NEEDS[runtime]} (missing module {exc.name!r})"
    return factory


def check_artifact(name: str, run: Callable[[str, np.ndarray], np.ndarray], tolerance: Tolerance,
                   artifact_dir: Path, cases: GoldenCases) -> list[CaseResult]:
    """Run `run(case name, x)` on every golden case; an exception in one case is that case's failure, not the end."""
    results = []
    for case, x, expected in iter_cases(artifact_dir, cases):
        try:
            got = run(case, x)
        except Exception as exc:
            results.append(CaseResult(name, case, x.shape, float("inf"), float("inf"), tolerance, False,
                                      error=f"{type(exc).__name__}: {first_line(exc)}"))
            continue
        cmp = compare(np.asarray(got), expected, tolerance)
        results.append(CaseResult(name, case, x.shape, cmp.max_abs, cmp.rel_l2, tolerance, cmp.ok))
    return results


def skipped(entry: CaseArtifact, cases: GoldenCases, why: str) -> list[CaseResult]:
    """Every case of an artifact this environment cannot run, reported as skipped (counted neither way)."""
    return [CaseResult(entry.file, c.name, c.input_shape, float("nan"), float("nan"), entry.tolerance, False,
                       error=why, skipped=True) for c in cases.cases]


def _onnx_run(artifact_dir: Path, entry: CaseArtifact, *, provider: str,
              threads: int | None) -> Callable[[str, np.ndarray], np.ndarray]:
    """An ONNX Runtime file as `run(case, x)`; the decode forms are fed by the schedules cases.json stores."""
    if entry.runtime == ONNX_RUNTIME:
        runner = OnnxRunner(artifact_dir, model=entry.file, provider=provider, threads=threads)
        return lambda case, x: runner.run(x)
    kind = DecodeSession if entry.runtime == DECODE_RUNTIME else InPlaceDecodeSession
    session = kind(artifact_dir, model=entry.file, provider=provider, threads=threads)
    schedules = entry.schedules or {}
    return lambda case, x: run_chunked(session, x, schedules[case])


def check_onnx_artifacts(artifact_dir: Path, *, provider: str = "cpu", threads: int | None = None) -> list[CaseResult]:
    """Every ONNX Runtime artifact that `cases.json` lists, on every case, with the row of the provider it ran on."""
    cases = load_cases(artifact_dir)
    resolved = resolve_provider(provider)
    results: list[CaseResult] = []
    for entry in cases.artifacts:
        if entry.runtime not in (ONNX_RUNTIME, DECODE_RUNTIME, DECODE_INPLACE_RUNTIME):
            continue
        why = cpu_only(entry.kind) if resolved == "cuda" else None
        if why is not None:
            results += skipped(entry, cases, f"runs on the CPU only: {why}")
            continue
        run = _onnx_run(artifact_dir, entry, provider=resolved, threads=threads)
        tolerance = entry.tolerance if resolved == "cpu" else tolerance_for(entry.kind, resolved)
        results += check_artifact(entry.file, run, tolerance, artifact_dir, cases)
    return results


def check_golden(folder: Path, *, provider: str = "cpu", threads: int | None = None) -> list[CaseResult]:
    """Every golden case on every artifact of `golden/cases.json`, every file verified against the manifest first."""
    verify_all(folder, load_manifest(folder))
    results = check_onnx_artifacts(folder, provider=provider, threads=threads)
    cases = load_cases(folder)
    for entry in cases.artifacts:
        if entry.runtime not in (TORCHSCRIPT_RUNTIME, EXECUTORCH_RUNTIME):
            continue
        factory = torch_side_runner(entry.runtime)
        if isinstance(factory, str):
            results += skipped(entry, cases, factory)
            continue
        run = factory(Path(folder) / entry.file)
        results += check_artifact(entry.file, lambda case, x, r=run: r(x), entry.tolerance, folder, cases)
    return results
