"""`mha bench`: every runner timed side by side in one process, interleaved, against the machine's MatMul peak."""
from __future__ import annotations

import contextlib
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import numpy as np
import onnx.helper as oh
import onnxruntime as ort
import torch
from onnx import TensorProto

from mha_export.atomic import write_file_atomic
from mha_export.bench_targets import fastest_fp32, judge
from mha_export.flops import DENSE_FORMULA, decode_step_flops, dense_flops
from mha_export.fused import fuse
from mha_export.manifest import versions
from mha_export.torchscript import load_torchscript
from mha_export.weights import load_artifact_model
from mha_runtime.config import MHAConfig
from mha_runtime.decode import DecodeSession
from mha_runtime.errors import ConfigError
from mha_runtime.manifest import Manifest, load_manifest
from mha_runtime.runner import OnnxRunner
from mha_runtime.variants import DECODE, EXECUTORCH_RUNTIME, ONNX_RUNTIME, TORCHSCRIPT_RUNTIME

PEAK_N = 2048
DEFAULT_TOKENS = (16, 64, 256, 1024)
# Idle time before each timed call: each ONNX Runtime session and torch's OpenMP pool slow the next runner
# down right after a call (docs/bench.md has the measurements behind 0.3 s).
SETTLE_S = 0.3
# Decode steps are timed as a generation loop runs them: bursts of back-to-back steps from the same cache at
# past_tokens = context_length - 1, the first reported apart as "first step after idle" (docs/bench.md).
DECODE_BURST = 32
# runtime/native/web/check.mjs --json writes <artifacts>/web/<name>.json (`make web-test`): onnxruntime-web's wasm
# backend in Node.js on one thread, median ms per golden case; bench reports it beside its own figures.
WASM_CHECK = Path("web")


def _matmul_session(threads: int) -> Callable[[], Any]:
    graph = oh.make_graph([oh.make_node("MatMul", ["a", "b"], ["c"])], "peak",
                          [oh.make_tensor_value_info(n, TensorProto.FLOAT, [PEAK_N, PEAK_N]) for n in ("a", "b")],
                          [oh.make_tensor_value_info("c", TensorProto.FLOAT, [PEAK_N, PEAK_N])])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    a = np.random.default_rng(0).standard_normal((PEAK_N, PEAK_N)).astype(np.float32)
    return lambda: session.run(None, {"a": a, "b": a})


@dataclass
class Runner:
    name: str
    kind: str  # eager | torchscript | onnxruntime
    fn: Callable[[np.ndarray], Any]
    file: str | None = None


def build_runners(folder: Path, manifest: Manifest, threads: int) -> list[Runner]:
    """Eager wrapper, eager fused module, TorchScript, and every ONNX artifact through OnnxRunner."""
    model, config = load_artifact_model(folder, manifest)
    fused = fuse(model, config, sdpa=True)

    def torch_fn(module: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[np.ndarray], Any]:
        def run(x: np.ndarray) -> Any:
            with torch.inference_mode():
                return module(torch.from_numpy(x))
        return run

    runners = [Runner("eager wrapper", "eager", torch_fn(model)), Runner("eager fused", "eager", torch_fn(fused))]
    for file, info in manifest.artifacts.items():
        if info.runtime == TORCHSCRIPT_RUNTIME:
            script, _ = load_torchscript(Path(folder) / file)
            runners.append(Runner(file, "torchscript", torch_fn(script), file))
        elif info.runtime == ONNX_RUNTIME:
            runner = OnnxRunner(folder, model=file, provider="cpu", threads=threads)
            runners.append(Runner(file, "onnxruntime", runner.run, file))
        elif info.runtime == EXECUTORCH_RUNTIME:
            from mha_export.pte import PteRunner

            runners.append(Runner(file, "executorch", PteRunner(folder, model=file, threads=threads).run, file))
    return runners


