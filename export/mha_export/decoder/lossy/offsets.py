"""The offsets quantizer: blocks of `bits` with a float offset each (llama.cpp's Q4_1 layout: w = d * q + m), as
com.microsoft.MatMulNBits beside a small fp32 MatMul of the input's block sums (a row of
mha_export.decoder.lossy.methods.QUANTIZERS).

Why: MatMulNBits' own zero points are integers, so an asymmetric block's minimum is rounded to its grid, and ONNX
Runtime 1.32 has no int8-compute kernel for float zero points (HQQ's fitted ones ran SmolLM2 at 3 tokens/s:
docs/measurements/smollm2.md). A block with a float offset is x . (d * (q - z) + o) = MatMulNBits(x) + o * sum(x),
summed over the block: MatMulNBits without zero points (z = 2^(bits-1)) computes the first term on its int8 kernel,
and (B, T, K / block) block sums times the (K / block, N) offsets o = m + z d the second, in fp32. d and m are
stored in fp16, as Q4_1 stores them (in fp32 they put SmolLM2's int4 file past llama.cpp's Q4_K_M); the casts and
o are constant subgraphs that ONNX Runtime folds when the session is made, before MatMulNBits packs its weights.

A weight of a pretrained model handed around as Q4_1 (SmolLM2's) is on exactly this grid: the minimum and maximum of
each dequantized block give its d and m back, and every q again. Symmetric passes (a plan's matrices kept at 8
bits) are MatMulNBits' own.
"""
from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
from onnx import TensorProto, numpy_helper

from mha_export.decoder.lossy import matmulnbits

LABEL = "MatMulNBits with a float offset per block (llama.cpp's Q4_1 layout)"  # as the manifest records it
MS = "com.microsoft"


def _blocks(weight: np.ndarray, bits: int, block: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(K, N) weight -> packed (N, K / block, block * bits / 8) uint8, fp16 scales d (N, K / block) and fp16 minimums
    m (K / block, N): w = d * q + m, q the nearest of 2^bits levels from the block's min to its max (by the stored
    d and m, so that a weight already on such a grid comes back exactly)."""
    k, n = weight.shape
    blocks = weight.astype(np.float32).reshape(k // block, block, n)  # (kb, block, N)
    low = blocks.min(axis=1).astype(np.float16)  # (kb, N)
    levels = 2 ** bits - 1
    scale = ((blocks.max(axis=1) - low.astype(np.float32)) / levels).astype(np.float16)  # (kb, N); 0: constant
    wide = scale.astype(np.float32)
    safe = np.where(wide == 0, 1.0, wide)[:, None, :]
    q = np.clip(np.rint((blocks - low.astype(np.float32)[:, None, :]) / safe), 0, levels).astype(np.uint8)
    per_byte = 8 // bits
    qt = q.transpose(2, 0, 1)  # (N, kb, block): MatMulNBits' layout, low bits first
    packed = np.zeros((n, k // block, block // per_byte), np.uint8)
    for i in range(per_byte):
        packed |= qt[..., i::per_byte] << (bits * i)
    return packed, np.ascontiguousarray(scale.T), low


def quantize(model: onnx.ModelProto, *, bits: int, block_size: int, symmetric: bool, accuracy_level: int,
             exclude: list[str]) -> onnx.ModelProto:
    """`model` with every MatMul not named in `exclude` (its weight a (K, N) initializer, K a whole number of
    blocks, its input (B, T, K)) in blocks with float offsets; a symmetric pass, or a weight whose rows no block
    divides, is MatMulNBits' own."""
    if symmetric:
        return matmulnbits.quantize(model, bits=bits, block_size=block_size, symmetric=True,
                                    accuracy_level=accuracy_level, exclude=exclude)
    inits = {t.name: t for t in model.graph.initializer}
    targets = [n for n in model.graph.node if n.op_type == "MatMul" and n.name not in exclude
               and n.input[1] in inits and inits[n.input[1]].dims[0] % block_size == 0]
    chosen = {n.name for n in targets}
    rest = [n.name for n in model.graph.node if n.op_type == "MatMul" and n.name not in exclude
            and n.name not in chosen]
    if rest:  # rows no block divides: MatMulNBits pads them, integer zero points
        keep = set(exclude) | chosen
        model = matmulnbits.quantize(model, bits=bits, block_size=block_size, symmetric=False,
                                     accuracy_level=accuracy_level, exclude=sorted(keep))
        inits = {t.name: t for t in model.graph.initializer}
    axes, zero = "offsets.sum_axes", f"offsets.zero{bits}"
    model.graph.initializer.extend([numpy_helper.from_array(np.array([-1], np.int64), axes),
                                    numpy_helper.from_array(np.array(2.0 ** (bits - 1), np.float32), zero)])
    replaced: dict[str, list[onnx.NodeProto]] = {}
    for node in targets:
        w = node.input[1]
        weight = numpy_helper.to_array(inits[w])  # (K, N)
        k, n = weight.shape
        packed, scales, mins = _blocks(weight, bits, block_size)
        model.graph.initializer.remove(inits[w])
        names = (f"{w}_Q{bits}", f"{w}_scales", f"{w}_mins", f"{w}_blocks.shape")
        model.graph.initializer.extend([
            numpy_helper.from_array(packed, names[0]), numpy_helper.from_array(scales, names[1]),
            numpy_helper.from_array(mins, names[2]),
            numpy_helper.from_array(np.array([0, 0, k // block_size, block_size], np.int64), names[3])])
        x, y, base = node.input[0], node.output[0], node.name
        replaced[node.name] = [
            oh.make_node("Cast", [names[1]], [f"{base}.scales"], name=f"{base}.cast_scales", to=TensorProto.FLOAT),
            # offsets (kb, N) = m + 2^(bits-1) d: MatMulNBits without zero points computes d (q - 2^(bits-1))
            oh.make_node("Cast", [names[2]], [f"{base}.mins"], name=f"{base}.cast_mins", to=TensorProto.FLOAT),
            oh.make_node("Transpose", [f"{base}.scales"], [f"{base}.scales_t"], name=f"{base}.scales_t"),
            oh.make_node("Mul", [f"{base}.scales_t", zero], [f"{base}.zero"], name=f"{base}.zero"),
            oh.make_node("Add", [f"{base}.mins", f"{base}.zero"], [f"{base}.offsets"], name=f"{base}.offsets"),
            oh.make_node("MatMulNBits", [x, names[0], f"{base}.scales"], [f"{base}.nbits"], name=f"{base}_Q{bits}",
                         domain=MS, K=k, N=n, bits=bits, block_size=block_size, accuracy_level=accuracy_level),
            oh.make_node("Reshape", [x, names[3]], [f"{base}.blocks"], name=f"{base}.blocks"),  # (B, T, kb, block)
            oh.make_node("ReduceSum", [f"{base}.blocks", axes], [f"{base}.sums"], name=f"{base}.sums",
                         keepdims=0),  # (B, T, kb)
            oh.make_node("MatMul", [f"{base}.sums", f"{base}.offsets"], [f"{base}.shift"], name=f"{base}.shift"),
            oh.make_node("Add", [f"{base}.nbits", f"{base}.shift"], [y], name=f"{base}.add")]  # (B, T, N)
    nodes = [m for node in model.graph.node for m in replaced.get(node.name, [node])]
    model.graph.ClearField("node")
    model.graph.node.extend(nodes)
    if not any(o.domain == MS for o in model.opset_import):
        model.opset_import.append(oh.make_opsetid(MS, 1))
    return model
