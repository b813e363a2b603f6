"""The packaging tests' fixtures: the torch-free runtime installed by the README's command into a fresh venv."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from helpers import copy_packages


@pytest.fixture(scope="session")
def runtime_venv(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(a fresh venv made by the README's `pip install ./runtime`, the copy of the checkout it was run in): the
    torch-free install, shared by test_install.py and test_packaging.py. pip may use its cache."""
    src = copy_packages(tmp_path_factory.mktemp("runtime-install") / "checkout")
    venv = src.parent / "venv"
    assert subprocess.run([sys.executable, "-m", "venv", venv], capture_output=True).returncode == 0
    installed = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-compile",
                                "--disable-pip-version-check", "./runtime"], capture_output=True, text=True,
                               timeout=900, cwd=src)  # --no-compile: as test_install.py says why
    assert installed.returncode == 0, installed.stderr[-2000:]
    return venv, src
