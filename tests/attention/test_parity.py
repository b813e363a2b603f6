"""ONNX (through the runner users use) and TorchScript equal eager PyTorch at every token count."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import book_wrapper
from mha_export.attention.weights.load import load_artifact_model
from mha_export.infer.torchscript_runner import load_torchscript
from mha_runtime.artifact.tolerance import compare
from mha_runtime.attention.config import MHAConfig
from mha_runtime.attention.manifest import load_manifest
from mha_runtime.attention.registry import tolerance_for
from mha_runtime.attention.runner import OnnxRunner


def _eager(folder: Path) -> tuple[torch.nn.Module, MHAConfig]:
    return load_artifact_model(folder, load_manifest(folder))


def _parity_every_length(folder: Path) -> int:
    """Compare both artifacts with eager at every (batch 1..3, tokens 1..context_length); return cases run."""
    model, config = _eager(folder)
    onnx_runner = OnnxRunner(folder, provider="cpu")
    script, script_config = load_torchscript(folder / "mha.pt")
    assert script_config == config
    cases = 0
    for batch in (1, 2, 3):
        for tokens in range(1, config.context_length + 1):
            x = torch.randn(batch, tokens, config.d_in, generator=torch.Generator().manual_seed(tokens))
            with torch.no_grad():
                expected = model(x).numpy()  # (B, T, H * d_out)
                scripted = script(x).numpy()
            onnx_cmp = compare(onnx_runner.run(x.numpy()), expected, tolerance_for("onnx"))
            ts_cmp = compare(scripted, expected, tolerance_for("torchscript"))
            assert onnx_cmp.ok, f"onnx batch={batch} tokens={tokens} max_abs={onnx_cmp.max_abs}"
            assert ts_cmp.ok, f"torchscript batch={batch} tokens={tokens} max_abs={ts_cmp.max_abs}"
            cases += 1
    return cases


def test_seed_parity_every_length(seed_dir: Path) -> None:
    assert _parity_every_length(seed_dir) == 3 * 6


def test_mid_config_parity_every_length(mid_dir: Path) -> None:
    assert _parity_every_length(mid_dir) == 3 * 48


def test_manifest_records_measured_errors(seed_dir: Path) -> None:
    artifacts = load_manifest(seed_dir).artifacts
    assert {"mha.onnx", "mha.pt"} <= set(artifacts)
    for info in artifacts.values():
        assert info.passed and info.cases == 20  # 10 sweep shapes x 2 seeds
        assert 0.0 <= info.max_abs_error <= info.tolerance.atol


@pytest.mark.slow
def test_gpt2_small_export_size_and_parity(gpt2_dir: Path) -> None:
    """Against the book's own wrapper (llms_from_scratch), not the export's copy its validation already used."""
    size = (gpt2_dir / "mha.onnx").stat().st_size
    assert size <= 12 * 2**20, f"mha.onnx is {size / 2**20:.1f} MiB; the per-head masks were not shared"
    model, config = book_wrapper(gpt2_dir)
    runner = OnnxRunner(gpt2_dir, provider="cpu")
    script, _ = load_torchscript(gpt2_dir / "mha.pt")
    for batch, tokens in [(1, 1), (2, 2), (1, 511), (1, 512), (3, 513), (1, 1023), (1, 1024)]:
        x = torch.randn(batch, tokens, config.d_in, generator=torch.Generator().manual_seed(7))
        with torch.no_grad():
            expected = model(x).numpy()
            scripted = script(x).numpy()
        got = runner.run(x.numpy())
        assert np.isfinite(got).all() and compare(got, expected, tolerance_for("onnx")).ok, (batch, tokens)
        assert compare(scripted, expected, tolerance_for("torchscript")).ok, (batch, tokens)


def test_torchscript_stores_one_mask(mid_dir: Path) -> None:
    script, _ = load_torchscript(mid_dir / "mha.pt")
    masks = [t for name, t in script.state_dict().items() if name.endswith(".mask")]
    assert len(masks) == 4
    assert len({m.data_ptr() for m in masks}) == 1 and torch.equal(masks[0], torch.triu(torch.ones(48, 48), 1))
