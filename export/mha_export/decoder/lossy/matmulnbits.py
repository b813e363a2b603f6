"""The MatMulNBits quantizer: onnxruntime's MatMulNBitsQuantizer turns each MatMul it is given into
com.microsoft.MatMulNBits, blocks along the input axis (a row of mha_export.decoder.lossy.methods.QUANTIZERS)."""
from __future__ import annotations

import onnx

LABEL = "MatMulNBits (onnxruntime MatMulNBitsQuantizer)"  # as the manifest's quantization plan records it


def quantize(model: onnx.ModelProto, *, bits: int, block_size: int, symmetric: bool, accuracy_level: int,
             exclude: list[str]) -> onnx.ModelProto:
    """`model` with every MatMul not named in `exclude` quantized to `bits` in blocks of `block_size` (its weights
    replaced in place)."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    quantizer = MatMulNBitsQuantizer(model, bits=bits, block_size=block_size, is_symmetric=symmetric,
                                     accuracy_level=accuracy_level, nodes_to_exclude=exclude)
    quantizer.process()
    out: onnx.ModelProto = quantizer.model.model
    return out
