"""The README's install table, row by row: each `pip install` gives what the row says.

The rows share what they can and are still run as written: `pip install ./runtime` is the session's runtime venv
(conftest.py's `runtime_venv`, which test_packaging.py also uses); the serve row gets a fresh venv; the three torch
rows upgrade one venv in the table's order (export, then bench, then executorch), each row's check run right after
its own install, so what a row must not bring yet is checked before the next row adds it. pip may use its cache and
takes torch 2.13.0 from this machine's disk. Each row runs with --no-compile (NO_COMPILE): the packages, versions
and entry points are the row's; pip skips writing bytecode for every installed module ahead of time (about half of
the torch rows' pip time, docs/measurements/tests.md), and Python compiles what the checks import as they run.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from helpers import REPO, copy_packages

# As a user's shell runs the commands: Python writes the bytecode of what it imports (a host that sets
# PYTHONDONTWRITEBYTECODE would compile torch and ExecuTorch from source at every command, NO_COMPILE below).
USER_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
TINY = {"d_in": 8, "d_out": 8, "num_heads": 2, "context_length": 16}
ROWS = re.findall(r"^\| [^|]+ \| `(pip install [^`]+)` \|", (REPO / "README.md").read_text(), re.M)


def _run(venv: Path, *args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(venv / "bin" / str(args[0])), *map(str, args[1:])], capture_output=True, text=True,
                          timeout=900, cwd=cwd, env=USER_ENV)


def _imports(venv: Path, cwd: Path, *modules: str) -> dict[str, bool]:
    code = ("import importlib.util, json, sys; "
            "print(json.dumps({m: importlib.util.find_spec(m) is not None for m in sys.argv[1:]}))")
    return json.loads(_run(venv, "python", "-c", code, *modules, cwd=cwd).stdout)


def _export(venv: Path, cwd: Path, *variants: str) -> subprocess.CompletedProcess[str]:
    (cwd / "tiny.json").write_text(json.dumps(TINY))
    extra = ["--variants", ",".join(variants)] if variants else []
    return _run(venv, "mha", "export", "--config", "tiny.json", "--name", "tiny", "--out", "out", *extra, cwd=cwd)


def check_runtime(venv: Path, cwd: Path, seed_dir: Path) -> None:
    listed = _run(venv, "mha", "--help", cwd=cwd).stdout
    assert all(f" {c} " in listed for c in ("run", "check", "inspect", "serve", "loadtest", "triton", "generate"))
    assert " export " not in listed
    assert _imports(venv, cwd, "mha_runtime", "onnxruntime", "tokenizers", "torch", "mha_export", "ray") == {
        "mha_runtime": True, "onnxruntime": True, "tokenizers": True, "torch": False, "mha_export": False,
        "ray": False}
    check = _run(venv, "mha", "check", seed_dir, cwd=cwd)
    assert check.returncode == 0 and " 0 failed, " in check.stdout.splitlines()[-1], check.stdout + check.stderr


def check_serve(venv: Path, cwd: Path, seed_dir: Path) -> None:
    assert _imports(venv, cwd, "ray.serve", "torch") == {"ray.serve": True, "torch": False}
    assert _run(venv, "mha", "serve", "--help", cwd=cwd).returncode == 0


def check_export(venv: Path, cwd: Path, seed_dir: Path) -> None:
    assert _imports(venv, cwd, "torch", "onnx", "mha_export", "executorch", "matplotlib") == {
        "torch": True, "onnx": True, "mha_export": True, "executorch": False, "matplotlib": False}
    made = _export(venv, cwd)
    assert made.returncode == 0, made.stderr
    assert made.stderr.strip().splitlines()[-1] == (
        "note: tiny: variant 'pte' left out: needs executorch: pip install './export[executorch]'")
    files = {p.name for p in (cwd / "out" / "tiny").iterdir()}  # the rest of the default set is made
    assert "mha.pte" not in files and {"mha.onnx", "mha.qblocks.onnx", "mha.int8.onnx"} <= files, files
    # The export validated every form it wrote (its table); `mha validate` itself is test_cli.py's.
    rows = [line.split() for line in made.stdout.splitlines() if line.startswith("tiny ")]
    assert {r[1] for r in rows} >= {"mha.onnx", "mha.int8.onnx"} and all(r[-1] == "ok" for r in rows), made.stdout


def check_bench(venv: Path, cwd: Path, seed_dir: Path) -> None:
    assert _imports(venv, cwd, "matplotlib", "mha_export") == {"matplotlib": True, "mha_export": True}
    assert _run(venv, "mha", "bench", "--help", cwd=cwd).returncode == 0


def check_executorch(venv: Path, cwd: Path, seed_dir: Path) -> None:
    made = _export(venv, cwd, "pte")
    assert made.returncode == 0 and (cwd / "out" / "tiny" / "mha.pte").exists(), made.stderr
    assert "left out" not in made.stderr


NO_COMPILE = "--no-compile"
RUNTIME_ROW = "pip install ./runtime"
SERVE_ROW = "pip install './runtime[serve]'"
TORCH_ROWS = ("pip install ./runtime ./export", "pip install ./runtime './export[bench]'",
              "pip install ./runtime './export[executorch]'")  # each adds to the one before
CHECKS: dict[str, Callable[[Path, Path, Path], None]] = {
    RUNTIME_ROW: check_runtime,
    SERVE_ROW: check_serve,
    TORCH_ROWS[0]: check_export,
    TORCH_ROWS[1]: check_bench,
    TORCH_ROWS[2]: check_executorch,
}


def _venv(at: Path) -> Path:
    assert subprocess.run([sys.executable, "-m", "venv", at], capture_output=True).returncode == 0
    return at


def _install(venv: Path, command: str, src: Path) -> None:
    args = command.split(" ", 2)[2]
    installed = subprocess.run(f"{venv}/bin/python -m pip install -q --disable-pip-version-check {NO_COMPILE} {args}",
                               shell=True, capture_output=True, text=True, timeout=900, cwd=src, env=USER_ENV)
    assert installed.returncode == 0, installed.stderr[-2000:]


def test_every_install_row_has_a_check() -> None:
    assert ROWS and set(ROWS) == set(CHECKS), "README's install table and tests/packaging/test_install.py disagree"


def test_the_runtime_row(runtime_venv: tuple[Path, Path], seed_dir: Path) -> None:
    venv, src = runtime_venv  # made by `pip install ./runtime` in a copy of the checkout
    check_runtime(venv, src, seed_dir)


def test_the_serve_row(seed_dir: Path, tmp_path: Path) -> None:
    src = copy_packages(tmp_path / "checkout")  # pip builds in the source tree: a copy keeps the checkout clean
    venv = _venv(tmp_path / "venv")
    _install(venv, SERVE_ROW, src)
    check_serve(venv, src, seed_dir)


def test_the_torch_rows_in_order_in_one_venv(seed_dir: Path, tmp_path: Path) -> None:
    src = copy_packages(tmp_path / "checkout")
    venv = _venv(tmp_path / "venv")
    for command in TORCH_ROWS:
        _install(venv, command, src)
        CHECKS[command](venv, src, seed_dir)
