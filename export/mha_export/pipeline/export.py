"""One artifact folder end to end: model, artifacts, fixtures, validation, manifest; staged, then moved into place."""
from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from mha_export.build.onnx_trace import DEFAULT_OPSET, check_opset
from mha_export.build.table import BUILDERS
from mha_export.pipeline.budget import check_budget
from mha_export.pipeline.fixtures import write_golden
from mha_export.pipeline.optimize import optimized_records, write_optimized
from mha_export.pipeline.progress import steps
from mha_export.pipeline.seal import artifact_facts, write_manifest
from mha_export.pipeline.validate import SWEEP_SEEDS, sweep_shapes, validate
from mha_export.weights.load import load_model
from mha_runtime.artifact.atomic import staged_folder
from mha_runtime.artifact.config import MHAConfig, preset
from mha_runtime.artifact.errors import ConfigError
from mha_runtime.artifact.manifest import Manifest
from mha_runtime.artifact.optimized import is_copy
from mha_runtime.artifact.registry import (
    ALL,
    EXECUTORCH_RUNTIME,
    PTE_MAX_BATCH,
    WEIGHTS_FILE,
    Selection,
    artifact_specs,
    buildable,
    with_needs,
)

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def check_folder_name(name: str) -> None:
    if not _NAME.fullmatch(name):
        raise ConfigError(f"folder name: expected letters, digits, '.', '_' or '-', got {name!r}")


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


@dataclass(frozen=True)
class ExportResult:
    name: str
    folder: Path
    manifest: Manifest
    seconds: float
    notes: tuple[str, ...] = ()  # variants of `all` this config cannot build, and why


def export_preset(name: str, out_root: Path, *, config: MHAConfig | None = None, weights: Path | None = None,
                  layer: int | None = None, opset: int = DEFAULT_OPSET, progress: bool = False,
                  variants: Selection = ALL) -> ExportResult:
    """Export preset `name` (or `config` under that folder name) into `out_root/name`, with the seed's weights
    or one layer of `weights`.

    Everything that can be refused is refused before any file is written, and nothing under `out_root/name`
    changes unless every artifact was written and validated.
    """
    start = time.perf_counter()
    check_folder_name(name)
    config = config or preset(name)
    check_opset(opset)
    check_budget(config)
    variants, notes = buildable(config, variants)
    model, weights_info = load_model(config, weights, layer=layer)
    artifacts = artifact_specs(variants)
    with staged_folder(Path(out_root) / name) as stage:
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(stage / WEIGHTS_FILE))
        seconds = build_all(model, config, stage, variants, opset=opset, progress=progress,
                            label=f"building {name}")
        copies = write_optimized(stage, artifacts)
        write_golden(model, config, stage, artifacts)
        every = (*artifacts, *(spec for by_source in copies.values() for spec in by_source.values()))
        reports = validate(stage, model, config, every, progress=progress, label=f"validating {name}")
        manifest = write_manifest(
            stage, name=name, config=config, opset=opset, weights=weights_info,
            artifacts={file: report.record(**artifact_facts(stage / file), export_seconds=round(seconds[file], 3),
                                           batch_max=PTE_MAX_BATCH if report.spec.runtime == EXECUTORCH_RUNTIME
                                           else None)
                       for file, report in reports.items() if not is_copy(file)},
            optimized=optimized_records(copies, reports),
            sweep={"shapes": [list(s) for s in sweep_shapes(config)], "seeds": list(SWEEP_SEEDS)},
        )
    return ExportResult(name, Path(out_root) / name, manifest, time.perf_counter() - start, tuple(notes))
