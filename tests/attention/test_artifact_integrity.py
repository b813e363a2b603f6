"""A missing, truncated or altered artifact is refused with a clear error, by the API and the CLI."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from helpers import reseal
from mha_runtime.artifact.errors import ArtifactError, ProviderError
from mha_runtime.attention.runner import OnnxRunner
from mha_runtime.cli.main import cli
from mha_runtime.infer.providers import resolve_provider


def _alter(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-100])


def _remove(path: Path) -> None:
    path.unlink()


@pytest.mark.parametrize("damage,message",
                         [(_alter, "differs from the manifest"), (_truncate, "truncated"), (_remove, "missing")])
def test_damaged_model_is_refused(seed_copy: Path, damage, message: str) -> None:
    damage(seed_copy / "mha.onnx")
    with pytest.raises(ArtifactError, match=message):
        OnnxRunner(seed_copy)


@pytest.mark.parametrize("damage,message", [(_alter, "differs from the manifest"), (_truncate, "truncated")])
def test_onnx_path_is_checked_against_the_manifest_beside_it(seed_copy: Path, damage, message: str) -> None:
    damage(seed_copy / "mha.onnx")
    with pytest.raises(ArtifactError, match=message):
        OnnxRunner(seed_copy / "mha.onnx")


@pytest.mark.parametrize("target", ["mha.pt", "golden/b1_t1.context.bin", "golden/cases.json"])
def test_check_refuses_any_altered_file(seed_copy: Path, target: str) -> None:
    _alter(seed_copy / target)
    result = CliRunner().invoke(cli, ["check", str(seed_copy)])
    assert result.exit_code == 1
    assert "differs from the manifest" in result.stderr and target in result.stderr


@pytest.mark.parametrize("command", ["check", "validate", "run", "bench"])
def test_a_manifest_config_edited_away_from_the_models_own_is_refused(seed_copy: Path, command: str) -> None:
    """manifest.json is not listed in itself: a config edited in it (here a context of 10**9, which `validate`
    used to size its eager mask from: 4e18 bytes) is caught against the model's metadata, before any work."""
    manifest = json.loads((seed_copy / "manifest.json").read_text())
    manifest["config"]["context_length"] = 10**9
    (seed_copy / "manifest.json").write_text(json.dumps(manifest))
    np.save(seed_copy.parent / "x.npy", np.ones((1, 3, 3), np.float32))
    args = {"check": [str(seed_copy)], "validate": [str(seed_copy)],
            "run": [str(seed_copy), "--input", str(seed_copy.parent / "x.npy"), "--output",
                    str(seed_copy.parent / "y.npy")],
            "bench": ["--artifacts", str(seed_copy.parent), "--preset", seed_copy.name, "--out",
                      str(seed_copy.parent / "bench")]}[command]
    result = CliRunner().invoke(cli, [command, *args])
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].endswith(
        "mha.onnx: the manifest's config says context_length=1000000000, the model's own metadata "
        "context_length=6; the model does not belong to this folder"), result.stderr


def test_missing_manifest(seed_copy: Path) -> None:
    (seed_copy / "manifest.json").unlink()
    with pytest.raises(ArtifactError, match="expected a manifest"):
        OnnxRunner(seed_copy)


def test_unlisted_corrupt_onnx_file_is_an_error_not_a_crash(tmp_path: Path) -> None:
    bad = tmp_path / "broken.onnx"
    bad.write_bytes(b"\x08\x07garbage" * 10)
    with pytest.raises(ArtifactError, match="ONNX Runtime cannot load it"):
        OnnxRunner(bad)


def test_cuda_unavailable_names_onnxruntime_gpu() -> None:
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers():
        assert resolve_provider("cuda") == "cuda"
        return
    assert resolve_provider("auto") == "cpu"
    with pytest.raises(ProviderError, match="install onnxruntime-gpu"):
        resolve_provider("cuda")


def test_altered_model_that_onnxruntime_loads_is_still_refused(seed_copy: Path) -> None:
    """The sha256 runs beside session creation; a file ORT loads happily must still be refused."""
    import onnx
    from onnx import numpy_helper

    from mha_runtime.attention.manifest import load_manifest

    path = seed_copy / "mha.contrib.onnx"
    model = onnx.load(str(path))
    weight = model.graph.initializer[0]
    array = numpy_helper.to_array(weight).copy()
    array.flat[0] += 1.0  # same size, different weights
    weight.CopyFrom(numpy_helper.from_array(array, weight.name))
    onnx.save(model, str(path))
    assert path.stat().st_size == load_manifest(seed_copy).files["mha.contrib.onnx"].size  # not the size check
    with pytest.raises(ArtifactError, match="differs from the manifest"):
        OnnxRunner(seed_copy, model="mha.contrib.onnx")


