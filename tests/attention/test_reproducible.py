"""The same config and weights give the same artifact bytes wherever the checkout lives, and no file names a path
of the machine that built it.

The other checkout exports every variant but mha.pte: ExecuTorch's lowering was half of this file's time, and
mha.pte's bytes are pinned (tests/data/preset_digests.json, checked by test_golden.py on every seed export, made at
whatever path the checkout has)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO, copy_packages
from mha_runtime.artifact.manifest import sha256_file
from mha_runtime.attention.manifest import load_manifest
from mha_runtime.attention.registry import CHOICES, PTE, VARIANTS

# ONNX Runtime's ORT-format writer orders its flatbuffer differently on every run of the same session (docs/
# design-notes.md, "Reproducible bytes", has the reproduction); the manifest records the digest of the file shipped.
NOT_BYTE_STABLE = (".ort",)
CASES = "golden/cases.json"
# What the manifest says about the run rather than the artifacts.
RUN_FACTS = ("created", "export_seconds")


def _files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _without_run_facts(value: object) -> object:
    if isinstance(value, dict):
        return {k: _without_run_facts(v) for k, v in value.items() if k not in RUN_FACTS}
    return value


@pytest.fixture(scope="module")
def elsewhere(seed_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The seed preset exported by a copy of the checkout at another path (PYTHONPATH puts the copy first), every
    variant seed_dir has but pte."""
    have = load_manifest(seed_dir).artifacts
    not_pte = tuple(n for n in CHOICES if n != "pte" and all(a.file in have for a in VARIANTS[n].artifacts))
    copy = copy_packages(tmp_path_factory.mktemp("another-checkout") / "mha")
    out = tmp_path_factory.mktemp("elsewhere-out")
    # Another shape exported first in the same process: the bytes must not depend on what the process did before.
    code = ("import sys, mha_export; from pathlib import Path; "
            "from mha_export.attention.pipeline.export import export_preset; "
            "from mha_runtime.attention.config import MHAConfig; print(mha_export.__file__); "
            "export_preset('other', Path(sys.argv[1]), config=MHAConfig(d_in=5, d_out=4, num_heads=3, "
            "context_length=7, qkv_bias=True), variants=('fused',)); "
            f"export_preset('seed', Path(sys.argv[1]), variants={not_pte!r})")
    env = {**os.environ, "PYTHONPATH": f"{copy / 'runtime'}{os.pathsep}{copy / 'export'}"}
    done = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, text=True, env=env,
                          cwd=copy, timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().startswith(str(copy)), done.stdout  # the copy's code did the export
    return out / "seed", copy


def test_two_checkouts_write_the_same_bytes(seed_dir: Path, elsewhere: tuple[Path, Path]) -> None:
    ours, theirs = _files(seed_dir), _files(elsewhere[0])
    assert sorted(set(ours) - set(theirs)) == [PTE.file] and set(theirs) <= set(ours)
    differ = [name for name in theirs if ours[name] != theirs[name]]
    assert [n for n in differ if not n.endswith(NOT_BYTE_STABLE)] == [CASES, "manifest.json"], differ
    cases = [json.loads(files[CASES]) for files in (ours, theirs)]  # each lists the artifacts it was made for
    cases[0]["artifacts"] = [a for a in cases[0]["artifacts"] if a["file"] != PTE.file]
    assert cases[0] == cases[1]
    a, b = (json.loads(files["manifest.json"]) for files in (ours, theirs))
    for name in [*differ, PTE.file]:  # the .ort digests differ; every other record is equal
        a["files"].pop(name, None), b["files"].pop(name, None)
    a["artifacts"].pop(PTE.file)
    assert _without_run_facts(a) == _without_run_facts(b)


def test_the_manifest_records_the_digest_of_the_file_that_ships(seed_dir: Path) -> None:
    manifest = load_manifest(seed_dir)
    assert {name: sha256_file(seed_dir / name) for name in manifest.files} == {
        name: record.sha256 for name, record in manifest.files.items()}


def test_no_artifact_names_a_path_of_the_build_machine(seed_dir: Path, elsewhere: tuple[Path, Path]) -> None:
    needles = {str(REPO), str(elsewhere[1]), str(Path(sys.prefix)), os.path.expanduser("~")}
    needles = {n.encode() for n in needles if len(n) > 1}
    for folder in (seed_dir, elsewhere[0]):
        for name, data in _files(folder).items():
            found = [n.decode() for n in needles if n in data]
            assert not found, f"{folder / name} names {found}"
