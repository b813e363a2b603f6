"""Edge variants: the fused mapping, each variant's parity and finiteness, sizes, refusals, .ort files."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from helpers import book_wrapper
from mha_export.attention.graphs.blocks import QUERY_BLOCKS, blocks_model
from mha_export.attention.weights.load import load_artifact_model
from mha_export.model.fused import fuse
from mha_export.model.wrapper import build_wrapper
from mha_runtime.artifact.errors import BadValueError
from mha_runtime.artifact.tolerance import compare
from mha_runtime.attention.config import MHAConfig
from mha_runtime.attention.manifest import load_manifest
from mha_runtime.attention.registry import (
    CHOICES,
    ONNX_RUNTIME,
    artifact_specs,
    parse_variants,
    spec_for,
    tolerance_for,
)
from mha_runtime.attention.runner import OnnxRunner
from mha_runtime.cli.main import cli
from torch_refs import explicit_fused

# The artifacts with the plain x -> context contract (the decode form is tested in test_decode.py).
VARIANT_FILES = {spec.file: spec.kind for spec in artifact_specs(CHOICES) if spec.runtime == ONNX_RUNTIME}


@pytest.mark.parametrize("config", [
    MHAConfig(d_in=3, d_out=2, num_heads=2, context_length=6),
    MHAConfig(d_in=64, d_out=16, num_heads=4, context_length=48, qkv_bias=True),
    MHAConfig(d_in=32, d_out=8, num_heads=1, context_length=20, qkv_bias=True),
    MHAConfig(d_in=96, d_out=32, num_heads=6, context_length=64),
], ids=["seed", "mid-bias", "one-head-bias", "six-heads"])
@pytest.mark.parametrize("sdpa", [False, True], ids=["explicit", "sdpa"])
def test_fused_mapping_equals_the_wrapper(config: MHAConfig, sdpa: bool) -> None:
    torch.manual_seed(5)
    wrapper = build_wrapper(config).eval()
    fused = fuse(wrapper, config) if sdpa else explicit_fused(wrapper, config)
    for tokens in (1, 2, config.context_length // 2, config.context_length):
        x = torch.randn(3, tokens, config.d_in)
        with torch.no_grad():
            diff = (fused(x) - wrapper(x)).abs().max().item()
        assert diff <= 1e-6, (tokens, diff)


@pytest.mark.parametrize("config", [
    MHAConfig(d_in=3, d_out=2, num_heads=2, context_length=6),
    MHAConfig(d_in=64, d_out=16, num_heads=4, context_length=48, qkv_bias=True),
], ids=["seed", "mid-bias"])
@pytest.mark.parametrize("blocks", [2, 3, QUERY_BLOCKS])
def test_blocks_form_equals_the_wrapper(config: MHAConfig, blocks: int) -> None:
    import onnxruntime as ort

    torch.manual_seed(6)
    wrapper = build_wrapper(config).eval()
    model = blocks_model(wrapper, config, blocks=blocks)
    assert [n.op_type for n in model.graph.node].count("MultiHeadAttention") == blocks
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for tokens in range(1, config.context_length + 1):  # includes T < blocks (empty blocks) and uneven splits
        x = torch.randn(2, tokens, config.d_in)
        with torch.no_grad():
            want = wrapper(x).numpy()
        (got,) = session.run(None, {"x": x.numpy()})
        assert np.abs(got - want).max() <= 1e-6, tokens


_CACHE: dict[tuple[Path, str], object] = {}


@pytest.mark.parametrize("config", [
    MHAConfig(d_in=3, d_out=2, num_heads=2, context_length=6),
    MHAConfig(d_in=64, d_out=16, num_heads=4, context_length=48, qkv_bias=True, out_proj=True),
], ids=["seed", "mid-bias-proj"])
@pytest.mark.parametrize("blocks,dense_below", [(2, 2), (3, 3), (8, 8), (8, 256)],
                         ids=["2-blocks", "3-blocks", "8-blocks", "8-blocks-dense-below-256"])
def test_qblocks_form_equals_the_wrapper(config: MHAConfig, blocks: int, dense_below: int) -> None:
    """Both branches of the If: the query blocks (at every length from `blocks` on) and the dense Attention."""
    import onnxruntime as ort

    from mha_export.attention.graphs.qblocks import qblocks_model

    torch.manual_seed(7)
    wrapper = build_wrapper(config).eval()
    model = qblocks_model(wrapper, config, blocks=blocks, dense_below=dense_below)
    (branching,) = [n for n in model.graph.node if n.op_type == "If"]
    then_branch = next(a.g for a in branching.attribute if a.name == "then_branch")
    assert [n.op_type for n in then_branch.node].count("Attention") == blocks
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for tokens in range(1, config.context_length + 1):
        x = torch.randn(2, tokens, config.d_in)
        with torch.no_grad():
            want = wrapper(x).numpy()
        (got,) = session.run(None, {"x": x.numpy()})
        assert np.abs(got - want).max() <= 1e-6, tokens


def _parity(folder: Path, file: str, tokens_list: list[int], *, book: bool = False) -> None:
    """One artifact against the eager model at batch 1 and 2 and every token count given: the export's wrapper,
    or with `book` the book's own (llms_from_scratch), a reference the export's validation did not use."""
    key = (folder, "book" if book else "")
    if key not in _CACHE:
        _CACHE[key] = book_wrapper(folder) if book else load_artifact_model(folder, load_manifest(folder))
    model, config = _CACHE[key]  # type: ignore[misc]
    runner = OnnxRunner(folder, model=file, provider="cpu")
    for batch in (1, 2):
        for tokens in tokens_list:
            x = torch.randn(batch, tokens, config.d_in, generator=torch.Generator().manual_seed(tokens))
            with torch.no_grad():
                expected = model(x).numpy()
            got = runner.run(x.numpy())
            assert np.isfinite(got).all(), f"{file} gave NaN/inf at batch={batch} tokens={tokens}"
            cmp = compare(got, expected, tolerance_for(VARIANT_FILES[file]))
            assert cmp.ok, f"{file} batch={batch} tokens={tokens}: {cmp}"


@pytest.mark.parametrize("file", VARIANT_FILES)
def test_every_variant_every_length_seed(seed_dir: Path, file: str) -> None:
    _parity(seed_dir, file, list(range(1, 7)))


@pytest.mark.parametrize("file", VARIANT_FILES)
@pytest.mark.parametrize("tokens", [range(1, 17), range(17, 33), range(33, 49)], ids=["t1-16", "t17-32", "t33-48"])
def test_every_variant_every_length_mid(mid_dir: Path, file: str, tokens: range) -> None:
    _parity(mid_dir, file, list(tokens))


@pytest.mark.slow
@pytest.mark.parametrize("file", VARIANT_FILES)
def test_gpt2_small_variants_parity(gpt2_dir: Path, file: str) -> None:
    _parity(gpt2_dir, file, [1, 2, 512, 1024], book=True)


@pytest.mark.slow
def test_gpt2_small_variant_sizes(gpt2_dir: Path) -> None:
    mib = {f: (gpt2_dir / f).stat().st_size / 2**20 for f in VARIANT_FILES}
    assert mib["mha.fused.onnx"] <= 7.5 and mib["mha.fp16.onnx"] <= 4.0 and mib["mha.int8.onnx"] <= 2.5, mib


def test_manifest_records_every_variant(seed_dir: Path) -> None:
    manifest = load_manifest(seed_dir)
    for file, kind in VARIANT_FILES.items():
        info = manifest.artifacts[file]
        assert info.kind == kind and info.passed and info.cases == 20
        assert info.tolerance == tolerance_for(kind)
        assert manifest.files[file].size == (seed_dir / file).stat().st_size
        assert 0 <= info.max_abs_error <= info.tolerance.atol
    assert manifest.artifacts["mha.attention.onnx"].opset == 23
    assert manifest.artifacts["mha.int8.onnx"].opset == 18


def test_attention_variant_is_one_attention_node(seed_dir: Path) -> None:
    import onnx

    ops = [n.op_type for n in onnx.load(str(seed_dir / "mha.attention.onnx")).graph.node]
    assert ops.count("Attention") == 1


def test_ort_files_load_from_a_path_and_match(seed_dir: Path) -> None:
    x = np.random.default_rng(3).standard_normal((2, 5, 3)).astype(np.float32)
    for ort_file, source in (("mha.ort", "mha.onnx"), ("mha.fused.ort", "mha.fused.onnx")):
        assert (seed_dir / ort_file).read_bytes()[4:8] == b"ORTM"  # flatbuffer identifier of the ORT format
        got = OnnxRunner(seed_dir / ort_file, provider="cpu").run(x)
        want = OnnxRunner(seed_dir, model=source, provider="cpu").run(x)
        np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)


def test_golden_check_covers_every_variant(seed_dir: Path) -> None:
    result = CliRunner().invoke(cli, ["check", str(seed_dir)])
    assert result.exit_code == 0, result.output
    checked = {line.split()[1] for line in result.stdout.splitlines() if line.startswith("ok")}
    assert checked == {"mha.onnx", "mha.pt", "mha.decode.onnx", "mha.pte"} | set(VARIANT_FILES)


@pytest.mark.parametrize("text,message", [
    ("int8-attention", "cannot be built: int8 dynamic quantization of the opset-23 Attention node"),
    ("fused,int4", f"unknown variant 'int4'; choose from {', '.join(CHOICES)}"),
])
def test_unbuildable_variants_are_refused_before_work(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(BadValueError, match=message):
        parse_variants(text)
    result = CliRunner().invoke(cli, ["export", "--preset", "seed", "--variants", text, "--out", str(tmp_path)])
    assert result.exit_code == 2 and message.split(":")[0] in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_variant_selection() -> None:
    assert parse_variants("all") == "all" and parse_variants("none") == ()
    from mha_runtime.attention.config import preset
    from mha_runtime.attention.registry import buildable

    assert buildable(preset("gpt2-small"), "all") == (CHOICES, [])  # every variant builds here, executorch too
    assert parse_variants(" decode , fused") == ("fused", "decode")
    core = ["mha.onnx", "mha.pt"]
    assert [s.file for s in artifact_specs(parse_variants("int8"))] == [*core, "mha.blocks.onnx", "mha.int8.onnx"]
    assert [s.file for s in artifact_specs(parse_variants("fp16"))] == [*core, "mha.fused.onnx", "mha.fp16.onnx"]
    assert [s.file for s in artifact_specs(["ort"])] == [*core, "mha.fused.onnx", "mha.ort", "mha.fused.ort"]
    assert spec_for("mha.fused.ort").kind == "fused"


def test_export_with_selected_variants(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["export", "--preset", "seed", "--variants", "fp16", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    files = set(load_manifest(tmp_path / "seed").artifacts)
    assert files == {"mha.onnx", "mha.pt", "mha.fused.onnx", "mha.fp16.onnx"}
    inspect = CliRunner().invoke(cli, ["inspect", str(tmp_path / "seed")])
    assert "mha.fp16.onnx" in inspect.stdout and "nodes" in inspect.stdout


def test_the_cuda_rows_fall_back_to_the_cpu_rows_until_one_is_declared(monkeypatch: pytest.MonkeyPatch) -> None:
    import mha_runtime.attention.registry as registry

    assert all(tolerance_for(kind, "cuda") == tolerance_for(kind, "cpu") for kind in VARIANT_FILES.values())
    measured = registry.Tolerance(atol=2e-5, rtol=2e-5)
    monkeypatch.setitem(registry.TOLERANCES, ("qblocks", "cuda"), measured)
    assert tolerance_for("qblocks", "cuda") == measured and tolerance_for("qblocks", "cpu") == registry.FP32
    with pytest.raises(KeyError, match="no tolerance rows for provider 'tpu'"):
        tolerance_for("qblocks", "tpu")
    with pytest.raises(KeyError, match="no tolerance row for int4/cpu"):
        tolerance_for("int4", "cpu")


def test_every_registry_name_has_exactly_one_builder(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    import mha_export.attention.graphs.table as table
    import mha_runtime.attention.registry as registry

    assert sorted(v.name for v in registry.REGISTRY) == sorted(table.BUILDERS)
    assert len(set(table.BUILDERS.values())) == len(table.BUILDERS)  # no builder serves two names
    assert all(callable(b) and b.__module__.startswith(("mha_export.attention.graphs.", "mha_export.executorch."))
               for b in table.BUILDERS.values())
    # A variant declared without a builder is refused when the table is imported.
    monkeypatch.setattr(registry, "VARIANTS", {**registry.VARIANTS, "int4": registry.VARIANTS["int8"]})
    with pytest.raises(ImportError, match=r"variants \['int4'\] have no builder"):
        importlib.reload(table)
    monkeypatch.undo()
    importlib.reload(table)
