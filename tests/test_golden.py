"""The presets' files and golden fixtures: unchanged by this release, and the goldens are the eager model's own."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import PRESET_DIGESTS, preset_digests
from mha_export.pipeline.fixtures import FIXTURE_SEED, golden_shapes
from mha_export.weights.load import load_artifact_model
from mha_runtime.artifact.golden import iter_cases, load_cases
from mha_runtime.artifact.manifest import load_manifest

PRESETS = ["seed", pytest.param("gpt2-small", marks=pytest.mark.slow)]
FIXTURE = {"seed": "seed_dir", "gpt2-small": "gpt2_dir"}


@pytest.mark.parametrize("name", PRESETS)
def test_preset_artifacts_and_weights_are_unchanged(name: str, request: pytest.FixtureRequest) -> None:
    """Byte for byte, against the digests pinned when exports became reproducible (every file a preset has)."""
    folder = request.getfixturevalue(FIXTURE[name])
    pinned = json.loads(PRESET_DIGESTS.read_text())[name]
    assert preset_digests(folder) == pinned


@pytest.mark.parametrize("name", PRESETS)
def test_goldens_are_the_eager_model_rebuilt_from_the_saved_weights(name: str, request: pytest.FixtureRequest) -> None:
    """Bit for bit: a golden written by any artifact instead of the eager model would differ in the last bits."""
    folder = request.getfixturevalue(FIXTURE[name])
    model, config = load_artifact_model(folder, load_manifest(folder))
    generator = torch.Generator().manual_seed(FIXTURE_SEED)
    cases = load_cases(folder)
    assert [c.name for c in cases.cases] == [n for n, _, _ in golden_shapes(config)]
    for (_, batch, tokens), (case, x, expected) in zip(golden_shapes(config), iter_cases(folder, cases), strict=True):
        assert np.array_equal(x, torch.randn(batch, tokens, config.d_in, generator=generator).numpy()), case
        with torch.no_grad():
            assert np.array_equal(expected, model(torch.from_numpy(x)).numpy()), case
        assert np.array_equal(np.load(Path(folder) / "golden" / f"{case}.context.npy"), expected), case
