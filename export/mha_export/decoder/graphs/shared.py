"""What both decoder graphs share: the Graph being written, the names an architecture's pieces and the builders
agree on (Linear, Layer, the token embedding), projections, the output head and the model's stamp.

Graphs are written node by node with onnx.helper: every op is chosen (one MatMul for q|k|v, the head as Gemm on the
token embedding so that a tied matrix is stored once; the architecture's pieces choose theirs: archs/protocol.py),
so nothing is left to a tracer.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
import torch
from onnx import numpy_helper

from mha_export.attention.graphs.contrib import stamped_model
from mha_export.decoder.archs.protocol import DecoderConfig, Pieces
from mha_runtime.decoder.contract import META_GPT_CONFIG, META_GPT_CONTRACT, n_inputs

OPSET = 20  # Gelu(approximate="tanh") is opset 20
MS = "com.microsoft"
# The token embedding's (V, E) initializer in every graph: the lossy forms find its Gather by this name
# (lossy/embedding.py), and a tied head reads it. The book's models all call it tok_emb; the head out_head.
TOKENS = "tok_emb"
HEAD_KEY = "out_head.weight"  # the head's key in the book's state_dict
HEAD_MATMUL = "head.weight_t"  # the head as its own (E, V) MatMul weight: add_head's `matmul` (int8 quantizes it)


@dataclass
class Graph:
    """Nodes and initializers being written; `name` gives each intermediate a unique, readable name."""

    nodes: list[onnx.NodeProto] = field(default_factory=list)
    arrays: list[tuple[str, np.ndarray]] = field(default_factory=list)  # initializers, kept as (views of) arrays
    _count: int = 0

    def init(self, name: str, array: np.ndarray) -> str:
        self.arrays.append((name, array))
        return name

    def i64(self, name: str, values: list[int] | int) -> str:
        return self.init(name, np.array(values, np.int64))

    def op(self, op_type: str, inputs: list[str], *, outputs: int = 1, out: list[str] | None = None,
           domain: str | None = None, **attrs: object) -> list[str]:
        """Add a node; return its output names (fresh names unless `out` gives them)."""
        if out is None:
            self._count += 1
            out = [f"{op_type.lower()}_{self._count}" + (f"_{k}" if outputs > 1 else "") for k in range(outputs)]
        self.nodes.append(oh.make_node(op_type, inputs, out, name=f"{op_type}_{len(self.nodes)}", domain=domain,
                                       **attrs))
        return out

    def one(self, op_type: str, inputs: list[str], **kw: object) -> str:
        return self.op(op_type, inputs, **kw)[0]


def numpy_state(state: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    return {k: v.detach().to(torch.float32).numpy() for k, v in state.items()}


@dataclass(frozen=True)
class Linear:
    """A projection's initializers: its weight (in, out) for MatMul and its bias (None without one)."""

    weight: str
    bias: str | None = None


# A projection's MatMul output and its bias, not yet added: the in-place form folds the bias into the op that
# follows (SkipLayerNormalization, FastGelu), the portable form adds it (add_bias).
Projected = tuple[str, str | None]


@dataclass(frozen=True)
class Layer:
    """One block's initializer names, as an architecture's pieces made them (Pieces.add_weights)."""

    norm1: tuple[str, ...]  # the norm before attention: its parameters
    qkv: Linear  # q|k|v fused on the output axis: (E, (H + 2K) * D)
    out: Linear  # (H * D, E)
    norm2: tuple[str, ...]  # the norm before the MLP
    mlp: tuple[Linear, ...]  # the MLP's projections, in the architecture's order
    extra: tuple[str, ...] = ()  # anything else its pieces read (a q/k norm's parameters)
    # A local layer's sliding window: it sees the last `window` positions, its own included (None: all of them).
    window: int | None = None
    post_attention: tuple[str, ...] = ()  # a norm of the attention's output before the residual add (Gemma's)


def project(g: Graph, x: str, linear: Linear) -> Projected:
    """x @ weight, the bias left to the caller."""
    return g.one("MatMul", [x, linear.weight]), linear.bias


def add_bias(g: Graph, projected: Projected) -> str:
    out, bias = projected
    return out if bias is None else g.one("Add", [out, bias])


def attended(g: Graph, arch: Pieces, context: str, layer: Layer) -> Projected:
    """The out projection of the attention's context (B, T, H * D), normed where the layer has a post-attention
    norm (its bias then added before the norm)."""
    out = project(g, context, layer.out)
    return out if not layer.post_attention else (arch.norm(add_bias(g, out), layer.post_attention), None)


def add_head(g: Graph, w: dict[str, np.ndarray], hidden: str, *, tied: bool, matmul: bool = False) -> str:
    """hidden (N, E) -> logits (N, V). Gemm with transB reads the (V, E) matrix as it is stored, so a head tied
    to the token embedding (TOKENS) is the same initializer; `matmul` stores the head as its own (E, V) MatMul
    weight instead (the int8 form: onnxruntime's dynamic quantization covers MatMul, not Gemm)."""
    if matmul:
        return g.one("MatMul", [hidden, g.init(HEAD_MATMUL, w[HEAD_KEY].T)])
    head = TOKENS if tied else g.init(HEAD_KEY, w[HEAD_KEY])
    return g.one("Gemm", [hidden, head], transB=1)


def value_info(name: str, dtype: str, shape: list[object]) -> onnx.ValueInfoProto:
    return oh.make_tensor_value_info(name, oh.np_dtype_to_tensor_dtype(np.dtype(dtype)), shape)


@dataclass(frozen=True)
class Built:
    """A model without its initializers, and the initializers as arrays: save() streams them to the file,
    full() makes the whole ModelProto (for the quantizer and for inspection)."""

    model: onnx.ModelProto
    arrays: list[tuple[str, np.ndarray]]

    def full(self) -> onnx.ModelProto:
        model = onnx.ModelProto()
        model.CopyFrom(self.model)
        # np.asarray keeps a scalar 0-d (ascontiguousarray would make it (1,)); Range takes scalars.
        model.graph.initializer.extend(numpy_helper.from_array(np.asarray(a, order="C"), n) for n, a in self.arrays)
        return model

    def save(self, path: Path) -> None:
        from mha_export.onnx_file.save import save_streamed

        save_streamed(self.model, self.arrays, path)

    def check(self) -> None:
        """onnx.checker on the graph, the initializers as stubs of their names, types and shapes (check.py)."""
        from mha_export.onnx_file.check import check_without_weights

        check_without_weights(self.model, ((n, list(np.shape(a)), oh.np_dtype_to_tensor_dtype(np.asarray(a).dtype))
                                           for n, a in self.arrays))


def make_model(g: Graph, name: str, cfg: DecoderConfig, kind: str, signature: dict[str, tuple[str, list[object]]], *,
               contrib: bool) -> Built:
    """The graph as the `kind` ("concat" | "inplace") model: the signature's inputs (its first n_inputs entries)
    and outputs, the config and the kind in metadata_props."""
    items = list(signature.items())
    inputs = n_inputs(kind, cfg)
    graph = oh.make_graph(g.nodes, name, [value_info(n, *t) for n, t in items[:inputs]],
                          [value_info(n, *t) for n, t in items[inputs:]])
    meta = {META_GPT_CONFIG: cfg.to_json(), META_GPT_CONTRACT: kind}
    return Built(stamped_model(graph, meta, opset=OPSET, contrib=contrib), list(g.arrays))
