"""The offline-optimized copies: written and sealed at export, equal to the plain files, loaded only where this
machine matches the export's ONNX Runtime and CPU, refused when altered. ONNX Runtime itself is the reference."""
from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from click.testing import CliRunner

import mha_runtime.infer.pick_copy as optimized
from helpers import REPO
from mha_runtime.artifact.errors import ArtifactError
from mha_runtime.attention.optimized_records import Fingerprint
from mha_runtime.attention.registry import OFFLINE_OPTIMIZED_FILES, tolerance_for
from mha_runtime.attention.runner import OnnxRunner
from mha_runtime.cli.main import cli
from mha_runtime.infer.cpu_features import cpu_fingerprint, parse_cpuinfo

COPIES = sorted(OFFLINE_OPTIMIZED_FILES)  # mha.blocks.onnx, mha.qblocks.onnx
SHAPES = [(1, 1), (1, 6), (3, 4), (2, 5)]


@pytest.fixture(autouse=True)
def fresh_notes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with no note said yet in this process."""
    monkeypatch.setattr(optimized, "_said", set())


def _copy_of(folder: Path, file: str) -> Path:
    return folder / json.loads((folder / "manifest.json").read_text())["optimized"]["cpu"]["files"][file]["file"]


def _edit_manifest(folder: Path, edit) -> None:
    doc = json.loads((folder / "manifest.json").read_text())
    edit(doc)
    (folder / "manifest.json").write_text(json.dumps(doc))


def _ort_session(data: bytes, level: ort.GraphOptimizationLevel) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = level
    return ort.InferenceSession(data, sess_options=options, providers=["CPUExecutionProvider"])


def test_the_manifest_lists_a_cpu_copy_of_each_fast_artifact_with_its_sha256(seed_dir: Path) -> None:
    doc = json.loads((seed_dir / "manifest.json").read_text())
    assert list(doc["optimized"]) == ["cpu"]  # no CUDA at export here: no CUDA copy, and the manifest says so
    record = doc["optimized"]["cpu"]
    assert record["onnxruntime"] == ort.__version__ and record["level"] == "all"
    assert sorted(record["files"]) == COPIES
    for file in COPIES:
        copy = record["files"][file]
        data = (seed_dir / copy["file"]).read_bytes()
        assert copy["file"] == f"optimized/cpu/{file}"
        assert doc["files"][copy["file"]] == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        assert copy["passed"] and copy["cases"] == doc["artifacts"][file]["cases"] == 20
        assert 0 <= copy["max_abs_error"] <= tolerance_for(doc["artifacts"][file]["kind"]).atol
    assert record["fingerprint"]["machine"] == os.uname().machine


def test_each_copy_is_the_graph_onnx_runtime_itself_builds_from_the_plain_file(seed_dir: Path, tmp_path: Path) -> None:
    """Made afresh in this process from the plain bytes, ONNX Runtime's optimized graph is the shipped copy, byte
    for byte (reproducible), and names no path of the machine that made it."""
    for file in COPIES:
        options = ort.SessionOptions()
        options.optimized_model_filepath = str(tmp_path / file)
        ort.InferenceSession((seed_dir / file).read_bytes(), sess_options=options, providers=["CPUExecutionProvider"])
        shipped = _copy_of(seed_dir, file).read_bytes()
        assert (tmp_path / file).read_bytes() == shipped
        assert shipped != (seed_dir / file).read_bytes()
        for needle in (str(seed_dir), str(REPO), str(Path(sys.prefix)), "/tmp/", ".optimizing-", ".tmp"):
            assert needle.encode() not in shipped, needle


@pytest.mark.parametrize("file", COPIES)
def test_the_runner_loads_the_copy_unoptimized_and_matches_the_plain_file(seed_dir: Path, file: str) -> None:
    runner = OnnxRunner(seed_dir, model=file, provider="cpu")
    assert runner.preoptimized and runner.loaded == _copy_of(seed_dir, file) and runner.path == seed_dir / file
    level = runner.session.get_session_options().graph_optimization_level
    assert level == ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    plain = _ort_session((seed_dir / file).read_bytes(), ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    tol = tolerance_for(file.split(".")[1])
    rng = np.random.default_rng(0)
    for batch, tokens in SHAPES:
        x = rng.standard_normal((batch, tokens, runner.config.d_in)).astype(np.float32)
        (expected,) = plain.run(["context"], {"x": x})
        np.testing.assert_allclose(runner.run(x), expected, atol=tol.atol, rtol=tol.rtol)


def test_offline_optimized_false_loads_the_plain_file(seed_dir: Path) -> None:
    runner = OnnxRunner(seed_dir, model=COPIES[0], provider="cpu", offline_optimized=False)
    assert not runner.preoptimized and runner.loaded == seed_dir / COPIES[0]
    assert runner.session.get_session_options().graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL


def test_a_file_without_a_copy_loads_as_before_and_says_nothing(seed_dir: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="mha_runtime"):
        runner = OnnxRunner(seed_dir, provider="cpu")  # mha.onnx
    assert not runner.preoptimized and runner.loaded == seed_dir / "mha.onnx" and caplog.records == []


def test_another_cpu_falls_back_to_the_plain_file_and_says_so_once(seed_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    here = cpu_fingerprint()
    # A flag this host lacks (hosts differ between runs: some have AVX-512, some not), and one it has taken away.
    extra = next(f for f in ("avx512f", "amx_tile", "avx_vnni", "sve2") if f not in (here.cpu_flags or ()))
    other = Fingerprint(here.machine, tuple(sorted({*(here.cpu_flags or ()), extra} - {"avx2"})))
    monkeypatch.setattr(optimized, "cpu_fingerprint", lambda: other)
    with caplog.at_level(logging.WARNING, logger="mha_runtime"):
        first = OnnxRunner(seed_dir, model="mha.qblocks.onnx", provider="cpu")
        second = OnnxRunner(seed_dir, model="mha.qblocks.onnx", provider="cpu")
    assert not first.preoptimized and first.loaded == second.loaded == seed_dir / "mha.qblocks.onnx"
    assert len(caplog.records) == 1  # not once per runner
    note = caplog.records[0].getMessage()
    assert "\n" not in note and "mha.qblocks.onnx" in note and "CPU features differ" in note
    assert extra in note and "avx2" in note and "plain file" in note


def test_another_onnx_runtime_version_falls_back(seed_copy: Path, caplog: pytest.LogCaptureFixture) -> None:
    _edit_manifest(seed_copy, lambda d: d["optimized"]["cpu"].update(onnxruntime="1.0.0"))
    with caplog.at_level(logging.WARNING, logger="mha_runtime"):
        runner = OnnxRunner(seed_copy, model="mha.blocks.onnx", provider="cpu")
    assert not runner.preoptimized and runner.loaded == seed_copy / "mha.blocks.onnx"
    assert [r.getMessage() for r in caplog.records if "onnxruntime 1.0.0" in r.getMessage()]


def test_a_recorded_fingerprint_of_another_machine_falls_back(seed_copy: Path,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    _edit_manifest(seed_copy, lambda d: d["optimized"]["cpu"]["fingerprint"].update(machine="riscv64"))
    with caplog.at_level(logging.WARNING, logger="mha_runtime"):
        runner = OnnxRunner(seed_copy, model="mha.blocks.onnx", provider="cpu")
    assert not runner.preoptimized and "riscv64" in caplog.records[0].getMessage()


def test_an_absent_copy_falls_back_with_the_note(seed_copy: Path, caplog: pytest.LogCaptureFixture) -> None:
    _copy_of(seed_copy, "mha.qblocks.onnx").unlink()
    with caplog.at_level(logging.WARNING, logger="mha_runtime"):
        runner = OnnxRunner(seed_copy, model="mha.qblocks.onnx", provider="cpu")
    assert not runner.preoptimized and "is not in the folder" in caplog.records[0].getMessage()


def test_a_folder_exported_before_the_copies_loads_the_plain_file(seed_copy: Path) -> None:
    _edit_manifest(seed_copy, lambda d: d.pop("optimized"))
    assert not OnnxRunner(seed_copy, model="mha.qblocks.onnx", provider="cpu").preoptimized


@pytest.mark.parametrize("other", ["mha.fp16.onnx", "optimized/cpu/mha.blocks.onnx"])
def test_a_record_naming_another_listed_file_is_refused(seed_copy: Path, other: str) -> None:
    """manifest.json is not listed in itself: a copy record for mha.qblocks.onnx edited to name another listed file
    ran that graph under mha.qblocks.onnx's name (sha256 and config checks pass: it is listed, its config the
    same)."""
    _edit_manifest(seed_copy, lambda d: d["optimized"]["cpu"]["files"]["mha.qblocks.onnx"].update(file=other))
    with pytest.raises(ArtifactError) as info:
        OnnxRunner(seed_copy, model="mha.qblocks.onnx", provider="cpu")
    assert f"optimized.cpu.files.mha.qblocks.onnx.file: expected 'optimized/cpu/mha.qblocks.onnx', got {other!r}" \
        in str(info.value)


@pytest.mark.parametrize("damage,message", [
    (lambda p: p.write_bytes(p.read_bytes()[:-64] + bytes(64)), "differs from the manifest"),
    (lambda p: p.write_bytes(p.read_bytes()[:-100]), "truncated"),
])
def test_an_altered_copy_is_refused_never_replaced_by_the_plain_file(seed_copy: Path, damage, message: str) -> None:
    damage(_copy_of(seed_copy, "mha.qblocks.onnx"))
    with pytest.raises(ArtifactError, match=message):
        OnnxRunner(seed_copy, model="mha.qblocks.onnx", provider="cpu")


def test_the_cli_refuses_an_altered_copy_in_one_line(seed_copy: Path, tmp_path: Path) -> None:
    copy = _copy_of(seed_copy, "mha.blocks.onnx")
    data = bytearray(copy.read_bytes())
    data[len(data) // 2] ^= 0xFF
    copy.write_bytes(bytes(data))
    np.save(tmp_path / "x.npy", np.zeros((1, 2, 3), np.float32))
    result = CliRunner().invoke(cli, ["run", str(seed_copy), "--model", "mha.blocks.onnx", "--input",
                                      str(tmp_path / "x.npy"), "--output", str(tmp_path / "y.npy")])
    assert result.exit_code == 1 and not (tmp_path / "y.npy").exists()
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "optimized/cpu/mha.blocks.onnx" in lines[0] and "differs from the manifest" in lines[0]
    check = CliRunner().invoke(cli, ["check", str(seed_copy)])
    assert check.exit_code == 1 and "optimized/cpu/mha.blocks.onnx" in check.stderr


@pytest.mark.parametrize("text,flags", [
    ("processor\t: 0\nflags\t\t: fpu sse2 pni ssse3 sse4_1 avx avx2 fma f16c avx512f avx512bw hypervisor md_clear\n"
     "processor\t: 1\nflags\t\t: fpu\n",
     ("avx", "avx2", "avx512bw", "avx512f", "f16c", "fma", "pni", "sse4_1", "ssse3")),
    ("processor\t: 0\nFeatures\t: fp asimd evtstrm aes asimddp sve i8mm bf16 cpuid\n",
     ("asimd", "asimddp", "bf16", "i8mm", "sve")),
    ("processor\t: 0\nvendor_id\t: x\n", None),
])
def test_the_fingerprint_keeps_the_simd_flags_of_the_first_processor(text: str, flags: tuple[str, ...] | None) -> None:
    assert parse_cpuinfo(text) == flags


def test_the_bench_times_the_file_the_runner_loads(seed_dir: Path) -> None:
    from mha_export.bench.runners import cold_start_loads
    from mha_runtime.attention.manifest import load_manifest

    manifest = load_manifest(seed_dir)
    assert cold_start_loads(seed_dir, manifest, "mha.qblocks.onnx") == "optimized/cpu/mha.qblocks.onnx"
    assert cold_start_loads(seed_dir, manifest, "mha.onnx") == "mha.onnx"
    assert cold_start_loads(seed_dir, manifest, "mha.pt") is None
