"""The saved ONNX file itself: symbolic axes, one file, contract metadata, shared mask, refusals."""
from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from mha_export.attention.graphs.onnx_trace import ExportError, check_opset, check_saved
from mha_export.model.example import example_input
from mha_runtime.artifact.errors import BadValueError, ConfigError
from mha_runtime.attention.config import MHAConfig, preset
from mha_runtime.attention.contract import META_CONFIG, META_CONTRACT, IOContract


def _dims(value: onnx.ValueInfoProto) -> list[str | int]:
    return [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]


@pytest.mark.parametrize("folder_fixture", ["seed_dir", "mid_dir"])
def test_axes_are_symbolic_in_the_saved_file(folder_fixture: str, request: pytest.FixtureRequest) -> None:
    folder: Path = request.getfixturevalue(folder_fixture)
    model = onnx.load(str(folder / "mha.onnx"))
    (x,), (ctx,) = model.graph.input, model.graph.output
    assert (x.name, ctx.name) == ("x", "context")
    assert _dims(x)[:2] == ["batch", "tokens"] and _dims(ctx)[:2] == ["batch", "tokens"]
    assert x.type.tensor_type.elem_type == onnx.TensorProto.FLOAT


def test_one_file_checker_clean_with_metadata(seed_dir: Path) -> None:
    model = onnx.load(str(seed_dir / "mha.onnx"))
    onnx.checker.check_model(model, full_check=True)
    assert not list(seed_dir.glob("*.data"))
    assert all(t.data_location != onnx.TensorProto.EXTERNAL for t in model.graph.initializer)
    meta = {p.key: p.value for p in model.metadata_props}
    assert MHAConfig.from_json(meta[META_CONFIG]) == preset("seed")
    assert meta[META_CONTRACT] == IOContract(preset("seed")).to_json()
    assert [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")] == [18]  # the default opset


def test_one_shared_mask_initializer(mid_dir: Path) -> None:
    model = onnx.load(str(mid_dir / "mha.onnx"))
    masks = [t for t in model.graph.initializer if list(t.dims) == [48, 48]]
    assert len(masks) == 1, f"expected one shared mask for 4 heads, found {len(masks)}"


def test_check_saved_refuses_a_frozen_axis(seed_dir: Path, tmp_path: Path) -> None:
    model = onnx.load(str(seed_dir / "mha.onnx"))
    model.graph.input[0].type.tensor_type.shape.dim[1].dim_value = 3  # freeze tokens
    path = tmp_path / "frozen.onnx"
    onnx.save(model, str(path))
    with pytest.raises(ExportError, match="an axis was frozen"):
        check_saved(path, preset("seed"))


@pytest.mark.parametrize("batch,tokens,why",
                         [(1, 3, "batch >= 2"), (2, 1, "2 <= tokens"), (2, 6, "tokens < context_length")])
def test_example_inputs_that_freeze_an_axis_are_refused(batch: int, tokens: int, why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        example_input(preset("seed"), batch=batch, tokens=tokens)


def test_context_too_short_for_a_dynamic_axis() -> None:
    with pytest.raises(ConfigError, match="context_length >= 3"):
        example_input(MHAConfig(d_in=3, d_out=2, num_heads=1, context_length=2))


@pytest.mark.parametrize("opset", [17, 26])
def test_unsupported_opset_is_refused(opset: int) -> None:
    with pytest.raises(BadValueError, match=r"expected 18\.\.25"):
        check_opset(opset)
