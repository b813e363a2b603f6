"""The bench's targets (issues 4 and 6), judged on one run's figures, with the exact-work floors beside them."""
from __future__ import annotations

from typing import Any

from mha_export.flops import causal_flops, dense_flops
from mha_runtime.config import MHAConfig
from mha_runtime.manifest import Manifest
from mha_runtime.variants import LOW_PRECISION_KINDS, ONNX, VARIANTS


def fastest_fp32(results: list[dict[str, Any]], manifest: Manifest, *, tokens: int) -> dict[str, Any] | None:
    """The fastest fp32 artifact (not eager, not fp16/int8) at `tokens`."""
    fp32 = [r for r in results if r["tokens"] == tokens and r["kind"] != "eager"
            and manifest.artifacts[r["runner"]].kind not in LOW_PRECISION_KINDS]
    return min(fp32, key=lambda r: r["median_s"]) if fp32 else None


FAITHFUL_FILE = ONNX.file
INT8_FILE = VARIANTS["int8"].file


def _at(result: dict[str, Any], runner: str, tokens: int) -> dict[str, Any] | None:
    return next((r for r in result["results"] if r["runner"] == runner and r["tokens"] == tokens), None)


def _target(name: str, value: float, goal: str, met: bool | None, unit: str) -> dict[str, Any]:
    """met is None for a row shown for information only."""
    return {"target": name, "value": value, "goal": goal, "unit": unit, "met": met}


def judge(result: dict[str, Any], manifest: Manifest) -> dict[str, Any]:
    """Targets at T = context_length (only those whose runners were timed) and the floors: the time the
    dense and the causal (masked half skipped) FLOP counts take at the run's own MatMul peak rate."""
    config = MHAConfig.from_dict(result["config"])
    t = config.context_length
    peak = result["matmul_peak"]["gflops"] * 1e9
    eager, best = _at(result, "eager wrapper", t), fastest_fp32(result["results"], manifest, tokens=t)
    if eager is None or best is None:
        return {"tokens": t, "targets": [], "floors": {}}
    floors = {"dense_at_peak_s": dense_flops(config, batch=1, tokens=t) / peak,
              "causal_at_peak_s": causal_flops(config, batch=1, tokens=t) / peak,
              "needed_for_3x_s": eager["median_s"] / 3, "needed_for_2x_s": eager["median_s"] / 2}
    targets = [
        _target(f"fastest fp32 ({best['runner']}) % of MatMul peak", best["pct_of_peak"], ">= 80",
                best["pct_of_peak"] >= 80, "%"),
        _target(f"fastest fp32 ({best['runner']}) vs eager wrapper", eager["median_s"] / best["median_s"], ">= 3",
                eager["median_s"] / best["median_s"] >= 3, "x"),
    ]
    faithful = _at(result, FAITHFUL_FILE, t)
    if faithful is not None:
        ratio = eager["median_s"] / faithful["median_s"]
        targets.append(_target(f"{FAITHFUL_FILE} vs eager wrapper", ratio, ">= 2", ratio >= 2, "x"))
    int8 = _at(result, INT8_FILE, t)
    if int8 is not None:
        targets.append(_target(f"{INT8_FILE} ms (fastest fp32: {1e3 * best['median_s']:.1f} ms)",
                               1e3 * int8["median_s"], "< fastest fp32", int8["median_s"] < best["median_s"], "ms"))
    # The issue asks for the cold start of "the fastest artifact" (any precision; int8 is meant to be it),
    # so that is the target; the fastest fp32 artifact's cold start is listed beside it, not judged.
    # Cold start is measured for the ONNX Runtime artifacts (TorchScript is a libtorch deployment).
    fastest = min((r for r in result["results"] if r["tokens"] == t and r["kind"] == "onnxruntime"),
                  key=lambda r: r["median_s"], default=None)
    cold = None if fastest is None else result["artifacts"][fastest["runner"]]["cold_start_s"]
    if fastest is not None and cold is not None:
        targets.append(_target(f"cold start of {fastest['runner']} (fastest artifact)", 1e3 * cold, "< 15",
                               cold < 0.015, "ms"))
    fp32_cold = result["artifacts"].get(best["runner"], {}).get("cold_start_s")
    if best is not fastest and fp32_cold is not None:
        targets.append(_target(f"cold start of {best['runner']} (fastest fp32; shown, not judged)", 1e3 * fp32_cold,
                               "< 15", None, "ms"))
    if "decode" in result:
        speedup = result["decode"]["speedup_vs_full_recompute"]
        targets.append(_target("decode step vs full recompute", speedup, ">= 50", speedup >= 50, "x"))
    return {"tokens": t, "targets": targets, "floors": floors}
