"""Variants built from the wrapper's weights: fused, attention (opset 23), fp16, int8, ORT format, decode."""
from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path

import onnx
import onnx_ir as ir
import onnx_ir.passes.common as ir_passes
import onnxruntime as ort
import torch

from export.artifacts import DECODE_RUNTIME, ONNX_RUNTIME, ArtifactSpec
from export.blocks import export_blocks
from export.contrib import export_contrib
from export.decode import DECODE_FILE, export_decode
from export.fused import fuse
from export.onnx_export import ExportError, save_onnx, shrink, trace_to_onnx
from runtime.config import MHAConfig
from runtime.contract import META_CONFIG, META_CONTRACT

FUSED_OPSET = 18  # fp16 and ort start from this form
FUSED_SDPA = True  # measured faster than the spelled-out form at opset 18; see README's edge table
ATTENTION_OPSET = 23  # scaled_dot_product_attention becomes one ONNX Attention node

SPECS: dict[str, tuple[ArtifactSpec, ...]] = {
    "fused": (ArtifactSpec("mha.fused.onnx", "fused", ONNX_RUNTIME),),
    "attention": (ArtifactSpec("mha.attention.onnx", "attention", ONNX_RUNTIME),),
    # ONNX Runtime's own fused causal Attention op (com.microsoft): one node, dense attention.
    "contrib": (ArtifactSpec("mha.contrib.onnx", "contrib", ONNX_RUNTIME),),
    # Query blocks that skip the masked keys: the fastest fp32 form on CPU (export/blocks.py).
    "blocks": (ArtifactSpec("mha.blocks.onnx", "blocks", ONNX_RUNTIME),),
    "fp16": (ArtifactSpec("mha.fp16.onnx", "fp16", ONNX_RUNTIME),),
    "int8": (ArtifactSpec("mha.int8.onnx", "int8", ONNX_RUNTIME),),
    # The .ort files hold the same fp32 arithmetic as their sources, so they share the sources' rows.
    "ort": (ArtifactSpec("mha.ort", "onnx", ONNX_RUNTIME), ArtifactSpec("mha.fused.ort", "fused", ONNX_RUNTIME)),
    # Key/value-cache form for token-by-token generation (its own I/O: see runtime/decode.py).
    "decode": (ArtifactSpec(DECODE_FILE, "decode", DECODE_RUNTIME),),
}
ALL_VARIANTS: tuple[str, ...] = tuple(SPECS)
# Combinations people ask for that cannot be built, with the reason.
UNBUILDABLE = {
    "int8-attention": "int8 dynamic quantization of the opset-23 Attention node gives an invalid graph; "
                      "int8 is built from the blocks form (variant 'int8')",
}
# What each variant is built from (and so brings along).
NEEDS = {"fp16": "fused", "ort": "fused", "int8": "blocks"}


def parse_variants(text: str | Iterable[str]) -> tuple[str, ...]:
    """'fused,int8' -> ('fused', 'int8'); 'all' -> every variant; 'none' or '' -> (). Refuses before any work."""
    names = [n.strip() for n in (text.split(",") if isinstance(text, str) else text) if n.strip()]
    if names == ["all"]:
        return ALL_VARIANTS
    if names in ([], ["none"]):
        return ()
    for name in names:
        if name in UNBUILDABLE:
            raise ExportError(f"variant {name!r} cannot be built: {UNBUILDABLE[name]}")
        if name not in SPECS:
            raise ExportError(f"unknown variant {name!r}; choose from {', '.join(ALL_VARIANTS)}, 'all' or 'none'")
    return tuple(v for v in ALL_VARIANTS if v in names)


def variant_specs(variants: Iterable[str]) -> tuple[ArtifactSpec, ...]:
    """The artifact files the variants produce; fp16 and ort bring the fused graph, int8 the blocks graph."""
    chosen = set(variants)
    chosen |= {NEEDS[v] for v in chosen if v in NEEDS}
    return tuple(spec for name in ALL_VARIANTS if name in chosen for spec in SPECS[name])


def _restamp(model: onnx.ModelProto, source: onnx.ModelProto) -> None:
    """Converters drop or keep metadata unpredictably: copy the contract from the source graph."""
    meta = {p.key: p.value for p in source.metadata_props}
    del model.metadata_props[:]
    for key in (META_CONFIG, META_CONTRACT):
        model.metadata_props.add(key=key, value=meta[key])


