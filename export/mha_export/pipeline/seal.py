"""The manifest's records: config, contract, files with sha256 and size, versions, validation figures."""
from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import onnx
import onnxruntime
import torch

from mha_runtime.artifact.manifest import MANIFEST_NAME, FileRecord, sha256_file
from mha_runtime.attention.config import MHAConfig
from mha_runtime.attention.contract import IOContract
from mha_runtime.attention.manifest import ArtifactRecord, Manifest, WeightsRecord
from mha_runtime.attention.optimized_records import OptimizedSet


def file_table(folder: Path) -> dict[str, FileRecord]:
    """sha256 and size of every file under `folder` (POSIX relative paths), the manifest excluded."""
    table = {}
    for path in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
        rel = path.relative_to(folder).as_posix()
        if rel != MANIFEST_NAME:
            table[rel] = FileRecord(size=path.stat().st_size, sha256=sha256_file(path))
    return table


def artifact_facts(path: Path) -> dict[str, Any]:
    """Opset and node count of an .onnx file; an .ort file reports its source's opset; TorchScript neither."""
    if path.suffix == ".onnx":
        model = onnx.load(str(path), load_external_data=False)
        version = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
        return {"opset": version, "nodes": len(model.graph.node)}
    if path.suffix == ".ort":
        return artifact_facts(path.with_suffix(".onnx")) | {"nodes": None}
    return {"opset": None, "nodes": None}


def versions() -> dict[str, str]:
    return {"torch": torch.__version__, "onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__}


def attention_manifest(folder: Path, *, name: str, config: MHAConfig, opset: int, weights: WeightsRecord,
                       artifacts: dict[str, ArtifactRecord], sweep: dict[str, Any],
                       optimized: dict[str, OptimizedSet] | None = None) -> Manifest:
    """The attention folder's manifest, every file in `folder` hashed (run.py writes it)."""
    return Manifest(
        name=name, created=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), config=config,
        contract=IOContract(config).to_dict(), opset=opset, versions=versions(), weights=weights,
        validation={"reference": "eager MultiHeadAttentionWrapper (torch, CPU)", "sweep": sweep},
        artifacts=artifacts, files=file_table(folder), optimized=optimized or {},
    )
