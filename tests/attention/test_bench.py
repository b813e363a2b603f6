"""The bench's wiring on the seed preset (one short round): every runner at every shape and thread count, ratios
consistent with the medians, both decode forms (mid preset), a PNG. No timing asserts."""
from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from helpers import MID
from mha_export.attention.weights.load import seeded_model
from mha_export.bench.flops import causal_flops, decode_step_flops, dense_flops, dense_formula
from mha_export.bench.options import default_threads, parse_batches, parse_threads, resolve_shapes
from mha_export.bench.report import NO_MATPLOTLIB, format_report, write_outputs
from mha_export.bench.run import _stats, run_bench
from mha_runtime.artifact.errors import ConfigError
from mha_runtime.attention.config import MHAConfig, preset
from mha_runtime.attention.manifest import load_manifest
from mha_runtime.cli.main import cli


def _torch_flops(config: MHAConfig, *, batch: int, tokens: int) -> int:
    """torch's FlopCounterMode over one forward pass of the eager wrapper (its matmuls, out_proj's included)."""
    from torch.utils.flop_counter import FlopCounterMode

    model = seeded_model(config)
    assert (model.out_proj is not None) == config.out_proj
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(torch.zeros(batch, tokens, config.d_in))
    return int(counter.get_total_flops())


@pytest.mark.parametrize("out_proj", [False, True])
@pytest.mark.parametrize("name,tokens", [("seed", 6), ("seed", 1), ("gpt2-small", 16), ("mid", 48)])
def test_dense_flops_equal_torchs_count_of_the_wrapper(name: str, tokens: int, out_proj: bool) -> None:
    """torch's FlopCounterMode counts the eager wrapper's matmuls independently of mha_export/bench/flops.py, with and
    without the output projection (mid has q/k/v biases: bias adds are not FLOPs in either count)."""
    config = dataclasses.replace(MID if name == "mid" else preset(name), out_proj=out_proj)
    assert dense_flops(config, batch=2, tokens=tokens) == _torch_flops(config, batch=2, tokens=tokens)
    assert dense_formula(config).endswith(" + 2*B*T*(H*d_out)^2") == out_proj


def test_out_proj_adds_its_matmul_to_every_count() -> None:
    """2*B*T*(H*d_out)^2 on top of the same config without it, in the dense, causal and decode-step counts."""
    plain = MHAConfig(d_in=5, d_out=3, num_heads=2, context_length=9)
    projected = dataclasses.replace(plain, out_proj=True)
    width = plain.num_heads * plain.d_out
    assert _torch_flops(projected, batch=3, tokens=7) - _torch_flops(plain, batch=3, tokens=7) == 2 * 3 * 7 * width**2
    for count in (dense_flops, causal_flops):
        assert count(projected, batch=3, tokens=7) - count(plain, batch=3, tokens=7) == 2 * 3 * 7 * width**2
    assert decode_step_flops(projected, past=8) - decode_step_flops(plain, past=8) == 2 * width**2


@pytest.mark.parametrize("out_proj", [False, True])
def test_decode_step_flops_are_the_causal_work_of_one_more_token(out_proj: bool) -> None:
    config = MHAConfig(d_in=5, d_out=3, num_heads=2, context_length=9, out_proj=out_proj)
    for past in (0, 3, 8):
        added = causal_flops(config, batch=1, tokens=past + 1) - causal_flops(config, batch=1, tokens=past)
        assert decode_step_flops(config, past=past) == added


@pytest.mark.parametrize("out_proj", [False, True])
def test_causal_flops_count_the_unmasked_pairs(out_proj: bool) -> None:
    config = MHAConfig(d_in=5, d_out=3, num_heads=2, context_length=9, out_proj=out_proj)
    for tokens in (1, 4, 9):
        visible = int(np.tril(np.ones((tokens, tokens))).sum())  # (query, key) pairs the mask keeps
        dense = dense_flops(config, batch=1, tokens=tokens)
        masked = 4 * config.num_heads * config.d_out * (tokens * tokens - visible)
        assert causal_flops(config, batch=1, tokens=tokens) == dense - masked


