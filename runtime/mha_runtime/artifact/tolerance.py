"""Tolerances and the comparison every validator and fixture check uses (the rows: mha_runtime.attention.registry)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from mha_runtime.artifact.fields import Record, record


@dataclass(frozen=True)
class Tolerance(Record):
    """Element-wise |a - e| <= atol + rtol * |e|; optionally also relative L2 error <= rel_l2."""

    atol: float
    rtol: float
    rel_l2: float | None = None

    @classmethod
    def from_dict(cls, data: Any, where: str = "tolerance") -> Tolerance:
        return record(cls, data, where)


@dataclass(frozen=True)
class Comparison:
    """How far an artifact's output is from the reference, and whether that is within tolerance."""

    max_abs: float
    rel_l2: float
    ok: bool


def compare(actual: np.ndarray, expected: np.ndarray, tol: Tolerance) -> Comparison:
    """Compare two outputs; a shape mismatch or any NaN/inf in `actual` is a failure."""
    if actual.shape != expected.shape:
        return Comparison(max_abs=float("inf"), rel_l2=float("inf"), ok=False)
    a = actual.astype(np.float64)
    e = expected.astype(np.float64)
    if not np.isfinite(a).all():
        return Comparison(max_abs=float("inf"), rel_l2=float("inf"), ok=False)
    diff = np.abs(a - e)
    max_abs = float(diff.max()) if diff.size else 0.0
    norm, err = _l2(e), _l2(a - e)
    rel_l2 = err / norm if norm > 0 else err
    with np.errstate(over="ignore", invalid="ignore"):  # a bound past float64 (inf, or inf * 0: NaN) is no warning
        ok = bool((diff <= tol.atol + tol.rtol * np.abs(e)).all())
    if tol.rel_l2 is not None:
        ok = ok and rel_l2 <= tol.rel_l2
    return Comparison(max_abs=max_abs, rel_l2=rel_l2, ok=ok)


def _l2(x: np.ndarray) -> float:
    """The L2 norm without BLAS: np.linalg.norm enters OpenBLAS's thread pool, which the load test's client
    threads contend for at once (docs/serving.md, "Checking answers", has the measurement)."""
    return float(np.sqrt(np.sum(np.square(x))))
