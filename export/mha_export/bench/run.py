"""`mha bench`: every runner timed side by side in one process, interleaved, against the machine's MatMul peak.

It reports facts only (latency, tokens/s, the floors, each runner's ratio to the causal floor and to torch's
fused kernel, decode speedups, cold starts); the targets they are read against are in docs/bench.md.
"""
from __future__ import annotations

import contextlib
import gc
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import numpy as np
import torch

from mha_export.bench.flops import causal_flops, decode_step_flops, dense_flops, dense_formula
from mha_export.bench.options import Shape, default_threads, resolve_shapes
from mha_export.bench.runners import (
    DECODE_BURST,
    EAGER,
    FUSED,
    PEAK_N,
    SETTLE_S,
    DecodeForm,
    _matmul_session,
    build_decode_forms,
    build_runners,
    cold_start,
    cold_start_loads,
    missing_variants,
    runner_names,
    wasm_medians,
)
from mha_export.pipeline.seal import versions
from mha_runtime.artifact.errors import BadValueError
from mha_runtime.attention.config import MHAConfig
from mha_runtime.attention.manifest import Manifest, load_manifest
from mha_runtime.attention.registry import (
    DECODE,
    DECODE_INPLACE,
    LOW_PRECISION_KINDS,
)
from mha_runtime.infer.cpu_features import load_average, machine


def _stats(samples: list[float]) -> dict[str, float]:
    """Median, min and p90. The p90 interpolates linearly between the order statistics around position
    0.9 * (n - 1): statistics.quantiles' "inclusive" method, which takes the samples as the whole population, so
    the min and max are the 0th and 100th percentiles and nothing lies past them ("exclusive", the default,
    puts p90 at position 0.9 * (n + 1): the max at 9 rounds, beyond it below 9). It is the same definition as
    numpy.percentile's default, which the test checks it against; the stdlib keeps the two independent."""
    ordered = sorted(samples)
    # Python 3.11's quantiles wants two points; one sample is its own p90.
    p90 = ordered[0] if len(ordered) == 1 else statistics.quantiles(ordered, n=10, method="inclusive")[8]
    return {"median_s": statistics.median(ordered), "min_s": ordered[0], "p90_s": p90}


def fastest_fp32(results: list[dict[str, Any]], manifest: Manifest, *, batch: int,
                 tokens: int) -> dict[str, Any] | None:
    """The fastest fp32 artifact (not eager, not fp16/int8) at batch x tokens."""
    fp32 = [r for r in results if r["batch"] == batch and r["tokens"] == tokens and r["kind"] != "eager"
            and manifest.artifacts[r["runner"]].kind not in LOW_PRECISION_KINDS]
    return min(fp32, key=lambda r: r["median_s"]) if fp32 else None


def run_bench(folder: Path, *, tokens: list[int] | None = None, batches: list[Shape] | None = None,
              threads: list[int] | None = None, rounds: int = 10, progress: bool = True,
              only: list[str] | None = None, settle: float = SETTLE_S) -> dict[str, Any]:
    """Time every runner at every shape and thread count (each thread count its own interleaved rounds), plus the
    MatMul peak, the decode forms and cold starts. tokens/batches None: the defaults; threads None: 1 and 2."""
    manifest = load_manifest(folder)
    config = manifest.config
    shapes = resolve_shapes(config, tokens, batches)
    threads = sorted(set(threads)) if threads is not None else default_threads()
    if not threads or threads[0] < 1:
        raise BadValueError(f"--threads: expected thread counts >= 1, got {threads or 'none'}")
    if only:
        names = runner_names(manifest)
        unknown = sorted(set(only) - set(names))
        if unknown:
            raise BadValueError(f"--only: unknown runner {unknown[0]!r}; choose from {', '.join(names)}")
    start_load = load_average()
    notes: list[str] = missing_variants(manifest)
    by_threads: dict[str, Any] = {}
    files: list[str] = []
    previous = torch.get_num_threads()
    try:
        for count in threads:
            run, timed_files = _run_threads(folder, manifest, shapes, count, rounds=rounds, progress=progress,
                                            only=only, settle=settle, notes=notes)
            by_threads[str(count)] = run
            files += [f for f in timed_files if f not in files]
            gc.collect()  # this count's sessions go before the next count's are made
    finally:
        torch.set_num_threads(previous)
    out: dict[str, Any] = {
        "name": manifest.name, "config": config.to_dict(), "tokens": [t for b, t in shapes if b == 1],
        "batches": [[b, t] for b, t in shapes if b > 1], "shapes": [list(s) for s in shapes],
        "threads": threads, "main_threads": max(threads), "rounds": rounds, "settle_s": settle,
        "decode_burst": DECODE_BURST,
        "machine": {**machine(), "loadavg_start": start_load, "loadavg_end": load_average()},
        "versions": versions(), "flop_formula": dense_formula(config), "notes": notes,
        "artifacts": {f: {"size_bytes": manifest.files[f].size,
                          "export_seconds": manifest.artifacts[f].export_seconds,
                          "cold_start_loads": cold_start_loads(folder, manifest, f)} for f in files},
        "by_threads": by_threads,
    }
    wasm = wasm_medians(folder, manifest)
    if wasm is not None:
        out["wasm_node"] = wasm
    return out


