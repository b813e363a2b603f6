"""The offsets quantizer (lossy/offsets.py): blocks with a float offset each, llama.cpp's Q4_1 layout, as
MatMulNBits plus a MatMul of the input's block sums. The reference is gguf-py's own Q4_1 (quantize and dequantize):
weights on its grid come back exactly, any other weight within half a step of its block."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
import onnxruntime as ort
import pytest
from gguf import GGMLQuantizationType, quants
from onnx import TensorProto, numpy_helper

from mha_export.decoder.lossy import offsets
from mha_export.decoder.lossy.methods import METHODS, QUANTIZERS
from mha_runtime.decoder.graph_plan import read_graph_plan
from mha_runtime.decoder.record_check import plan_problems

K, N, BLOCK = 128, 48, 32


def _model(weight: np.ndarray) -> onnx.ModelProto:
    """y (B, T, N) = x (B, T, K) @ weight, one MatMul named 'mm'."""
    graph = oh.make_graph(
        [oh.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "T", K])],
        [oh.make_tensor_value_info("y", TensorProto.FLOAT, ["B", "T", N])],
        [numpy_helper.from_array(weight.astype(np.float32), "w")])
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 20)])


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def _q4_1(weight: np.ndarray) -> np.ndarray:
    """gguf-py's Q4_1 round trip of a (K, N) weight, blocks of 32 along K (as a GGUF row runs along the input)."""
    rows = np.ascontiguousarray(weight.T)  # (N, K): GGUF blocks along a row's last axis
    back = quants.dequantize(quants.quantize(rows, GGMLQuantizationType.Q4_1), GGMLQuantizationType.Q4_1)
    return np.asarray(back, np.float32).reshape(N, K).T


