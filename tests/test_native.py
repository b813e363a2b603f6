"""The native runners (built by `make native-build`, which `make test` runs first): bad fixtures and bad files.

The golden checks themselves run in `make native-test`; these tests feed each runner deliberately broken input.
"""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from mha_export.fixtures import cases_tsv
from mha_runtime.golden import GoldenCases

NATIVE = Path(__file__).resolve().parents[1] / "runtime" / "native"
C_CHECK = NATIVE / "c" / "build" / "mha_check"
CPP_CHECK = NATIVE / "cpp-libtorch" / "build" / "mha_ts"
NODE_CLI = NATIVE / "node" / "cli.js"
RUNNERS = {
    "c": lambda d: [str(C_CHECK), "check", str(d)],
    "node": lambda d: ["node", str(NODE_CLI), "check", str(d)],
    "cpp": lambda d: [str(CPP_CHECK), "check", str(d)],
}
MODEL_OF = {"c": "mha.onnx", "node": "mha.onnx", "cpp": "mha.pt"}


def _run(runner: str, folder: Path) -> subprocess.CompletedProcess[str]:
    built = {"c": C_CHECK, "cpp": CPP_CHECK, "node": NATIVE / "node" / "node_modules" / "onnxruntime-node"}[runner]
    assert built.exists(), f"{built} is missing: build the native runners first (make native-build)"
    return subprocess.run(RUNNERS[runner](folder), capture_output=True, text=True, timeout=300)


def _add_case(folder: Path, name: str, shape: tuple[int, int, int], width: int) -> None:
    """Append a golden case with the given input shape to cases.json and cases.tsv (outputs are zeros)."""
    golden = folder / "golden"
    x = np.zeros(shape, "<f4")
    y = np.zeros((shape[0], shape[1], width), "<f4")
    (golden / f"{name}.x.bin").write_bytes(x.tobytes())
    (golden / f"{name}.context.bin").write_bytes(y.tobytes())
    doc = json.loads((golden / "cases.json").read_text())
    doc["cases"].append({"name": name, "input_shape": list(shape), "output_shape": list(y.shape),
                         "input_bin": f"{name}.x.bin", "output_bin": f"{name}.context.bin",
                         "input_npy": f"{name}.x.npy", "output_npy": f"{name}.context.npy"})
    for entry in doc["artifacts"]:
        if "schedules" in entry:
            entry["schedules"][name] = [shape[1]]
    (golden / "cases.json").write_text(json.dumps(doc))
    (golden / "cases.tsv").write_text(cases_tsv(GoldenCases.from_dict(doc, "cases.json")))


@pytest.mark.parametrize("runner", list(RUNNERS))
def test_golden_cases_pass(runner: str, seed_dir: Path) -> None:
    result = _run(runner, seed_dir)
    assert result.returncode == 0, result.stdout + result.stderr
    last = result.stdout.strip().splitlines()[-1]
    assert last.endswith("passed, 0 failed") and not last.startswith("0 ")


@pytest.mark.parametrize("runner", list(RUNNERS))
@pytest.mark.parametrize("shape,message", [
    ((1, 7, 3), "expected 1 <= tokens <= context_length=6, got 7"),
    ((1, 2, 5), "expected last axis d_in=3, got 5"),
])
def test_contract_breaking_fixture_is_refused(runner: str, shape: tuple[int, int, int], message: str,
                                              seed_dir: Path, tmp_path: Path) -> None:
    folder = Path(shutil.copytree(seed_dir, tmp_path / "seed"))
    _add_case(folder, "bad", shape, 4)
    result = _run(runner, folder)
    assert result.returncode == 1
    assert message in result.stdout + result.stderr
    assert result.stdout.strip().splitlines()[-1].endswith(" failed") and " 0 failed" not in result.stdout


@pytest.mark.parametrize("runner", list(RUNNERS))
def test_corrupted_model_is_an_error_not_a_crash(runner: str, seed_dir: Path, tmp_path: Path) -> None:
    folder = Path(shutil.copytree(seed_dir, tmp_path / "seed"))
    model = folder / MODEL_OF[runner]
    model.write_bytes(b"\x00garbage" + model.read_bytes()[100:])
    result = _run(runner, folder)
    assert result.returncode == 1, result.stdout + result.stderr  # a crash would be a signal (negative code)
    out = result.stdout + result.stderr
    assert {"c": "cannot load model", "node": "truncated or replaced", "cpp": "torch::jit::load failed"}[runner] in out


@pytest.mark.parametrize("runner", list(RUNNERS))
def test_no_fixtures_is_a_failure(runner: str, tmp_path: Path) -> None:
    result = _run(runner, tmp_path)
    assert result.returncode == 1 and "expected golden fixtures" in result.stderr


def test_embedding_snippets_are_the_built_examples() -> None:
    readme = (Path(__file__).resolve().parents[1] / "docs" / "embedding.md").read_text()
    examples = (NATIVE / "node" / "example.js", NATIVE / "c" / "example.c", NATIVE / "cpp-libtorch" / "example.cpp")
    for example in examples:
        assert example.read_text().strip() in readme, f"docs/embedding.md snippet differs from {example}"
