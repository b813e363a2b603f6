"""Exact graph rewrites for the traced mask: masked_fill as an additive mask, the scale before it.

The wrapper's `scores.masked_fill(mask, -inf) / sqrt(d_out)` exports as Where -> Div on every head.
ONNX Runtime's CPU Where is several times slower than Add (docs/design-notes.md has the profile), so:

    Where(mask, -inf, s) / c   ->   s / c + Where(mask, -inf, 0)

The additive mask `Where(mask, -inf, 0)` is computed once per distinct mask and shared by every head.
Both sides are bitwise equal for every finite score: s + 0 = s, s + (-inf) = -inf, and dividing by c
commutes with both. (They differ only if a masked score is +inf or NaN; the runner refuses non-finite
inputs.) With the Div now right after the MatMul, ONNX Runtime folds it into FusedMatMul's alpha.
"""
from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir


def _scalar(value: ir.Value | None) -> float | None:
    """The float a constant scalar value holds, or None."""
    if value is None or value.const_value is None:
        return None
    array = value.const_value.numpy()
    return float(array.reshape(-1)[0]) if array.size == 1 and array.dtype.kind == "f" else None


def _constant(graph: ir.Graph, name: str, array: np.ndarray) -> ir.Value:
    value = ir.Value(name=name, shape=ir.Shape(array.shape), type=ir.TensorType(ir.DataType.FLOAT),
                     const_value=ir.tensor(array, name=name))
    graph.register_initializer(value)
    return value


def additive_mask(model: ir.Model) -> int:
    """Rewrite every Where(mask, -inf, scores) [-> Div(c)] as described above; return how many."""
    graph = model.graph
    masks: dict[ir.Value, ir.Value] = {}  # bool mask -> its shared float additive form
    neg_inf = zero = None
    rewritten = 0
    for node in list(graph):
        if node.op_type != "Where" or node.domain != "" or _scalar(node.inputs[1]) != -math.inf:
            continue
        cond, scores = node.inputs[0], node.inputs[2]
        if scores is None or scores.const_value is not None:
            continue  # only masking computed scores is worth it
        if neg_inf is None:
            neg_inf = _constant(graph, "additive_mask_neg_inf", np.array(-np.inf, np.float32))
            zero = _constant(graph, "additive_mask_zero", np.array(0.0, np.float32))
        if cond not in masks:
            build = ir.node("Where", [cond, neg_inf, zero], name=f"additive_mask_{len(masks)}")
            graph.insert_before(node, build)
            masks[cond] = build.outputs[0]
            masks[cond].name = f"additive_mask_{len(masks) - 1}"
        users = node.outputs[0].uses()
        div = users[0].node if len(users) == 1 else None
        if (div is not None and div.op_type == "Div" and div.domain == "" and _scalar(div.inputs[1]) is not None
                and not div.outputs[0].is_graph_output()):
            scaled = ir.node("Div", [scores, div.inputs[1]], name=f"{div.name}_before_mask")
            add = ir.node("Add", [scaled.outputs[0], masks[cond]], name=f"{node.name}_additive")
            graph.insert_before(node, [scaled, add])
            div.outputs[0].replace_all_uses_with(add.outputs[0])
            graph.remove([node, div], safe=True)
        else:
            add = ir.node("Add", [scores, masks[cond]], name=f"{node.name}_additive")
            graph.insert_before(node, add)
            node.outputs[0].replace_all_uses_with(add.outputs[0])
            graph.remove(node, safe=True)
        rewritten += 1
    return rewritten
