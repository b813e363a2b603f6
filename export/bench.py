"""`mha bench`: every runner timed side by side in one process, interleaved, against the machine's MatMul peak.

It reports facts only (latency, tokens/s, the floors, each runner's ratio to the causal floor and to torch's
fused kernel, decode speedups, cold starts); the targets they are read against are in docs/bench.md.
"""
from __future__ import annotations

import contextlib
import gc
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
from mha_export.flops import DENSE_FORMULA, causal_flops, decode_step_flops, dense_flops
from mha_export.fused import fuse
from mha_export.manifest import versions
from mha_export.report import human_size, save_png, table
from mha_export.torchscript import load_torchscript
from mha_export.weights import load_artifact_model
from mha_runtime.config import MHAConfig
from mha_runtime.decode import DecodeSession
from mha_runtime.decode_inplace import InPlaceDecodeSession
from mha_runtime.errors import ConfigError
from mha_runtime.manifest import Manifest, load_manifest
from mha_runtime.runner import OnnxRunner
from mha_runtime.variants import (
    CHOICES,
    DECODE,
    DECODE_INPLACE,
    EXECUTORCH_RUNTIME,
    LOW_PRECISION_KINDS,
    ONNX_RUNTIME,
    TORCHSCRIPT_RUNTIME,
    VARIANTS,
    buildable,
)

PEAK_N = 2048
DEFAULT_TOKENS = (16, 64, 256, 1024)
# Batch x tokens shapes timed beside batch 1; their tokens are cut to context_length.
DEFAULT_BATCHES = ((8, 128), (32, 16))
# Idle time before each timed call: each ONNX Runtime session and torch's OpenMP pool slow the next runner
# down right after a call (docs/bench.md has the measurements behind 0.3 s).
SETTLE_S = 0.3
# Decode steps are timed as a generation loop runs them: bursts of back-to-back steps from the same cache at
# past_tokens = context_length - 1, the first reported apart as "first step after idle" (docs/bench.md).
DECODE_BURST = 32
# runtime/native/web/check.mjs --json writes <artifacts>/web/<name>.json (`make web-test`): onnxruntime-web's wasm
# backend in Node.js on one thread, median ms per golden case; bench reports it beside its own figures.
WASM_CHECK = Path("web")
EAGER, FUSED = "eager wrapper", "eager fused"

Shape = tuple[int, int]  # (batch, tokens)


def default_threads() -> list[int]:
    """1 and 2 threads where the machine has 2 cores or more, else 1."""
    return [1, 2] if (os.cpu_count() or 1) >= 2 else [1]


def parse_counts(text: str) -> list[int]:
    """'16,64' -> [16, 64] (sorted, without repeats)."""
    try:
        return sorted({int(t) for t in text.split(",") if t.strip()})
    except ValueError:
        raise ValueError(f"expected comma-separated integers, got {text!r}") from None


def parse_threads(text: str) -> list[int]:
    """'1,2' -> [1, 2]; every count at least 1."""
    counts = parse_counts(text)
    if not counts or counts[0] < 1:
        raise ValueError(f"expected comma-separated thread counts >= 1, got {text!r}")
    return counts


def parse_batches(text: str) -> list[Shape]:
    """'8x128,32x16' -> [(8, 128), (32, 16)]; 'none' -> []."""
    if text.strip() == "none":
        return []
    shapes: list[Shape] = []
    for part in (p.strip() for p in text.split(",")):
        batch, sep, tokens = part.partition("x")
        if not (sep and batch.isdigit() and tokens.isdigit() and int(batch) >= 1 and int(tokens) >= 1):
            raise ValueError(f"expected BATCHxTOKENS pairs such as 8x128,32x16 (or 'none'), got {part!r}")
        if (int(batch), int(tokens)) not in shapes:
            shapes.append((int(batch), int(tokens)))
    return shapes


