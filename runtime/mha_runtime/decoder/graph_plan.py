"""How a lossy ONNX form is quantized, read from the graph itself (torch-free, without the `onnx` package).

`mha inspect` prints this, not the manifest's recorded plan, and `mha check` fails when the recorded plan
(bits, block_size, symmetric, accuracy_level, kept, finer) disagrees with it: the manifest is re-sealable by
anyone, the graph is what ONNX Runtime runs.

The ONNX file is read as protobuf wire format by hand (a varint reader and a field walker, below): only the few
fields needed are decoded and every other field, the weights' bytes included, is skipped by its length. The
field numbers are onnx.proto's: ModelProto.graph = 7; GraphProto.node = 1, initializer = 5; NodeProto input = 1,
output = 2, name = 3, op_type = 4, attribute = 5, domain = 7; AttributeProto name = 1, i = 3; TensorProto
name = 8. The file is memory-mapped, so a large model is not read into memory to be skipped.
"""
from __future__ import annotations

import mmap
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mha_runtime.artifact.errors import ArtifactError

MATMUL_NBITS = "MatMulNBits"
GATHER_QUANTIZED = "GatherBlockQuantized"  # a quantized embedding gather: its weights are input 0
# onnxruntime's quantizer names a quantized weight after the fp32 one: `<name>_Q<bits>`.
_SUFFIX = re.compile(r"_Q\d+$")
_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5


@dataclass(frozen=True)
class Quantized:
    """One weight as the graph quantizes it."""

    op: str  # MatMulNBits | GatherBlockQuantized
    bits: int
    block_size: int
    symmetric: bool  # no zero points input, and no float offsets added
    accuracy_level: int | None  # MatMulNBits only
    # MatMulNBits without zero points whose output gets the input's block sums times a float offset per block added
    # (the export's offsets quantizer, llama.cpp's Q4_1 layout): asymmetric, with offsets that are not integers.
    # Words only: a plan records such a weight as asymmetric, so equality leaves this out.
    float_offsets: bool = field(default=False, compare=False)

    def words(self) -> str:
        sym = "symmetric" if self.symmetric else "float offsets" if self.float_offsets else "asymmetric"
        return f"{self.bits} bits in blocks of {self.block_size}, {sym}"


@dataclass(frozen=True)
class GraphPlan:
    """Every quantized weight (its fp32 name -> how) and the MatMul weights the graph keeps at fp32."""

    quantized: dict[str, Quantized]
    fp32: list[str]

    def line(self) -> str:
        """The plan in words, as `mha inspect` prints it: each setting with its weights (named when few)."""
        groups: dict[Quantized, list[str]] = {}
        for name, q in self.quantized.items():
            groups.setdefault(q, []).append(name)
        parts = []
        for q, names in sorted(groups.items(), key=lambda item: -len(item[1])):
            level = "" if q.accuracy_level is None else f", accuracy level {q.accuracy_level}"
            who = ", ".join(names) if len(names) <= 3 else f"{len(names)} weights"
            parts.append(f"{q.op} {q.words()}{level}: {who}")
        fp32 = ", ".join(self.fp32) if len(self.fp32) <= 3 else f"{len(self.fp32)} weights"
        return f"from the graph: {'; '.join(parts) or 'nothing quantized'}; MatMul kept at fp32: {fp32 or 'none'}"


def _varint(buf: memoryview, at: int) -> tuple[int, int]:
    """The unsigned varint at `at` -> (value, the offset after it)."""
    value = shift = 0
    while True:
        if at >= len(buf) or shift > 63:
            raise ValueError("a varint runs past its message")
        byte = buf[at]
        value |= (byte & 0x7F) << shift
        at, shift = at + 1, shift + 7
        if byte < 0x80:
            return value, at


def _fields(buf: memoryview) -> Iterator[tuple[int, int, Any]]:
    """(field number, wire type, value) of each field of one message: an int for a varint, a memoryview of the
    bytes for a length-delimited field; fixed-width fields are skipped with their bytes."""
    at = 0
    while at < len(buf):
        key, at = _varint(buf, at)
        number, wire = key >> 3, key & 7
        if wire == _VARINT:
            value, at = _varint(buf, at)
            yield number, wire, value
        elif wire == _LEN:
            size, at = _varint(buf, at)
            if at + size > len(buf):
                raise ValueError("a field runs past its message")
            yield number, wire, buf[at:at + size]
            at += size
        elif wire in (_I64, _I32):
            at += 8 if wire == _I64 else 4
        else:
            raise ValueError(f"wire type {wire} of field {number} is not protobuf's")