def cold_start(folder: Path, file: str, config: MHAConfig, threads: int, repeats: int = 5) -> float:
    """Median seconds for session creation (manifest check included) plus a first run on one token."""
    x = np.zeros((1, 1, config.d_in), np.float32)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        OnnxRunner(folder, model=file, provider="cpu", threads=threads).run(x)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def wasm_medians(folder: Path, manifest: Manifest) -> dict[str, Any] | None:
    """The wasm check's median ms per golden case of each artifact, when its JSON sits beside the artifact folder;
    an entry whose sha256 is not the manifest's (an older export) is left out."""
    path = Path(folder).parent / WASM_CHECK / f"{Path(folder).name}.json"
    try:
        doc = json.loads(path.read_text())
        current = {a["file"] for a in doc["artifacts"] if a.get("loaded") and a["file"] in manifest.files
                   and a["sha256"] == manifest.files[a["file"]].sha256}
        medians = {a["file"]: {c["name"]: c["median_ms"] for c in a["cases"] if c["ok"]} for a in doc["artifacts"]
                   if a["file"] in current}
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return {"source": str(path), "onnxruntime_web": doc.get("onnxruntime_web"), "host": doc.get("host"),
            "threads": doc.get("threads"), "repeats": doc.get("repeats"), "median_ms": medians} if medians else None


def _stats(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {"median_s": statistics.median(ordered), "p90_s": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]}


def run_bench(folder: Path, *, tokens: list[int] | None, threads: int, rounds: int, warmup: int = 1,
              progress: bool = True, only: list[str] | None = None, settle: float = SETTLE_S) -> dict[str, Any]:
    """Time every runner at every token count, interleaved round by round, plus the MatMul peak and decode."""
    torch.set_num_threads(threads)
    manifest = load_manifest(folder)
    config = manifest.config
    if tokens is None:  # the default counts that fit, and the full context
        tokens = [t for t in DEFAULT_TOKENS if t < config.context_length] + [config.context_length]
    outside = [t for t in tokens if not 1 <= t <= config.context_length]
    if outside or not tokens:
        raise ConfigError(f"--tokens: expected counts in 1..context_length={config.context_length}, "
                          f"got {outside or 'none'}")
    tokens = sorted(set(tokens))
    runners = build_runners(folder, manifest, threads)
    if only:
        unknown = sorted(set(only) - {r.name for r in runners})
        if unknown:
            names = ", ".join(r.name for r in runners)
            raise ConfigError(f"--only: unknown runner {unknown[0]!r}; choose from {names}")
        runners = [r for r in runners if r.name in only or r.name == "eager wrapper"]  # the ratios need eager
    peak = _matmul_session(threads)
    inputs = {t: np.random.default_rng(t).standard_normal((1, t, config.d_in)).astype(np.float32) for t in tokens}
    decode = None
    if DECODE.file in manifest.artifacts:
        decode = DecodeSession(folder, provider="cpu", threads=threads)
        past = config.context_length - 1
        decode.step(np.random.default_rng(1).standard_normal((1, past, config.d_in)).astype(np.float32))
        cache = decode.snapshot()
        one = np.random.default_rng(2).standard_normal((1, 1, config.d_in)).astype(np.float32)

    def decode_step() -> None:
        decode.restore(cache)  # always from past_tokens = context_length - 1
        decode.step(one)

    samples: dict[tuple[str, int], list[float]] = {(r.name, t): [] for r in runners for t in tokens}
    peak_samples: list[float] = []
    decode_samples: list[float] = []
    decode_first: list[float] = []

    def timed(fn: Callable[[], Any], pause: float | None = None) -> float:
        time.sleep(settle if pause is None else pause)
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    for _ in range(warmup):
        peak()
        for r in runners:
            for t in tokens:
                r.fn(inputs[t])
        if decode is not None:
            decode_step()
    jobs = range(rounds)
    bar = click.progressbar(jobs, label="benchmarking", file=sys.stderr) if progress else None
    with bar if bar is not None else contextlib.nullcontext(jobs) as items:
        for _ in items:
            peak_samples.append(timed(peak))
            for t in tokens:
                for r in runners:
                    samples[(r.name, t)].append(timed(lambda r=r, t=t: r.fn(inputs[t])))
            if decode is not None:
                burst = [timed(decode_step)] + [timed(decode_step, pause=0.0) for _ in range(DECODE_BURST - 1)]
                decode_first.append(burst[0])
                decode_samples.extend(burst[1:])

    peak_gflops = 2 * PEAK_N ** 3 / statistics.median(peak_samples) / 1e9
    results = []
    for r in runners:
        for t in tokens:
            stats = _stats(samples[(r.name, t)])
            gflops = dense_flops(config, batch=1, tokens=t) / stats["median_s"] / 1e9
            results.append({"runner": r.name, "kind": r.kind, "tokens": t, **stats,
                            "tokens_per_s": t / stats["median_s"], "gflops": gflops,
                            "pct_of_peak": 100.0 * gflops / peak_gflops})
    artifacts = {}
    for r in runners:
        if r.file is None:
            continue
        artifacts[r.file] = {"size_bytes": manifest.files[r.file].size,
                             "export_seconds": manifest.artifacts[r.file].export_seconds,
                             "cold_start_s": (cold_start(folder, r.file, config, threads)
                                              if r.kind == "onnxruntime" else None)}
    out: dict[str, Any] = {
        "name": manifest.name, "config": config.to_dict(), "batch": 1, "tokens": tokens, "threads": threads,
        "rounds": rounds, "settle_s": settle, "machine": machine(), "versions": versions(),
        "flop_formula": DENSE_FORMULA,
        "matmul_peak": {"n": PEAK_N, "gflops": peak_gflops, **_stats(peak_samples)},
        "results": results, "artifacts": artifacts,
    }
    full = fastest_fp32(results, manifest, tokens=config.context_length)
    if decode is not None and full is not None:
        past = config.context_length - 1
        out["decode"] = {"past_tokens": past, **_stats(decode_samples), "burst": DECODE_BURST,
                         "first_step_after_idle_median_s": statistics.median(decode_first),
                         "gflops": decode_step_flops(config, past=past) / statistics.median(decode_samples) / 1e9,
                         "full_recompute": {"runner": full["runner"], "tokens": config.context_length,
                                            "median_s": full["median_s"]},
                         "speedup_vs_full_recompute": full["median_s"] / statistics.median(decode_samples)}
    out["judged"] = judge(out, manifest)
    wasm = wasm_medians(folder, manifest)
    if wasm is not None:
        out["wasm_node"] = wasm
    return out


def machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "system": platform.platform(), "python": platform.python_version()}


def summary_rows(result: dict[str, Any]) -> list[list[Any]]:
    """One row per (runner, tokens): latency, rates, % of peak, and the ratio to the eager wrapper."""
    eager = {r["tokens"]: r["median_s"] for r in result["results"] if r["runner"] == "eager wrapper"}
    rows = []
    for r in result["results"]:
        rows.append([r["runner"], r["tokens"], f"{1e3 * r['median_s']:.2f}", f"{1e3 * r['p90_s']:.2f}",
                     f"{r['tokens_per_s']:.0f}", f"{r['gflops']:.1f}", f"{r['pct_of_peak']:.0f}%",
                     f"{eager[r['tokens']] / r['median_s']:.2f}x"])
    return rows


SUMMARY_HEADERS = ["runner", "T", "median ms", "p90 ms", "tokens/s", "GFLOP/s", "% peak", "vs eager"]


def write_outputs(result: dict[str, Any], out_dir: Path) -> tuple[Path, Path]:
    """bench.json and latency.png (log-log latency against tokens, the MatMul-peak floor as its own line)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, png_path = out_dir / "bench.json", out_dir / "latency.png"
    write_file_atomic(json_path, (json.dumps(result, indent=2) + "\n").encode())
    fig, ax = plt.subplots(figsize=(8, 5.5))
    colors = plt.get_cmap("tab20").colors  # one distinct colour per runner (there are more than 10)
    for i, name in enumerate(dict.fromkeys(r["runner"] for r in result["results"])):
        pts = [(r["tokens"], 1e3 * r["median_s"]) for r in result["results"] if r["runner"] == name]
        ax.plot(*zip(*pts, strict=True), marker="o", label=name, color=colors[i % len(colors)])
    config = MHAConfig.from_dict(result["config"])
    floor = [(t, 1e3 * dense_flops(config, batch=1, tokens=t) / (result["matmul_peak"]["gflops"] * 1e9))
             for t in result["tokens"]]
    peak = result["matmul_peak"]["gflops"]
    ax.plot(*zip(*floor, strict=True), "k--", linewidth=2, label=f"MatMul peak floor ({peak:.0f} GFLOP/s)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("tokens (batch 1)")
    ax.set_ylabel("median latency (ms)")
    ax.set_title(f"{result['name']}: {result['threads']} threads, {result['machine']['cpu']}", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    tmp = png_path.with_name(".latency.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, png_path)
    return json_path, png_path
