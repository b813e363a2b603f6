"""Every artifact against the eager wrapper over a sweep of shapes and seeds; failures collected, then raised."""
from __future__ import annotations

import gc
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import torch

from mha_export.infer.torchscript_runner import torchscript_runner
from mha_export.model.example import example_tokens
from mha_export.pipeline.progress import steps
from mha_runtime.artifact.errors import ValidationError
from mha_runtime.artifact.tolerance import Tolerance, compare
from mha_runtime.attention.config import MHAConfig
from mha_runtime.attention.contract import INPUT_NAME, OUTPUT_NAME
from mha_runtime.attention.decode_session import SCHEDULES, DecodeSession, run_chunked
from mha_runtime.attention.inplace_session import InPlaceDecodeSession
from mha_runtime.attention.manifest import ArtifactRecord
from mha_runtime.attention.optimized_records import is_copy
from mha_runtime.attention.registry import (
    DECODE_INPLACE_RUNTIME,
    DECODE_RUNTIME,
    EXECUTORCH_RUNTIME,
    ONNX_RUNTIME,
    ArtifactSpec,
)
from mha_runtime.attention.runner import OnnxRunner
from mha_runtime.infer.pick_copy import session_options
from mha_runtime.infer.providers import session_providers

SWEEP_BATCHES = (1, 3)
SWEEP_SEEDS = (0, 1)


def sweep_tokens(config: MHAConfig) -> list[int]:
    """1, 2, the example length and its neighbours, an odd length, and context_length."""
    ex, cl = example_tokens(config), config.context_length
    odd = max(1, (cl // 3) | 1)
    return sorted({t for t in (1, 2, ex - 1, ex, ex + 1, odd, cl) if 1 <= t <= cl})


def sweep_shapes(config: MHAConfig) -> list[tuple[int, int]]:
    return [(b, t) for b in SWEEP_BATCHES for t in sweep_tokens(config)]


@dataclass(frozen=True)
class Failure:
    artifact: str
    shape: tuple[int, ...]
    seed: int
    max_abs: float
    rel_l2: float
    tolerance: Tolerance

    def line(self) -> str:
        tol = self.tolerance
        limit = f"atol {tol.atol:g}, rtol {tol.rtol:g}" + (f", rel_l2 {tol.rel_l2:g}" if tol.rel_l2 is not None else "")
        return (f"{self.artifact} shape={list(self.shape)} seed={self.seed}: max abs diff {self.max_abs:.3g}, "
                f"rel L2 {self.rel_l2:.3g}; tolerance {limit}")


@dataclass
class ArtifactReport:
    """Worst-case figures of one artifact over the sweep."""

    spec: ArtifactSpec
    cases: int = 0
    max_abs: float = 0.0
    rel_l2: float = 0.0
    failures: list[Failure] = field(default_factory=list)

    def record(self, **facts: Any) -> ArtifactRecord:
        """The manifest's record of this artifact; `facts` are opset, nodes and export_seconds."""
        return ArtifactRecord(kind=self.spec.kind, runtime=self.spec.runtime, tolerance=self.spec.tolerance,
                              cases=self.cases, max_abs_error=self.max_abs, rel_l2_error=self.rel_l2,
                              passed=not self.failures, **facts)


def artifact_runner(folder: Path, spec: ArtifactSpec) -> Callable[[np.ndarray], np.ndarray]:
    """The same runner users use: OnnxRunner for ONNX files, DecodeSession for the decode form
    (each call takes the next chunk schedule: one prefill, token by token, uneven, golden),
    torch.jit.load for TorchScript."""
    if spec.runtime == ONNX_RUNTIME and is_copy(spec.file):  # an optimized copy, loaded as the runtime loads it
        copy = ort.InferenceSession((Path(folder) / spec.file).read_bytes(), providers=session_providers("cpu"),
                                    sess_options=session_options(None, preoptimized=True))
        return lambda x: copy.run([OUTPUT_NAME], {INPUT_NAME: x})[0]
    if spec.runtime == ONNX_RUNTIME:  # the plain file even where the folder has a copy this machine could use
        return OnnxRunner(Path(folder) / spec.file, provider="cpu", offline_optimized=False).run
    if spec.runtime in (DECODE_RUNTIME, DECODE_INPLACE_RUNTIME):
        inplace = spec.runtime == DECODE_INPLACE_RUNTIME
        session = (InPlaceDecodeSession if inplace else DecodeSession)(Path(folder) / spec.file, provider="cpu")
        rotation = itertools.cycle(SCHEDULES)
        return lambda x: run_chunked(session, x, SCHEDULES[_schedule(next(rotation), x.shape[0], inplace)](x.shape[1]))
    if spec.runtime == EXECUTORCH_RUNTIME:
        from mha_export.infer.pte_runner import PteRunner

        return PteRunner(Path(folder) / spec.file).run
    return torchscript_runner(Path(folder) / spec.file)


def _schedule(name: str, batch: int, inplace: bool) -> str:
    """The in-place form chunks after a past only at batch 1 (its limit): past it, "uneven" gives way to "golden"."""
    return name if not inplace or batch == 1 or name in ("prefill", "token-by-token", "golden") else "golden"


# One sweep case: the input, the eager output and the seed that drew the input.
SweepCase = tuple[np.ndarray, np.ndarray, int]


def sweep_cases(model: torch.nn.Module, config: MHAConfig) -> list[SweepCase]:
    """The sweep's inputs and the eager wrapper's outputs, in the sweep's order."""
    sweep = []
    for (batch, tokens), seed in itertools.product(sweep_shapes(config), SWEEP_SEEDS):
        gen = torch.Generator().manual_seed(seed)
        x = torch.randn(batch, tokens, config.d_in, generator=gen)  # (B, T, d_in)
        with torch.no_grad():
            sweep.append((x.numpy(), model(x).numpy(), seed))  # expected: (B, T, num_heads * d_out)
    return sweep


def validate(folder: Path, model: torch.nn.Module, config: MHAConfig, artifacts: Sequence[ArtifactSpec], *,
             progress: bool = False, label: str = "validating",
             sweep: Sequence[SweepCase] | None = None) -> dict[str, ArtifactReport]:
    """Run every artifact at every sweep shape and seed; raise ValidationError listing all failures.

    The eager outputs are computed once (`sweep`: already computed by the caller); then one artifact at a time is
    loaded, run over the whole sweep (in the sweep's order, which the decode forms' rotating schedules follow) and
    released, so the peak holds one runtime's session and its buffers, not every artifact's at once."""
    sweep = sweep_cases(model, config) if sweep is None else sweep
    reports = {spec.file: ArtifactReport(spec) for spec in artifacts}
    for spec in steps(artifacts, label=label, unit="artifact", enabled=progress, name=lambda s: s.file):
        run = artifact_runner(folder, spec)
        report = reports[spec.file]
        for x, expected, seed in sweep:
            cmp = compare(run(x), expected, spec.tolerance)
            report.cases += 1
            report.max_abs = max(report.max_abs, cmp.max_abs)
            report.rel_l2 = max(report.rel_l2, cmp.rel_l2)
            if not cmp.ok:
                report.failures.append(Failure(spec.file, x.shape, seed, cmp.max_abs, cmp.rel_l2, spec.tolerance))
        del run
        gc.collect()  # the session's arena goes now, before the next artifact's
    failures = [f for r in reports.values() for f in r.failures]
    if failures:
        raise ValidationError(failures)
    return reports
