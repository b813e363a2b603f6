"""Hostile and careless input through the CLI and the Python API: one line, a non-zero exit (or the project's own
error class), no traceback, and no output file written or changed."""
from __future__ import annotations

import io
import json
import os
import shutil
import stat
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from helpers import REPO, reseal, reseal_json
from mha_runtime.artifact.errors import MHAError
from mha_runtime.artifact.manifest import sha256_file
from mha_runtime.attention.decode_session import DecodeSession
from mha_runtime.attention.runner import OnnxRunner
from mha_runtime.cli.main import cli
from mha_runtime.cli.options import MAX_BATCH, MAX_BATCH_WAIT_MS, MAX_REPLICAS, MAX_THREADS

Setup = Callable[[Path, Path], list[str]]  # (a private copy of the seed folder, a work folder) -> `mha run` args


def _x(work: Path, array: np.ndarray, name: str = "x.npy") -> str:
    np.save(work / name, array)
    return str(work / name)


def _ones(shape: tuple[int, ...], dtype: str = "float32") -> np.ndarray:
    return np.ones(shape, dtype)


def _huge_header(work: Path) -> str:
    path = Path(_x(work, _ones((1, 2, 3))))
    path.write_bytes(path.read_bytes().replace(b"'shape': (1, 2, 3)", b"'shape': (999999999, 2, 3)"))
    return str(path)


def _rewrite_manifest(seed: Path, edit: Callable[[dict], None]) -> None:
    data = json.loads((seed / "manifest.json").read_text())
    edit(data)
    (seed / "manifest.json").write_text(json.dumps(data))


def _lone_model_with_wrong_metadata(seed: Path, work: Path) -> str:
    model = onnx.load(str(seed / "mha.onnx"))
    for prop in model.metadata_props:
        if prop.key == "mha.config":
            prop.value = prop.value.replace('"d_in": 3', '"d_in": 5')
    onnx.save(model, str(work / "lone.onnx"))
    return str(work / "lone.onnx")


