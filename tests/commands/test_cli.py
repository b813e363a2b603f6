"""CliRunner coverage of every command's wiring, and one-line errors."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from click.testing import CliRunner

from mha_runtime.attention.manifest import load_manifest
from mha_runtime.cli.main import cli


def test_export_writes_a_validated_folder_and_table(tmp_path: Path) -> None:
    # the core pair only: every variant of the seed is exported once per session (conftest.seed_dir)
    result = CliRunner().invoke(cli, ["export", "--preset", "seed", "--variants", "none", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "mha.onnx" in result.stdout and "mha.pt" in result.stdout and "ok" in result.stdout
    assert f"artifacts in {tmp_path / 'seed'}" in result.stdout
    names = {p.name for p in (tmp_path / "seed").iterdir()}
    assert {"mha.onnx", "mha.pt", "manifest.json", "golden", "weights.safetensors"} <= names


def test_export_refusals_before_any_work(tmp_path: Path) -> None:
    r = CliRunner().invoke(cli, ["export", "--preset", "gpt5", "--out", str(tmp_path)])
    assert r.exit_code == 2 and "'gpt5' is not one of 'seed', 'gpt2-small'" in r.stderr
    r = CliRunner().invoke(cli, ["export", "--weights", "w.pt", "--out", str(tmp_path)])
    assert r.exit_code == 2 and "--weights and --name fit one preset" in r.stderr
    r = CliRunner().invoke(cli, ["export", "--preset", "seed", "--opset", "12", "--out", str(tmp_path)])
    assert r.exit_code == 2 and "--opset: expected 18..25, got 12" in r.stderr
    missing = str(tmp_path / "none.pt")
    r = CliRunner().invoke(cli, ["export", "--preset", "seed", "--weights", missing, "--out", str(tmp_path)])
    assert r.exit_code == 1 and "found nothing" in r.stderr
    assert list(tmp_path.iterdir()) == []


def test_validate(seed_dir: Path) -> None:
    result = CliRunner().invoke(cli, ["validate", str(seed_dir)])
    assert result.exit_code == 0, result.output
    manifest = load_manifest(seed_dir)
    judged = len(manifest.artifacts) + len(manifest.optimized["cpu"].files)  # and the copies this machine loads
    assert result.stdout.strip().splitlines()[-1] == f"{judged * 20} passed, 0 failed"  # 10 shapes x 2 seeds


def test_run_writes_the_output(seed_dir: Path, tmp_path: Path) -> None:
    x = np.random.default_rng(1).standard_normal((3, 5, 3)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    result = CliRunner().invoke(cli, ["run", str(seed_dir / "mha.onnx"), "--input", str(tmp_path / "x.npy"),
                                      "--output", str(tmp_path / "y.npy"), "--provider", "cpu", "--threads", "1"])
    assert result.exit_code == 0, result.output
    y = np.load(tmp_path / "y.npy")
    assert y.shape == (3, 5, 4) and y.dtype == np.float32 and np.isfinite(y).all()


def test_run_cuda_when_unavailable_is_one_line(seed_dir: Path, tmp_path: Path) -> None:
    import onnxruntime as ort

    np.save(tmp_path / "x.npy", np.zeros((1, 2, 3), np.float32))
    result = CliRunner().invoke(cli, ["run", str(seed_dir), "--input", str(tmp_path / "x.npy"), "--output",
                                      str(tmp_path / "y.npy"), "--provider", "cuda"])
    if "CUDAExecutionProvider" in ort.get_available_providers():
        assert result.exit_code == 0
    else:
        assert result.exit_code == 1 and "onnxruntime-gpu" in result.stderr and not (tmp_path / "y.npy").exists()


def test_check_prints_summary_last(seed_dir: Path) -> None:
    result = CliRunner().invoke(cli, ["check", str(seed_dir)])
    assert result.exit_code == 0, result.output
    lines = result.stdout.strip().splitlines()
    expected = 3 * len(load_manifest(seed_dir).artifacts)  # 3 golden cases per artifact
    assert lines[-1] == f"{expected} passed, 0 failed"
    assert sum(line.startswith("ok") for line in lines) == expected


def test_check_fails_when_a_golden_output_is_wrong(seed_copy: Path) -> None:
    """Rewrite a golden output and its manifest entry consistently: the numbers, not the hash, must fail it."""
    from mha_runtime.artifact.manifest import sha256_file

    target = seed_copy / "golden" / "b1_t1.context.bin"
    target.write_bytes((np.fromfile(target, "<f4") + 1.0).astype("<f4").tobytes())
    manifest = json.loads((seed_copy / "manifest.json").read_text())
    manifest["files"]["golden/b1_t1.context.bin"]["sha256"] = sha256_file(target)
    (seed_copy / "manifest.json").write_text(json.dumps(manifest))
    result = CliRunner().invoke(cli, ["check", str(seed_copy)])
    assert result.exit_code == 1
    artifacts = len(manifest["artifacts"])  # the case b1_t1 now fails on every artifact, the other two pass
    assert result.stdout.strip().splitlines()[-1] == f"{2 * artifacts} passed, {artifacts} failed"


def test_check_json_target_is_refused_before_the_check_runs(seed_dir: Path, tmp_path: Path) -> None:
    """A --json PATH that cannot be written is a bad value, refused in one line before any case runs."""
    for target, says in ((tmp_path, "expected a file name, got a folder"),
                         (tmp_path / "none" / "r.json", "expected a file in an existing folder")):
        result = CliRunner().invoke(cli, ["check", str(seed_dir), "--json", str(target)])
        assert result.exit_code == 2 and result.stdout == "" and says in result.stderr, result.output
        assert result.stderr.count("\n") == 1 and f"--json {target}" in result.stderr


def test_inspect(seed_dir: Path) -> None:
    result = CliRunner().invoke(cli, ["inspect", str(seed_dir)])
    assert result.exit_code == 0, result.output
    assert "input    x float32 ['batch', 'tokens', 3]" in result.stdout
    assert "limits   1 <= tokens <= 6" in result.stdout
    assert "mha.onnx" in result.stdout and "golden/cases.json" in result.stdout
    as_json = CliRunner().invoke(cli, ["inspect", str(seed_dir), "--json"])
    assert json.loads(as_json.stdout)["name"] == "seed"


def test_inspect_of_a_non_artifact_folder(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["inspect", str(tmp_path)])
    assert result.exit_code == 1 and "expected a manifest" in result.stderr and "Traceback" not in result.output