def _run_threads(folder: Path, manifest: Manifest, shapes: list[Shape], threads: int, *, rounds: int,
                 progress: bool, only: list[str] | None, settle: float,
                 notes: list[str]) -> tuple[dict[str, Any], list[str]]:
    """One thread count: torch, ONNX Runtime and ExecuTorch all set to it, every job timed in interleaved rounds.
    Returns that count's figures and the artifact files it timed; a shape a runner cannot take goes to `notes`."""
    config = manifest.config
    torch.set_num_threads(threads)
    runners = [r for r in build_runners(folder, manifest, threads) if r.kind == "eager" or not only or r.name in only]
    forms = [f for f in build_decode_forms(folder, manifest, threads) if not only or f.file in only]
    peak = _matmul_session(threads)
    inputs = {s: np.random.default_rng(list(s)).standard_normal((*s, config.d_in)).astype(np.float32)
              for s in shapes}
    jobs = []
    for s in shapes:
        for r in runners:
            if r.batch_max is not None and s[0] > r.batch_max:
                note = f"{r.name}: batch {s[0]} x {s[1]} not timed (its planned maximum batch is {r.batch_max})"
                if note not in notes:
                    notes.append(note)
            else:
                jobs.append((r, s))
    samples: dict[tuple[str, Shape], list[float]] = {(r.name, s): [] for r, s in jobs}
    peak_samples: list[float] = []
    steps: dict[str, list[float]] = {f.file: [] for f in forms}
    firsts: dict[str, list[float]] = {f.file: [] for f in forms}

    def timed(fn: Callable[[], Any], pause: float | None = None) -> float:
        time.sleep(settle if pause is None else pause)
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    peak()  # one untimed warm-up pass of every job
    for r, s in jobs:
        r.fn(inputs[s])
    for f in forms:
        f.step()
    label = f"benchmarking, {threads} thread{'s' if threads > 1 else ''}"
    bar = click.progressbar(range(rounds), label=label, file=sys.stderr) if progress else None
    with bar if bar is not None else contextlib.nullcontext(range(rounds)) as items:
        for _ in items:
            peak_samples.append(timed(peak))
            for r, s in jobs:
                samples[(r.name, s)].append(timed(lambda r=r, s=s: r.fn(inputs[s])))
            for f in forms:
                burst = [timed(f.step)] + [timed(f.step, pause=0.0) for _ in range(DECODE_BURST - 1)]
                firsts[f.file].append(burst[0])
                steps[f.file].extend(burst[1:])

    peak_gflops = 2 * PEAK_N ** 3 / statistics.median(peak_samples) / 1e9
    floors = {s: {"batch": s[0], "tokens": s[1], "dense_at_peak_s": dense_flops(config, batch=s[0], tokens=s[1])
                  / (peak_gflops * 1e9), "causal_at_peak_s": causal_flops(config, batch=s[0], tokens=s[1])
                  / (peak_gflops * 1e9)} for s in shapes}
    medians = {key: statistics.median(v) for key, v in samples.items()}
    results = []
    for r, s in jobs:  # shape by shape, runners in build order
        stats = _stats(samples[(r.name, s)])
        median = stats["median_s"]
        gflops = dense_flops(config, batch=s[0], tokens=s[1]) / median / 1e9
        results.append({"runner": r.name, "kind": r.kind, "threads": threads, "batch": s[0], "tokens": s[1],
                        **stats, "tokens_per_s": s[0] * s[1] / median, "gflops": gflops,
                        "pct_of_peak": 100.0 * gflops / peak_gflops,
                        "vs_causal_floor": median / floors[s]["causal_at_peak_s"],
                        "vs_eager_fused": medians[(FUSED, s)] / median,
                        "vs_eager_wrapper": medians[(EAGER, s)] / median})
    cold = {r.file: cold_start(folder, r.file, config, threads) for r in runners
            if r.kind == "onnxruntime" and r.file is not None}
    fastest = []
    for s in shapes:
        best = fastest_fp32(results, manifest, batch=s[0], tokens=s[1])
        if best is not None:
            fastest.append({k: best[k] for k in ("batch", "tokens", "runner", "median_s", "tokens_per_s",
                                                 "vs_causal_floor", "vs_eager_fused")}
                           | {"cold_start_s": cold.get(best["runner"])})
    run: dict[str, Any] = {
        "threads": threads, "matmul_peak": {"n": PEAK_N, "gflops": peak_gflops, **_stats(peak_samples)},
        "floors": list(floors.values()), "results": results, "fastest_fp32": fastest, "cold_start_s": cold,
    }
    if forms:
        run["decode"] = _decode_summary(config, forms, steps, firsts, results, manifest)
    return run, [r.file for r in runners if r.file is not None] + [f.file for f in forms]


def _decode_summary(config: MHAConfig, forms: list[DecodeForm], steps: dict[str, list[float]],
                    firsts: dict[str, list[float]], results: list[dict[str, Any]],
                    manifest: Manifest) -> dict[str, Any]:
    """Each form's per-step figures, its speedup over the fastest fp32 full recompute at T = context_length, and
    the in-place form's per-step ratio to mha.decode.onnx."""
    past = config.context_length - 1
    full = fastest_fp32(results, manifest, batch=1, tokens=config.context_length)
    out: dict[str, Any] = {"past_tokens": past, "burst": DECODE_BURST, "full_recompute": None if full is None else
                           {"runner": full["runner"], "batch": 1, "tokens": config.context_length,
                            "median_s": full["median_s"]}, "forms": {}}
    for f in forms:
        stats = _stats(steps[f.file])
        out["forms"][f.file] = {
            "session": f.session, **stats, "first_step_after_idle_median_s": statistics.median(firsts[f.file]),
            "gflops": decode_step_flops(config, past=past) / stats["median_s"] / 1e9,
            "speedup_vs_full_recompute": None if full is None else full["median_s"] / stats["median_s"]}
    if DECODE.file in out["forms"] and DECODE_INPLACE.file in out["forms"]:
        out["inplace_vs_decode"] = (out["forms"][DECODE.file]["median_s"]
                                    / out["forms"][DECODE_INPLACE.file]["median_s"])
    return out