RUN_CASES: dict[str, tuple[Setup, str]] = {
    "input missing": (lambda s, w: [str(s), "--input", str(w / "none.npy")], "found nothing there"),
    "input is a folder": (lambda s, w: [str(s), "--input", str(w)], "found a folder"),
    "input not npy": (lambda s, w: [str(s), "--input", str(s / "mha.onnx")], "expected a .npy array"),
    "npy header claims a huge shape": (lambda s, w: [str(s), "--input", _huge_header(w)], "the header says shape"),
    "npy of objects": (lambda s, w: [str(s), "--input", _x(w, np.array([{"a": 1}], dtype=object))],
                       "expected a numeric array"),
    "integers": (lambda s, w: [str(s), "--input", _x(w, _ones((1, 2, 3), "int32"))], "expected dtype float32"),
    "complex": (lambda s, w: [str(s), "--input", _x(w, _ones((1, 2, 3), "complex64"))], "expected dtype float32"),
    "rank 2": (lambda s, w: [str(s), "--input", _x(w, _ones((2, 3)))], "expected rank 3"),
    "wrong d_in": (lambda s, w: [str(s), "--input", _x(w, _ones((1, 2, 5)))], "expected last axis d_in=3"),
    "too many tokens": (lambda s, w: [str(s), "--input", _x(w, _ones((1, 7, 3)))], "1 <= tokens <= context_length"),
    "empty batch": (lambda s, w: [str(s), "--input", _x(w, _ones((0, 2, 3)))], "expected batch >= 1"),
    "NaN": (lambda s, w: [str(s), "--input", _x(w, np.full((1, 2, 3), np.nan, np.float32))], "NaN/inf"),
    "float64 overflowing float32": (lambda s, w: [str(s), "--input", _x(w, np.full((1, 2, 3), 1e300))], "NaN/inf"),
    "finite but overflowing attention": (lambda s, w: [str(s), "--input", _x(w, np.full((1, 3, 3), 1e20, "f4"))],
                                         "max |x| = 1e+20"),
    "output is a folder": (lambda s, w: [str(s), "--input", _x(w, _ones((1, 2, 3))), "--output", str(w)],
                           "expected a file name, got a folder"),
    "output folder missing": (lambda s, w: [str(s), "--input", _x(w, _ones((1, 2, 3))), "--output",
                                            str(w / "no" / "y.npy")], "expected a file in an existing folder"),
    "output not writable": (lambda s, w: [str(s), "--input", _x(w, _ones((1, 2, 3))), "--output", "/proc/y.npy"],
                            "/proc"),
    "model is a folder": (lambda s, w: [str(s), "--input", _x(w, _ones((1, 2, 3))), "--model", "golden"],
                          "not listed in"),
    "model not listed": (lambda s, w: [str(s), "--input", _x(w, _ones((1, 2, 3))), "--model", "other.onnx"],
                         "not listed in"),
    "manifest is a folder": (lambda s, w: (os.remove(s / "manifest.json"), (s / "manifest.json").mkdir(),
                                           [str(s), "--input", _x(w, _ones((1, 2, 3)))])[-1], "manifest.json"),
    "manifest files is a list": (lambda s, w: (_rewrite_manifest(s, lambda d: d.update(files=[])),
                                               [str(s), "--input", _x(w, _ones((1, 2, 3)))])[-1],
                                 "field 'files' expected a JSON object"),
    "manifest entry without size": (lambda s, w: (_rewrite_manifest(s, lambda d: d["files"]["mha.onnx"].pop("size")),
                                                  [str(s), "--input", _x(w, _ones((1, 2, 3)))])[-1],
                                    "files.mha.onnx: missing field 'size'"),
    "manifest not JSON": (lambda s, w: ((s / "manifest.json").write_text("{"),
                                        [str(s), "--input", _x(w, _ones((1, 2, 3)))])[-1], "expected JSON"),
    "file removed from the manifest": (lambda s, w: (_rewrite_manifest(s, lambda d: d["files"].pop("mha.onnx")),
                                                     [str(s / "mha.onnx"), "--input", _x(w, _ones((1, 2, 3)))])[-1],
                                       "mha.onnx: not listed in"),
    "lone model whose metadata disagrees with its graph": (
        lambda s, w: [_lone_model_with_wrong_metadata(s, w), "--input", _x(w, _ones((1, 2, 5)))],
        "but its metadata's config says [batch, tokens, 5]"),
    "bad provider": (lambda s, w: [str(s), "--input", _x(w, _ones((1, 2, 3))), "--provider", "tpu"],
                     "'tpu' is not one of"),
    "threads zero": (lambda s, w: [str(s), "--input", _x(w, _ones((1, 2, 3))), "--threads", "0"], "--threads"),
}


@pytest.mark.parametrize("case", list(RUN_CASES))
def test_mha_run_refuses_in_one_line(case: str, seed_copy: Path, tmp_path: Path) -> None:
    setup, message = RUN_CASES[case]
    work = tmp_path / "work"
    work.mkdir()
    (work / "y.npy").write_bytes(b"old output")
    args = setup(seed_copy, work)
    if "--output" not in args:
        args += ["--output", str(work / "y.npy")]
    result = CliRunner().invoke(cli, ["run", *args])
    lines = result.stderr.strip().splitlines()
    assert result.exit_code in (1, 2), result.output
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "Traceback" not in result.output, result.stderr
    assert message in lines[0], lines[0]
    assert (work / "y.npy").read_bytes() == b"old output" and not list(work.glob(".y.npy.*"))


def test_a_lone_model_without_manifest_runs_and_says_it_is_unverified(seed_dir: Path, tmp_path: Path) -> None:
    shutil.copy(seed_dir / "mha.onnx", tmp_path / "mha.onnx")
    np.save(tmp_path / "x.npy", _ones((1, 2, 3)))
    result = CliRunner().invoke(cli, ["run", str(tmp_path / "mha.onnx"), "--input", str(tmp_path / "x.npy"),
                                      "--output", str(tmp_path / "y.npy")])
    assert result.exit_code == 0 and "its sha256 is unverified" in result.stderr
    assert np.load(tmp_path / "y.npy").shape == (1, 2, 4)


