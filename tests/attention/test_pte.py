"""The ExecuTorch program: the whole token range, its batch limit refused before the runtime, self-describing,
no mask copies in the file."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from mha_export.attention.weights.load import load_artifact_model
from mha_export.infer.pte_runner import PteRunner
from mha_runtime.artifact.errors import ContractError
from mha_runtime.artifact.tolerance import compare
from mha_runtime.attention.manifest import load_manifest
from mha_runtime.attention.registry import PTE, PTE_MAX_BATCH, tolerance_for


def test_every_length_up_to_context_length_and_every_batch_up_to_the_maximum(mid_dir: Path) -> None:
    runner = PteRunner(mid_dir)
    model, config = load_artifact_model(mid_dir, load_manifest(mid_dir))
    for batch in range(1, PTE_MAX_BATCH + 1):
        for tokens in (1, 2, 17, config.context_length - 1, config.context_length):
            x = torch.randn(batch, tokens, config.d_in, generator=torch.Generator().manual_seed(tokens))
            with torch.no_grad():
                expected = model(x).numpy()
            assert compare(runner.run(x.numpy()), expected, tolerance_for(PTE.kind)).ok, (batch, tokens)


@pytest.mark.parametrize("shape,message", [
    ((PTE_MAX_BATCH + 1, 2, 3), f"expected batch <= {PTE_MAX_BATCH} (the ExecuTorch program's planned maximum)"),
    ((1, 7, 3), "expected 1 <= tokens <= context_length=6, got 7"),
    ((1, 2, 4), "expected last axis d_in=3"),
])
def test_the_contract_check_refuses_before_executorch(seed_dir: Path, shape: tuple[int, ...], message: str) -> None:
    runner = PteRunner(seed_dir)
    with pytest.raises(ContractError, match=message.replace("(", r"\(").replace(")", r"\)")):
        runner.run(np.ones(shape, np.float32))
    assert runner.run(np.ones((1, 2, 3), np.float32)).shape == (1, 2, 4)  # the method still works afterwards


def test_the_program_carries_its_config_and_the_manifest_its_limit(seed_dir: Path, tmp_path: Path) -> None:
    manifest = load_manifest(seed_dir)
    assert manifest.artifacts[PTE.file].batch_max == PTE_MAX_BATCH
    shutil.copy(seed_dir / PTE.file, tmp_path / PTE.file)  # a lone file: no manifest, config from the program
    lone = PteRunner(tmp_path / PTE.file)
    assert not lone.verified and lone.config == manifest.config and lone.batch_max == PTE_MAX_BATCH


def test_an_altered_program_is_refused(seed_copy: Path) -> None:
    data = bytearray((seed_copy / PTE.file).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (seed_copy / PTE.file).write_bytes(bytes(data))
    with pytest.raises(Exception, match="differs from the manifest"):
        PteRunner(seed_copy)


@pytest.mark.slow
def test_gpt2_small_pte_size_and_the_full_context(gpt2_dir: Path) -> None:
    """Within 1.05x of the fp32 weights (no mask copies); T = 1, 512 and 1024 within the fp32 tolerance."""
    weights = 3 * 768 * 768 * 4
    assert (gpt2_dir / PTE.file).stat().st_size <= 1.05 * weights
    runner = PteRunner(gpt2_dir)
    model, config = load_artifact_model(gpt2_dir, load_manifest(gpt2_dir))
    for tokens in (1, 512, 1024):
        x = torch.randn(1, tokens, config.d_in, generator=torch.Generator().manual_seed(tokens))
        with torch.no_grad():
            expected = model(x).numpy()
        assert compare(runner.run(x.numpy()), expected, tolerance_for(PTE.kind)).ok, tokens


def test_one_head_lowers_whole(tmp_path: Path) -> None:
    """num_heads 1: the one head's context is the output; a cat of one tensor was left outside XNNPACK and the
    export failed after its work ('XNNPACK did not take 1 op(s)')."""
    from mha_export.executorch.attention import build_pte
    from mha_export.model.wrapper import build_wrapper
    from mha_runtime.attention.config import MHAConfig

    config = MHAConfig(d_in=4, d_out=8, num_heads=1, context_length=5, out_proj=True)
    torch.manual_seed(0)
    wrapper = build_wrapper(config).eval()
    build_pte(wrapper, config, tmp_path, opset=18)
    runner = PteRunner(tmp_path / PTE.file)
    for tokens in (1, 3, 5):
        x = torch.randn(2, tokens, config.d_in, generator=torch.Generator().manual_seed(tokens))
        with torch.no_grad():
            expected = wrapper(x).numpy()
        assert compare(runner.run(x.numpy()), expected, tolerance_for(PTE.kind)).ok, tokens
