"""One preset end to end: model, artifacts, fixtures, validation, manifest; staged, then moved into place."""
from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from safetensors.torch import save_file

from export.artifacts import FAITHFUL, ONNX, TORCHSCRIPT, WEIGHTS_FILE, ArtifactSpec
from export.atomic import staged_folder
from export.fixtures import write_golden
from export.manifest import artifact_facts, write_manifest
from export.onnx_export import DEFAULT_OPSET, check_opset, export_onnx
from export.torchscript import export_torchscript
from export.validate import SWEEP_SEEDS, ArtifactReport, sweep_shapes, validate
from export.variants import ALL_VARIANTS, build_variants, variant_specs
from export.weights import SEED, load_model
from runtime.config import MHAConfig, preset
from runtime.errors import ConfigError
from runtime.manifest import sha256_file

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def check_folder_name(name: str) -> None:
    if not _NAME.fullmatch(name):
        raise ConfigError(f"preset folder name: expected letters, digits, '.', '_' or '-', got {name!r}")


def _timed(step: Callable[[], None]) -> float:
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


@dataclass(frozen=True)
class ExportResult:
    name: str
    folder: Path
    manifest: dict[str, Any]
    reports: dict[str, ArtifactReport]
    seconds: float


def export_preset(name: str, out_root: Path, *, config: MHAConfig | None = None, weights: Path | None = None,
                  opset: int = DEFAULT_OPSET, progress: bool = False,
                  variants: tuple[str, ...] = ALL_VARIANTS) -> ExportResult:
    """Export preset `name` (or `config` under that folder name) into `out_root/name`.

    Nothing under `out_root/name` changes unless every artifact was written and validated.
    """
    start = time.perf_counter()
    check_folder_name(name)
    config = config or preset(name)
    check_opset(opset)
    model = load_model(config, weights)
    artifacts: tuple[ArtifactSpec, ...] = FAITHFUL + variant_specs(variants)
    with staged_folder(Path(out_root) / name) as stage:
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(stage / WEIGHTS_FILE))
        seconds = {ONNX.file: _timed(lambda: export_onnx(model, config, stage / ONNX.file, opset=opset)),
                   TORCHSCRIPT.file: _timed(lambda: export_torchscript(model, config, stage / TORCHSCRIPT.file))}
        seconds |= build_variants(model, config, stage, variants)
        write_golden(model, config, stage, artifacts)
        reports = validate(stage, model, config, artifacts, progress=progress, label=f"validating {name}")
        weights_info = ({"source": f"torch.manual_seed({SEED})"} if weights is None
                        else {"source": str(weights), "sha256": sha256_file(Path(weights))})
        manifest = write_manifest(
            stage, preset=name, config=config, opset=opset, weights=weights_info,
            artifacts={file: report.to_dict() | artifact_facts(stage / file) | {"export_seconds": round(seconds[file], 3)}
                       for file, report in reports.items()},
            sweep={"shapes": [list(s) for s in sweep_shapes(config)], "seeds": list(SWEEP_SEEDS)},
        )
    return ExportResult(name, Path(out_root) / name, manifest, reports, time.perf_counter() - start)