def test_weights_on_the_q4_1_grid_come_back_exactly() -> None:
    rng = np.random.default_rng(0)
    weight = _q4_1(rng.standard_normal((K, N)).astype(np.float32) * 0.05 + 0.01)
    model = offsets.quantize(_model(weight), bits=4, block_size=BLOCK, symmetric=False, accuracy_level=1,
                             exclude=[])
    ops = [n.op_type for n in model.graph.node]
    assert "MatMul" in ops and ops.count("MatMulNBits") == 1  # the block-sum MatMul is the only MatMul left
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    assert inits["w_scales"].dtype == np.float16 and inits["w_mins"].dtype == np.float16
    assert inits["w_Q4"].shape == (N, K // BLOCK, BLOCK // 2) and "w" not in inits
    x = rng.standard_normal((2, 3, K)).astype(np.float32)
    want = x @ weight
    got = _run(model, x)
    # fp32 compute (accuracy_level 1): what is left is float reassociation (the block sums); a weight off its grid
    # by one step would move y by about 0.05 / 15 x |x| ~ 1e-2.
    assert np.abs(got - want).max() < 2e-6 * np.abs(want).max()


def test_any_weight_is_within_half_a_step_and_beats_integer_zero_points() -> None:
    rng = np.random.default_rng(1)
    weight = rng.standard_normal((K, N)).astype(np.float32) * 0.05 + 0.02
    model = offsets.quantize(_model(weight), bits=4, block_size=BLOCK, symmetric=False, accuracy_level=1,
                             exclude=[])
    eye = np.eye(K, dtype=np.float32)[None]  # (1, K, K): y rows are the dequantized weight's rows
    back = _run(model, eye)[0]  # (K, N)
    blocks = weight.reshape(K // BLOCK, BLOCK, N)
    step = (blocks.max(axis=1) - blocks.min(axis=1)) / 15  # (kb, N)
    err = np.abs(back - weight).reshape(K // BLOCK, BLOCK, N)
    # Half a step, plus what fp16 storage adds: the scale's rounding (2^-11 relative) times up to 15 levels (0.0073
    # of a step) and the minimum's (2^-11 of |m| <= 0.3 here, 1.5e-4).
    assert (err <= step[:, None, :] * (0.5 + 15 * 2 ** -11) + 1.5e-4).all()
    gguf_err = np.abs(_q4_1(weight) - weight)
    assert abs(float(np.sqrt((back - weight) ** 2).mean()) - float(gguf_err.mean())) < 0.05 * float(gguf_err.mean())
    integer = QUANTIZERS["matmulnbits"].quantize(_model(weight), bits=4, block_size=BLOCK, symmetric=False,
                                                 accuracy_level=1, exclude=[])
    assert np.abs(_run(integer, eye)[0] - weight).mean() > np.abs(back - weight).mean()


def test_a_symmetric_pass_and_excluded_matmuls_are_left_to_matmulnbits() -> None:
    weight = np.random.default_rng(2).standard_normal((K, N)).astype(np.float32)
    kept = offsets.quantize(_model(weight), bits=4, block_size=BLOCK, symmetric=False, accuracy_level=4,
                            exclude=["mm"])
    assert [n.op_type for n in kept.graph.node] == ["MatMul"]
    eight = offsets.quantize(_model(weight), bits=8, block_size=BLOCK, symmetric=True, accuracy_level=4, exclude=[])
    assert [n.op_type for n in eight.graph.node] == ["MatMulNBits"] and len(eight.graph.node[0].input) == 3


def test_the_int4_search_tries_the_offsets_plan_after_the_fast_one() -> None:
    method = METHODS["matmulnbits-4"]
    ranking = ["h0.fc.weight", "head.weight_t", "h1.fc.weight"]
    tried = method.plans(ranking, [0, 1])
    assert tried[1] == method.offset_plan(ranking) and tried[2] == method.fine(ranking)
    plan = tried[1]
    assert plan.quantizer == "offsets" and not plan.symmetric and plan.kept == {"head.weight_t": "int8"}
    assert "float offsets" in plan.label() and plan.to_dict()["method"] == offsets.LABEL
    assert not METHODS["matmulnbits-8"].offsets


@pytest.mark.parametrize("rows", [48])
def test_rows_no_block_divides_fall_back_to_integer_zero_points(rows: int) -> None:
    weight = np.random.default_rng(3).standard_normal((rows, N)).astype(np.float32)
    graph = oh.make_graph(
        [oh.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, rows])],
        [oh.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, N])],
        [numpy_helper.from_array(weight, "w")])
    model = offsets.quantize(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 20)]), bits=4,
                             block_size=BLOCK, symmetric=False, accuracy_level=1, exclude=[])
    node = next(n for n in model.graph.node if n.op_type == "MatMulNBits")
    assert len(node.input) == 4  # MatMulNBits' own asymmetric blocks (padded), integer zero points


def test_the_check_reads_float_offsets_from_the_graph_as_the_plan_records_them(tmp_path: Path) -> None:
    """`mha check` compares the recorded plan with the graph (runtime graph_plan.py): an offsets weight is
    MatMulNBits without zero points plus the block-sum Add, which the plan records as asymmetric; the same
    MatMulNBits with its Add taken away reads as symmetric, and the check says so."""
    rng = np.random.default_rng(4)
    model = offsets.quantize(_model(rng.standard_normal((K, N)).astype(np.float32)), bits=4, block_size=BLOCK,
                             symmetric=False, accuracy_level=4, exclude=[])
    onnx.save(model, tmp_path / "offsets.onnx")
    got = read_graph_plan(tmp_path / "offsets.onnx").quantized["w"]
    assert (got.bits, got.block_size, got.symmetric, got.float_offsets) == (4, BLOCK, False, True)
    assert "float offsets" in got.words()
    plan = METHODS["matmulnbits-4"].offset_plan(["w"]).to_dict() | {"embedding": {"dtype": "fp32"}}  # no gather
    assert plan_problems(plan, read_graph_plan(tmp_path / "offsets.onnx")) == []
    add = next(n for n in model.graph.node if n.op_type == "Add" and n.output[0] == "y")
    add.op_type = "Max"  # no longer an offset added: the graph's weight is symmetric now
    onnx.save(model, tmp_path / "no_offsets.onnx")
    problems = plan_problems(plan, read_graph_plan(tmp_path / "no_offsets.onnx"))
    assert len(problems) == 1 and "the graph has 4 bits in blocks of 32, symmetric" in problems[0]
