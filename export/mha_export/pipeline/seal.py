"""What every kind's manifest records alike: its files with sha256 and size, and the library versions."""
from __future__ import annotations

from pathlib import Path

import onnx
import onnxruntime
import torch

from mha_runtime.artifact.manifest import MANIFEST_NAME, FileRecord, sha256_file


def file_table(folder: Path) -> dict[str, FileRecord]:
    """sha256 and size of every file under `folder` (POSIX relative paths), the manifest excluded."""
    table = {}
    for path in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
        rel = path.relative_to(folder).as_posix()
        if rel != MANIFEST_NAME:
            table[rel] = FileRecord(size=path.stat().st_size, sha256=sha256_file(path))
    return table


def versions() -> dict[str, str]:
    return {"torch": torch.__version__, "onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__}
