"""Validation compares over the sweep and, on mismatch, raises listing every failing case."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from mha_export.attention.pipeline.validate import sweep_shapes, sweep_tokens, validate
from mha_export.attention.weights.load import seeded_model
from mha_runtime.artifact.errors import ValidationError
from mha_runtime.artifact.tolerance import Tolerance, compare
from mha_runtime.attention.config import preset
from mha_runtime.attention.registry import ONNX, TORCHSCRIPT


def test_sweep_covers_the_policy() -> None:
    assert sweep_tokens(preset("seed")) == [1, 2, 3, 4, 6]
    assert sweep_tokens(preset("gpt2-small")) == [1, 2, 341, 511, 512, 513, 1024]
    assert {b for b, _ in sweep_shapes(preset("seed"))} == {1, 3}


def test_mismatch_lists_every_failing_case(seed_dir: Path) -> None:
    model = seeded_model(preset("seed"))
    with torch.no_grad():
        model.heads[0].W_value.weight.add_(0.5)  # a different model: every artifact now disagrees with it
    with pytest.raises(ValidationError) as info:
        validate(seed_dir, model, preset("seed"), (ONNX, TORCHSCRIPT))
    failures = info.value.failures
    assert len(failures) == 2 * len(sweep_shapes(preset("seed"))) * 2  # 2 artifacts x shapes x 2 seeds
    assert {f.artifact for f in failures} == {"mha.onnx", "mha.pt"}
    message = str(info.value)
    assert message.count("\n") == len(failures) and "mha.pt shape=[3, 6, 3] seed=1" in message


def test_compare_catches_nan_shape_and_excess() -> None:
    tol = Tolerance(atol=1e-5, rtol=0.0)
    e = np.zeros((1, 2, 4), np.float32)
    assert compare(e, e, tol).ok
    assert not compare(e + 2e-5, e, tol).ok
    assert not compare(np.full_like(e, np.nan), e, tol).ok
    assert not compare(e[:, :1], e, tol).ok
    assert not compare(e + 1e-6, e + 1.0, Tolerance(atol=1.0, rtol=0.0, rel_l2=1e-9)).ok
