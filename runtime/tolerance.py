"""The one tolerance table, and the comparison every validator and fixture check uses."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Tolerance:
    """Element-wise |a - e| <= atol + rtol * |e|; optionally also relative L2 error <= rel_l2."""

    atol: float
    rtol: float
    rel_l2: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"atol": self.atol, "rtol": self.rtol, "rel_l2": self.rel_l2}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Tolerance:
        return cls(atol=float(data["atol"]), rtol=float(data["rtol"]), rel_l2=data.get("rel_l2"))


# One row per (artifact kind, provider). Loosen a row only with a comment: why, and what was measured.
TOLERANCES: dict[tuple[str, str], Tolerance] = {
    # Measured: max abs diff about 1e-6 at gpt2-small T=1024 (ORT vs eager); 1e-7 on the seed preset.
    ("onnx", "cpu"): Tolerance(atol=1e-5, rtol=1e-5),
    # Not measured yet (no GPU lent to this project so far); kept at the fp32 CPU row until it is.
    ("onnx", "cuda"): Tolerance(atol=1e-5, rtol=1e-5),
    # Measured: 0.0 to 5e-7 (the traced graph runs the same kernels as eager).
    ("torchscript", "cpu"): Tolerance(atol=1e-5, rtol=1e-5),
    # Fused Q/K/V projection; SDPA's op order differs from the wrapper's by about 2e-7.
    ("fused", "cpu"): Tolerance(atol=1e-5, rtol=1e-5),
    ("attention", "cpu"): Tolerance(atol=1e-5, rtol=1e-5),
    # ORT's com.microsoft Attention kernel: measured 7e-7 at gpt2-small T=1024.
    ("contrib", "cpu"): Tolerance(atol=1e-5, rtol=1e-5),
    # Query blocks that leave out masked keys: only the order of sums changes; measured 7e-7 at gpt2-small T=1024.
    ("blocks", "cpu"): Tolerance(atol=1e-5, rtol=1e-5),
    # Key/value-cache decode, any chunking, against the full-sequence output: fp32 arithmetic, 1e-5 as the issue asks.
    ("decode", "cpu"): Tolerance(atol=1e-5, rtol=1e-5),
    # float16 weights and compute (fp32 I/O). Measured over the gpt2-small sweep: max abs 9.5e-4,
    # relative L2 3.9e-4; DESIGN's starting point 5e-3 leaves 5x headroom.
    ("fp16", "cpu"): Tolerance(atol=5e-3, rtol=0.0),
    # int8 dynamic quantization, judged mainly by relative L2 error <= 3e-2 (measured 1.3e-2 over the
    # gpt2-small sweep). Max abs measured 2.7e-2 (outputs reach about 2.0); the 0.1 bound is about 4x that
    # and still catches a broken quantization (signed weights on AVX2 gave 0.28 max abs, 0.28 rel L2).
    ("int8", "cpu"): Tolerance(atol=0.1, rtol=0.0, rel_l2=3e-2),
}


def tolerance_for(kind: str, provider: str = "cpu") -> Tolerance:
    """The row for (kind, provider); an unknown pair is a programming error, named."""
    try:
        return TOLERANCES[(kind, provider)]
    except KeyError:
        known = ", ".join(f"{k}/{p}" for k, p in TOLERANCES)
        raise KeyError(f"no tolerance row for {kind}/{provider}; rows: {known}") from None


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
    norm = float(np.linalg.norm(e))
    rel_l2 = float(np.linalg.norm(a - e) / norm) if norm > 0 else float(np.linalg.norm(a - e))
    ok = bool((diff <= tol.atol + tol.rtol * np.abs(e)).all())
    if tol.rel_l2 is not None:
        ok = ok and rel_l2 <= tol.rel_l2
    return Comparison(max_abs=max_abs, rel_l2=rel_l2, ok=ok)
