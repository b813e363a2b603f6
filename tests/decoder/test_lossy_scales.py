"""Block scales in fp16 (lossy/scales.py, a plan's `scales`): 8-bit blocks as llama.cpp's Q8_0 rounds them (gguf-py's
own Q8_0 is the reference: the weights come back exactly), every other scale in fp16 behind a Cast ONNX Runtime
folds, and the architecture's choice: the GPT-2 folders' plans and manifests as they were."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
import onnxruntime as ort
import pytest
from gguf import GGMLQuantizationType, quants
from onnx import TensorProto, numpy_helper

from mha_export.decoder.archs import arch_named
from mha_export.decoder.archs.gpt2.config import GPTConfig
from mha_export.decoder.eager import seeded_gpt
from mha_export.decoder.lossy import matmulnbits, scales
from mha_export.decoder.lossy.methods import HEAD, METHODS
from mha_export.decoder.lossy.quantize import fit, lossy_source, quantize_to

K, N, BLOCK = 128, 48, 32
CFG = GPTConfig(vocab_size=211, context_length=32, emb_dim=64, n_heads=4, n_layers=2, qkv_bias=True)


def _model(weight: np.ndarray) -> onnx.ModelProto:
    """y (B, T, N) = x (B, T, K) @ weight, one MatMul named 'mm'."""
    graph = oh.make_graph(
        [oh.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "T", K])],
        [oh.make_tensor_value_info("y", TensorProto.FLOAT, ["B", "T", N])],
        [numpy_helper.from_array(weight.astype(np.float32), "w")])
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 20)])


def _rows(model: onnx.ModelProto) -> np.ndarray:
    """The (K, N) weight the model computes with: its output for the identity (fp32 compute, accuracy level 1)."""
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": np.eye(K, dtype=np.float32)[None]})[0][0]


def _q8_0(weight: np.ndarray) -> np.ndarray:
    """gguf-py's Q8_0 round trip of a (K, N) weight, blocks of 32 along K (a GGUF row runs along the input)."""
    rows = np.ascontiguousarray(weight.T)
    back = quants.dequantize(quants.quantize(rows, GGMLQuantizationType.Q8_0), GGMLQuantizationType.Q8_0)
    return np.asarray(back, np.float32).reshape(N, K).T


@pytest.mark.parametrize("scale", [0.05, 3.0])
def test_8_bit_blocks_are_gguf_pys_q8_0_exactly(scale: float) -> None:
    weight = np.random.default_rng(0).standard_normal((K, N)).astype(np.float32) * scale
    model = scales.quantize(_model(weight), bits=8, block_size=BLOCK, symmetric=True, accuracy_level=1, exclude=[])
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    assert inits["w_scales.fp16"].dtype == np.float16 and inits["w_Q8"].shape == (N, K // BLOCK, BLOCK)
    assert [n.op_type for n in model.graph.node] == ["Cast", "MatMulNBits"]
    want = _q8_0(weight)
    assert np.array_equal(_rows(model), want)
    # a weight already on the Q8_0 grid (Gemma 3 270M's embedding) stays on it; onnxruntime's own 8-bit blocks
    # (scale max / -128, q in [-128, 127]) round it again
    again = scales.quantize(_model(want), bits=8, block_size=BLOCK, symmetric=True, accuracy_level=1, exclude=[])
    assert np.array_equal(_rows(again), want)
    theirs = matmulnbits.quantize(_model(want), bits=8, block_size=BLOCK, symmetric=True, accuracy_level=1,
                                  exclude=[])
    assert not np.array_equal(_rows(theirs), want)


def test_other_scales_are_halved_behind_a_cast_and_compute_as_fp16_values() -> None:
    weight = np.random.default_rng(1).standard_normal((K, N)).astype(np.float32) * 0.05
    model = matmulnbits.quantize(_model(weight), bits=4, block_size=BLOCK, symmetric=False, accuracy_level=1,
                                 exclude=[])
    before = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    assert before["w_scales"].dtype == np.float32
    rounded = onnx.ModelProto()
    rounded.CopyFrom(model)
    for t in rounded.graph.initializer:  # the same scales, rounded to fp16 and stored in fp32
        if t.name == "w_scales":
            t.CopyFrom(numpy_helper.from_array(before["w_scales"].astype(np.float16).astype(np.float32), t.name))
    assert scales.half_scales(model) == 1
    after = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    assert "w_scales" not in after and after["w_scales.fp16"].dtype == np.float16
    assert np.array_equal(_rows(model), _rows(rounded))


def test_the_architecture_picks_the_storage_and_fp32_plans_record_as_before(tmp_path: Path) -> None:
    assert {arch_named(a).LOSSY_SCALES for a in ("gemma3", "llama", "qwen3")} == {scales.FP16}
    assert arch_named("gpt2").LOSSY_SCALES == "fp32"  # GPT-2's lossy files as they were
    plan = METHODS["matmulnbits-8"].fine()
    assert "scales" not in plan.to_dict() and replace(plan, scales="fp16").to_dict()["scales"] == "fp16"
    state = {k: v for k, v in seeded_gpt(CFG).state_dict().items() if not k.endswith(".mask")}
    sizes = {}
    for stored in ("fp32", "fp16"):
        source = lossy_source(state, CFG, tied=True)
        half = fit(replace(plan, scales=stored), source, tied=True)
        quantize_to(source, tmp_path / f"{stored}.onnx", half, tied=True)
        sizes[stored] = (tmp_path / f"{stored}.onnx").stat().st_size
    model = onnx.load(str(tmp_path / "fp16.onnx"))
    inits = {t.name: t for t in model.graph.initializer}
    readers = [n for n in model.graph.node if n.op_type in scales.READERS]
    assert readers and all(n.input[2] not in inits for n in readers)  # every scale is a Cast's output
    gather = next(n for n in readers if n.op_type == "GatherBlockQuantized")
    head = next(n for n in readers if n.op_type == "MatMulNBits" and n.input[1].startswith(f"{HEAD}_Q"))
    assert gather.input[2] == head.input[2]  # the tied embedding still reads the head's scales
    weights = sum(int(np.prod(t.dims)) for t in model.graph.initializer if t.name.endswith("_Q8"))
    # a scale per block of 32 bytes: 4 bytes each in fp32, 2 in fp16; the Casts cost about 100 bytes a matrix
    casts = sum(n.op_type == "Cast" for n in model.graph.node)
    assert 2 * weights / 32 - 150 * casts < sizes["fp32"] - sizes["fp16"] < 2 * weights / 32
    ort.InferenceSession(str(tmp_path / "fp16.onnx"), providers=["CPUExecutionProvider"])
