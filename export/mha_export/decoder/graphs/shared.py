"""What both decoder graphs share: the weights as initializers, the embeddings and the output head.

Graphs are written node by node with onnx.helper: every op is chosen (LayerNormalization, one MatMul for q|k|v,
the head as Gemm on the token embedding so that a tied matrix is stored once), so nothing is left to a tracer.
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
from mha_runtime.decoder.config import GPTConfig
from mha_runtime.decoder.contract import META_GPT_CONFIG, META_GPT_CONTRACT, n_inputs

OPSET = 20  # Gelu(approximate="tanh") is opset 20


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
class Layer:
    """One block's initializer names, weights as (in, out) for MatMul."""

    ln1: tuple[str, str]
    qkv: str
    qkv_bias: str | None
    out: tuple[str, str]
    ln2: tuple[str, str]
    fc: tuple[str, str]
    proj: tuple[str, str]


def add_weights(g: Graph, w: dict[str, np.ndarray], cfg: GPTConfig) -> list[Layer]:
    """Every block's weights as initializers: q|k|v fused on the output axis (all q heads, all k, all v)."""
    layers = []
    for i in range(cfg.n_layers):
        p = f"trf_blocks.{i}."
        qkv = np.concatenate([w[f"{p}att.W_{n}.weight"].T for n in ("query", "key", "value")], axis=1)  # (E, 3E)
        bias = (g.init(f"h{i}.qkv.bias", np.concatenate([w[f"{p}att.W_{n}.bias"] for n in ("query", "key", "value")]))
                if cfg.qkv_bias else None)
        layers.append(Layer(
            ln1=(g.init(f"h{i}.ln1.scale", w[f"{p}norm1.scale"]), g.init(f"h{i}.ln1.shift", w[f"{p}norm1.shift"])),
            qkv=g.init(f"h{i}.qkv.weight", qkv), qkv_bias=bias,
            out=(g.init(f"h{i}.out.weight", w[f"{p}att.out_proj.weight"].T),
                 g.init(f"h{i}.out.bias", w[f"{p}att.out_proj.bias"])),
            ln2=(g.init(f"h{i}.ln2.scale", w[f"{p}norm2.scale"]), g.init(f"h{i}.ln2.shift", w[f"{p}norm2.shift"])),
            fc=(g.init(f"h{i}.fc.weight", w[f"{p}ff.layers.0.weight"].T),
                g.init(f"h{i}.fc.bias", w[f"{p}ff.layers.0.bias"])),
            proj=(g.init(f"h{i}.proj.weight", w[f"{p}ff.layers.2.weight"].T),
                  g.init(f"h{i}.proj.bias", w[f"{p}ff.layers.2.bias"]))))
    return layers


def add_embeddings(g: Graph, w: dict[str, np.ndarray], input_ids: str, positions: str) -> str:
    """tok_emb[input_ids] + pos_emb[positions]: (B, T, E)."""
    g.init("tok_emb", w["tok_emb.weight"])  # (V, E)
    g.init("pos_emb", w["pos_emb.weight"])  # (C, E)
    return g.one("Add", [g.one("Gather", ["tok_emb", input_ids]), g.one("Gather", ["pos_emb", positions])])


def add_head(g: Graph, w: dict[str, np.ndarray], hidden: str, *, tied: bool, matmul: bool = False) -> str:
    """hidden (N, E) -> logits (N, V). Gemm with transB reads the (V, E) matrix as it is stored, so a head tied
    to tok_emb is the same initializer; `matmul` stores the head as its own (E, V) MatMul weight instead (the
    int8 form: onnxruntime's dynamic quantization covers MatMul, not Gemm)."""
    if matmul:
        return g.one("MatMul", [hidden, g.init("head.weight_t", w["out_head.weight"].T)])
    head = "tok_emb" if tied else g.init("out_head.weight", w["out_head.weight"])
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


def make_model(g: Graph, name: str, cfg: GPTConfig, kind: str, signature: dict[str, tuple[str, list[object]]], *,
               contrib: bool) -> Built:
    """The graph as the `kind` ("concat" | "inplace") model: the signature's inputs (its first n_inputs entries)
    and outputs, the config and the kind in metadata_props."""
    items = list(signature.items())
    inputs = n_inputs(kind, cfg)
    graph = oh.make_graph(g.nodes, name, [value_info(n, *t) for n, t in items[:inputs]],
                          [value_info(n, *t) for n, t in items[inputs:]])
    meta = {META_GPT_CONFIG: cfg.to_json(), META_GPT_CONTRACT: kind}
    return Built(stamped_model(graph, meta, opset=OPSET, contrib=contrib), list(g.arrays))
