"""Every contract violation is refused before ONNX Runtime sees it, through the API and the CLI."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from mha_runtime.artifact.errors import ContractError
from mha_runtime.attention.runner import OnnxRunner
from mha_runtime.cli.main import cli

GOOD = np.zeros((2, 3, 3), dtype=np.float32)
NAN = GOOD.copy()
NAN[0, 1, 2] = np.nan
INF = GOOD.copy()
INF[1, 0, 0] = np.inf

# (id, array, fragment of the one-line error)
VIOLATIONS = [
    ("rank2", np.zeros((3, 3), np.float32), "expected rank 3"),
    ("rank4", np.zeros((1, 2, 3, 3), np.float32), "expected rank 3"),
    ("wrong_d_in", np.zeros((2, 3, 5), np.float32), "expected last axis d_in=3, got 5"),
    ("zero_tokens", np.zeros((2, 0, 3), np.float32), "expected 1 <= tokens <= context_length=6, got 0"),
    ("too_many_tokens", np.zeros((1, 7, 3), np.float32), "expected 1 <= tokens <= context_length=6, got 7"),
    ("zero_batch", np.zeros((0, 3, 3), np.float32), "expected batch >= 1, got 0"),
    ("int32", np.zeros((2, 3, 3), np.int32), "expected dtype float32"),
    ("bool", np.zeros((2, 3, 3), bool), "expected dtype float32"),
    ("nan", NAN, "expected finite float32 values, got 1 NaN/inf"),
    ("inf", INF, "expected finite float32 values, got 1 NaN/inf"),
    ("float64_overflow", np.full((1, 2, 3), 1e300), "expected finite float32 values"),
]


@pytest.fixture(scope="module")
def runner(seed_dir: Path) -> OnnxRunner:
    return OnnxRunner(seed_dir, provider="cpu")


@pytest.mark.parametrize("name,array,message", VIOLATIONS, ids=[v[0] for v in VIOLATIONS])
def test_api_refuses(runner: OnnxRunner, name: str, array: np.ndarray, message: str) -> None:
    with pytest.raises(ContractError, match=message.replace("(", r"\(")):
        runner.run(array)


def test_api_refuses_non_arrays(runner: OnnxRunner) -> None:
    with pytest.raises(ContractError, match="expected a numpy array, got list"):
        runner.run([[[0.0, 0.0, 0.0]]])


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_float16_and_float64_are_cast(runner: OnnxRunner, dtype: type) -> None:
    x = np.random.default_rng(0).standard_normal((2, 4, 3)).astype(dtype)
    out = runner.run(x)
    assert out.dtype == np.float32 and out.shape == (2, 4, 4)
    np.testing.assert_allclose(out, runner.run(x.astype(np.float32)), rtol=0, atol=0)


@pytest.mark.parametrize("name,array,message", VIOLATIONS, ids=[v[0] for v in VIOLATIONS])
def test_cli_refuses_with_one_line_and_no_output(seed_dir: Path, tmp_path: Path, name: str, array: np.ndarray,
                                                message: str) -> None:
    np.save(tmp_path / "x.npy", array)
    out = tmp_path / "y.npy"
    result = CliRunner().invoke(cli, ["run", str(seed_dir), "--input", str(tmp_path / "x.npy"), "--output", str(out),
                                      "--provider", "cpu"])
    assert result.exit_code == 1
    assert message in result.stderr and "Traceback" not in result.output
    assert len(result.stderr.strip().splitlines()) == 1
    assert not out.exists() and not list(tmp_path.glob(".y.npy*"))


def test_cli_refuses_a_file_that_is_not_npy(seed_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "x.npy").write_text("not an array")
    result = CliRunner().invoke(cli, ["run", str(seed_dir), "--input", str(tmp_path / "x.npy"), "--output",
                                      str(tmp_path / "y.npy")])
    assert result.exit_code == 1 and "expected a .npy array" in result.stderr
    assert not (tmp_path / "y.npy").exists()
