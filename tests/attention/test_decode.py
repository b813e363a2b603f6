"""Key/value-cache decoding equals the full-sequence output, however the sequence is chunked."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from helpers import book_wrapper
from mha_export.attention.weights.load import load_artifact_model
from mha_runtime.artifact.errors import ContractError
from mha_runtime.artifact.tolerance import compare
from mha_runtime.attention.decode_session import SCHEDULES, DecodeSession, run_chunked, uneven_schedule
from mha_runtime.attention.manifest import load_manifest
from mha_runtime.attention.registry import tolerance_for
from mha_runtime.attention.runner import OnnxRunner


def test_uneven_schedule() -> None:
    assert uneven_schedule(30) == [5, 1, 17, 1, 3, 3]
    assert all(sum(s(t)) == t for s in SCHEDULES.values() for t in range(1, 40))


def _ort_every_schedule(folder: Path, lengths: list[int], batches: tuple[int, ...] = (1, 2), *,
                        book: bool = False) -> None:
    """Every chunking schedule against the full sequence of the export's wrapper, or with `book` the book's own
    (llms_from_scratch)."""
    model, config = book_wrapper(folder) if book else load_artifact_model(folder, load_manifest(folder))
    session = DecodeSession(folder, provider="cpu")
    for tokens in lengths:
        for batch in batches:
            x = torch.randn(batch, tokens, config.d_in, generator=torch.Generator().manual_seed(tokens))
            with torch.no_grad():
                full = model(x).numpy()
            for name, schedule in SCHEDULES.items():
                cmp = compare(run_chunked(session, x.numpy(), schedule(tokens)), full, tolerance_for("decode"))
                assert cmp.ok, f"{name} tokens={tokens} batch={batch}: {cmp}"
                assert session.past_tokens == tokens


def test_ort_decode_seed_every_length(seed_dir: Path) -> None:
    _ort_every_schedule(seed_dir, list(range(1, 7)))


def test_ort_decode_mid_every_length(mid_dir: Path) -> None:
    _ort_every_schedule(mid_dir, list(range(1, 49)))


@pytest.mark.slow
def test_ort_decode_gpt2_up_to_1024(gpt2_dir: Path) -> None:
    _ort_every_schedule(gpt2_dir, [1, 2, 100, 1024], batches=(1,), book=True)


def test_decode_file_axes_are_symbolic(seed_dir: Path) -> None:
    model = onnx.load(str(seed_dir / "mha.decode.onnx"))
    dims = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in list(model.graph.input) + list(model.graph.output)}
    assert dims == {
        "x": ["batch", "new_tokens", 3], "past_key": ["batch", 2, "past_tokens", 2],
        "past_value": ["batch", 2, "past_tokens", 2], "context": ["batch", "new_tokens", 4],
        "present_key": ["batch", 2, "past_tokens + new_tokens", 2],
        "present_value": ["batch", 2, "past_tokens + new_tokens", 2],
    }
    assert [n.op_type for n in model.graph.node] == ["MatMul", "Split", "MultiHeadAttention"]


def test_step_past_context_is_refused_and_cache_kept(seed_dir: Path) -> None:
    session = DecodeSession(seed_dir, provider="cpu")
    session.step(np.zeros((2, 4, 3), np.float32))
    key_before = session.past_key.copy()
    with pytest.raises(ContractError, match="<= context_length - past_tokens = 6 - 4 = 2, got 3"):
        session.step(np.zeros((2, 3, 3), np.float32))
    assert session.past_tokens == 4 and np.array_equal(session.past_key, key_before)
    with pytest.raises(ContractError, match="expected batch 2 \\(the cache's\\), got 1"):
        session.step(np.zeros((1, 1, 3), np.float32))
    session.step(np.zeros((2, 2, 3), np.float32))
    assert session.past_tokens == 6
    with pytest.raises(ContractError, match="= 0, got 1"):
        session.step(np.zeros((2, 1, 3), np.float32))
    session.reset()
    assert session.past_tokens == 0


def test_plain_runner_refuses_the_decode_file(seed_dir: Path) -> None:
    with pytest.raises(ContractError, match="run the decode form"):
        OnnxRunner(seed_dir, model="mha.decode.onnx", provider="cpu").run(np.zeros((1, 1, 3), np.float32))
