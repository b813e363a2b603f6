"""`mha bench` output: the text report, bench.json (written first) and the plot."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mha_export.bench.plots import save_png
from mha_export.bench.runners import FUSED
from mha_runtime.artifact.atomic import probe_writable, write_file_atomic
from mha_runtime.artifact.errors import ArtifactError
from mha_runtime.attention.registry import (
    DECODE,
    DECODE_INPLACE,
)
from mha_runtime.cli.tables import human_size, table

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
    copies = [f"{f} ({a['cold_start_loads']})" for f, a in result["artifacts"].items()
              if a.get("cold_start_loads") not in (None, f)]
    if copies:
        lines.append(f"cold start through the offline-optimized copy: {', '.join(copies)}")
    if "wasm_node" in result:  # from runtime/native/web/check.mjs --json (make web-test)
        wasm = result["wasm_node"]
        names = list(dict.fromkeys(c for per in wasm["median_ms"].values() for c in per))
        lines += ["", f"onnxruntime-web {wasm['onnxruntime_web']} (wasm, {wasm['threads']} thread, {wasm['host']}): "
                      f"median ms per golden case, from {wasm['source']}",
                  table(["artifact", *names], [[f, *(f"{per[c]:.2f}" if c in per else "-" for c in names)]
                                               for f, per in wasm["median_ms"].items()])]
    return "\n".join(lines)


JSON_NAME, PNG_NAME = "bench.json", "latency.png"
NO_MATPLOTLIB = "latency.png not written: matplotlib is not installed (pip install './export[bench]')"


@dataclass(frozen=True)
class Outputs:
    """What write_outputs wrote: bench.json always; latency.png, or None and a note saying why not."""

    json_path: Path
    png_path: Path | None
    note: str | None = None


def check_out_dir(out_dir: Path) -> None:
    """--out before any timing: a folder or nothing yet, below a folder that takes new entries (probed with an
    empty folder, removed at once), and bench.json and latency.png not folders; else one ArtifactError line. The
    bench's outputs were written only after all of its rounds, and a file at --out failed there."""
    existing = Path(out_dir)
    while not existing.exists() and not existing.is_symlink() and existing != existing.parent:
        existing = existing.parent
    if existing.is_symlink() and not existing.exists():  # mkdir would fail on it after the rounds
        raise ArtifactError(f"--out {out_dir}: {existing} is a symbolic link to {os.readlink(existing)}, which does "
                            "not exist; expected a folder, a link to one, or nothing there")
    if not existing.is_dir():
        raise ArtifactError(f"--out {out_dir}: expected a folder, found a file"
                            + ("" if existing == Path(out_dir) else f" at {existing}"))
    for name in (JSON_NAME, PNG_NAME):
        if (Path(out_dir) / name).is_dir():
            raise ArtifactError(f"--out {out_dir}: expected {name} to be a file, found a folder")
    probe_writable(existing, out_dir)


def write_outputs(result: dict[str, Any], out_dir: Path) -> Outputs:
    """bench.json, then latency.png (log-log latency against tokens at batch 1 for the main thread count, with
    the causal and dense floors at that run's MatMul peak as lines). The JSON is written before matplotlib is
    imported: without it (an optional extra) the figures are kept and only the plot is skipped, with a note."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, png_path = out_dir / JSON_NAME, out_dir / PNG_NAME
    write_file_atomic(json_path, (json.dumps(result, indent=2) + "\n").encode())
    try:
        import matplotlib
    except ImportError:
        return Outputs(json_path, None, NO_MATPLOTLIB)
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    return Outputs(json_path, png_path)
