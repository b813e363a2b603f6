"""The presets' files and golden fixtures: unchanged by this release, and the goldens are the eager model's own."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import PRESET_DIGESTS, preset_digests, reseal
from mha_export.attention.pipeline.fixtures import FIXTURE_SEED, golden_shapes
from mha_export.attention.weights.load import load_artifact_model
from mha_runtime.attention.golden import iter_cases, load_cases
from mha_runtime.attention.manifest import load_manifest

PRESETS = ["seed", pytest.param("gpt2-small", marks=pytest.mark.slow)]
FIXTURE = {"seed": "seed_dir", "gpt2-small": "gpt2_dir"}


@pytest.mark.parametrize("name", PRESETS)
def test_preset_artifacts_and_weights_are_unchanged(name: str, request: pytest.FixtureRequest) -> None:
    """Byte for byte, against the digests pinned when exports became reproducible (every file a preset has)."""
    folder = request.getfixturevalue(FIXTURE[name])
    pinned = json.loads(PRESET_DIGESTS.read_text())[name]
    assert preset_digests(folder) == pinned


def test_mid_artifacts_and_weights_are_unchanged(mid_dir: Path) -> None:
    """The tests' mid folder, pinned for the same reason (conftest.py takes `make test`'s artifacts/mid only at
    these bytes)."""
    assert preset_digests(mid_dir) == json.loads(PRESET_DIGESTS.read_text())["mid"]


def test_gpt_mini_forms_and_weights_are_unchanged(gpt_mini: Path) -> None:
    """The same pin for the GPT preset `make test` exports (all its forms, gpt.pte too): conftest.py takes that
    folder only at these bytes, so a change that moves them fails here, not silently as a slower suite."""
    assert preset_digests(gpt_mini) == json.loads(PRESET_DIGESTS.read_text())["gpt-mini"]


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


def test_the_python_check_feeds_the_decode_forms_the_stored_schedules(mid_copy: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """cases.json's schedules are the contract every runner follows: an edited one is what the Python check runs."""
    import mha_runtime.attention.golden_check as golden_check

    path = mid_copy / "golden" / "cases.json"
    doc = json.loads(path.read_text())
    case = doc["cases"][-1]
    tokens = case["input_shape"][1]
    for entry in doc["artifacts"]:
        if "schedules" in entry:
            entry["schedules"][case["name"]] = [1] * tokens  # token by token instead of the stored prefill + steps
    path.write_text(json.dumps(doc))
    reseal(mid_copy, "golden/cases.json")
    fed: list[list[int]] = []
    real = golden_check.run_chunked

    def recording(session: object, x: object, chunks: list[int]) -> object:
        fed.append(list(chunks))
        return real(session, x, chunks)  # type: ignore[arg-type]

    monkeypatch.setattr(golden_check, "run_chunked", recording)
    results = golden_check.check_golden(mid_copy)
    assert all(r.ok or r.skipped for r in results)
    decode_files = [e["file"] for e in doc["artifacts"] if "schedules" in e]
    assert len(decode_files) == 2 and fed.count([1] * tokens) == len(decode_files)
    assert all(chunks in [e["schedules"][c["name"]] for e in doc["artifacts"] if "schedules" in e
                          for c in doc["cases"]] for chunks in fed)
