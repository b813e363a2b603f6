"""Shared fixtures: each preset is exported once per test session into a temporary folder."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from helpers import MID
from mha_export.pipeline.export import export_preset


@pytest.fixture(scope="session")
def seed_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_preset("seed", tmp_path_factory.mktemp("artifacts")).folder


@pytest.fixture(scope="session")
def mid_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_preset("mid", tmp_path_factory.mktemp("artifacts"), config=MID).folder


@pytest.fixture(scope="session")
def gpt2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_preset("gpt2-small", tmp_path_factory.mktemp("artifacts")).folder


@pytest.fixture
def seed_copy(seed_dir: Path, tmp_path: Path) -> Path:
    """A private copy of the seed artifacts that a test may damage."""
    return Path(shutil.copytree(seed_dir, tmp_path / "seed"))


@pytest.fixture
def mid_copy(mid_dir: Path, tmp_path: Path) -> Path:
    """A private copy of the mid artifacts (d_out 16: it has mha.decode-inplace.onnx) that a test may damage."""
    return Path(shutil.copytree(mid_dir, tmp_path / "mid"))
