"""One artifact folder end to end: model, artifacts, fixtures, validation, manifest; staged, then moved into place."""
from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from mha_export.graphs.onnx_trace import DEFAULT_OPSET, check_opset
from mha_export.graphs.table import BUILDERS
from mha_export.pipeline.budget import check_budget
from mha_export.pipeline.fixtures import write_golden
from mha_export.pipeline.progress import steps
from mha_export.pipeline.seal import artifact_facts, write_manifest
from mha_export.pipeline.validate import SWEEP_SEEDS, sweep_shapes, validate
from mha_export.pipeline.write_optimized import optimized_records, write_optimized
from mha_export.weights.load import load_model
from mha_runtime.artifact.atomic import staged_folder
from mha_runtime.artifact.config import MHAConfig, preset
from mha_runtime.artifact.errors import BadValueError, cut
from mha_runtime.artifact.manifest import Manifest
from mha_runtime.artifact.optimized_records import is_copy
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

# A folder name under --out: one path part, never '.' or '..', short enough for the staging folder's suffix to
# stay under the file systems' 255-byte limit.
MAX_NAME = 100
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def check_folder_name(name: str) -> None:
    """Refuse a --name that is not one plain folder name (a usage error)."""
    if not _NAME.fullmatch(name) or len(name) > MAX_NAME:
        raise BadValueError(f"--name: expected a folder name of 1 to {MAX_NAME} letters, digits, '.', '_' or '-' "
                            f"that starts with a letter or digit, got {cut(name)!r}"
                            + (f" ({len(name)} characters)" if len(name) > MAX_NAME else ""))


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
                  variants: Selection = ALL, announce: Callable[[], None] | None = None) -> ExportResult:
    """Export preset `name` (or `config` under that folder name) into `out_root/name`, with the seed's weights
    or one layer of `weights`.

    Everything that can be refused is refused before any file is written, and nothing under `out_root/name`
    changes unless every artifact was written and validated. `announce` is called once the weights are read: the
    work starts.
    """
    start = time.perf_counter()
    check_folder_name(name)
    config = config or preset(name)
    check_opset(opset)
    check_budget(config)
    variants, notes = buildable(config, variants)
    model, weights_info = load_model(config, weights, layer=layer)
    if announce is not None:
        announce()
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