def resolve_shapes(config: MHAConfig, tokens: list[int] | None, batches: list[Shape] | None) -> list[Shape]:
    """Batch 1 at each token count, then the batch shapes; the defaults fit context_length, a count asked for
    beyond it is refused."""
    limit = config.context_length
    if tokens is None:  # the default counts that fit, and the full context
        tokens = [t for t in DEFAULT_TOKENS if t < limit] + [limit]
    outside = [t for t in tokens if not 1 <= t <= limit]
    if outside or not tokens:
        raise ConfigError(f"--tokens: expected counts in 1..context_length={limit}, got {outside or 'none'}")
    if batches is None:
        batches = [(b, min(t, limit)) for b, t in DEFAULT_BATCHES]
    wide = [f"{b}x{t}" for b, t in batches if not 1 <= t <= limit or b < 1]
    if wide:
        raise ConfigError(f"--batches: expected tokens in 1..context_length={limit}, got {', '.join(wide)}")
    shapes = [(1, t) for t in sorted(set(tokens))]
    return shapes + [s for s in dict.fromkeys(batches) if s not in shapes]


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
    kind: str  # eager | torchscript | onnxruntime | executorch
    fn: Callable[[np.ndarray], Any]
    file: str | None = None
    batch_max: int | None = None  # the ExecuTorch program's planned maximum batch


@dataclass
class DecodeForm:
    file: str
    session: str  # the class that runs it
    step: Callable[[], Any]  # one step from past_tokens = context_length - 1


def runner_names(manifest: Manifest) -> list[str]:
    """What `--only` may name: the eager pair, every full-sequence artifact and the decode forms present."""
    timed = (ONNX_RUNTIME, TORCHSCRIPT_RUNTIME, EXECUTORCH_RUNTIME)
    return [EAGER, FUSED] + [f for f, i in manifest.artifacts.items() if i.runtime in timed] + \
        [f for f in (DECODE.file, DECODE_INPLACE.file) if f in manifest.artifacts]


def build_runners(folder: Path, manifest: Manifest, threads: int) -> list[Runner]:
    """Eager wrapper, eager fused module (torch SDPA), TorchScript, every ONNX artifact through OnnxRunner and the
    ExecuTorch program; not the decode forms."""
    model, config = load_artifact_model(folder, manifest)
    fused = fuse(model, config, sdpa=True)

    def torch_fn(module: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[np.ndarray], Any]:
        def run(x: np.ndarray) -> Any:
            with torch.inference_mode():
                return module(torch.from_numpy(x))
        return run

    runners = [Runner(EAGER, "eager", torch_fn(model)), Runner(FUSED, "eager", torch_fn(fused))]
    for file, info in manifest.artifacts.items():
        if info.runtime == TORCHSCRIPT_RUNTIME:
            script, _ = load_torchscript(Path(folder) / file)
            runners.append(Runner(file, "torchscript", torch_fn(script), file))
        elif info.runtime == ONNX_RUNTIME:
            runner = OnnxRunner(folder, model=file, provider="cpu", threads=threads)
            runners.append(Runner(file, "onnxruntime", runner.run, file))
        elif info.runtime == EXECUTORCH_RUNTIME:
            from mha_export.pte import PteRunner

            pte = PteRunner(folder, model=file, threads=threads)
            runners.append(Runner(file, "executorch", pte.run, file, batch_max=int(pte.batch_max)))
    return runners


def build_decode_forms(folder: Path, manifest: Manifest, threads: int) -> list[DecodeForm]:
    """Each decode form present, its cache filled to past_tokens = context_length - 1; a step goes back there
    first (DecodeSession: restore a snapshot; InPlaceDecodeSession: rewind) and adds one token."""
    config = manifest.config
    past = config.context_length - 1
    prefix = np.random.default_rng(1).standard_normal((1, past, config.d_in)).astype(np.float32)
    one = np.random.default_rng(2).standard_normal((1, 1, config.d_in)).astype(np.float32)
    forms = []
    if DECODE.file in manifest.artifacts:
        session = DecodeSession(folder, provider="cpu", threads=threads)
        if past:
            session.step(prefix)
        cache = session.snapshot()

        def restore_and_step() -> None:
            session.restore(cache)
            session.step(one)
        forms.append(DecodeForm(DECODE.file, "DecodeSession", restore_and_step))
    if DECODE_INPLACE.file in manifest.artifacts:
        inplace = InPlaceDecodeSession(folder, provider="cpu", threads=threads)
        if past:
            inplace.step(prefix)

        def rewind_and_step() -> None:
            inplace.rewind(past)
            inplace.step(one)
        forms.append(DecodeForm(DECODE_INPLACE.file, "InPlaceDecodeSession", rewind_and_step))
    return forms


