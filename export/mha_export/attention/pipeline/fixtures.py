"""Golden fixtures: inputs and eager outputs as raw little-endian float32 and .npy, plus cases.json."""
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from mha_export.model.example import example_tokens
from mha_runtime.attention.config import MHAConfig
from mha_runtime.attention.contract import INPUT_NAME, OUTPUT_NAME
from mha_runtime.attention.decode_session import golden_schedule
from mha_runtime.attention.golden import CASES_NAME, GOLDEN_DIR, CaseArtifact, GoldenCase, GoldenCases
from mha_runtime.attention.registry import (
    DECODE_INPLACE_RUNTIME,
    DECODE_RUNTIME,
    EXECUTORCH_RUNTIME,
    PTE_MAX_BATCH,
    ArtifactSpec,
)

FIXTURE_SEED = 2024


def golden_shapes(config: MHAConfig) -> list[tuple[str, int, int]]:
    """(name, batch, tokens): one token, a middle length with batch 2, the full context."""
    mid = example_tokens(config)
    shapes = [("b1_t1", 1, 1), (f"b2_t{mid}", 2, mid), (f"b1_t{config.context_length}", 1, config.context_length)]
    return list(dict.fromkeys(shapes))


def _write_array(root: Path, stem: str, array: np.ndarray) -> tuple[str, str]:
    bin_name, npy_name = f"{stem}.bin", f"{stem}.npy"
    (root / bin_name).write_bytes(array.astype("<f4").tobytes())
    np.save(root / npy_name, array.astype(np.float32))
    return bin_name, npy_name


def _entry(spec: ArtifactSpec, cases: list[GoldenCase]) -> CaseArtifact:
    """cases.json's line for one artifact; the decode form also says how each case is fed."""
    if spec.runtime == EXECUTORCH_RUNTIME:
        return CaseArtifact(spec.file, spec.kind, spec.runtime, spec.tolerance, batch_max=PTE_MAX_BATCH)
    if spec.runtime not in (DECODE_RUNTIME, DECODE_INPLACE_RUNTIME):
        return CaseArtifact(spec.file, spec.kind, spec.runtime, spec.tolerance)
    return CaseArtifact(spec.file, spec.kind, spec.runtime, spec.tolerance,
                        schedule="from an empty cache: a prefill of ceil(tokens / 2) tokens, then one token per step",
                        schedules={c.name: golden_schedule(c.input_shape[1]) for c in cases})


def write_golden(model: torch.nn.Module, config: MHAConfig, folder: Path, artifacts: Sequence[ArtifactSpec]) -> Path:
    """Write `folder/golden/` with every case and a cases.json naming each artifact's tolerance."""
    root = Path(folder) / GOLDEN_DIR
    root.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(FIXTURE_SEED)
    cases = []
    for name, batch, tokens in golden_shapes(config):
        x = torch.randn(batch, tokens, config.d_in, generator=gen)  # (B, T, d_in)
        with torch.no_grad():
            y = model(x)  # (B, T, num_heads * d_out)
        x_bin, x_npy = _write_array(root, f"{name}.{INPUT_NAME}", x.numpy())
        y_bin, y_npy = _write_array(root, f"{name}.{OUTPUT_NAME}", y.numpy())
        cases.append(GoldenCase(name, (batch, tokens, config.d_in), (batch, tokens, config.d_model),
                                x_bin, y_bin, x_npy, y_npy))
    doc = GoldenCases(config=config, cases=tuple(cases), artifacts=tuple(_entry(spec, cases) for spec in artifacts),
                      input=INPUT_NAME, output=OUTPUT_NAME)
    (root / CASES_NAME).write_text(json.dumps(doc.to_dict(), indent=2) + "\n")
    return root
