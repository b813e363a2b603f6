"""Write an ONNX model with its weights streamed from numpy, never holding a serialized copy in memory.

`onnx.save` needs the whole ModelProto (one copy of every weight) and then its serialized bytes (a second
copy). Here the model is built without initializers and the file is written field by field in protobuf's
canonical order: ModelProto fields below `graph` (7), then the graph (its nodes and name, each initializer as
TensorProto fields 1..8 plus raw_data (9) written straight from the array, then inputs, outputs and the rest),
then the fields above 7. The bytes equal `model.SerializeToString()` of the full model
(tests/decoder/test_gpt_build.py), so the export's peak memory is the weights once.
"""
from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

MODEL_GRAPH = 7  # ModelProto.graph
GRAPH_INITIALIZER = 5  # GraphProto.initializer
TENSOR_RAW_DATA = 9  # TensorProto.raw_data
LEN = 2  # wire type: length-delimited


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _key(field: int) -> bytes:
    return _varint(field << 3 | LEN)


def _tensor_head(name: str, array: np.ndarray) -> bytes:
    """TensorProto fields dims (1), data_type (2) and name (8): all but raw_data, in field order."""
    meta = onnx.TensorProto(name=name, dims=array.shape,
                            data_type=helper.np_dtype_to_tensor_dtype(array.dtype))
    return meta.SerializeToString() + _key(TENSOR_RAW_DATA) + _varint(array.nbytes)


def save_streamed(model: onnx.ModelProto, initializers: Iterable[tuple[str, np.ndarray]], path: Path) -> None:
    """`model` holds no initializers; `initializers` are (name, array) in the graph's order."""
    inits = list(initializers)
    heads = [_tensor_head(name, a) for name, a in inits]
    graph = model.graph
    before = onnx.GraphProto(node=graph.node, name=graph.name).SerializeToString()  # fields 1, 2
    after = onnx.GraphProto()
    after.CopyFrom(graph)
    after.ClearField("node")
    after.ClearField("name")
    after_bytes = after.SerializeToString()  # fields 10 and up
    entries = [len(h) + a.nbytes for h, (_, a) in zip(heads, inits, strict=True)]
    graph_len = len(before) + sum(len(_key(GRAPH_INITIALIZER)) + len(_varint(n)) + n for n in entries) \
        + len(after_bytes)
    low, high = onnx.ModelProto(), onnx.ModelProto()
    low.CopyFrom(model)
    low.ClearField("graph")
    high.opset_import.extend(low.opset_import)
    high.metadata_props.extend(low.metadata_props)
    high.functions.extend(low.functions)
    for field in ("opset_import", "metadata_props", "functions"):
        low.ClearField(field)
    with open(path, "wb") as fh:
        fh.write(low.SerializeToString())  # fields 1..6
        fh.write(_key(MODEL_GRAPH) + _varint(graph_len) + before)
        for head, (_, array), n in zip(heads, inits, entries, strict=True):
            fh.write(_key(GRAPH_INITIALIZER) + _varint(n) + head)
            contiguous = np.asarray(array, order="C")  # a transposed view is copied one tensor at a time
            fh.write(contiguous.tobytes() if contiguous.ndim == 0 else memoryview(contiguous).cast("B"))
        fh.write(after_bytes)
        fh.write(high.SerializeToString())  # fields 8 and up
