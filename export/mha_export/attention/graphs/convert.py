"""Conversions of a built graph: the fp16, int8 and ORT-format variants (declared in mha_runtime.attention.registry)."""
from __future__ import annotations

import logging
import warnings
from pathlib import Path

import onnx
import onnx_ir as ir
import onnx_ir.passes.common as ir_passes
import onnxruntime as ort
import torch

from mha_export.attention.graphs.contrib import OUT_PROJ_MATMUL
from mha_runtime.artifact.errors import ExportError
from mha_runtime.attention.config import MHAConfig
from mha_runtime.attention.contract import META_CONFIG, META_CONTRACT
from mha_runtime.attention.registry import VARIANTS


def _save_restamped(model: onnx.ModelProto, source: onnx.ModelProto, path: Path) -> None:
    """Converters drop or keep metadata unpredictably: copy the contract from the source graph, check, save."""
    meta = {p.key: p.value for p in source.metadata_props}
    del model.metadata_props[:]
    for key in (META_CONFIG, META_CONTRACT):
        model.metadata_props.add(key=key, value=meta[key])
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))


def build_fp16(wrapper: torch.nn.Module, config: MHAConfig, folder: Path, *, opset: int) -> None:
    """The fused graph with weights and compute in float16; input and output stay float32 (the contract does not
    change)."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    source = onnx.load(str(folder / VARIANTS["fused"].file))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = convert_float_to_float16(source, keep_io_types=True)
    # the converter appends its input Casts at the end of the node list: sort for the checker
    sorted_ir = ir.from_proto(model)
    ir_passes.TopologicalSortPass()(sorted_ir)
    model = ir.to_proto(sorted_ir)
    _save_restamped(model, source, folder / VARIANTS["fp16"].file)


def build_int8(wrapper: torch.nn.Module, config: MHAConfig, folder: Path, *, opset: int) -> None:
    """ONNX Runtime dynamic quantization: 8-bit weights, activations quantized per call.

    The source is the blocks graph: its Q/K/V projection becomes DynamicQuantizeLinear + MatMulInteger,
    the attention stays fp32: faster than int8 of the contrib graph (one QAttention node) and than fp32
    blocks (docs/design-notes.md).

    Weights are unsigned (QUInt8): with signed weights, x86 CPUs without VNNI saturate the u8 x s8
    products (docs/design-notes.md has the figures). The output projection stays fp32: its input, the
    attention context, loses too much to per-tensor 8-bit activations (a GPT-2 layer failed validation
    with it quantized; docs/design-notes.md has the figures).
    """
    from onnxruntime.quantization import QuantType, quantize_dynamic

    source_path, path = folder / VARIANTS["blocks"].file, folder / VARIANTS["int8"].file
    source = onnx.load(str(source_path))
    logging.disable(logging.WARNING)  # the quantizer logs a pre-processing hint to the root logger
    try:
        # contrib ops have no shape inference: tensors whose type it cannot find are float32
        quantize_dynamic(source_path, path, weight_type=QuantType.QUInt8, nodes_to_exclude=[OUT_PROJ_MATMUL],
                         extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    finally:
        logging.disable(logging.NOTSET)
    _save_restamped(onnx.load(str(path)), source, path)


def build_ort(wrapper: torch.nn.Module, config: MHAConfig, folder: Path, *, opset: int) -> None:
    """Each .ort file from the .onnx file of the same stem (mha.ort from mha.onnx, ...): ORT format for mobile and
    minimal builds, with basic (hardware-independent) optimizations only."""
    for spec in VARIANTS["ort"].artifacts:
        path = folder / spec.file
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        options.optimized_model_filepath = str(path)
        options.add_session_config_entry("session.save_model_format", "ORT")
        options.log_severity_level = 3
        ort.InferenceSession(str(path.with_suffix(".onnx")), sess_options=options, providers=["CPUExecutionProvider"])
        if not path.exists():
            raise ExportError(f"{path}: ONNX Runtime did not write the ORT-format file")
