"""Two distributions whose folders are their import names, built and installed for real.

mha-runtime (runtime/) is the torch-free base install; mha-export (export/) adds torch and the export commands
to the same `mha` command through entry points.
"""
from __future__ import annotations

import importlib.util
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from helpers import REPO, copy_packages
from mha_runtime.attention.manifest import load_manifest


def _run(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=600, cwd=cwd)


def _source_packages(root: Path, name: str) -> set[str]:
    """Every package under root/name, as dotted names: each folder holding an __init__.py."""
    return {".".join(p.parent.relative_to(root).parts) for p in (root / name).rglob("__init__.py")}


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out, src = tmp_path_factory.mktemp("wheels"), tmp_path_factory.mktemp("src")
    copy_packages(src)  # built from copies: setuptools' build/ and egg-info stay out of the checkout
    built = _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", out, src / "runtime", src / "export")
    assert built.returncode == 0, built.stderr
    (runtime,) = out.glob("mha_runtime-*.whl")
    (export,) = out.glob("mha_export-*.whl")
    return {"mha_runtime": runtime, "mha_export": export}


@pytest.fixture(scope="module")
def base_venv(runtime_venv: tuple[Path, Path]) -> Path:
    """The session's venv with only the runtime (`pip install ./runtime`: pip builds its wheel and installs that;
    numpy, onnxruntime, click, tokenizers)."""
    return runtime_venv[0]


@pytest.mark.parametrize("name", ["mha_runtime", "mha_export"])
def test_each_wheel_holds_exactly_its_package_and_every_subpackage(wheels: dict[str, Path], name: str) -> None:
    folder = REPO / name.removeprefix("mha_")
    with zipfile.ZipFile(wheels[name]) as archive:
        files = [n for n in archive.namelist() if ".dist-info/" not in n]
    assert {f.split("/")[0] for f in files} == {name}
    in_wheel = {".".join(f.split("/")[:-1]) for f in files if f.endswith("/__init__.py")}
    assert in_wheel == _source_packages(folder, name) and len(in_wheel) > 3


@pytest.mark.parametrize("name", ["mha_runtime", "mha_export"])
def test_the_editable_install_finds_each_package_in_the_folder_of_its_name(name: str) -> None:
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.origin is not None
    origin = Path(spec.origin)
    assert origin.parent.name == name and origin.parent.parent == REPO / name.removeprefix("mha_")


def test_the_wheel_install_finds_the_runtime_in_the_folder_of_its_name(base_venv: Path, tmp_path: Path) -> None:
    code = ("import importlib.util as u; print(u.find_spec('mha_runtime').origin); "
            "print(u.find_spec('mha_export') is None, u.find_spec('torch') is None)")
    out = _run(base_venv / "bin" / "python", "-c", code, cwd=tmp_path)
    origin, absent = out.stdout.strip().splitlines()
    assert Path(origin).parent.name == "mha_runtime" and "site-packages" in origin, out.stderr
    assert absent == "True True"  # no export code and no torch in the base install


def test_base_install_runs_checks_and_inspects_without_torch(base_venv: Path, seed_dir: Path, tmp_path: Path) -> None:
    python, mha = base_venv / "bin" / "python", base_venv / "bin" / "mha"
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
    listed = _run(mha, "--help", cwd=tmp_path)
    assert listed.returncode == 0 and " run " in listed.stdout and " export " not in listed.stdout


@pytest.mark.parametrize("command", ["export", "validate", "bench"])
def test_base_install_export_commands_name_the_package(base_venv: Path, tmp_path: Path, command: str) -> None:
    result = _run(base_venv / "bin" / "mha", command, "--out", tmp_path / "out", cwd=tmp_path)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.strip().count("\n") == 0 and "pip install ./runtime ./export" in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "out").exists()


def test_base_install_serve_names_the_extra(base_venv: Path, seed_dir: Path, tmp_path: Path) -> None:
    result = _run(base_venv / "bin" / "mha", "serve", seed_dir, "--port", "1", cwd=tmp_path)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.strip().count("\n") == 0 and "pip install './runtime[serve]'" in result.stderr
    assert "Traceback" not in result.stderr
    repo = tmp_path / "repo"  # the Triton repository needs neither torch nor ray
    triton = _run(base_venv / "bin" / "mha", "triton", seed_dir, "--out", repo, cwd=tmp_path)
    assert triton.returncode == 0 and (repo / "seed_torchscript" / "1" / "model.pt").exists(), triton.stderr
