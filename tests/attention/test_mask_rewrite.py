"""The additive-mask rewrite of masked_fill: exact against the plain trace, and present in the artifacts."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest

from helpers import MID
from mha_export.attention.graphs.mask_rewrite import additive_mask
from mha_export.attention.graphs.onnx_trace import trace_to_onnx
from mha_export.attention.weights.load import seeded_model
from mha_runtime.attention.config import MHAConfig

ODD_SCALE = MHAConfig(d_in=12, d_out=3, num_heads=2, context_length=20)  # sqrt(3): the scale is not a power of 2


def _session(proto: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("config", [MID, ODD_SCALE], ids=["mid", "odd-scale"])
def test_rewrite_matches_the_plain_trace(config: MHAConfig) -> None:
    plain = ir.to_proto(trace_to_onnx(seeded_model(config), config, opset=18))
    model = ir.from_proto(plain)
    assert additive_mask(model) == config.num_heads  # one masked_fill per head
    wheres = [n for n in model.graph if n.op_type == "Where"]
    assert wheres and all(n.inputs[2].const_value is not None for n in wheres)  # Where(mask, -inf, 0) only
    assert all(n.inputs[0].producer().op_type != "Where" for n in model.graph if n.op_type == "Softmax")
    before, after = _session(plain), _session(ir.to_proto(model))
    rng = np.random.default_rng(0)
    for tokens in (1, 2, 7, config.context_length):
        x = rng.standard_normal((3, tokens, config.d_in)).astype(np.float32)
        (want,), (got,) = before.run(None, {"x": x}), after.run(None, {"x": x})
        if config is MID:  # scale 4: dividing and ORT's folded multiply by 0.25 are both exact
            np.testing.assert_array_equal(got, want)
        else:  # 1/sqrt(3) as a multiply differs from the divide by at most an ulp or two
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


@pytest.mark.parametrize("folder_fixture", ["seed_dir", "mid_dir"])
def test_artifacts_carry_no_masked_fill(folder_fixture: str, request: pytest.FixtureRequest) -> None:
    folder: Path = request.getfixturevalue(folder_fixture)
    graph = ir.load(str(folder / "mha.onnx")).graph
    assert [n.op_type for n in graph].count("Where") == 1  # one shared additive mask
    divs = [n for n in graph if n.op_type == "Div"]
    assert divs and all(n.inputs[0].producer().op_type == "MatMul" for n in divs)  # scale, then mask
