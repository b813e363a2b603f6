"""Golden fixtures: inputs and eager outputs as raw little-endian float32 and .npy, plus cases.json."""
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from mha_export.example import example_tokens
from mha_runtime.config import MHAConfig
from mha_runtime.contract import INPUT_NAME, OUTPUT_NAME
from mha_runtime.decode import golden_schedule
from mha_runtime.golden import CASES_NAME, CASES_TSV, GOLDEN_DIR, CaseArtifact, GoldenCase, GoldenCases
from mha_runtime.variants import (
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
    (root / CASES_TSV).write_text(cases_tsv(doc))
    return root


TSV_COLUMNS = ("file", "kind", "runtime", "atol", "rtol", "rel_l2", "case", "batch", "tokens", "d_in", "d_model",
               "input_bin", "output_bin", "schedule")


def cases_tsv(doc: GoldenCases) -> str:
    """cases.json flattened for C and C++: one tab-separated line per (artifact, case); '-' for none."""
    lines = ["# " + "\t".join(TSV_COLUMNS)]
    for entry in doc.artifacts:
        tol = entry.tolerance
        for case in doc.cases:
            batch, tokens, d_in = case.input_shape
            schedule = (entry.schedules or {}).get(case.name)
            row = [entry.file, entry.kind, entry.runtime, repr(tol.atol), repr(tol.rtol),
                   "-" if tol.rel_l2 is None else repr(tol.rel_l2), case.name, batch, tokens, d_in,
                   case.output_shape[2], case.input_bin, case.output_bin,
                   "-" if schedule is None else ",".join(map(str, schedule))]
            lines.append("\t".join(map(str, row)))
    return "\n".join(lines) + "\n"