def export_fused(wrapper: torch.nn.Module, config: MHAConfig, path: Path, *, sdpa: bool, opset: int) -> None:
    save_onnx(shrink(trace_to_onnx(fuse(wrapper, config, sdpa=sdpa), config, opset=opset)), path, config)


def export_fp16(fused_path: Path, path: Path) -> None:
    """Weights and compute in float16; input and output stay float32 (the contract does not change)."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    source = onnx.load(str(fused_path))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = convert_float_to_float16(source, keep_io_types=True)
    # the converter appends its input Casts at the end of the node list: sort for the checker
    sorted_ir = ir.from_proto(model)
    ir_passes.TopologicalSortPass()(sorted_ir)
    model = ir.to_proto(sorted_ir)
    _restamp(model, source)
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))


def export_int8(source_path: Path, path: Path) -> None:
    """ONNX Runtime dynamic quantization: 8-bit weights, activations quantized per call.

    The source is the blocks graph: its Q/K/V projection becomes DynamicQuantizeLinear + MatMulInteger,
    the attention stays fp32. gpt2-small, T=1024, 20 interleaved rounds: 41.6 ms, against 46.8 ms for
    int8 of the contrib graph (one QAttention node), 48.2 ms for fp32 blocks and 54.2 ms for fp32 contrib.

    Weights are unsigned (QUInt8): with signed weights, x86 CPUs without VNNI saturate the u8 x s8
    products (measured on this AVX2 machine: relative L2 error 0.28 with QInt8, 0.012 with QUInt8).
    """
    from onnxruntime.quantization import QuantType, quantize_dynamic

    source = onnx.load(str(source_path))
    logging.disable(logging.WARNING)  # the quantizer logs a pre-processing hint to the root logger
    try:
        quantize_dynamic(source_path, path, weight_type=QuantType.QUInt8)
    finally:
        logging.disable(logging.NOTSET)
    model = onnx.load(str(path))
    _restamp(model, source)
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))


def export_ort(onnx_path: Path, path: Path) -> None:
    """ORT format for mobile and minimal builds, with basic (hardware-independent) optimizations only."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.optimized_model_filepath = str(path)
    options.add_session_config_entry("session.save_model_format", "ORT")
    options.log_severity_level = 3
    ort.InferenceSession(str(onnx_path), sess_options=options, providers=["CPUExecutionProvider"])
    if not path.exists():
        raise ExportError(f"{path}: ONNX Runtime did not write the ORT-format file")


def build_variants(wrapper: torch.nn.Module, config: MHAConfig, folder: Path, variants: Iterable[str]
                   ) -> dict[str, float]:
    """Write every requested variant (and the fused graph they need) into `folder`; return seconds per file."""
    files = {spec.file for spec in variant_specs(variants)}
    f = Path(folder)
    steps: list[tuple[str, Callable[[], None]]] = [
        ("mha.fused.onnx", lambda: export_fused(wrapper, config, f / "mha.fused.onnx", sdpa=FUSED_SDPA, opset=FUSED_OPSET)),
        ("mha.attention.onnx", lambda: export_fused(wrapper, config, f / "mha.attention.onnx", sdpa=True,
                                                    opset=ATTENTION_OPSET)),
        ("mha.contrib.onnx", lambda: export_contrib(wrapper, config, f / "mha.contrib.onnx")),
        ("mha.blocks.onnx", lambda: export_blocks(wrapper, config, f / "mha.blocks.onnx")),
        ("mha.fp16.onnx", lambda: export_fp16(f / "mha.fused.onnx", f / "mha.fp16.onnx")),
        ("mha.int8.onnx", lambda: export_int8(f / "mha.blocks.onnx", f / "mha.int8.onnx")),
        (DECODE_FILE, lambda: export_decode(wrapper, config, f / DECODE_FILE)),
        ("mha.ort", lambda: export_ort(f / "mha.onnx", f / "mha.ort")),
        ("mha.fused.ort", lambda: export_ort(f / "mha.fused.onnx", f / "mha.fused.ort")),
    ]
    seconds = {}
    for file, build in steps:
        if file in files:
            start = time.perf_counter()
            build()
            seconds[file] = time.perf_counter() - start
    return seconds