def test_a_lone_model_that_is_not_a_regular_file_is_refused_before_a_read(tmp_path: Path) -> None:
    """No manifest beside it, so no listed size: a FIFO blocked the read for ever (and a link to /dev/zero filled
    the memory until the kernel killed the process: the same check, not run here)."""
    os.mkfifo(tmp_path / "lone.onnx")
    np.save(tmp_path / "x.npy", _ones((1, 2, 3)))
    result = subprocess.run([sys.executable, "-m", "mha_runtime", "run", str(tmp_path / "lone.onnx"), "--input",
                             str(tmp_path / "x.npy"), "--output", str(tmp_path / "y.npy")], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 1 and result.stderr.count("\n") == 1 and result.stdout == "", result.stderr
    assert "lone.onnx: expected a model file, got a FIFO (named pipe)" in result.stderr
    assert not (tmp_path / "y.npy").exists()


def test_an_onnx_runtime_failure_is_one_line_without_its_own_log(seed_dir: Path, tmp_path: Path) -> None:
    """A lone model whose metadata says context_length 1000 over a graph whose mask holds 6: the run fails inside
    ONNX Runtime, whose own coloured error log came on stderr before the one line."""
    model = onnx.load(str(seed_dir / "mha.onnx"))
    for prop in model.metadata_props:
        if prop.key == "mha.config":
            prop.value = prop.value.replace('"context_length": 6', '"context_length": 1000')
    onnx.save(model, str(tmp_path / "lone.onnx"))
    np.save(tmp_path / "x.npy", _ones((1, 100, 3)))
    result = subprocess.run([sys.executable, "-m", "mha_runtime", "run", str(tmp_path / "lone.onnx"), "--input",
                             str(tmp_path / "x.npy"), "--output", str(tmp_path / "y.npy")], capture_output=True,
                            text=True, timeout=120)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 2 and "its sha256 is unverified" in lines[0], result.stderr
    assert lines[1].startswith("Error: ") and "ONNX Runtime failed on x [1, 100, 3]" in lines[1]


@pytest.mark.parametrize("call,message", [
    (lambda d: OnnxRunner(None), "expected a folder or an .onnx/.ort path"),  # type: ignore[arg-type]
    (lambda d: OnnxRunner(d, threads="2"), "threads: expected a positive integer"),  # type: ignore[arg-type]
    (lambda d: OnnxRunner(d, threads=True), "threads: expected a positive integer"),
    (lambda d: OnnxRunner(d, provider=["cpu"]), "provider: expected one of"),  # type: ignore[arg-type]
    (lambda d: OnnxRunner(d, model=None), "model: expected a file name"),  # type: ignore[arg-type]
    (lambda d: OnnxRunner(d, model="../seed/mha.onnx"), "not listed in"),
    (lambda d: OnnxRunner(d).run([[[1.0, 2.0, 3.0]]]), "expected a numpy array, got list"),
    (lambda d: OnnxRunner(d).run(np.ma.masked_invalid(np.full((1, 2, 3), np.nan, np.float32))), "masked array"),
    (lambda d: OnnxRunner(d).run(np.ones((1, 2, 3), np.float128)), "expected dtype float32"),
    (lambda d: OnnxRunner(d).run(np.full((1, 3, 3), 1e20, np.float32)), "overflow float32 attention scores"),
    (lambda d: DecodeSession(d, model="mha.onnx"), "expected the decode form"),
    (lambda d: DecodeSession(d).restore((np.zeros((1, 2, 3, 2), np.float32), np.zeros((1, 2, 2, 2), np.float32))),
     "differ"),
    (lambda d: DecodeSession(d).restore((np.zeros((1, 2, 9, 2), np.float32),) * 2), "past_tokens <= 6"),
    (lambda d: DecodeSession(d).restore("cache"), "expected (past_key, past_value)"),
], ids=lambda v: v if isinstance(v, str) else "")
def test_api_raises_only_project_errors(seed_dir: Path, call: Callable[[Path], object], message: str) -> None:
    with pytest.raises(MHAError) as info:
        call(seed_dir)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_big_endian_inputs_are_read_like_native_ones(seed_dir: Path) -> None:
    x = np.random.default_rng(0).standard_normal((2, 4, 3)).astype(np.float32)
    runner = OnnxRunner(seed_dir)
    want = runner.run(x)
    assert np.array_equal(runner.run(x.astype(">f4")), want)
    assert np.array_equal(runner.run(x.astype(">f8")), want)


def test_decode_restore_with_a_foreign_cache_leaves_the_session_usable(seed_dir: Path) -> None:
    session = DecodeSession(seed_dir)
    session.step(np.ones((1, 2, 3), np.float32))
    before = session.snapshot()
    with pytest.raises(MHAError):
        session.restore((np.zeros((1, 2, 2, 5), np.float32),) * 2)
    assert session.snapshot() is not None and session.past_tokens == 2 and session.snapshot()[0] is before[0]
    assert session.step(np.ones((1, 1, 3), np.float32)).shape == (1, 1, 4)


@pytest.mark.parametrize("args,message", [
    (lambda t: ["inspect", str(t)], "expected a manifest"),
    (lambda t: ["inspect", str(t / "absent")], "expected a folder made by `mha export`"),
    (lambda t: ["check", str(t / "absent")], "expected a folder made by `mha export`"),
    (lambda t: ["export", "--preset", "seed", "--variants", "none", "--out", "/dev/null"], "/dev/null"),
    (lambda t: ["export", "--preset", "seed", "--variants", "none", "--out", str(t / "file")],
     "expected a folder, found a file"),
    # not writable even by root (sysfs refuses new entries): a PermissionError where the folder would go
    (lambda t: ["export", "--preset", "seed", "--variants", "none", "--out", "/sys/kernel/mha-out"],
     "--out /sys/kernel/mha-out: cannot write there"),
    (lambda t: ["export", "--preset", "seed", "--opset", "x"], "'x' is not a valid integer"),
    # empty values are not the defaults (the preset's name, 'all')
    (lambda t: ["export", "--preset", "seed", "--name", "", "--out", str(t)], "--name: expected a folder name"),
    (lambda t: ["export", "--gpt", "--preset", "gpt-mini", "--name", "", "--out", str(t)],
     "--name: expected a folder name"),
    (lambda t: ["export", "--preset", "seed", "--variants", " ", "--out", str(t)], "got none"),
    (lambda t: ["bench", "--preset", "nope", "--artifacts", str(t)], "expected a folder made by `mha export`"),
])
def test_cli_refusals_are_one_line(tmp_path: Path, args: Callable[[Path], list[str]], message: str) -> None:
    (tmp_path / "file").write_text("a file, not a folder")
    result = CliRunner().invoke(cli, args(tmp_path))
    lines = result.stderr.strip().splitlines()
    assert result.exit_code in (1, 2) and len(lines) == 1 and message in lines[0], result.output
    assert "Traceback" not in result.output


def test_inspect_of_a_manifest_without_contract_is_one_line(seed_copy: Path) -> None:
    _rewrite_manifest(seed_copy, lambda d: d.pop("contract"))
    result = CliRunner().invoke(cli, ["inspect", str(seed_copy)])
    assert result.exit_code == 1 and result.stderr.count("\n") == 1 and "missing field 'contract'" in result.stderr


def test_resealed_golden_cases_with_format_true_are_refused(seed_copy: Path) -> None:
    """JSON true equals 1 in Python: cases.json with "format": true was read as format 1."""
    reseal_json(seed_copy, "golden/cases.json", format=True)
    result = CliRunner().invoke(cli, ["check", str(seed_copy)])
    assert result.exit_code == 1 and result.stderr.count("\n") == 1, result.output
    assert "cases.json: expected format 1, got True" in result.stderr, result.stderr


def test_resealed_golden_artifact_with_an_unknown_runtime_is_refused(seed_copy: Path) -> None:
    """`mha check` runs each file of cases.json by its runtime: mha.onnx under "tensorflow" was left out of the
    check without a word, which passed on the other files."""
    doc = json.loads((seed_copy / "golden" / "cases.json").read_text())
    doc["artifacts"][0]["runtime"] = "tensorflow"
    (seed_copy / "golden" / "cases.json").write_text(json.dumps(doc))
    reseal(seed_copy, "golden/cases.json")
    result = CliRunner().invoke(cli, ["check", str(seed_copy)])
    assert result.exit_code == 1 and result.stderr.count("\n") == 1 and result.stdout == "", result.output
    assert "cases.json: artifacts[0].runtime: expected one of onnxruntime, " in result.stderr, result.stderr


def test_resealed_golden_case_whose_shape_wraps_int64_round_is_one_line(seed_copy: Path) -> None:
    """2**32 * 2**32 * 1 float32 values: numpy's product wrapped to 0, so an empty input file matched the shape and
    the reshape after was an internal error."""
    golden = seed_copy / "golden"
    doc = json.loads((golden / "cases.json").read_text())
    case = doc["cases"][0]
    case.update(input_shape=[2**32, 2**32, 1], output_shape=[2**32, 2**32, 4])
    for entry in doc["artifacts"]:
        if "schedules" in entry:
            entry["schedules"][case["name"]] = [2**32]
    (golden / "cases.json").write_text(json.dumps(doc))
    (golden / case["input_bin"]).write_bytes(b"")
    reseal(seed_copy, "golden/cases.json", f"golden/{case['input_bin']}")
    result = CliRunner().invoke(cli, ["check", str(seed_copy)])
    assert result.exit_code == 1 and result.stderr.count("\n") == 1 and "internal error" not in result.stderr
    assert "expected 18446744073709551616 float32 values for shape [4294967296, 4294967296, 1], found 0" in \
        result.stderr, result.stderr


def test_a_resealed_tolerance_past_float64_prints_no_numpy_warning(seed_copy: Path) -> None:
    """rtol 1e308 times an output's magnitude overflows: numpy's RuntimeWarning (two raw lines) was on stderr."""
    doc = json.loads((seed_copy / "golden" / "cases.json").read_text())
    doc["artifacts"][0]["tolerance"].update(atol=1e308, rtol=1e308)
    (seed_copy / "golden" / "cases.json").write_text(json.dumps(doc))
    reseal(seed_copy, "golden/cases.json")
    result = subprocess.run([sys.executable, "-m", "mha_runtime", "check", str(seed_copy)], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0 and result.stderr == "", result.stderr


@pytest.mark.parametrize("args,code", [(["run", "{t}", "--input", "{t}/x.npy", "--output", "{t}/y.npy"], 1),
                                       (["export", "--variants", "bogus"], 2), (["nope"], 2)])
def test_the_installed_command_gives_one_line(tmp_path: Path, args: list[str], code: int) -> None:
    """The real entry point, not CliRunner."""
    np.save(tmp_path / "x.npy", _ones((1, 2, 3)))
    mha = Path(sys.executable).parent / "mha"
    result = subprocess.run([str(mha), *[a.format(t=tmp_path) for a in args]], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == code and result.stderr.count("\n") == 1 and result.stderr.startswith("Error: ")
    assert result.stdout == "" and not (tmp_path / "y.npy").exists()


def test_written_files_follow_the_umask(seed_dir: Path, tmp_path: Path) -> None:
    previous = os.umask(0o022)
    try:
        np.save(tmp_path / "x.npy", _ones((1, 2, 3)))
        result = CliRunner().invoke(cli, ["run", str(seed_dir), "--input", str(tmp_path / "x.npy"), "--output",
                                          str(tmp_path / "y.npy")])
        assert result.exit_code == 0, result.output
        assert stat.S_IMODE((tmp_path / "y.npy").stat().st_mode) == 0o644
        modes = {p.relative_to(seed_dir).as_posix(): stat.S_IMODE(p.stat().st_mode) for p in seed_dir.rglob("*")}
        assert stat.S_IMODE(seed_dir.stat().st_mode) == 0o755
        assert modes["weights.safetensors"] == 0o644 and modes["golden"] == 0o755
        assert set(modes.values()) == {0o644, 0o755}, modes
    finally:
        os.umask(previous)


def test_a_check_of_an_altered_file_names_both_digests(seed_copy: Path) -> None:
    path = seed_copy / "mha.onnx"
    expected = sha256_file(path)
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(MHAError) as info:
        OnnxRunner(seed_copy)
    message = str(info.value)
    assert expected[:12] in message and sha256_file(path)[:12] in message and "re-export" in message
    assert REPO.exists()


@pytest.mark.parametrize("args,option", [
    # One past the bound: were it taken, the run would start 1,025 threads (100,000 grew to 16 GB).
    (["run", "{seed}", "--input", "{t}/x.npy", "--output", "{t}/y.npy", "--threads", str(MAX_THREADS + 1)],
     "--threads"),
    (["check", "{seed}", "--threads", "99999999999999999999"], "--threads"),
    (["serve", "{t}/absent", "--batch-wait-ms", "nan"], "--batch-wait-ms"),  # click's FloatRange takes NaN
    # one past the drain timeout: 1e308 held a lone request for ever
    (["serve", "{t}/absent", "--batch-wait-ms", str(MAX_BATCH_WAIT_MS + 1)], "--batch-wait-ms"),
    (["serve", "{t}/absent", "--max-batch", str(MAX_BATCH + 1)], "--max-batch"),
    (["serve", "{t}/absent", "--address", "127.0.0.1:99999"], "--address"),  # Ray retried this for minutes
    (["serve", "{t}/absent", "--replicas", str(MAX_REPLICAS + 1)], "--replicas"),
    (["loadtest", "http://127.0.0.1:9", "--artifact", "{seed}", "--max-seconds", "inf"], "--max-seconds"),
    (["loadtest", "http://127.0.0.1:9", "--artifact", "{seed}", "--generate", "--stream", "nan"], "--stream"),
    (["triton", "{seed}", "--out", "{t}/repo", "--max-batch", "99999999999999999999"], "--max-batch"),
    (["triton", "{seed}", "--out", "{t}/repo", "--name", "n" * 300], "--name"),  # left an empty --out behind
    # a load test's own values, before any server is asked (nothing listens on port 9: it would say "no answer")
    (["loadtest", "http://127.0.0.1:9", "--artifact", "{seed}", "--batch", "0"], "--batch: expected sizes >= 1"),
    (["loadtest", "http://127.0.0.1:9", "--artifact", "{seed}", "--seed", "-1"], "--seed: expected an integer"),
    (["loadtest", "http://127.0.0.1:9", "--artifact", "{seed}", "--json", "{t}"], "--json"),
    (["loadtest", "http://127.0.0.1:9", "--artifact", "{seed}", "--generate", "--prompt-tokens", "0"],
     "--prompt-tokens: expected counts >= 1"),
    (["bench", "--preset", "seed", "--settle", "1e308", "--out", "{t}/bench"], "--settle"),  # was an OverflowError
])
def test_numbers_out_of_bounds_are_usage_errors(seed_dir: Path, tmp_path: Path, args: list[str], option: str) -> None:
    """Refused by the option's type before anything starts (no server contacted, no Ray, no file): exit 2, one
    line naming the option."""
    np.save(tmp_path / "x.npy", _ones((1, 2, 3)))
    result = CliRunner().invoke(cli, [a.format(seed=seed_dir, t=tmp_path) for a in args])
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and option in lines[0], result.output
    assert not (tmp_path / "y.npy").exists() and not (tmp_path / "repo").exists()


def test_outputs_through_a_link_or_a_fifo_are_written_not_replaced(seed_dir: Path, tmp_path: Path) -> None:
    """--output into a symbolic link writes the link's target (the link stays a link); into a FIFO, its reader
    gets the bytes and the FIFO stays a FIFO (it used to be swapped for a regular file, as /dev/full was)."""
    np.save(tmp_path / "x.npy", _ones((1, 2, 3)))
    run = ["run", str(seed_dir), "--input", str(tmp_path / "x.npy"), "--output"]
    (tmp_path / "target.npy").write_bytes(b"old")
    (tmp_path / "link.npy").symlink_to("target.npy")
    assert CliRunner().invoke(cli, [*run, str(tmp_path / "link.npy")]).exit_code == 0
    assert (tmp_path / "link.npy").is_symlink() and np.load(tmp_path / "target.npy").shape == (1, 2, 4)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got: dict[str, bytes] = {}
    reader = threading.Thread(target=lambda: got.update(data=fifo.read_bytes()), daemon=True)
    reader.start()
    result = CliRunner().invoke(cli, [*run, str(fifo)])
    reader.join(timeout=120)  # the writer's close ends the read
    assert result.exit_code == 0 and stat.S_ISFIFO(os.lstat(fifo).st_mode), result.output
    assert np.array_equal(np.load(tmp_path / "target.npy"), np.load(io.BytesIO(got["data"])))


def test_inspect_of_a_size_past_63_bits_is_one_line(seed_copy: Path) -> None:
    _rewrite_manifest(seed_copy, lambda d: d["files"]["mha.onnx"].update(size=10**400))
    result = CliRunner().invoke(cli, ["inspect", str(seed_copy)])
    assert result.exit_code == 1 and result.stderr.count("\n") == 1, result.output
    assert "more than 63 bits" in result.stderr and "internal error" not in result.stderr


@pytest.mark.parametrize("name", ["mha\x00.onnx", "mha\n.onnx"])
def test_a_listed_name_with_a_control_character_is_one_line(seed_copy: Path, name: str) -> None:
    """manifest.json is not listed in itself: a NUL in a listed name was an internal ValueError of `mha check`, a
    newline split its error into two lines."""
    _rewrite_manifest(seed_copy, lambda d: d["files"].update({name: d["files"]["mha.onnx"]}))
    result = CliRunner().invoke(cli, ["check", str(seed_copy)])
    assert result.exit_code == 1 and result.stderr.count("\n") == 1 and result.stdout == "", result.output
    assert f"files: expected a file name inside the artifact folder, got {name!r}" in result.stderr


@pytest.mark.parametrize("command", ["inspect", "check"])
def test_a_number_field_holding_an_integer_past_floats_range_is_one_line(seed_copy: Path, command: str) -> None:
    """float(10**400) raised OverflowError: every command on the folder was an "internal error"."""
    _rewrite_manifest(seed_copy, lambda d: d["artifacts"]["mha.onnx"].update(max_abs_error=10**400))
    result = CliRunner().invoke(cli, [command, str(seed_copy)])
    assert result.exit_code == 1 and result.stderr.count("\n") == 1 and result.stdout == "", result.output
    assert "artifacts.mha.onnx: field 'max_abs_error' expected a number, got an integer of 401 digits" in result.stderr


@pytest.mark.parametrize("url", ["http://[::1", "http://[::1:8000/"])
def test_a_url_that_does_not_parse_is_one_line(seed_dir: Path, url: str) -> None:
    """urlsplit's own ValueError (an unclosed IPv6 bracket) was an "internal error"."""
    result = CliRunner().invoke(cli, ["loadtest", url, "--artifact", str(seed_dir)])
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 1 and len(lines) == 1, result.output
    assert lines[0] == (f"Error: {url}: expected http://127.0.0.1:PORT (a load test targets this machine's "
                        "loopback only)")


def test_inspect_shows_a_manifest_name_with_control_characters_escaped(seed_copy: Path) -> None:
    """manifest.json is not listed in itself: a name edited to hold a newline would forge a line of the output."""
    _rewrite_manifest(seed_copy, lambda d: d.update(name="seed\nresult   ok\u202e"))
    result = CliRunner().invoke(cli, ["inspect", str(seed_copy)])
    assert result.exit_code == 0, result.output
    assert not any(line.startswith("result") for line in result.output.splitlines())
    assert "'seed\\nresult   ok\\u202e'" in result.output and "\u202e" not in result.output
