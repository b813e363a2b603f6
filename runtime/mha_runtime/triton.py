"""`mha triton`: a Triton Inference Server model repository for the ONNX and TorchScript artifacts (torch-free).

    REPO/<name>_onnx/config.pbtxt          platform onnxruntime_onnx, tensors named as in the graph (x, context)
    REPO/<name>_onnx/1/model.onnx
    REPO/<name>_torchscript/config.pbtxt   platform pytorch_libtorch, tensors INPUT__0 / OUTPUT__0 (the PyTorch
    REPO/<name>_torchscript/1/model.pt     backend's naming: TorchScript files do not keep the names)

`max_batch_size` > 0 makes the batch axis implicit: `dims` is [tokens, width] with tokens variable (-1).
Triton cannot express tokens <= context_length; the config says it in a comment. Its dynamic batcher merges
only requests of one shape (same token count), unlike `mha serve`, which pads.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from mha_runtime.artifact.atomic import MAX_NAME
from mha_runtime.artifact.errors import ArtifactError, BadValueError, cut
from mha_runtime.artifact.manifest import read_verified
from mha_runtime.attention.contract import INPUT_NAME, OUTPUT_NAME
from mha_runtime.attention.manifest import load_manifest
from mha_runtime.attention.registry import ONNX, TORCHSCRIPT
from mha_runtime.attention.runner import OnnxRunner

ONNX_PLATFORM = "onnxruntime_onnx"
TORCHSCRIPT_PLATFORM = "pytorch_libtorch"
TORCHSCRIPT_INPUT, TORCHSCRIPT_OUTPUT = "INPUT__0", "OUTPUT__0"
VERSION = "1"
_NAME = re.compile(r"[A-Za-z0-9_.-]+")


@dataclass(frozen=True)
class TritonModel:
    """One model of the repository: its folder name, config text and the model file's bytes."""

    name: str
    platform: str
    file: str
    data: bytes
    input_name: str
    output_name: str
    config: str

    def write(self, folder: Path) -> None:
        """Write config.pbtxt and 1/<file> into `folder` (the model's folder)."""
        (folder / VERSION).mkdir(parents=True, exist_ok=True)
        (folder / VERSION / self.file).write_bytes(self.data)
        (folder / "config.pbtxt").write_text(self.config)


def config_text(*, name: str, platform: str, input_name: str, output_name: str, d_in: int, d_model: int,
                context_length: int, max_batch: int, queue_delay_us: int, source: str) -> str:
    """A config.pbtxt (protobuf text format of Triton's ModelConfig)."""
    return f"""# Written by `mha triton` from {source}.
# Tokens per request: 1..{context_length} (context_length); Triton checks the dims below, not this bound.
name: "{name}"
platform: "{platform}"
max_batch_size: {max_batch}
input [
  {{
    name: "{input_name}"
    data_type: TYPE_FP32
    dims: [ -1, {d_in} ]
  }}
]
output [
  {{
    name: "{output_name}"
    data_type: TYPE_FP32
    dims: [ -1, {d_model} ]
  }}
]
dynamic_batching {{
  max_queue_delay_microseconds: {queue_delay_us}
}}
"""


def triton_models(artifact: Path, *, name: str | None = None, model: str = ONNX.file, max_batch: int = 8,
                  queue_delay_us: int = 100) -> list[TritonModel]:
    """The ONNX and TorchScript models of an artifact folder, files checked against the manifest's sha256."""
    manifest = load_manifest(artifact)
    base = name if name is not None else re.sub(r"[^A-Za-z0-9_-]", "_", manifest.name)
    if name is None and not 1 <= len(base) <= MAX_NAME:  # an edited manifest (not listed in itself): no flag to blame
        raise ArtifactError(f"{artifact}: the manifest's name {cut(manifest.name)!r} gives no model name of 1 to "
                            f"{MAX_NAME} characters; give one with --name")
    if not _NAME.fullmatch(base) or len(base) > MAX_NAME:  # past it, the folder's name is past the OS's 255 bytes
        raise BadValueError(f"--name {cut(base)!r}: expected 1 to {MAX_NAME} letters, digits, '_', '-' or '.' (a "
                            "folder name)" + (f", got {len(base)} characters" if len(base) > MAX_NAME else ""))
    if max_batch < 1:
        raise BadValueError(f"--max-batch: expected a positive integer, got {max_batch}")
    if not model.endswith(".onnx"):  # an .ort file is ORT format, which Triton's 1/model.onnx would not load
        raise BadValueError(f"--model {cut(model)!r}: expected an .onnx file of the folder (Triton's onnxruntime "
                            "backend reads 1/model.onnx as ONNX)")
    runner = OnnxRunner(artifact, model=model, provider="cpu")  # checks the file; tells its inputs
    if runner.input_names != [INPUT_NAME]:
        raise ArtifactError(f"{model} takes inputs {runner.input_names}, not just {INPUT_NAME!r}: "
                            f"choose an ONNX file of the full-sequence form (default {ONNX.file})")
    config = manifest.config
    shapes = {"d_in": config.d_in, "d_model": config.d_model, "context_length": config.context_length,
              "max_batch": max_batch, "queue_delay_us": queue_delay_us}
    models = []
    kinds = (("onnx", ONNX_PLATFORM, model, "model.onnx", (INPUT_NAME, OUTPUT_NAME)),
             ("torchscript", TORCHSCRIPT_PLATFORM, TORCHSCRIPT.file, "model.pt",
              (TORCHSCRIPT_INPUT, TORCHSCRIPT_OUTPUT)))
    for suffix, platform, source, file, names in kinds:
        folder_name = f"{base}_{suffix}"
        digest = manifest.files[source].sha256 if source in manifest.files else "?"
        text = config_text(name=folder_name, platform=platform, input_name=names[0], output_name=names[1],
                           source=f"{manifest.name}/{source} (sha256 {digest[:16]}...)", **shapes)
        models.append(TritonModel(folder_name, platform, file, read_verified(artifact, source, manifest),
                                  names[0], names[1], text))
    return models
