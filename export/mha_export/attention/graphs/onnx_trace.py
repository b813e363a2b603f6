"""The faithful ONNX export: dynamo exporter, dynamic axes, deduplicated masks, config in metadata."""
from __future__ import annotations

import io
import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stdout
from pathlib import Path

import onnx
import onnx_ir as ir
import onnx_ir.passes.common as ir_passes
import onnxscript.optimizer
import torch
from torch.export import Dim

from mha_export.attention.graphs.mask_rewrite import additive_mask
from mha_export.model.example import example_input
from mha_export.pipeline.preflight import DEFAULT_OPSET, check_opset
from mha_runtime.artifact.errors import ExportError
from mha_runtime.attention.config import MHAConfig
from mha_runtime.attention.contract import BATCH_AXIS, INPUT_NAME, OUTPUT_NAME, TOKENS_AXIS, IOContract, metadata
from mha_runtime.attention.registry import ONNX

# Masks are (context, context) bool after folding: fold tensors up to 16M elements (context 4096).
FOLD_LIMIT = 1 << 24


@contextmanager
def _quiet_torch_logs() -> Iterator[None]:
    """The exporter logs notes such as 'torchvision is not installed'; they are not the user's concern."""
    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def trace_to_onnx(module: torch.nn.Module, config: MHAConfig, *, opset: int) -> ir.Model:
    """The main contract, `x` -> `context` with symbolic `batch` and `tokens`: torch.onnx.export (dynamo), quietly,
    into an ONNX IR model (one file, no external data)."""
    x = example_input(config)  # (2, T_example, d_in): no size-1 axis, T_example < context_length
    dynamic_shapes = {"x": {0: Dim(BATCH_AXIS), 1: Dim(TOKENS_AXIS, max=config.context_length)}}
    with warnings.catch_warnings(), redirect_stdout(io.StringIO()), _quiet_torch_logs():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            module.eval(), (x,), input_names=[INPUT_NAME], output_names=[OUTPUT_NAME],
            dynamic_shapes=dynamic_shapes, dynamo=True, opset_version=check_opset(opset),
            external_data=False, verbose=False, report=False,
        )
    return program.model


def shrink(model: ir.Model) -> ir.Model:
    """Fold each head's mask Cast into one shared bool initializer (the per-head float masks are
    identical; docs/design-notes.md has what they would weigh), then turn masked_fill into an
    additive mask (exact; mask_rewrite.py beside this file says why and what it saves)."""
    ir_passes.DeduplicateInitializersPass(size_limit=FOLD_LIMIT)(model)  # 12 identical float masks -> 1
    ir_passes.CommonSubexpressionEliminationPass()(model)  # 12 identical Casts of it -> 1
    onnxscript.optimizer.fold_constants(model, input_size_limit=FOLD_LIMIT, output_size_limit=FOLD_LIMIT)
    additive_mask(model)
    ir_passes.RemoveUnusedNodesPass()(model)  # drops the float mask, leaves the bool one
    ir_passes.DeduplicateInitializersPass(size_limit=FOLD_LIMIT)(model)
    return model


# Node metadata the dynamo exporter stamps that names files of the machine that built the model (the source
# lines of every op: the checkout, the venv's site-packages). Dropped so that the bytes depend only on the
# config and weights; the op names, name scopes and module classes stay.
MACHINE_METADATA = ("pkg.torch.onnx.stack_trace",)


def check_saved(path: Path, config: MHAConfig, signature: dict[str, list[str | int]] | None = None) -> None:
    """The saved file: checker-clean, one file, and the contract's names and symbolic axes, in order."""
    proto = onnx.load(str(path), load_external_data=False)
    onnx.checker.check_model(proto, full_check=True)
    if any(t.data_location == onnx.TensorProto.EXTERNAL for t in proto.graph.initializer):
        raise ExportError(f"{path}: expected one self-contained file, found external data references")
    if signature is None:
        contract = IOContract(config)
        signature = {INPUT_NAME: contract.input_shape, OUTPUT_NAME: contract.output_shape}
    found = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
             for v in list(proto.graph.input) + list(proto.graph.output)}
    if list(found) != list(signature):
        raise ExportError(f"{path}: expected inputs/outputs {list(signature)}, got {list(found)}")
    for name, want in signature.items():
        if found[name] != want:
            raise ExportError(f"{path}: {name!r} has shape {found[name]}, expected {want} (an axis was frozen)")


def export_onnx(module: torch.nn.Module, config: MHAConfig, path: Path, *, opset: int = DEFAULT_OPSET) -> None:
    """Trace `module`, shrink the graph, drop MACHINE_METADATA from every node of every graph (subgraphs included),
    carry the config and the I/O contract in metadata_props (a runner needs nothing else), save to `path` and check
    the file."""
    model = shrink(trace_to_onnx(module, config, opset=opset))
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        for key in MACHINE_METADATA:
            node.metadata_props.pop(key, None)
    model.metadata_props.update(metadata(config))
    model.producer_name = "mha-export"
    ir.save(model, str(path))
    check_saved(path, config)


def build_onnx(wrapper: torch.nn.Module, config: MHAConfig, folder: Path, *, opset: int) -> None:
    export_onnx(wrapper, config, folder / ONNX.file, opset=opset)
