"""The bench's wiring on the seed preset (one short round): every runner, finite figures, a PNG. No timing asserts."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from mha_export.bench import _stats, run_bench, write_outputs
from mha_export.cli import cli
from mha_export.flops import causal_flops, dense_flops
from mha_export.weights import seeded_model
from mha_runtime.config import MHAConfig, preset
from mha_runtime.manifest import load_manifest


@pytest.mark.parametrize("name,tokens", [("seed", 6), ("seed", 1), ("gpt2-small", 16)])
def test_dense_flops_equal_torchs_count_of_the_wrapper(name: str, tokens: int) -> None:
    """torch's FlopCounterMode counts the eager wrapper's matmuls independently of export/flops.py."""
    from torch.utils.flop_counter import FlopCounterMode

    config = preset(name)
    model = seeded_model(config)
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(torch.zeros(2, tokens, config.d_in))
    assert dense_flops(config, batch=2, tokens=tokens) == counter.get_total_flops()


def test_causal_flops_count_the_unmasked_pairs() -> None:
    config = MHAConfig(d_in=5, d_out=3, num_heads=2, context_length=9)
    for tokens in (1, 4, 9):
        visible = int(np.tril(np.ones((tokens, tokens))).sum())  # (query, key) pairs the mask keeps
        dense = dense_flops(config, batch=1, tokens=tokens)
        masked = 4 * config.num_heads * config.d_out * (tokens * tokens - visible)
        assert causal_flops(config, batch=1, tokens=tokens) == dense - masked


def test_stats_median_and_p90() -> None:
    samples = [float(v) for v in (7, 1, 9, 3, 5, 2, 10, 4, 8, 6)]
    assert _stats(samples) == {"median_s": 5.5, "p90_s": 10.0}
    assert _stats([2.0]) == {"median_s": 2.0, "p90_s": 2.0}


def test_bench_json_has_every_runner_and_finite_figures(seed_dir: Path, tmp_path: Path) -> None:
    result = run_bench(seed_dir, tokens=[1, 4, 6], threads=1, rounds=1, progress=False, settle=0.0)
    json_path, png_path = write_outputs(result, tmp_path / "bench")
    data = json.loads(json_path.read_text())
    artifacts = [f for f, i in load_manifest(seed_dir).artifacts.items() if i.runtime != "onnxruntime-decode"]
    runners = {r["runner"] for r in data["results"]}
    assert runners == {"eager wrapper", "eager fused"} | set(artifacts)
    assert data["tokens"] == [1, 4, 6]
    assert len(data["results"]) == len(runners) * 3
    for r in data["results"]:
        for key in ("median_s", "p90_s", "tokens_per_s", "gflops", "pct_of_peak"):
            assert math.isfinite(r[key]) and r[key] > 0, (r["runner"], key, r[key])
    assert data["matmul_peak"]["gflops"] > 0 and data["threads"] == 1
    assert data["decode"]["past_tokens"] == 5 and data["decode"]["speedup_vs_full_recompute"] > 0
    for file, info in data["artifacts"].items():
        assert info["size_bytes"] > 0 and info["export_seconds"] >= 0
        if file.endswith((".onnx", ".ort")):
            assert info["cold_start_s"] > 0
    assert png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_command(seed_dir: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["bench", "--preset", "seed", "--artifacts", str(seed_dir.parent), "--rounds", "1",
                                      "--threads", "1", "--tokens", "2,6", "--settle", "0", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "MatMul peak" in result.stdout and "eager wrapper" in result.stdout and "decode step" in result.stdout
    assert (tmp_path / "bench.json").exists() and (tmp_path / "latency.png").exists()
    bad = CliRunner().invoke(cli, ["bench", "--preset", "seed", "--artifacts", str(seed_dir.parent), "--tokens", "a,b"])
    assert bad.exit_code == 2 and "expected comma-separated integers" in bad.stderr
    bad = CliRunner().invoke(cli, ["bench", "--preset", "seed", "--artifacts", str(seed_dir.parent), "--tokens", "7"])
    assert bad.exit_code == 1 and "--tokens: expected counts in 1..context_length=6, got [7]" in bad.stderr


def test_bench_only_selects_runners(seed_dir: Path) -> None:
    result = run_bench(seed_dir, tokens=[6], threads=1, rounds=1, progress=False, only=["mha.onnx"], settle=0.0)
    assert {r["runner"] for r in result["results"]} == {"eager wrapper", "mha.onnx"}
    bad = CliRunner().invoke(cli, ["bench", "--preset", "seed", "--artifacts", str(seed_dir.parent), "--only", "nope"])
    assert bad.exit_code == 1 and "--only: unknown runner 'nope'" in bad.stderr


def test_causal_flops_and_targets(seed_dir: Path) -> None:
    from mha_export.bench_targets import judge
    result = run_bench(seed_dir, tokens=[6], threads=1, rounds=1, progress=False, settle=0.0)
    judged = judge(result, load_manifest(seed_dir))
    assert judged["tokens"] == 6
    names = " | ".join(t["target"] for t in judged["targets"])
    for part in ("% of MatMul peak", "mha.onnx vs eager", "mha.int8.onnx", "(fastest artifact)", "decode step"):
        assert part in names, names
    assert all(isinstance(t["met"], bool) for t in judged["targets"] if "not judged" not in t["target"])
    floors = judged["floors"]
    assert 0 < floors["causal_at_peak_s"] < floors["dense_at_peak_s"]
    eager = next(r for r in result["results"] if r["runner"] == "eager wrapper")
    assert floors["needed_for_3x_s"] == eager["median_s"] / 3
    assert result["decode"]["first_step_after_idle_median_s"] > 0 and result["decode"]["burst"] > 1