def missing_variants(manifest: Manifest) -> list[str]:
    """A note when the folder lacks variants its config allows (an export by an older version, or a --variants
    subset): `make bench` reuses an existing folder, and a silently shorter table would look like the whole."""
    allowed, _ = buildable(manifest.config, CHOICES)
    missing = [v for v in allowed if any(spec.file not in manifest.files for spec in VARIANTS[v].artifacts)]
    if not missing:
        return []
    return [f"{manifest.name}: variants not in this folder, so not timed: {', '.join(missing)} "
            f"(`mha export` builds them)"]


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
    return {"median_s": statistics.median(ordered), "min_s": ordered[0],
            "p90_s": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]}


def fastest_fp32(results: list[dict[str, Any]], manifest: Manifest, *, batch: int,
                 tokens: int) -> dict[str, Any] | None:
    """The fastest fp32 artifact (not eager, not fp16/int8) at batch x tokens."""
    fp32 = [r for r in results if r["batch"] == batch and r["tokens"] == tokens and r["kind"] != "eager"
            and manifest.artifacts[r["runner"]].kind not in LOW_PRECISION_KINDS]
    return min(fp32, key=lambda r: r["median_s"]) if fp32 else None


def loadavg() -> float | None:
    """The 1-minute load average, where the system has one."""
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return None


def run_bench(folder: Path, *, tokens: list[int] | None = None, batches: list[Shape] | None = None,
              threads: list[int] | None = None, rounds: int = 10, warmup: int = 1, progress: bool = True,
              only: list[str] | None = None, settle: float = SETTLE_S) -> dict[str, Any]:
    """Time every runner at every shape and thread count (each thread count its own interleaved rounds), plus the
    MatMul peak, the decode forms and cold starts. tokens/batches None: the defaults; threads None: 1 and 2."""
    manifest = load_manifest(folder)
    config = manifest.config
    shapes = resolve_shapes(config, tokens, batches)
    threads = sorted(set(threads)) if threads is not None else default_threads()
    if not threads or threads[0] < 1:
        raise ConfigError(f"--threads: expected thread counts >= 1, got {threads or 'none'}")
    if only:
        names = runner_names(manifest)
        unknown = sorted(set(only) - set(names))
        if unknown:
            raise ConfigError(f"--only: unknown runner {unknown[0]!r}; choose from {', '.join(names)}")
    start_load = loadavg()
    notes: list[str] = missing_variants(manifest)
    by_threads: dict[str, Any] = {}
    files: list[str] = []
    previous = torch.get_num_threads()
    try:
        for count in threads:
            run, timed_files = _run_threads(folder, manifest, shapes, count, rounds=rounds, warmup=warmup,
                                            progress=progress, only=only, settle=settle, notes=notes)
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
        "machine": {**machine(), "loadavg_start": start_load, "loadavg_end": loadavg()},
        "versions": versions(), "flop_formula": DENSE_FORMULA, "notes": notes,
        "artifacts": {f: {"size_bytes": manifest.files[f].size,
                          "export_seconds": manifest.artifacts[f].export_seconds} for f in files},
        "by_threads": by_threads,
    }
    wasm = wasm_medians(folder, manifest)
    if wasm is not None:
        out["wasm_node"] = wasm
    return out


