"""The attention folder's export: its steps in the one pipeline (run.py) and the builders its variants need."""
from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from mha_export.attention.graphs.table import BUILDERS
from mha_export.attention.pipeline.fixtures import write_golden
from mha_export.attention.pipeline.validate import SWEEP_SEEDS, sweep_cases, sweep_shapes, validate
from mha_export.attention.pipeline.write_optimized import optimized_records, write_optimized
from mha_export.attention.weights.load import load_model
from mha_export.pipeline.budget import check_budget
from mha_export.pipeline.preflight import DEFAULT_OPSET, check_opset
from mha_export.pipeline.progress import steps
from mha_export.pipeline.run import ExportResult, run_export
from mha_export.pipeline.seal import artifact_facts, attention_manifest
from mha_runtime.artifact.errors import ConfigError
from mha_runtime.artifact.manifest import Manifest
from mha_runtime.attention.config import MHAConfig, preset
from mha_runtime.attention.optimized_records import is_copy
from mha_runtime.attention.registry import (
    ALL,
    EXECUTORCH_RUNTIME,
    PTE_MAX_BATCH,
    WEIGHTS_FILE,
    Selection,
    artifact_specs,
    buildable,
    with_needs,
)


def build_all(model: torch.nn.Module, config: MHAConfig, folder: Path, variants: tuple[str, ...], *,
              opset: int, progress: bool = False, label: str = "building") -> dict[str, float]:
    """Run every builder the variants need, in registry order; return seconds per artifact file."""
    seconds = {}
    for variant in steps(with_needs(variants), label=label, unit="variant", enabled=progress,
                         name=lambda v: v.name):
        start = time.perf_counter()
        BUILDERS[variant.name](model, config, folder, opset=opset)
        for spec in variant.artifacts:  # a variant of several files records its whole build time on each
            seconds[spec.file] = time.perf_counter() - start
    return seconds


class AttentionExport:
    """The attention folder's steps in the one pipeline (run.py): the seed's weights or one layer of `weights`,
    every builder its variants need, the offline-optimized copies, the golden fixtures, the sweep, the manifest."""

    def __init__(self, name: str, *, config: MHAConfig | None, weights: Path | None, layer: int | None,
                 opset: int, variants: Selection) -> None:
        self.name, self.config_arg, self.weights, self.layer = name, config, weights, layer
        self.opset, self.selection = opset, variants
        self.notes: tuple[str, ...] = ()

    def check(self) -> None:
        self.config = self.config_arg or preset(self.name)
        check_opset(self.opset)
        check_budget(self.config)
        self.variants, notes = buildable(self.config, self.selection)
        self.notes = tuple(notes)
        self.artifacts = artifact_specs(self.variants)

    def load(self) -> None:
        self.model, self.weights_info = load_model(self.config, self.weights, layer=self.layer)
        # Computed before the work: finite weights can still overflow float32 attention scores, and every artifact
        # would then fail the sweep with a line blaming the input (it was found only after all of the builds).
        self.sweep = sweep_cases(self.model, self.config)
        if not all(np.isfinite(expected).all() for _, expected, _ in self.sweep):
            raise ConfigError("weights: eager PyTorch's output is NaN or inf with these weights (their values overflow "
                              "float32 attention scores); no exported artifact could be checked against it")

    def build(self, stage: Path, *, progress: bool, label: str) -> None:
        save_file({k: v.contiguous() for k, v in self.model.state_dict().items()}, str(stage / WEIGHTS_FILE))
        self.seconds = build_all(self.model, self.config, stage, self.variants, opset=self.opset,
                                 progress=progress, label=label)
        self.copies = write_optimized(stage, self.artifacts)
        write_golden(self.model, self.config, stage, self.artifacts)

    def validate(self, stage: Path, *, progress: bool, label: str) -> None:
        every = (*self.artifacts, *(spec for by_source in self.copies.values() for spec in by_source.values()))
        self.reports = validate(stage, self.model, self.config, every, progress=progress, label=label,
                                sweep=self.sweep)

    def seal(self, stage: Path) -> Manifest:
        return attention_manifest(
            stage, name=self.name, config=self.config, opset=self.opset, weights=self.weights_info,
            artifacts={file: report.record(**artifact_facts(stage / file),
                                           export_seconds=round(self.seconds[file], 3),
                                           batch_max=PTE_MAX_BATCH if report.spec.runtime == EXECUTORCH_RUNTIME
                                           else None)
                       for file, report in self.reports.items() if not is_copy(file)},
            optimized=optimized_records(self.copies, self.reports),
            sweep={"shapes": [list(s) for s in sweep_shapes(self.config)], "seeds": list(SWEEP_SEEDS)},
        )


def export_preset(name: str, out_root: Path, *, config: MHAConfig | None = None, weights: Path | None = None,
                  layer: int | None = None, opset: int = DEFAULT_OPSET, progress: bool = False,
                  variants: Selection = ALL, announce: Callable[[], None] | None = None) -> ExportResult:
    """Export preset `name` (or `config` under that folder name) into `out_root/name`, with the seed's weights
    or one layer of `weights`, through the one pipeline (run.py: refusals first, staged, placed when valid)."""
    kind = AttentionExport(name, config=config, weights=weights, layer=layer, opset=opset, variants=variants)
    return run_export(name, out_root, kind, progress=progress, announce=announce)