def test_stats_median_min_and_p90() -> None:
    samples = [float(v) for v in (7, 1, 9, 3, 5, 2, 10, 4, 8, 6)]
    stats = _stats(samples)
    assert (stats["median_s"], stats["min_s"]) == (5.5, 1.0)
    assert stats["p90_s"] == pytest.approx(float(np.percentile(samples, 90)))  # 9.1: not the max at 10 rounds
    assert stats["p90_s"] < max(samples)
    assert _stats([2.0]) == {"median_s": 2.0, "min_s": 2.0, "p90_s": 2.0}


@pytest.mark.parametrize("n", [2, 3, 5, 9, 10, 11, 32, 101])
def test_stats_p90_is_numpys_percentile(n: int) -> None:
    samples = [float(v) for v in np.random.default_rng(n).exponential(1e-3, n)]
    stats = _stats(samples)
    assert stats["p90_s"] == pytest.approx(float(np.percentile(samples, 90)), rel=1e-12)
    assert stats["median_s"] == pytest.approx(float(np.median(samples)), rel=1e-12) and stats["min_s"] == min(samples)


def test_shapes_defaults_options_and_refusals(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_shapes(preset("gpt2-small"), None, None) == [(1, 16), (1, 64), (1, 256), (1, 1024), (8, 128),
                                                                 (32, 16)]
    assert resolve_shapes(preset("seed"), None, None) == [(1, 6), (8, 6), (32, 6)]  # cut to context_length
    assert resolve_shapes(preset("seed"), [4, 2], [(1, 4), (2, 3)]) == [(1, 2), (1, 4), (2, 3)]
    assert resolve_shapes(preset("seed"), [6], []) == [(1, 6)]
    with pytest.raises(ConfigError, match=r"--batches: expected tokens in 1..context_length=6, got 2x7"):
        resolve_shapes(preset("seed"), [6], [(2, 7)])
    assert parse_batches("8x128, 32x16,8x128") == [(8, 128), (32, 16)] and parse_batches("none") == []
    for bad in ("8x", "x8", "8", "0x4", "8x0", "8x1.5", ""):
        with pytest.raises(ValueError, match="expected BATCHxTOKENS pairs"):
            parse_batches(bad)
    assert parse_threads("2,1,2") == [1, 2]
    for bad in ("0", "", "1,-2"):
        with pytest.raises(ValueError, match="thread counts >= 1"):
            parse_threads(bad)
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    assert default_threads() == [1]
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert default_threads() == [1, 2]


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9)


FIGURES = ("median_s", "min_s", "p90_s", "tokens_per_s", "gflops", "pct_of_peak", "vs_causal_floor", "vs_eager_fused",
           "vs_eager_wrapper")