def _tamper(path: Path) -> None:
    """Same size, one byte changed: only the sha256 can tell."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def _refused_unparsed(monkeypatch: pytest.MonkeyPatch, target: object, attribute: str, build: object) -> None:
    """`build()` must raise the sha256 refusal with `target.attribute` (the parser's entry point) never called."""
    calls: list[object] = []
    monkeypatch.setattr(target, attribute, lambda *args, **kwargs: calls.append(args) or pytest.fail("parsed"))
    with pytest.raises(ArtifactError, match="differs from the manifest"):
        build()  # type: ignore[operator]
    assert calls == []


@pytest.mark.parametrize("file", ["mha.onnx", "mha.decode.onnx", "mha.ort"])
def test_a_tampered_onnx_model_never_reaches_onnxruntime(seed_copy: Path, monkeypatch: pytest.MonkeyPatch,
                                                         file: str) -> None:
    import mha_runtime.attention.runner as runner
    from mha_runtime.attention.decode_session import DecodeSession

    _tamper(seed_copy / file)
    kind = DecodeSession if "decode" in file else OnnxRunner
    _refused_unparsed(monkeypatch, runner.ort, "InferenceSession",
                      lambda: kind(seed_copy, model=file, provider="cpu"))


def test_a_tampered_torchscript_never_reaches_torch_jit(seed_copy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from mha_export.infer.torchscript_runner import load_torchscript

    _tamper(seed_copy / "mha.pt")
    _refused_unparsed(monkeypatch, torch.jit, "load", lambda: load_torchscript(seed_copy / "mha.pt"))


def test_a_tampered_pte_never_reaches_executorch(seed_copy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from executorch.runtime import Runtime

    from mha_export.infer.pte_runner import PteRunner

    _tamper(seed_copy / "mha.pte")
    _refused_unparsed(monkeypatch, type(Runtime.get()), "load_program", lambda: PteRunner(seed_copy))


@pytest.mark.parametrize("special", ["/dev/zero", "fifo"])
def test_a_listed_file_that_is_a_device_or_a_fifo_is_never_read(seed_copy: Path, special: str) -> None:
    """/dev/zero in a listed file's place was read without end (the whole machine's memory); a FIFO blocked for a
    writer. Both are refused by their kind before a byte is read, by every reader of listed files."""
    model = seed_copy / "mha.onnx"
    model.unlink()
    if special == "fifo":
        os.mkfifo(model)
    else:
        model.symlink_to(special)
    kind = "a FIFO (named pipe)" if special == "fifo" else "a character device"
    with pytest.raises(ArtifactError, match=re.escape(f"listed in the manifest as a file, but it is {kind}")):
        OnnxRunner(seed_copy)
    for command in (["check", str(seed_copy)], ["triton", str(seed_copy), "--out", str(seed_copy.parent / "repo")]):
        result = CliRunner().invoke(cli, command)
        assert result.exit_code == 1 and kind in result.stderr, (command, result.output)


def test_a_golden_case_name_with_control_characters_is_one_line(seed_copy: Path) -> None:
    """The name is printed in every result line: a newline and an escape sequence in it (resealed) split the error
    over two lines and named the wrong thing."""
    doc = json.loads((seed_copy / "golden" / "cases.json").read_text())
    doc["cases"][0]["name"] = "a\n\x1b[31mred"
    (seed_copy / "golden" / "cases.json").write_text(json.dumps(doc))
    reseal(seed_copy, "golden/cases.json")
    result = CliRunner().invoke(cli, ["check", str(seed_copy)])
    assert result.exit_code == 1 and result.stderr.count("\n") == 1, result.output
    assert "cases[0].name: expected printable text, got 'a\\n\\x1b[31mred'" in result.stderr


def test_golden_cases_with_an_integer_past_4300_digits_is_one_line(seed_copy: Path) -> None:
    """json.loads' own ValueError (not a JSONDecodeError) escaped as an "internal error"."""
    (seed_copy / "golden" / "cases.json").write_text('{"format": 1' + "0" * 5000 + "}")
    reseal(seed_copy, "golden/cases.json")
    result = CliRunner().invoke(cli, ["check", str(seed_copy)])
    assert result.exit_code == 1 and result.stderr.count("\n") == 1, result.output
    assert "cases.json: expected JSON, got a parse error" in result.stderr and "internal error" not in result.stderr


def test_validate_refuses_a_manifest_that_lists_no_artifact(seed_copy: Path) -> None:
    """An export lists its core pair at least; a manifest edited to list none was '0 passed, 0 failed', exit 0."""
    manifest = json.loads((seed_copy / "manifest.json").read_text())
    manifest["artifacts"] = {}
    (seed_copy / "manifest.json").write_text(json.dumps(manifest))
    result = CliRunner().invoke(cli, ["validate", str(seed_copy)])
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].endswith("manifest.json: 'artifacts': expected at least one artifact"), lines
    assert result.stdout == ""
