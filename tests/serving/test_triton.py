"""`mha triton`: the model repository, each config parsed with the ModelConfig protobuf tritonclient ships."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import onnxruntime as ort
import pytest
from click.testing import CliRunner
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from mha_runtime.artifact.manifest import sha256_file
from mha_runtime.attention.contract import INPUT_NAME, OUTPUT_NAME
from mha_runtime.attention.manifest import load_manifest
from mha_runtime.cli.main import cli
from mha_runtime.triton import TORCHSCRIPT_INPUT, TORCHSCRIPT_OUTPUT


def parse(path: Path) -> mc.ModelConfig:
    """Strict: an unknown field, a bad enum or a missing brace raises text_format.ParseError."""
    return text_format.Parse(path.read_text(), mc.ModelConfig())


@pytest.fixture
def repo(seed_dir: Path, tmp_path: Path) -> Path:
    out = tmp_path / "repo"
    result = CliRunner().invoke(cli, ["triton", str(seed_dir), "--out", str(out), "--max-batch", "4"])
    assert result.exit_code == 0, result.output
    assert f"tritonserver --model-repository={out.resolve()}" in result.stdout
    return out


@pytest.mark.parametrize(("folder", "platform", "file", "source", "names"), [
    ("seed_onnx", "onnxruntime_onnx", "model.onnx", "mha.onnx", (INPUT_NAME, OUTPUT_NAME)),
    ("seed_torchscript", "pytorch_libtorch", "model.pt", "mha.pt", (TORCHSCRIPT_INPUT, TORCHSCRIPT_OUTPUT)),
])
def test_configs_match_the_contract(repo: Path, seed_dir: Path, folder: str, platform: str, file: str, source: str,
                                    names: tuple[str, str]) -> None:
    manifest = load_manifest(seed_dir)
    config = manifest.config
    cfg = parse(repo / folder / "config.pbtxt")
    assert cfg.name == folder and cfg.platform == platform and cfg.max_batch_size == 4
    assert [(t.name, mc.DataType.Name(t.data_type), list(t.dims)) for t in cfg.input] == [
        (names[0], "TYPE_FP32", [-1, config.d_in])]  # batch implicit (max_batch_size > 0), tokens variable
    assert [(t.name, mc.DataType.Name(t.data_type), list(t.dims)) for t in cfg.output] == [
        (names[1], "TYPE_FP32", [-1, config.d_model])]
    assert cfg.HasField("dynamic_batching")
    assert sha256_file(repo / folder / "1" / file) == manifest.files[source].sha256
    assert sorted(p.name for p in (repo / folder).iterdir()) == ["1", "config.pbtxt"]


def test_onnx_config_names_and_ranks_are_the_graphs(repo: Path) -> None:
    cfg = parse(repo / "seed_onnx" / "config.pbtxt")
    session = ort.InferenceSession(str(repo / "seed_onnx" / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    for tensors, declared in ((session.get_inputs(), cfg.input), (session.get_outputs(), cfg.output)):
        assert [(t.name, t.type, len(t.shape)) for t in tensors] == [
            (d.name, "tensor(float)", 1 + len(d.dims)) for d in declared]
        assert all(t.shape[1] == "tokens" and t.shape[0] == "batch" for t in tensors)


def test_rewriting_keeps_other_models_in_the_repository(repo: Path, seed_dir: Path) -> None:
    (repo / "other_model" / "1").mkdir(parents=True)
    (repo / "seed_onnx" / "stale.txt").write_text("left by an earlier version")
    result = CliRunner().invoke(cli, ["triton", str(seed_dir), "--out", str(repo), "--name", "mha"])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in repo.iterdir()) == ["mha_onnx", "mha_torchscript", "other_model", "seed_onnx",
                                                      "seed_torchscript"]
    assert parse(repo / "mha_onnx" / "config.pbtxt").name == "mha_onnx"
    result = CliRunner().invoke(cli, ["triton", str(seed_dir), "--out", str(repo)])
    assert result.exit_code == 0 and not (repo / "seed_onnx" / "stale.txt").exists()  # a model folder is replaced whole


def test_refusals_are_one_line_and_write_nothing(seed_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "repo"
    for args, says, code in ((["--model", "mha.decode.onnx"], "not just 'x'", 1),
                             (["--name", "a/b"], "--name 'a/b'", 2), (["--model", "mha.nope.onnx"], "not listed", 1),
                             # ORT format: written as 1/model.onnx, it was a repository ONNX Runtime cannot load
                             (["--model", "mha.ort"], "--model 'mha.ort': expected an .onnx file", 2)):
        result = CliRunner().invoke(cli, ["triton", str(seed_dir), "--out", str(out), *args])
        assert result.exit_code == code and says in result.stderr and result.stderr.count("\n") == 1, result.output
    result = CliRunner().invoke(cli, ["triton", str(tmp_path / "none"), "--out", str(out)])
    assert result.exit_code == 1 and "found none" in result.stderr
    assert not out.exists()


@pytest.mark.parametrize("name", ["", "n" * 101])
def test_a_manifest_name_that_makes_no_model_name_is_the_folders_fault(seed_dir: Path, tmp_path: Path,
                                                                       name: str) -> None:
    """No --name given: the line blamed --name (exit 2) for the manifest's own name, edited after export."""
    folder = shutil.copytree(seed_dir, tmp_path / "seed")
    doc = json.loads((folder / "manifest.json").read_text())
    (folder / "manifest.json").write_text(json.dumps(doc | {"name": name}))
    result = CliRunner().invoke(cli, ["triton", str(folder), "--out", str(tmp_path / "repo")])
    assert result.exit_code == 1 and result.stderr.count("\n") == 1, result.output
    assert "the manifest's name" in result.stderr and "give one with --name" in result.stderr
    assert not (tmp_path / "repo").exists()


def test_a_model_folder_that_cannot_be_written_leaves_the_other_unwritten(seed_dir: Path, tmp_path: Path) -> None:
    """seed_torchscript is a file: refused before seed_onnx is written (it used to be written, then the refusal)."""
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "seed_torchscript").write_text("a file")
    result = CliRunner().invoke(cli, ["triton", str(seed_dir), "--out", str(tmp_path / "repo")])
    assert result.exit_code == 1 and result.stdout == "" and result.stderr.count("\n") == 1, result.output
    assert "seed_torchscript: expected a folder, found a file" in result.stderr
    assert sorted(p.name for p in (tmp_path / "repo").iterdir()) == ["seed_torchscript"]