def test_bench_json_has_every_runner_shape_and_thread_count(seed_dir: Path, tmp_path: Path) -> None:
    # Two rounds, so that a median differs from the min and the p90 the ratios must not be taken from.
    result = run_bench(seed_dir, tokens=[1, 4, 6], batches=[(2, 3), (8, 6)], threads=[2, 1], rounds=2,
                       progress=False, settle=0.0)
    written = write_outputs(result, tmp_path / "bench")
    assert written.note is None and written.png_path is not None
    json_path, png_path = written.json_path, written.png_path
    data = json.loads(json_path.read_text())
    manifest = load_manifest(seed_dir)
    config = manifest.config
    timed = {f for f, i in manifest.artifacts.items() if not i.runtime.startswith("onnxruntime-decode")}
    shapes = [(1, 1), (1, 4), (1, 6), (2, 3), (8, 6)]
    assert data["threads"] == [1, 2] and data["main_threads"] == 2 and set(data["by_threads"]) == {"1", "2"}
    assert data["tokens"] == [1, 4, 6] and data["batches"] == [[2, 3], [8, 6]]
    assert data["flop_formula"] == "2*B*T*d_in*3*H*d_out + 4*B*H*T^2*d_out"  # the seed config has no out_proj
    assert "judged" not in data and "targets" not in json_path.read_text()
    assert data["notes"] == ["mha.pte: batch 8 x 6 not timed (its planned maximum batch is 4)"]
    for key, run in data["by_threads"].items():
        assert run["threads"] == int(key)
        peak = run["matmul_peak"]["gflops"] * 1e9
        assert peak > 0
        rows = {(r["runner"], r["batch"], r["tokens"]): r for r in run["results"]}
        for b, t in shapes:
            expected = {"eager wrapper", "eager fused"} | timed - ({"mha.pte"} if b > 4 else set())
            assert {n for n, rb, rt in rows if (rb, rt) == (b, t)} == expected, (key, b, t)
        assert len(rows) == len(run["results"]) == (len(timed) + 2) * len(shapes) - 1
        floors = {(f["batch"], f["tokens"]): f for f in run["floors"]}
        assert list(floors) == shapes
        for (b, t), f in floors.items():
            assert _close(f["causal_at_peak_s"], causal_flops(config, batch=b, tokens=t) / peak)
            assert _close(f["dense_at_peak_s"], dense_flops(config, batch=b, tokens=t) / peak)
            assert 0 < f["causal_at_peak_s"] <= f["dense_at_peak_s"]
        for (name, b, t), r in rows.items():
            for field in FIGURES:
                assert math.isfinite(r[field]) and r[field] > 0, (name, b, t, field, r[field])
            assert r["threads"] == int(key)
            assert _close(r["vs_eager_fused"] * r["median_s"], rows[("eager fused", b, t)]["median_s"])
            assert _close(r["vs_eager_wrapper"] * r["median_s"], rows[("eager wrapper", b, t)]["median_s"])
            assert _close(r["vs_causal_floor"] * floors[(b, t)]["causal_at_peak_s"], r["median_s"])
            assert _close(r["tokens_per_s"] * r["median_s"], b * t)
            assert r["min_s"] <= r["median_s"] <= r["p90_s"]
        fastest = {(f["batch"], f["tokens"]): f for f in run["fastest_fp32"]}
        assert list(fastest) == shapes
        for (b, t), f in fastest.items():
            fp32 = [r for (n, rb, rt), r in rows.items() if (rb, rt) == (b, t) and n in timed
                    and manifest.artifacts[n].kind not in ("fp16", "int8")]
            best = min(fp32, key=lambda r: r["median_s"])
            assert f["runner"] == best["runner"] and f["median_s"] == best["median_s"]
            assert f["vs_eager_fused"] == best["vs_eager_fused"]
            assert f["cold_start_s"] == run["cold_start_s"].get(best["runner"])
        assert set(run["cold_start_s"]) == {f for f in timed if f.endswith((".onnx", ".ort"))}
        assert all(c > 0 for c in run["cold_start_s"].values())
        decode = run["decode"]
        assert decode["past_tokens"] == 5 and decode["burst"] > 1 and list(decode["forms"]) == ["mha.decode.onnx"]
        assert "inplace_vs_decode" not in decode  # the seed preset has no in-place form (d_out = 2)
        full = decode["full_recompute"]
        assert (full["runner"], full["batch"], full["tokens"]) == (fastest[(1, 6)]["runner"], 1, 6)
        form = decode["forms"]["mha.decode.onnx"]
        assert form["session"] == "DecodeSession" and form["first_step_after_idle_median_s"] > 0
        assert _close(form["speedup_vs_full_recompute"] * form["median_s"], full["median_s"])
    for file, info in data["artifacts"].items():
        assert info["size_bytes"] > 0 and info["export_seconds"] >= 0, file
    assert set(data["artifacts"]) == timed | {"mha.decode.onnx"}
    assert png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_times_both_decode_forms(mid_dir: Path) -> None:
    manifest = load_manifest(mid_dir)
    assert {"mha.decode.onnx", "mha.decode-inplace.onnx"} <= set(manifest.artifacts)
    only = ["mha.qblocks.onnx", "mha.decode.onnx", "mha.decode-inplace.onnx"]
    result = run_bench(mid_dir, tokens=[48], batches=[], threads=[1], rounds=1, progress=False, only=only,
                       settle=0.0)
    run = result["by_threads"]["1"]
    assert {r["runner"] for r in run["results"]} == {"eager wrapper", "eager fused", "mha.qblocks.onnx"}
    decode = run["decode"]
    assert decode["past_tokens"] == 47
    forms = decode["forms"]
    assert {f: d["session"] for f, d in forms.items()} == {"mha.decode.onnx": "DecodeSession",
                                                         "mha.decode-inplace.onnx": "InPlaceDecodeSession"}
    full = decode["full_recompute"]
    assert full["runner"] == "mha.qblocks.onnx" and full["tokens"] == 48
    for d in forms.values():
        for field in ("median_s", "min_s", "p90_s", "first_step_after_idle_median_s", "gflops"):
            assert math.isfinite(d[field]) and d[field] > 0
        assert _close(d["speedup_vs_full_recompute"] * d["median_s"], full["median_s"])
    assert _close(decode["inplace_vs_decode"] * forms["mha.decode-inplace.onnx"]["median_s"],
                  forms["mha.decode.onnx"]["median_s"])
    assert set(result["artifacts"]) == set(only)
    text = format_report(result)
    assert "mha.decode-inplace.onnx (InPlaceDecodeSession)" in text and "faster than mha.decode.onnx" in text


