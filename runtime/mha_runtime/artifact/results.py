"""What `mha check` reports for every kind: one result per artifact and case, the summary line, and the JSON every
runner's `check --json` writes (runtime/native/web/check.mjs defined the format)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mha_runtime.artifact.tolerance import Tolerance


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
    skipped: bool = False
    detail: str | None = None  # what the line shows instead of the tolerance figures (a lossy form's quality)

    def line(self) -> str:
        status = "skip" if self.skipped else "ok  " if self.ok else "FAIL"
        detail = self.error or self.detail or \
            f"max_abs={self.max_abs:.3g} rel_l2={self.rel_l2:.3g} atol={self.tolerance.atol:g}"
        return f"{status} {self.artifact:<16} {self.case:<12} {list(self.shape)!s:<18} {detail}"


def results_json(results: list[CaseResult], *, runtime: str, artifact_dir: Path) -> dict[str, Any]:
    """The results as every runner's `check --json` writes them (runtime/native/web/check.mjs defined the
    format): counts, and per artifact file its cases, or why it was skipped."""
    artifacts: dict[str, dict[str, Any]] = {}
    for r in results:
        entry = artifacts.setdefault(r.artifact, {"file": r.artifact, "not_loadable": None, "skipped": None,
                                                  "cases": []})
        if r.skipped:
            entry["skipped"] = r.error
            continue
        entry["cases"].append({"name": r.case, "shape": list(r.shape), "ok": r.ok, "error": r.error,
                               "max_abs": _finite(r.max_abs), "rel_l2": _finite(r.rel_l2)})
    passed = sum(r.ok for r in results)
    failed = sum(not r.ok and not r.skipped for r in results)
    return {"runtime": runtime, "artifact_dir": str(artifact_dir), "passed": passed, "failed": failed,
            "artifacts": list(artifacts.values())}


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def summary_line(results: list[CaseResult]) -> str:
    passed = sum(r.ok for r in results)
    skips = sum(r.skipped for r in results)
    failed = len(results) - passed - skips
    return f"{passed} passed, {failed} failed" + (f", {skips} skipped" if skips else "")