def _text(value: memoryview) -> str:
    return bytes(value).decode("utf-8", errors="replace")


def _signed(value: int) -> int:
    """An int64 written as a varint (two's complement over 64 bits)."""
    return value - (1 << 64) if value >= 1 << 63 else value


def _node(buf: memoryview) -> tuple[str, list[str], list[str], dict[str, int]]:
    """(op_type, inputs, outputs, integer attributes) of a NodeProto."""
    op, inputs, outputs, attrs = "", [], [], {}
    for number, wire, value in _fields(buf):
        if number == 4 and wire == _LEN:
            op = _text(value)
        elif number == 1 and wire == _LEN:
            inputs.append(_text(value))
        elif number == 2 and wire == _LEN:
            outputs.append(_text(value))
        elif number == 5 and wire == _LEN:
            name, i = "", None
            for n, w, v in _fields(value):
                if n == 1 and w == _LEN:
                    name = _text(v)
                elif n == 3 and w == _VARINT:
                    i = _signed(v)
            if i is not None:
                attrs[name] = i
    return op, inputs, outputs, attrs


def _offset_outputs(nodes: list[tuple[str, list[str], list[str], dict[str, int]]]) -> set[str]:
    """The tensors that get a float offset per block added: one input of an Add whose other input is a MatMul of
    a ReduceSum's output (block sums (B, T, K / block) times offsets (K / block, N))."""
    made_by = {out: (op, inputs) for op, inputs, outputs, _ in nodes for out in outputs}

    def shift(name: str) -> bool:
        op, inputs = made_by.get(name, ("", []))
        return op == "MatMul" and bool(inputs) and made_by.get(inputs[0], ("", []))[0] == "ReduceSum"

    return {a if shift(b) else b for op, inputs, _, _ in nodes if op == "Add" and len(inputs) == 2
            for a, b in [inputs] if shift(a) or shift(b)}


def _graph(buf: memoryview) -> GraphPlan:
    nodes, initializers = [], set()
    for number, wire, value in _fields(buf):
        if number == 1 and wire == _LEN:
            nodes.append(_node(value))
        elif number == 5 and wire == _LEN:
            initializers |= {_text(v) for n, w, v in _fields(value) if n == 8 and w == _LEN}
    quantized, fp32 = {}, []
    shifted = _offset_outputs(nodes)
    for op, inputs, outputs, attrs in nodes:
        at = {MATMUL_NBITS: 1, GATHER_QUANTIZED: 0}.get(op)
        if at is not None and len(inputs) > at:
            offsets = op == MATMUL_NBITS and bool(outputs) and outputs[0] in shifted
            symmetric = (len(inputs) < 4 or not inputs[3]) and not offsets  # zero_points: input 3 of both ops
            quantized[_SUFFIX.sub("", inputs[at])] = Quantized(
                op, attrs.get("bits", 4), attrs.get("block_size", 128), symmetric,  # the ops' defaults
                attrs.get("accuracy_level", 0) if op == MATMUL_NBITS else None, offsets)
        elif op == "MatMul" and len(inputs) > 1 and inputs[1] in initializers:
            fp32.append(inputs[1])
    return GraphPlan(quantized, fp32)


def read_graph_plan(path: Path) -> GraphPlan:
    """The quantization of the ONNX file at `path`, from its graph (ArtifactError when it is not an ONNX model)."""
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            view = memoryview(mapped)
            try:
                graphs = [v for n, w, v in _fields(view) if n == 7 and w == _LEN]
                if len(graphs) != 1:
                    raise ValueError(f"expected one graph, found {len(graphs)}")
                plan = _graph(graphs[0])
                del graphs
            finally:
                view.release()
    except (ValueError, OSError) as exc:
        raise ArtifactError(f"{path}: expected an ONNX model ({exc})") from None
    return plan
