"""Which artifact files a preset folder holds, and how each is run and judged."""
from __future__ import annotations

from dataclasses import dataclass

from runtime.golden import DECODE_RUNTIME, ONNX_RUNTIME, TORCHSCRIPT_RUNTIME
from runtime.tolerance import Tolerance, tolerance_for

WEIGHTS_FILE = "weights.safetensors"


@dataclass(frozen=True)
class ArtifactSpec:
    """One artifact file: its name, its tolerance-table kind and the runtime that loads it."""

    file: str
    kind: str
    runtime: str

    @property
    def tolerance(self) -> Tolerance:
        return tolerance_for(self.kind, "cpu")

    def to_dict(self) -> dict[str, object]:
        return {"file": self.file, "kind": self.kind, "runtime": self.runtime, "tolerance": self.tolerance.to_dict()}


ONNX = ArtifactSpec("mha.onnx", "onnx", ONNX_RUNTIME)
TORCHSCRIPT = ArtifactSpec("mha.pt", "torchscript", TORCHSCRIPT_RUNTIME)
FAITHFUL: tuple[ArtifactSpec, ...] = (ONNX, TORCHSCRIPT)

# The runtime names are defined once in runtime.golden (cases.json's `runtime` field) and re-exported here.
__all__ = ["ArtifactSpec", "FAITHFUL", "ONNX", "TORCHSCRIPT", "WEIGHTS_FILE", "ONNX_RUNTIME", "DECODE_RUNTIME",
           "TORCHSCRIPT_RUNTIME"]
