"""Tests that name the bug they guard against: each one fails if that part of the pipeline is weakened."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
import onnx_ir as ir
import pytest
import torch
from click.testing import CliRunner

import mha_export.attention.pipeline.validate as validate_module
from mha_export.attention.graphs.mask_rewrite import additive_mask
from mha_export.attention.weights.load import load_artifact_model
from mha_export.infer.pte_runner import PteRunner
from mha_runtime.artifact.errors import ValidationError
from mha_runtime.artifact.manifest import sha256_file
from mha_runtime.artifact.tolerance import Tolerance
from mha_runtime.attention.decode_session import DecodeSession
from mha_runtime.attention.golden import load_cases
from mha_runtime.attention.golden_check import check_artifact
from mha_runtime.attention.manifest import load_manifest
from mha_runtime.attention.registry import (
    CHOICES,
    DECODE,
    EXECUTORCH_RUNTIME,
    ONNX_RUNTIME,
    VARIANTS,
    artifact_specs,
    spec_for,
    tolerance_for,
)
from mha_runtime.attention.runner import OnnxRunner
from mha_runtime.cli.main import cli

# Per-tensor dynamic quantization (int8) and float16 are not causal-invariant by construction: a huge future
# token changes the int8 scale of every token and overflows float16; the fp32 artifacts must be exactly causal.
FP32_FILES = [s.file for s in artifact_specs(CHOICES) if s.runtime in (ONNX_RUNTIME, EXECUTORCH_RUNTIME)
              and s.kind not in ("int8", "fp16")]


@pytest.mark.parametrize("folder_fixture", ["seed_dir", "mid_dir"])
@pytest.mark.parametrize("file", FP32_FILES)
@pytest.mark.parametrize("scale", [1e4, 1e8])
def test_future_tokens_scaled_up_leave_earlier_outputs_bit_identical(folder_fixture: str, file: str, scale: float,
                                                                     request: pytest.FixtureRequest) -> None:
    """Guards the causal mask's value: a finite mask such as -1e4 instead of -inf lets huge future scores leak
    (scores here are below 1, so 1e4 alone does not always beat -1e4; 1e8 does)."""
    folder = request.getfixturevalue(folder_fixture)
    runner = PteRunner(folder, model=file) if file.endswith(".pte") else OnnxRunner(folder, model=file)
    config = runner.config
    tokens = config.context_length
    x = np.random.default_rng(5).standard_normal((2, tokens, config.d_in)).astype(np.float32)
    base = runner.run(x)
    for cut in (1, tokens // 2, tokens - 1):
        loud = x.copy()
        loud[:, cut:] *= scale
        assert np.array_equal(runner.run(loud)[:, :cut], base[:, :cut]), f"{file}: tokens >= {cut} leak backwards"


@pytest.mark.parametrize("scale", [1e4, 1e8])
def test_qblocks_query_blocks_leave_earlier_outputs_bit_identical(mid_dir: Path, scale: float) -> None:
    """The same guard on the query-block branch of qblocks, which the presets' short contexts never reach (it runs
    from 256 tokens on): built here with the blocks from 8 tokens on, each block's additive mask is exercised."""
    import onnxruntime as ort

    from mha_export.attention.graphs.qblocks import qblocks_model

    wrapper, config = load_artifact_model(mid_dir, load_manifest(mid_dir))
    model = qblocks_model(wrapper, config, blocks=8, dense_below=8)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    tokens = config.context_length
    x = np.random.default_rng(6).standard_normal((2, tokens, config.d_in)).astype(np.float32)
    (base,) = session.run(None, {"x": x})
    for cut in (1, 7, tokens // 2, tokens - 1):  # inside the first block, at a block edge, mid-way, last row
        loud = x.copy()
        loud[:, cut:] *= scale
        (got,) = session.run(None, {"x": loud})
        assert np.array_equal(got[:, :cut], base[:, :cut]), f"query blocks: tokens >= {cut} leak backwards"


def test_the_fp32_tolerance_rows_are_pinned() -> None:
    """Guards the tolerance table itself: a loosened fp32 row would let every fp32 test pass anything."""
    for kind in ("onnx", "torchscript", "fused", "attention", "contrib", "blocks", "decode"):
        assert tolerance_for(kind) == Tolerance(atol=1e-5, rtol=1e-5), kind
    assert tolerance_for("fp16") == Tolerance(atol=5e-3, rtol=0.0)
    assert tolerance_for("int8") == Tolerance(atol=0.1, rtol=0.0, rel_l2=3e-2)


def test_a_1e_3_weight_drift_fails_validation(seed_dir: Path) -> None:
    model, config = load_artifact_model(seed_dir, load_manifest(seed_dir))
    with torch.no_grad():
        model.heads[1].W_query.weight[0, 0] += 1e-3
    with pytest.raises(ValidationError) as info:
        validate_module.validate(seed_dir, model, config, [spec_for("mha.onnx")])
    assert all(f.artifact == "mha.onnx" for f in info.value.failures)


def test_an_error_only_in_later_batch_rows_fails_validation(seed_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Guards validation against comparing batch row 0 only."""
    real = validate_module.artifact_runner

    def later_rows_off(folder: Path, spec: object) -> object:
        run = real(folder, spec)

        def wrong(x: np.ndarray) -> np.ndarray:
            out = run(x).copy()
            out[1:] += 1e-3  # rows after the first
            return out
        return wrong

    monkeypatch.setattr(validate_module, "artifact_runner", later_rows_off)
    model, config = load_artifact_model(seed_dir, load_manifest(seed_dir))
    with pytest.raises(ValidationError) as info:
        validate_module.validate(seed_dir, model, config, [spec_for("mha.onnx")])
    assert {f.shape[0] for f in info.value.failures} == {3}  # only the batch-3 shapes fail


def test_decode_validation_feeds_single_token_steps(seed_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Guards the decode sweep against feeding only a prefill: a step of one token after a past must run."""
    real_step = DecodeSession.step

    def broken_single_steps(self: DecodeSession, x: np.ndarray) -> np.ndarray:
        out = real_step(self, x)
        return out + 1.0 if x.shape[1] == 1 and self.past_tokens > 1 else out

    monkeypatch.setattr(DecodeSession, "step", broken_single_steps)
    model, config = load_artifact_model(seed_dir, load_manifest(seed_dir))
    with pytest.raises(ValidationError):
        validate_module.validate(seed_dir, model, config, [DECODE])


@pytest.mark.parametrize("excess,rel_l2_only", [(1.5, False), (0.5, True)])
def test_python_check_fails_near_misses(seed_dir: Path, excess: float, rel_l2_only: bool) -> None:
    """Just over atol fails; within atol but over the relative-L2 bound fails too."""
    cases = load_cases(seed_dir)
    tol = Tolerance(atol=1e-3, rtol=0.0, rel_l2=1e-4 if rel_l2_only else None)
    from mha_runtime.attention.golden import iter_cases

    goldens = {name: y for name, _, y in iter_cases(seed_dir, cases)}
    by_shape = {tuple(g.shape): g for g in goldens.values()}
    near = lambda _, x: by_shape[(*x.shape[:2], 4)] + excess * 1e-3  # noqa: E731
    results = check_artifact("near-miss", near, tol, seed_dir, cases)
    assert results and not any(r.ok for r in results)
    exact = check_artifact("exact", lambda _, x: by_shape[(*x.shape[:2], 4)], tol, seed_dir, cases)
    assert all(r.ok for r in exact)


def test_mha_check_applies_the_relative_l2_bound(seed_copy: Path) -> None:
    """Guards `mha check` against dropping int8's relative-L2 bound: tightened in cases.json, int8 must fail."""
    cases_path = seed_copy / "golden" / "cases.json"
    doc = json.loads(cases_path.read_text())
    for entry in doc["artifacts"]:
        if entry["file"] == VARIANTS["int8"].file:
            entry["tolerance"]["rel_l2"] = 1e-9
    cases_path.write_text(json.dumps(doc))
    manifest = json.loads((seed_copy / "manifest.json").read_text())
    manifest["files"]["golden/cases.json"] = {"size": cases_path.stat().st_size, "sha256": sha256_file(cases_path)}
    (seed_copy / "manifest.json").write_text(json.dumps(manifest))
    result = CliRunner().invoke(cli, ["check", str(seed_copy)])
    failed = {line.split()[1] for line in result.stdout.splitlines() if line.startswith("FAIL")}
    assert result.exit_code == 1 and failed == {VARIANTS["int8"].file}, result.stdout


def test_mask_rewrite_keeps_a_division_that_is_a_graph_output() -> None:
    """Guards the rewrite's graph-output check: a Div that is an output must stay, its value unchanged."""
    graph = oh.make_graph(
        [oh.make_node("Where", ["m", "neg_inf", "s"], ["masked"]), oh.make_node("Div", ["masked", "c"], ["out"])],
        "g", [oh.make_tensor_value_info("m", onnx.TensorProto.BOOL, [2, 2]),
              oh.make_tensor_value_info("s", onnx.TensorProto.FLOAT, [2, 2])],
        [oh.make_tensor_value_info("out", onnx.TensorProto.FLOAT, [2, 2])],
        [onnx.numpy_helper.from_array(np.array(-np.inf, np.float32), "neg_inf"),
         onnx.numpy_helper.from_array(np.array(2.0, np.float32), "c")])
    proto = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])
    proto.ir_version = 10
    model = ir.from_proto(proto)
    assert additive_mask(model) == 1
    rewritten = ir.to_proto(model)
    assert [o.name for o in rewritten.graph.output] == ["out"]
    import onnxruntime as ort

    feeds = {"m": np.array([[False, True], [False, False]]), "s": np.array([[2.0, 4.0], [6.0, 8.0]], np.float32)}
    want = ort.InferenceSession(proto.SerializeToString()).run(None, feeds)[0]
    got = ort.InferenceSession(rewritten.SerializeToString()).run(None, feeds)[0]
    assert np.array_equal(got, want) and want[0, 1] == -np.inf