def _bench(seed_dir: Path, *args: str) -> Any:
    """`mha bench --preset seed` on a folder that holds seed_dir alone: seed_dir may be `make test`'s own
    artifacts/seed, beside an artifacts/web/seed.json the bench would read (the wasm figures)."""
    root = Path(tempfile.mkdtemp(prefix="bench-artifacts-"))
    (root / "seed").symlink_to(seed_dir, target_is_directory=True)
    try:
        return CliRunner().invoke(cli, ["bench", "--preset", "seed", "--artifacts", str(root), *args])
    finally:
        shutil.rmtree(root)


def test_bench_command(seed_dir: Path, tmp_path: Path) -> None:
    result = _bench(seed_dir, "--rounds", "1", "--threads", "1", "--tokens", "2,6", "--batches", "2x4",
                    "--settle", "0", "--out", str(tmp_path))
    assert result.exit_code == 0, result.output
    for part in ("MatMul peak", "eager wrapper", "eager fused", "vs causal floor", "vs eager fused", "fastest fp32",
                 "decode at past_tokens=5", "mha.decode.onnx (DecodeSession)", "cold start ms, 1 thr"):
        assert part in result.stdout, part
    assert "target" not in result.stdout
    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["shapes"] == [[1, 2], [1, 6], [2, 4]] and data["threads"] == [1]
    assert (tmp_path / "latency.png").exists()
    for args, code, message in [
        (("--tokens", "a,b"), 2, "Invalid value for --tokens: expected comma-separated integers, got 'a,b'"),
        (("--tokens", "7"), 2, "--tokens: expected counts in 1..context_length=6, got [7]"),  # a bad value
        (("--tokens", "0"), 2, "--tokens: expected counts in 1..context_length=6, got [0]"),
        (("--batches", "8x"), 2, "Invalid value for --batches: expected BATCHxTOKENS pairs"),
        (("--batches", "2x7"), 2, "--batches: expected tokens in 1..context_length=6, got 2x7"),
        (("--threads", "0"), 2, "Invalid value for --threads: expected comma-separated thread counts >= 1"),
        (("--threads", "1,x"), 2, "Invalid value for --threads: expected comma-separated integers"),
        # int() read another script's digit (Arabic-Indic 3) as 3 and '1_6' as 16; '²' passed isdigit() and was
        # int()'s own "invalid literal" line
        (("--tokens", "\u0663"), 2, "Invalid value for --tokens: expected comma-separated integers, got '\u0663'"),
        (("--tokens", "1_6"), 2, "Invalid value for --tokens: expected comma-separated integers, got '1_6'"),
        (("--batches", "\u00b2x4"), 2, "Invalid value for --batches: expected BATCHxTOKENS pairs"),
    ]:
        bad = _bench(seed_dir, *args, "--out", str(tmp_path / "bad"))
        assert bad.exit_code == code and message in bad.stderr, (args, bad.stderr)
        assert len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    assert not (tmp_path / "bad").exists()


