"""The attention folder's manifest: config, contract, validation sweep, each artifact's opset and node count, files."""
from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import onnx

from mha_export.pipeline.seal import file_table, versions
from mha_runtime.attention.config import MHAConfig
from mha_runtime.attention.contract import IOContract
from mha_runtime.attention.manifest import ArtifactRecord, Manifest, WeightsRecord
from mha_runtime.attention.optimized_records import OptimizedSet


def artifact_facts(path: Path) -> dict[str, Any]:
    """Opset and node count of an .onnx file; an .ort file reports its source's opset; TorchScript neither."""
    if path.suffix == ".onnx":
        model = onnx.load(str(path), load_external_data=False)
        version = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
        return {"opset": version, "nodes": len(model.graph.node)}
    if path.suffix == ".ort":
        return artifact_facts(path.with_suffix(".onnx")) | {"nodes": None}
    return {"opset": None, "nodes": None}


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
