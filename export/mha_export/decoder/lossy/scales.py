"""Block scales in fp16, as llama.cpp stores its d (a plan's `scales`, which the architecture picks: its
LOSSY_SCALES): 8-bit symmetric blocks rounded as llama.cpp's Q8_0 rounds (d = max |w| / 127 in fp32, q = round(w /
d) in [-127, 127], d stored in fp16) as MatMulNBits' own 8-bit blocks (q + 128, no zero points); every other fp32
scales initializer that a MatMulNBits or the embedding's GatherBlockQuantized reads stored in fp16 too. Each is an
fp16 initializer and a Cast back to fp32 under the name its readers read, first in the graph: a constant subgraph
ONNX Runtime folds when the session is made, before MatMulNBits packs its weights (as offsets.py stores d and m),
so a tied embedding's lookup and the head still share one initializer.

Why: fp32 scales cost 1 bit a weight in blocks of 32, so an 8-bit matrix was 9 bits a weight where Q8_0 is 8.5; on a
model whose tied embedding is most of its weights (Gemma 3 270M: 168M of 268M) that put the int8 file past Q8_0's.
And onnxruntime's 8-bit symmetric blocks divide by -128 (q in [-128, 127]), so a weight handed around as Q8_0 (Gemma
3 270M's embedding) came back rounded again; these blocks give it back exactly (docs/measurements/gemma3.md).
"""
from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
from onnx import TensorProto, numpy_helper

from mha_export.decoder.lossy import matmulnbits

FP16 = "fp16"
READERS = ("MatMulNBits", "GatherBlockQuantized")  # each reads its scales as input 2
SUFFIX = ".fp16"
MS = "com.microsoft"


def q8_blocks(weight: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """(K, N) weight -> MatMulNBits' (N, K / block, block) uint8 q + 128 and the (N, K / block) fp16 d, as
    ggml's quantize_row_q8_0_ref rounds (by the fp32 d, before it is stored in fp16)."""
    k, n = weight.shape
    blocks = weight.astype(np.float32).reshape(k // block, block, n)  # (kb, block, N)
    d = np.abs(blocks).max(axis=1) / 127  # (kb, N)
    inverse = np.where(d == 0, 0, 1 / np.where(d == 0, 1, d))
    q = np.rint(blocks * inverse[:, None, :]).astype(np.int16)  # (kb, block, N) in [-127, 127]
    packed = (q + 128).astype(np.uint8).transpose(2, 0, 1)  # (N, kb, block)
    return np.ascontiguousarray(packed), np.ascontiguousarray(d.astype(np.float16).T)


def quantize(model: onnx.ModelProto, *, bits: int, block_size: int, symmetric: bool, accuracy_level: int,
             exclude: list[str]) -> onnx.ModelProto:
    """An 8-bit symmetric pass in Q8_0's blocks (every MatMul not in `exclude` whose rows a block divides);
    anything else, and rows no block divides, is MatMulNBits' own (its scales halved later: half_scales)."""
    if bits != 8 or not symmetric:
        return matmulnbits.quantize(model, bits=bits, block_size=block_size, symmetric=symmetric,
                                    accuracy_level=accuracy_level, exclude=exclude)
    inits = {t.name: t for t in model.graph.initializer}
    targets = {n.name for n in model.graph.node if n.op_type == "MatMul" and n.name not in exclude
               and n.input[1] in inits and inits[n.input[1]].dims[0] % block_size == 0}
    rest = [n.name for n in model.graph.node if n.op_type == "MatMul" and n.name not in exclude
            and n.name not in targets]
    if rest:
        model = matmulnbits.quantize(model, bits=8, block_size=block_size, symmetric=True,
                                     accuracy_level=accuracy_level, exclude=sorted(set(exclude) | targets))
        inits = {t.name: t for t in model.graph.initializer}
    casts, nodes = [], []
    for node in model.graph.node:
        if node.name not in targets:
            nodes.append(node)
            continue
        w = node.input[1]
        weight = numpy_helper.to_array(inits[w])  # (K, N)
        k, n = weight.shape
        packed, d = q8_blocks(weight, block_size)
        model.graph.initializer.remove(inits[w])
        model.graph.initializer.extend([numpy_helper.from_array(packed, f"{w}_Q8"),
                                        numpy_helper.from_array(d, f"{w}_scales{SUFFIX}")])
        casts.append(oh.make_node("Cast", [f"{w}_scales{SUFFIX}"], [f"{w}_scales"], name=f"{w}_scales.cast",
                                  to=TensorProto.FLOAT))
        nodes.append(oh.make_node("MatMulNBits", [node.input[0], f"{w}_Q8", f"{w}_scales"], list(node.output),
                                  name=f"{node.name}_Q8", domain=MS, K=k, N=n, bits=8, block_size=block_size,
                                  accuracy_level=accuracy_level))
    model.graph.ClearField("node")
    model.graph.node.extend([*casts, *nodes])
    if not any(o.domain == MS for o in model.opset_import):
        model.opset_import.append(oh.make_opsetid(MS, 1))
    return model


def half_scales(model: onnx.ModelProto) -> int:
    """Every fp32 scales initializer a MatMulNBits or GatherBlockQuantized reads stored in fp16, a Cast to its
    name first in the graph (module docstring), in place; returns how many were."""
    inits = {t.name: t for t in model.graph.initializer}
    names = sorted({n.input[2] for n in model.graph.node if n.op_type in READERS and len(n.input) > 2
                    and n.input[2] in inits and inits[n.input[2]].data_type == TensorProto.FLOAT})
    casts = []
    for name in names:
        array = numpy_helper.to_array(inits[name])  # (N, K / block) or (V, E / block)
        model.graph.initializer.remove(inits[name])
        model.graph.initializer.append(numpy_helper.from_array(array.astype(np.float16), name + SUFFIX))
        casts.append(oh.make_node("Cast", [name + SUFFIX], [name], name=name + ".cast", to=TensorProto.FLOAT))
    nodes = [*casts, *model.graph.node]
    model.graph.ClearField("node")
    model.graph.node.extend(nodes)
    return len(names)
