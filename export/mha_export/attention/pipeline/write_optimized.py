"""ONNX Runtime's offline-optimized copies of the artifacts their variants mark, and their manifest records.

ONNX Runtime writes the graph it would build online (`optimized_model_filepath`, level `all`, as an online session
uses by default) from the plain file's bytes, so the copy names no path of the build machine. The copies are
validated with the plain files, over the same sweep and tolerance row (mha_export.attention.pipeline.validate), loaded
the way the runtime loads them: graph optimizations disabled.
"""
from __future__ import annotations

import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

import onnxruntime as ort

from mha_export.attention.pipeline.validate import ArtifactReport
from mha_runtime.artifact.atomic import write_file_atomic
from mha_runtime.artifact.errors import ExportError
from mha_runtime.attention.optimized_records import LEVEL, OptimizedFile, OptimizedSet, optimized_name
from mha_runtime.attention.registry import OFFLINE_OPTIMIZED_FILES, ArtifactSpec
from mha_runtime.infer.cpu_features import cpu_fingerprint
from mha_runtime.infer.providers import session_providers

# Copies are made for the CPU provider only: a CUDA copy would need validating on CUDA (the export validates on
# the CPU) and a GPU fingerprint to match at load; without one the manifest's `optimized` says only cpu.
PROVIDERS = ("cpu",)
_LEVELS = {"all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL, "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED}


def save_optimized(source: bytes, target: Path, provider: str) -> None:
    """Let ONNX Runtime write the graph it builds from `source` for `provider` to `target` (atomically)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".optimizing-", dir=target.parent) as tmp:
        written = Path(tmp) / target.name
        options = ort.SessionOptions()
        options.log_severity_level = 3
        options.intra_op_num_threads = 1
        options.graph_optimization_level = _LEVELS[LEVEL]
        options.optimized_model_filepath = str(written)
        ort.InferenceSession(source, sess_options=options, providers=session_providers(provider))
        extra = sorted(p.name for p in Path(tmp).iterdir() if p != written)
        if extra:  # one self-contained file, like the plain one
            raise ExportError(f"{target.name}: ONNX Runtime wrote external data beside the optimized copy ({extra})")
        write_file_atomic(target, written.read_bytes())


def write_optimized(folder: Path, artifacts: Iterable[ArtifactSpec]) -> dict[str, dict[str, ArtifactSpec]]:
    """Write the copy of every marked artifact for every provider; return {provider: {plain file: copy's spec}}
    (the copy keeps the plain file's kind, so the validator judges it by the same row)."""
    marked = [spec for spec in artifacts if spec.file in OFFLINE_OPTIMIZED_FILES]
    copies: dict[str, dict[str, ArtifactSpec]] = {}
    for provider in PROVIDERS:
        for spec in marked:
            name = optimized_name(spec.file, provider)
            save_optimized((Path(folder) / spec.file).read_bytes(), Path(folder) / name, provider)
            copies.setdefault(provider, {})[spec.file] = ArtifactSpec(name, spec.kind, spec.runtime)
    return copies


def optimized_records(copies: Mapping[str, Mapping[str, ArtifactSpec]],
                      reports: Mapping[str, ArtifactReport]) -> dict[str, OptimizedSet]:
    """The manifest's `optimized` object from the copies and their validation reports (keyed by copy file)."""
    return {provider: OptimizedSet(
        onnxruntime=ort.__version__, level=LEVEL, fingerprint=cpu_fingerprint(),
        files={source: OptimizedFile(file=spec.file, cases=reports[spec.file].cases,
                                     max_abs_error=reports[spec.file].max_abs, rel_l2_error=reports[spec.file].rel_l2,
                                     passed=not reports[spec.file].failures)
               for source, spec in by_source.items()})
        for provider, by_source in copies.items()}