def test_write_outputs_without_matplotlib_writes_the_json_and_a_note(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    result = {"name": "seed", "by_threads": {}, "main_threads": 1}  # the plot would need more: never reached
    written = write_outputs(result, tmp_path / "out")
    assert written.json_path == tmp_path / "out" / "bench.json" and json.loads(written.json_path.read_text()) == result
    assert written.png_path is None and written.note == NO_MATPLOTLIB
    assert not (tmp_path / "out" / "latency.png").exists()


def test_bench_command_without_matplotlib_notes_the_skipped_plot(seed_dir: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    result = _bench(seed_dir, "--rounds", "1", "--threads", "1", "--tokens", "6", "--batches", "none",
                    "--settle", "0", "--only", "mha.onnx", "--out", str(tmp_path))
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines.count(f"note: {NO_MATPLOTLIB}") == 1 and lines[-1] == f"wrote {tmp_path / 'bench.json'}"
    assert json.loads((tmp_path / "bench.json").read_text())["shapes"] == [[1, 6]]
    assert not (tmp_path / "latency.png").exists()


def test_bench_names_variants_missing_from_the_folder(seed_copy: Path) -> None:
    path = seed_copy / "manifest.json"
    doc = json.loads(path.read_text())
    for file in ("mha.qblocks.onnx", "mha.int8.onnx"):  # as an export by an older version would leave it
        del doc["files"][file], doc["artifacts"][file]
        (seed_copy / file).unlink()
    path.write_text(json.dumps(doc))
    result = run_bench(seed_copy, tokens=[6], batches=[], threads=[1], rounds=1, progress=False, only=["mha.onnx"],
                       settle=0.0)
    assert result["notes"] == ["seed: variants not in this folder, so not timed: qblocks, int8 (`mha export` "
                               "builds them)"]


def test_bench_only_selects_runners(seed_dir: Path) -> None:
    result = run_bench(seed_dir, tokens=[6], batches=[], threads=[1], rounds=1, progress=False, only=["mha.onnx"],
                       settle=0.0)
    run = result["by_threads"]["1"]
    assert {r["runner"] for r in run["results"]} == {"eager wrapper", "eager fused", "mha.onnx"}
    assert "decode" not in run and set(result["artifacts"]) == {"mha.onnx"}
    bad = _bench(seed_dir, "--only", "nope")
    assert bad.exit_code == 2 and "--only: unknown runner 'nope'" in bad.stderr


def test_bench_out_is_checked_before_the_rounds(seed_dir: Path, tmp_path: Path) -> None:
    """A file at --out (or above it), a folder named bench.json in it, a dangling link: one line, exit 1, before any
    timing; each failed only after every round, the first as "<path>: File exists"."""
    (tmp_path / "file").write_text("x")
    (tmp_path / "taken" / "bench.json").mkdir(parents=True)
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    for out, message in [(tmp_path / "file", "expected a folder, found a file"),
                         (tmp_path / "file" / "sub", f"expected a folder, found a file at {tmp_path / 'file'}"),
                         (tmp_path / "taken", "expected bench.json to be a file, found a folder"),
                         (tmp_path / "dangling", "which does not exist")]:
        result = _bench(seed_dir, "--rounds", "1", "--threads", "1", "--tokens", "6", "--batches", "none",
                        "--settle", "0", "--out", str(out))
        lines = result.stderr.strip().splitlines()
        assert result.exit_code == 1 and len(lines) == 1, result.stderr
        assert lines[0].startswith(f"Error: --out {out}: ") and message in lines[0], lines[0]
        assert result.stdout == ""
