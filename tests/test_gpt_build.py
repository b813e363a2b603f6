"""The streamed writer (export/mha_export/gpt/stream_save.py) writes exactly protobuf's own serialization."""
from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

from mha_export.gpt.concat import concat_model
from mha_export.gpt.eager import seeded_gpt
from mha_export.gpt.inplace import inplace_model
from mha_export.gpt.quantize import ACCURACY_LEVEL, BITS, BLOCK, int8_source, quantize_to
from mha_runtime.gpt.config import GPTConfig

CFG = GPTConfig(vocab_size=97, context_length=16, emb_dim=16, n_heads=2, n_layers=2, qkv_bias=True)


def test_streamed_files_equal_onnx_save(tmp_path: Path) -> None:
    state = {k: v for k, v in seeded_gpt(CFG).state_dict().items() if not k.endswith(".mask")}
    for name, built in (("concat", concat_model(state, CFG, tied=False)),
                        ("inplace", inplace_model(state, CFG, tied=True))):
        built.save(tmp_path / f"{name}.onnx")
        onnx.save(built.full(), str(tmp_path / f"{name}.ref.onnx"))
        assert (tmp_path / f"{name}.onnx").read_bytes() == (tmp_path / f"{name}.ref.onnx").read_bytes(), name
        onnx.checker.check_model(str(tmp_path / f"{name}.onnx"))


def test_int8_file_equals_onnx_save_of_the_quantized_model(tmp_path: Path) -> None:
    """quantize_to streams the quantized model (its serialized copy was the export's peak): the same bytes."""
    state = {k: v for k, v in seeded_gpt(CFG).state_dict().items() if not k.endswith(".mask")}
    quantize_to(int8_source(state, CFG, tied=False), tmp_path / "int8.onnx")
    reference = int8_source(state, CFG, tied=False)
    quantizer = MatMulNBitsQuantizer(reference, bits=BITS, block_size=BLOCK, is_symmetric=True,
                                     accuracy_level=ACCURACY_LEVEL)
    quantizer.process()
    onnx.save(quantizer.model.model, str(tmp_path / "int8.ref.onnx"))
    assert (tmp_path / "int8.onnx").read_bytes() == (tmp_path / "int8.ref.onnx").read_bytes()
    assert any(n.op_type == "MatMulNBits" for n in onnx.load(str(tmp_path / "int8.onnx")).graph.node)


def test_the_weightless_check_still_checks_the_graph() -> None:
    """check.py gives the checker stubs for the weights; a broken graph is still refused."""
    state = {k: v for k, v in seeded_gpt(CFG).state_dict().items() if not k.endswith(".mask")}
    built = inplace_model(state, CFG, tied=True)
    built.check()  # the sound graph passes
    for breakage in ("undefined input", "unknown op", "missing weight"):
        broken = inplace_model(state, CFG, tied=True)
        node = next(n for n in broken.model.graph.node if n.op_type == "MatMul")
        if breakage == "undefined input":
            node.input[0] = "nowhere"
        elif breakage == "unknown op":
            node.op_type = "NoSuchOp"
        else:
            broken.arrays.pop(next(i for i, (name, _) in enumerate(broken.arrays) if name == node.input[1]))
        with pytest.raises(onnx.checker.ValidationError):
            broken.check()
