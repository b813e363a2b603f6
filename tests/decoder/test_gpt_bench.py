"""The GPT bench's wiring on gpt-mini (one round, so three first-token prefills; 8 new tokens): every figure of
gpt.json present, finite and positive, every fp32 peer greedy-equal to gpt.inplace.onnx. No timing asserts."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from benchmarks.gpt_bench import GENAI, HF, TORCH_KV, main
from benchmarks.gpt_floors import child_peak, prefill_flops
from benchmarks.gpt_quant_bench import NOT_BUILT
from benchmarks.llama_peer import llama_bin
from mha_export.decoder.archs.gpt2.config import GPT_PRESETS
from mha_runtime.decoder.contract import CONCAT_FORM, INPLACE_FORM, INT4_FORM, INT8_FORM

NEW = 8


def _numbers(value: Any) -> list[float]:
    if isinstance(value, dict):
        return [n for v in value.values() for n in _numbers(v)]
    if isinstance(value, list):
        return [n for v in value for n in _numbers(v)]
    return [float(value)] if isinstance(value, (int, float)) and not isinstance(value, bool) else []


def _positive(*values: float) -> None:
    for v in values:
        assert math.isfinite(v) and v > 0, v


def test_gpt_bench_writes_every_figure(gpt_mini: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("benchmarks.gpt_bench.SETTLE_S", 0.0)  # the pause between timed calls is for the timings
    result = CliRunner().invoke(main, ["--artifact", str(gpt_mini), "--out", str(tmp_path), "--threads", "1",
                                       "--rounds", "1", "--new-tokens", str(NEW)])
    assert result.exit_code == 0, result.output
    assert "tokens/s" in result.output and "first token" in result.output
    report = json.loads((tmp_path / "gpt.json").read_text())
    assert all(math.isfinite(n) for n in _numbers(report))
    assert report["threads"] == 1 and report["export"] is None
    assert report["other_processes_cores"] >= 0 and report["decode"]["other_processes_cores"] >= 0
    assert report["host"]["versions"]["onnxruntime"]
    _positive(report["bandwidth"]["bytes_per_s"], report["matmul_peak"]["flop_per_s"])
    decode = report["decode"]
    assert set(decode["runners"]) == {INPLACE_FORM, CONCAT_FORM, INT8_FORM, INT4_FORM, GENAI, HF, TORCH_KV}
    for name, figures in decode["runners"].items():
        assert figures["new_tokens"] == NEW and len(figures["samples"]) == 1
        _positive(figures["tokens_per_s"], figures["first_token_s"])
        if name not in (INT8_FORM, INT4_FORM):  # the lossy forms round the weights: their ids may part early
            assert figures["greedy_prefix_equal"] == NEW, name
    assert decode["fastest_fp32"] in (INPLACE_FORM, CONCAT_FORM)
    ratios = decode["ratios"]
    _positive(decode["floor_tokens_per_s"], decode["streamed_floor_tokens_per_s"], ratios["fastest_fp32_to_floor"],
              ratios["fastest_fp32_to_streamed_floor"], ratios["int8_to_fastest_fp32"], ratios["int4_to_fastest_fp32"],
              *ratios["fastest_fp32_to_runner"].values())
    assert len(ratios["fastest_fp32_to_runner"]) == 4  # the other fp32 form, genai, transformers, the torch loop
    batch, first = report["batch"], report["first_token"]
    assert len(batch["prompt_lengths"]) == 8 and batch["form"] == decode["fastest_fp32"]
    _positive(batch["tokens_per_s"], batch["batch1_tokens_per_s"], batch["ratio_to_batch1"],
              batch["paired_ratio_median"])
    _positive(first["seconds"], first["floor_s"], first["ratio_to_floor"], first["paired_ratio_median"])
    assert first["peak_flop_per_s"] >= max(report["matmul_peak"]["flop_per_s"], *first["peak_samples"])
    assert first["best_seconds"] == min(first["samples"]) and len(first["samples"]) == len(first["peak_samples"]) == 3
    assert first["prefill_flops"] == prefill_flops(GPT_PRESETS["gpt-mini"], first["prompt_tokens"])
    assert "2*N*T" in first["formula"]
    profile = report["profile"]
    assert profile["form"] == decode["fastest_fp32"] and "MatMul" in profile["kernel_ms_per_step"]
    _positive(profile["step_ms"], profile["matmul_gemm_weight_bytes_per_s"])
    assert math.isclose(sum(profile["share"].values()), 1.0)
    quantized = report["quantized"]
    assert [r["form"] for r in quantized["forms"]] == [INPLACE_FORM, INT8_FORM, INT4_FORM]
    bandwidth = quantized["read_bandwidth"]
    assert len(bandwidth["round_samples"]) == quantized["rounds"] and bandwidth["bytes_per_s"] == max(
        bandwidth["round_samples"])  # sampled beside the runners each round; the floor at the best of them
    for row in quantized["forms"]:
        _positive(row["decode_tokens_per_s"], row["prefill_tokens_per_s"], row["step_bytes"], row["ratio_to_floor"],
                  row["paired_ratio_to_floor_median"])
        if row["form"] != INPLACE_FORM:  # measured on llama-perplexity's windows of the held-out text
            assert row["quality"]["positions"] == 16 * 64 and row["quality"]["perplexity"] > 1
            assert row["step_bytes"] < quantized["forms"][0]["step_bytes"]
        if llama_bin("llama-bench") is None:  # CI builds libllama only, not the tools: the peer is named as missing
            assert quantized["peers"] == NOT_BUILT and "peer" not in row
        else:
            _positive(row["peer"]["decode_tokens_per_s"], row["decode_ratio"])
    assert "quantized forms beside" in result.output
    cpuinfo = Path("/proc/cpuinfo")
    flags = next((line.split(":", 1)[1].split() for line in cpuinfo.read_text().splitlines()
                  if line.startswith("flags")), []) if cpuinfo.exists() else []
    if "avx2" in flags:  # the host named by its widest vector, read here from /proc/cpuinfo itself
        widest = "AVX-512" if "avx512f" in flags else "AVX2"
        header = next(line for line in result.output.splitlines()
                      if line.startswith("quantized forms beside") and "rounds taking turns" in line)
        assert header.endswith(f"({widest})"), header
        assert ("avx512f" in quantized["machine"]["cpu_flags"]) == ("avx512f" in flags)


def test_prefill_flops_of_the_book_gpt() -> None:
    """GPT_CONFIG_124M, 128 tokens: 2 * 85M non-embedding parameters per token dominate; the head is one token's."""
    cfg = GPT_PRESETS["gpt-124m"]
    non_embedding = 12 * (12 * 768 * 768 + 10 * 768) + 2 * 768  # a block: 12 E^2 weights, 10 E biases, norms
    assert prefill_flops(cfg, 128) == 2 * non_embedding * 128 + 2 * 12 * 128 * 128 * 768 + 2 * 768 * 50257


def test_child_peak_reads_the_childs_rss(tmp_path: Path) -> None:
    figures = child_peak([sys.executable, "-c", "b = bytearray(96 << 20); b[::4096] = b'x' * len(b[::4096])"],
                         log=tmp_path / "log")
    assert figures["peak_rss_bytes"] >= 96 << 20 and figures["seconds"] > 0


def test_child_peak_is_not_the_benchs_own_peak(tmp_path: Path) -> None:
    """A child forked from this process would start from its RSS high-water mark (Linux keeps it across exec)."""
    touched = bytearray(512 << 20)
    touched[::4096] = b"x" * len(touched[::4096])
    del touched
    assert child_peak([sys.executable, "-c", "pass"], log=tmp_path / "log")["peak_rss_bytes"] < 128 << 20
