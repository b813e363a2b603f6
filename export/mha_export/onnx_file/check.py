"""onnx.checker over a decoder graph without its weights' bytes.

`onnx.checker.check_model(path)` reads the file and parses it: two copies of a 650 MB model at once (measured
+1.2 GiB on GPT_CONFIG_124M, the export's peak). The checker's subject is the graph (nodes in order, every input
defined, schemas, attributes, opsets, names), so it is given the graph with each initializer as a stub of the
same name, type and shape whose data is "in memory" (an external location starting with '#', onnx's convention
for initializers kept outside the proto: `onnx.model_container`, which the checker leaves unread). The bytes
themselves are proven elsewhere: the streamed writer equals `onnx.save` byte for byte (tests/decoder/test_gpt_build.py)
and every file is validated numerically by ONNX Runtime against the eager model.
"""
from __future__ import annotations

from collections.abc import Iterable

import onnx
from onnx import TensorProto


def _stub(name: str, dims: Iterable[int], data_type: int) -> TensorProto:
    tensor = TensorProto(name=name, dims=list(dims), data_type=data_type, data_location=TensorProto.EXTERNAL)
    tensor.external_data.add(key="location", value=f"#{name}")
    return tensor


def check_without_weights(model: onnx.ModelProto, initializers: Iterable[tuple[str, list[int], int]]) -> None:
    """Check `model` (its own initializers are not read) with `initializers` (name, dims, data type) as stubs."""
    graph = model.graph
    light_graph = onnx.GraphProto(name=graph.name, node=graph.node, input=graph.input, output=graph.output,
                                  value_info=graph.value_info, doc_string=graph.doc_string,
                                  initializer=[_stub(*i) for i in initializers])
    light = onnx.ModelProto(ir_version=model.ir_version, opset_import=model.opset_import,
                            producer_name=model.producer_name, producer_version=model.producer_version,
                            domain=model.domain, model_version=model.model_version,
                            metadata_props=model.metadata_props, graph=light_graph)
    onnx.checker.check_model(light)


def check_model_light(model: onnx.ModelProto) -> None:
    """check_without_weights with `model`'s own initializers as the stubs (for a model held whole in memory)."""
    check_without_weights(model, ((t.name, list(t.dims), t.data_type) for t in model.graph.initializer))