def _run_threads(folder: Path, manifest: Manifest, shapes: list[Shape], threads: int, *, rounds: int, warmup: int,
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

    for _ in range(warmup):
        peak()
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


def machine() -> dict[str, Any]:
    """The CPU model, core count, system and Python version."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "system": platform.platform(), "python": platform.python_version()}


SUMMARY_HEADERS = ["runner", "B", "T", "median ms", "min ms", "p90 ms", "tokens/s", "GFLOP/s", "% peak",
                   "vs causal floor", "vs eager fused", "vs eager"]
SHAPE_HEADERS = ["B x T", "dense floor ms", "causal floor ms", "eager fused ms", "fastest fp32", "ms", "tokens/s",
                 "vs causal floor", "vs eager fused", "cold start ms"]


def summary_rows(run: dict[str, Any]) -> list[list[Any]]:
    """One row per (runner, shape) of one thread count: latency, rates, % of peak and the three ratios."""
    return [[r["runner"], r["batch"], r["tokens"], f"{1e3 * r['median_s']:.2f}", f"{1e3 * r['min_s']:.2f}",
             f"{1e3 * r['p90_s']:.2f}", f"{r['tokens_per_s']:.0f}", f"{r['gflops']:.1f}", f"{r['pct_of_peak']:.0f}%",
             f"{r['vs_causal_floor']:.2f}x", f"{r['vs_eager_fused']:.2f}x", f"{r['vs_eager_wrapper']:.2f}x"]
            for r in run["results"]]


def shape_rows(run: dict[str, Any]) -> list[list[Any]]:
    """One row per shape: the floors, eager fused, and the fastest fp32 artifact with its ratios."""
    fused = {(r["batch"], r["tokens"]): r["median_s"] for r in run["results"] if r["runner"] == FUSED}
    best = {(f["batch"], f["tokens"]): f for f in run["fastest_fp32"]}
    rows = []
    for fl in run["floors"]:
        s = (fl["batch"], fl["tokens"])
        row = [f"{s[0]} x {s[1]}", f"{1e3 * fl['dense_at_peak_s']:.2f}", f"{1e3 * fl['causal_at_peak_s']:.2f}",
               f"{1e3 * fused[s]:.2f}" if s in fused else "-"]
        b = best.get(s)
        rows.append(row + (["-"] * 6 if b is None else [
            b["runner"], f"{1e3 * b['median_s']:.2f}", f"{b['tokens_per_s']:.0f}", f"{b['vs_causal_floor']:.2f}x",
            f"{b['vs_eager_fused']:.2f}x", "-" if b["cold_start_s"] is None else f"{1e3 * b['cold_start_s']:.1f}"]))
    return rows


def decode_lines(decode: dict[str, Any]) -> list[str]:
    """The decode forms in words: per-step median, first step after idle, speedups."""
    full = decode["full_recompute"]
    lines = [f"decode at past_tokens={decode['past_tokens']}, bursts of {decode['burst']} back-to-back steps"
             + ("" if full is None else f"; full recompute at T={full['tokens']} with {full['runner']}: "
                f"{1e3 * full['median_s']:.2f} ms")]
    for file, d in decode["forms"].items():
        speedup = "" if d["speedup_vs_full_recompute"] is None else \
            f", {d['speedup_vs_full_recompute']:.3g}x faster than the full recompute"
        lines.append(f"  {file} ({d['session']}): {1e3 * d['median_s']:.3f} ms per step (min "
                     f"{1e3 * d['min_s']:.3f}), first after idle {1e3 * d['first_step_after_idle_median_s']:.3f} ms"
                     f"{speedup}")
    if "inplace_vs_decode" in decode:
        lines.append(f"  {DECODE_INPLACE.file} per step: {decode['inplace_vs_decode']:.2f}x faster than "
                     f"{DECODE.file}")
    return lines


def format_report(result: dict[str, Any]) -> str:
    """The printed form of a result: per thread count the peak, the per-shape summary, every row and decode;
    then the artifacts' sizes and cold starts, and the wasm figures when present."""
    m = result["machine"]
    load = " ".join(f"{v:.2f}" if v is not None else "-" for v in (m["loadavg_start"], m["loadavg_end"]))
    lines = [f"{result['name']}: threads {','.join(map(str, result['threads']))}, {result['rounds']} rounds, "
             f"settle {result['settle_s']} s; {m['cpu']}, {m['cores']} cores; load average {load} (start, end)"]
    for key, run in result["by_threads"].items():
        peak = run["matmul_peak"]
        lines += ["", f"== {key} thread{'s' if run['threads'] > 1 else ''}: MatMul peak (ONNX Runtime, "
                      f"{peak['n']}^2 fp32) {peak['gflops']:.1f} GFLOP/s; floors are the dense and causal FLOPs "
                      "at that rate", "",
                  table(SHAPE_HEADERS, shape_rows(run)), "", table(SUMMARY_HEADERS, summary_rows(run))]
        if "decode" in run:
            lines += ["", *decode_lines(run["decode"])]
    if result["notes"]:
        lines += ["", *(f"note: {n}" for n in result["notes"])]
    keys = list(result["by_threads"])
    rows = [[f, human_size(a["size_bytes"]), "-" if a["export_seconds"] is None else f"{a['export_seconds']:.2f}",
             *("-" if (c := result["by_threads"][k]["cold_start_s"].get(f)) is None else f"{1e3 * c:.1f}"
               for k in keys)] for f, a in result["artifacts"].items()]
    lines += ["", table(["artifact", "size", "export s", *(f"cold start ms, {k} thr" for k in keys)], rows)]
    if "wasm_node" in result:  # from runtime/native/web/check.mjs --json (make web-test)
        wasm = result["wasm_node"]
        names = list(dict.fromkeys(c for per in wasm["median_ms"].values() for c in per))
        lines += ["", f"onnxruntime-web {wasm['onnxruntime_web']} (wasm, {wasm['threads']} thread, {wasm['host']}): "
                      f"median ms per golden case, from {wasm['source']}",
                  table(["artifact", *names], [[f, *(f"{per[c]:.2f}" if c in per else "-" for c in names)]
                                               for f, per in wasm["median_ms"].items()])]
    return "\n".join(lines)


def write_outputs(result: dict[str, Any], out_dir: Path) -> tuple[Path, Path]:
    """bench.json and latency.png (log-log latency against tokens at batch 1 for the main thread count, with the
    causal and dense floors at that run's MatMul peak as lines)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, png_path = out_dir / "bench.json", out_dir / "latency.png"
    write_file_atomic(json_path, (json.dumps(result, indent=2) + "\n").encode())
    run = result["by_threads"][str(result["main_threads"])]
    rows = [r for r in run["results"] if r["batch"] == 1]
    fig, ax = plt.subplots(figsize=(8, 5.5))
    colors = plt.get_cmap("tab20").colors  # one distinct colour per runner (there are more than 10)
    for i, name in enumerate(dict.fromkeys(r["runner"] for r in rows)):
        pts = [(r["tokens"], 1e3 * r["median_s"]) for r in rows if r["runner"] == name]
        ax.plot(*zip(*pts, strict=True), marker="o", label=name, color=colors[i % len(colors)])
    floors = [f for f in run["floors"] if f["batch"] == 1]
    peak = run["matmul_peak"]["gflops"]
    ax.plot([f["tokens"] for f in floors], [1e3 * f["causal_at_peak_s"] for f in floors], "k--", linewidth=2,
            label=f"causal floor ({peak:.0f} GFLOP/s MatMul peak)")
    ax.plot([f["tokens"] for f in floors], [1e3 * f["dense_at_peak_s"] for f in floors], "k:", linewidth=1,
            label="dense floor")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("tokens (batch 1)")
    ax.set_ylabel("median latency (ms)")
    ax.set_title(f"{result['name']}: {result['main_threads']} threads, {result['machine']['cpu']}", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_png(fig, png_path)
    return json_path, png_path
