"""The base install is the torch-free runtime under names that cannot collide (built and installed for real)."""
from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from helpers import REPO
from mha_runtime.manifest import load_manifest


def _run(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=600, cwd=cwd)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    built = _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", out, REPO)
    assert built.returncode == 0, built.stderr
    (path,) = out.glob("mha_export-*.whl")
    return path


@pytest.fixture(scope="module")
def base_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with only the base install of the wheel (numpy, onnxruntime, click; pip may use its cache)."""
    venv = tmp_path_factory.mktemp("base") / "venv"
    assert _run(sys.executable, "-m", "venv", venv).returncode == 0
    installed = _run(venv / "bin" / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check", wheel)
    assert installed.returncode == 0, installed.stderr
    return venv


def test_wheel_top_level_names_are_prefixed(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        tops = {name.split("/")[0] for name in archive.namelist() if ".dist-info/" not in name}
    assert tops == {"mha_export", "mha_runtime"}


def test_base_install_runs_checks_and_inspects_without_torch(base_venv: Path, seed_dir: Path, tmp_path: Path) -> None:
    python, mha = base_venv / "bin" / "python", base_venv / "bin" / "mha"
    no_torch = _run(python, "-c", "import torch", cwd=tmp_path)
    assert no_torch.returncode == 1 and "No module named 'torch'" in no_torch.stderr
    code = "import numpy as np; np.save('x.npy', np.ones((2, 3, 3), np.float32))"
    assert _run(python, "-c", code, cwd=tmp_path).returncode == 0
    run = _run(mha, "run", seed_dir, "--input", "x.npy", "--output", "y.npy", "--provider", "cpu", cwd=tmp_path)
    assert run.returncode == 0 and (tmp_path / "y.npy").exists(), run.stderr
    check = _run(mha, "check", seed_dir, cwd=tmp_path)
    assert check.returncode == 0, check.stdout + check.stderr
    last = check.stdout.strip().splitlines()[-1]
    torch_side = [f for f, a in load_manifest(seed_dir).artifacts.items() if a.runtime in ("torchscript", "executorch")]
    assert last.endswith(f", 0 failed, {3 * len(torch_side)} skipped") and not last.startswith("0 ")  # need torch
    inspect = _run(mha, "inspect", seed_dir, cwd=tmp_path)
    assert inspect.returncode == 0 and "mha.onnx" in inspect.stdout


def test_base_install_export_names_the_extra(base_venv: Path, tmp_path: Path) -> None:
    result = _run(base_venv / "bin" / "mha", "export", "--preset", "seed", "--out", tmp_path / "out", cwd=tmp_path)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.strip().count("\n") == 0 and "pip install 'mha-export[export]'" in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "out").exists()


def test_base_install_serve_names_the_extra(base_venv: Path, seed_dir: Path, tmp_path: Path) -> None:
    result = _run(base_venv / "bin" / "mha", "serve", seed_dir, "--port", "1", cwd=tmp_path)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.strip().count("\n") == 0 and "pip install 'mha-export[serve]'" in result.stderr
    assert "Traceback" not in result.stderr
    repo = tmp_path / "repo"  # the Triton repository needs neither torch nor ray
    triton = _run(base_venv / "bin" / "mha", "triton", seed_dir, "--out", repo, cwd=tmp_path)
    assert triton.returncode == 0 and (repo / "seed_torchscript" / "1" / "model.pt").exists(), triton.stderr
