"""onnxruntime-web: the wasm check in Node.js (runtime/native/web/check.mjs) and the browser page in headless chromium.

Needs `make web-build` (npm ci in runtime/native/web) and Debian's /usr/bin/chromium (`make chromium`); `make test`
runs both first. The page runs are saved as artifacts/web/<preset>.png and .browser.json, which the
portability table of docs/portability.md is generated from (tools/portability.py); make test checks it after pytest.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import onnx.helper as oh
import pytest
from onnx import TensorProto

from helpers import add_zero_case, reseal
from mha_export.bench.runners import wasm_medians
from mha_runtime.artifact.errors import ArtifactError
from mha_runtime.attention.manifest import load_manifest
from mha_runtime.attention.runner import OnnxRunner
from portability import collect, parse_json, render
from torch_refs import EXPECTED, INPUTS

REPO = Path(__file__).resolve().parents[2]
WEB = REPO / "runtime" / "native" / "web"
OUT = REPO / "artifacts" / "web"
CHROMIUM = Path("/usr/bin/chromium")
PRESETS = ["seed", pytest.param("gpt2-small", marks=pytest.mark.slow)]
FIXTURE = {"seed": "seed_dir", "gpt2-small": "gpt2_dir"}
WEB_RUNTIMES = ("onnxruntime", "onnxruntime-decode", "onnxruntime-decode-inplace")
INPLACE = "mha.decode-inplace.onnx"


def _built() -> None:
    assert (WEB / "node_modules" / "onnxruntime-web").is_dir(), "onnxruntime-web is missing: run `make web-build`"


def _check(folder: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    _built()
    return subprocess.run(["node", str(WEB / "check.mjs"), str(folder), *extra], capture_output=True, text=True,
                          timeout=600)


def _expected_cases(folder: Path) -> int:
    doc = json.loads((folder / "golden" / "cases.json").read_text())
    return len(doc["cases"]) * sum(a["runtime"] in WEB_RUNTIMES for a in doc["artifacts"])


def _alter(path: Path) -> None:
    """Same size, different bytes: only the sha256 can tell."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _add_unloadable(folder: Path) -> str:
    """A model with an op no ONNX Runtime build has, listed in the manifest (right sha256) and in cases.json."""
    node = oh.make_node("NotARealOp", ["x"], ["context"], domain="com.microsoft")
    graph = oh.make_graph([node], "bogus", [oh.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "t", 3])],
                          [oh.make_tensor_value_info("context", TensorProto.FLOAT, ["b", "t", 4])])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18), oh.make_opsetid("com.microsoft", 1)],
                          ir_version=10)  # onnx 1.23 writes IR 14 by default; onnxruntime-web 1.30 stops at 13
    data = model.SerializeToString()
    (folder / "mha.bogus.onnx").write_bytes(data)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"]["mha.bogus.onnx"] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    cases = json.loads((folder / "golden" / "cases.json").read_text())
    cases["artifacts"].append({"file": "mha.bogus.onnx", "kind": "bogus", "runtime": "onnxruntime",
                               "tolerance": {"atol": 1e-5, "rtol": 1e-5, "rel_l2": None}})
    (folder / "golden" / "cases.json").write_text(json.dumps(cases))
    reseal(folder, "golden/cases.json")  # the check reads only sealed golden files
    return "mha.bogus.onnx"


# --- the wasm check in Node.js ---------------------------------------------------------------------------------


def test_wasm_check_passes_every_case_and_writes_json(seed_dir: Path, tmp_path: Path) -> None:
    result = _check(seed_dir, "--json", str(tmp_path / "seed.json"), "--repeats", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    expected = _expected_cases(seed_dir)
    assert result.stdout.strip().splitlines()[-1] == f"{expected} passed, 0 failed"
    doc = json.loads((tmp_path / "seed.json").read_text())
    assert (doc["passed"], doc["failed"], doc["threads"], doc["onnxruntime_web"]) == (expected, 0, 1, "1.30.0")
    manifest = load_manifest(seed_dir)
    for artifact in doc["artifacts"]:
        assert artifact["sha256"] == manifest.files[artifact["file"]].sha256
        assert all(c["ok"] and c["max_abs"] is not None and c["median_ms"] > 0 for c in artifact["cases"]), artifact


def test_wasm_check_refuses_an_altered_model(seed_copy: Path) -> None:
    _alter(seed_copy / "mha.fused.onnx")
    result = _check(seed_copy, "--repeats", "1")
    assert result.returncode == 1
    fused = [line for line in result.stdout.splitlines() if " mha.fused.onnx " in line]
    assert fused and all(line.startswith("FAIL") and "differs from the manifest's" in line for line in fused)
    cases = len(json.loads((seed_copy / "golden" / "cases.json").read_text())["cases"])
    total = _expected_cases(seed_copy)
    assert result.stdout.strip().splitlines()[-1] == f"{total - cases} passed, {cases} failed"


def test_wasm_check_never_reads_a_fifo_or_a_device(seed_copy: Path) -> None:
    """manifest.json as a FIFO blocked for a writer; a listed model linked to /dev/zero was read without end."""
    (seed_copy / "mha.fused.onnx").unlink()
    (seed_copy / "mha.fused.onnx").symlink_to("/dev/zero")
    result = _check(seed_copy, "--repeats", "1")
    fused = [line for line in result.stdout.splitlines() if " mha.fused.onnx " in line]
    assert result.returncode == 1 and fused, result.stdout + result.stderr
    assert all(line.startswith("FAIL") and "expected a regular file, got a character device" in line for line in fused)
    (seed_copy / "manifest.json").unlink()
    os.mkfifo(seed_copy / "manifest.json")
    result = _check(seed_copy, "--repeats", "1")
    assert result.returncode == 1 and result.stderr.strip().endswith(
        "manifest.json: expected a regular file, got a FIFO (named pipe)"), result.stderr


def test_wasm_check_refuses_a_contract_breaking_case(seed_copy: Path) -> None:
    add_zero_case(seed_copy, "too_long", (1, 7, 3), 4)
    reseal(seed_copy, "golden/cases.json", "golden/too_long.x.bin", "golden/too_long.context.bin")
    result = _check(seed_copy, "--repeats", "1")
    assert result.returncode == 1
    assert "expected 1 <= tokens <= context_length=6, got 7" in result.stdout
    assert re.fullmatch(r"\d+ passed, [1-9]\d* failed", result.stdout.strip().splitlines()[-1])


def _edit_cases_json(folder: Path, change: Callable[[dict], object]) -> None:
    """golden/cases.json changed and resealed (a consistent, if hostile, export)."""
    doc = json.loads((folder / "golden" / "cases.json").read_text())
    change(doc)
    (folder / "golden" / "cases.json").write_text(json.dumps(doc))
    reseal(folder, "golden/cases.json")


@pytest.mark.parametrize("change,line", [
    # the newline and the escape sequence were written out raw, the line split in two and the terminal recoloured
    (lambda d: d["cases"][0].update(name="a\n\x1b[31mred"),
     'FAIL mha.onnx             a\\n\\u001b[31mred name: expected printable text, got "a\\n\\u001b[31mred"'),
    # was "error: file.padEnd is not a function", the whole check stopped
    (lambda d: d["artifacts"][0].update(file=5),
     "FAIL 5                    b1_t1      file: expected a file name inside the artifact folder, got 5"),
    # was "Cannot read properties of undefined (reading 'atol')" in every line
    (lambda d: d["artifacts"][0].pop("tolerance"),
     "FAIL mha.onnx             b1_t1      mha.onnx: tolerance: expected a tolerance {atol, rtol, rel_l2} of numbers "
     ">= 0, got undefined"),
    # was read from outside the folder
    (lambda d: d["cases"][0].update(input_bin="../../etc/passwd"),
     'FAIL mha.onnx             b1_t1      golden file: expected a file name inside the artifact folder, got '
     '"../../etc/passwd" and "b1_t1.context.bin"'),
    # was "Cannot read properties of undefined (reading '2')"
    (lambda d: d["cases"][0].pop("output_shape"),
     "FAIL mha.onnx             b1_t1      expected input_shape and output_shape [batch, tokens, width] of integers, "
     "got [1,1,3] and undefined"),
], ids=["name-control-characters", "file-a-number", "tolerance-missing", "input-bin-outside", "output-shape-missing"])
def test_wasm_check_refuses_a_hostile_case_as_node_does(change: Callable[[dict], object], line: str,
                                                        seed_copy: Path) -> None:
    """cases.json edited and resealed: that case (or that artifact) FAILs with the Node runner's line."""
    _edit_cases_json(seed_copy, change)
    result = _check(seed_copy, "--repeats", "1")
    assert result.returncode == 1 and result.stderr == "", result.stderr
    assert line in result.stdout.splitlines(), result.stdout
    assert "\x1b" not in result.stdout and re.fullmatch(r"\d+ passed, [1-9]\d* failed",
                                                          result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("change", [lambda d: d.update(cases={}), lambda d: d.pop("cases"),
                                    lambda d: d.update(artifacts={})],
                         ids=["cases-object", "no-cases", "artifacts-object"])
def test_wasm_check_of_a_cases_json_without_its_lists_is_one_line(change: Callable[[dict], object],
                                                                   seed_copy: Path) -> None:
    """Was "cases.cases is not iterable" or "object is not iterable (cannot read property Symbol(Symbol.iterator))"."""
    _edit_cases_json(seed_copy, change)
    result = _check(seed_copy, "--repeats", "1")
    assert result.returncode == 1 and result.stdout == "", result.stdout
    assert result.stderr.splitlines() == [f"error: {seed_copy}/golden/cases.json: expected an object with 'cases' and "
                                          "'artifacts' arrays"], result.stderr


def test_wasm_check_reads_only_sealed_golden_files(seed_copy: Path) -> None:
    """An edited golden output FAILs its cases on the sha256, an edited cases.json stops the check, as in the Node,
    C and Python checks (cases.json cut to one case passed, unsealed, and the outputs were only compared)."""
    out = seed_copy / "golden" / "b1_t1.context.bin"
    values = np.fromfile(out, "<f4")
    values[0] += 1
    values.tofile(out)
    result = _check(seed_copy, "--repeats", "1")
    lines = [line for line in result.stdout.splitlines() if line.split()[2:3] == ["b1_t1"]]
    assert result.returncode == 1 and lines, result.stdout
    assert all(line.startswith("FAIL") and "b1_t1.context.bin: sha256 " in line for line in lines), result.stdout
    doc = json.loads((seed_copy / "golden" / "cases.json").read_text())
    (seed_copy / "golden" / "cases.json").write_text(json.dumps(doc | {"cases": doc["cases"][:1]}))
    result = _check(seed_copy, "--repeats", "1")
    assert result.returncode == 1 and result.stdout == "", result.stdout
    assert result.stderr.startswith(f"error: {seed_copy}/golden/cases.json: expected ") and \
        "file truncated or replaced" in result.stderr and len(result.stderr.splitlines()) == 1, result.stderr


def test_wasm_check_lists_an_unloadable_artifact_and_counts_it_neither_way(seed_copy: Path, tmp_path: Path) -> None:
    expected = _expected_cases(seed_copy)
    bogus = _add_unloadable(seed_copy)
    result = _check(seed_copy, "--repeats", "1", "--json", str(tmp_path / "out.json"))
    assert result.returncode == 0, result.stdout + result.stderr
    line = next(line for line in result.stdout.splitlines() if bogus in line)
    assert line.startswith("skip") and "not a registered function/op" in line  # the runtime's own reason
    assert result.stdout.strip().splitlines()[-1] == f"{expected} passed, 0 failed"
    doc = json.loads((tmp_path / "out.json").read_text())
    assert [a["file"] for a in doc["not_loadable"]] == [bogus]
    assert parse_json(tmp_path / "out.json").by_file[bogus].not_loadable


def _case_line(out: str, file: str, case: str) -> str:
    lines = [line for line in out.splitlines() if line.split()[1:3] == [file, case]]
    assert len(lines) == 1, out
    return lines[0]


def test_wasm_check_runs_the_inplace_decode_form(mid_dir: Path, tmp_path: Path) -> None:
    """mid (d_out 16) has mha.decode-inplace.onnx: GroupQueryAttention loads in the wasm build and every case passes."""
    result = _check(mid_dir, "--repeats", "1", "--json", str(tmp_path / "mid.json"))
    assert result.returncode == 0, result.stdout + result.stderr
    for case in ("b1_t1", "b2_t24", "b1_t48"):
        assert _case_line(result.stdout, INPLACE, case).startswith("ok   "), result.stdout
    assert result.stdout.strip().splitlines()[-1] == f"{_expected_cases(mid_dir)} passed, 0 failed"
    doc = json.loads((tmp_path / "mid.json").read_text())
    inplace = next(a for a in doc["artifacts"] if a["file"] == INPLACE)
    assert (inplace["runtime"], inplace["loaded"], inplace["passed"], inplace["failed"]) == \
        ("onnxruntime-decode-inplace", True, 3, 0)


def test_wasm_check_refuses_an_inplace_chunk_after_a_past_at_batch_2(mid_copy: Path) -> None:
    doc = json.loads((mid_copy / "golden" / "cases.json").read_text())
    for entry in doc["artifacts"]:
        if "schedules" in entry:
            entry["schedules"]["b2_t24"] = [12, 2] + [1] * 10
    (mid_copy / "golden" / "cases.json").write_text(json.dumps(doc))
    reseal(mid_copy, "golden/cases.json")
    result = _check(mid_copy, "--repeats", "1")
    assert result.returncode == 1, result.stdout + result.stderr
    fails = [line for line in result.stdout.splitlines() if line.startswith("FAIL")]
    assert fails == [_case_line(result.stdout, INPLACE, "b2_t24")], result.stdout
    assert fails[0].endswith("schedule 12,2,1,1,1,1,1,1,1,1,1,1: a chunk of 2 tokens after a past of 12 needs batch 1 "
                             "(ONNX Runtime's GroupQueryAttention), got batch 2: feed single tokens")
    assert _case_line(result.stdout, "mha.decode.onnx", "b2_t24").startswith("ok   ")  # the plain form runs it
    assert result.stdout.strip().splitlines()[-1] == f"{_expected_cases(mid_copy) - 1} passed, 1 failed"


def test_wasm_check_fails_a_near_miss_on_an_inplace_output(mid_copy: Path) -> None:
    path = mid_copy / "golden" / "b2_t24.context.bin"
    y = np.fromfile(path, "<f4")
    y[-1] += np.float32(1.5e-5 * (1 + abs(y[-1])))  # the last single-token step of batch row 2: 1.5x its bound
    path.write_bytes(y.astype("<f4").tobytes())
    reseal(mid_copy, "golden/b2_t24.context.bin")
    result = _check(mid_copy, "--repeats", "1")
    assert result.returncode == 1
    line = _case_line(result.stdout, INPLACE, "b2_t24")
    assert line.startswith("FAIL") and 1e-5 < float(re.search(r"max_abs=(\S+)", line)[1]) < 1e-4, line
    assert _case_line(result.stdout, INPLACE, "b1_t48").startswith("ok   ")
    assert _case_line(result.stdout, "mha.fp16.onnx", "b2_t24").startswith("ok   ")  # inside fp16's atol


def test_wasm_check_reports_the_whole_comparison_not_a_prefix(seed_copy: Path) -> None:
    """A first element just past its bound and a large error further on: the FAIL line reports the large one and
    the relative L2 over every element (a comparison that stopped at the first failure reported a prefix's)."""
    path = seed_copy / "golden" / "b1_t6.context.bin"
    y = np.fromfile(path, "<f4")
    want = y.copy()
    y[0] += np.float32(1.5e-5 * (1 + abs(y[0])))
    y[20] += np.float32(0.5)
    path.write_bytes(y.astype("<f4").tobytes())
    reseal(seed_copy, "golden/b1_t6.context.bin")
    result = _check(seed_copy, "--repeats", "1")
    line = _case_line(result.stdout, "mha.onnx", "b1_t6")
    max_abs, rel_l2 = (float(re.search(rf"{k}=(\S+)", line)[1]) for k in ("max_abs", "rel_l2"))
    assert line.startswith("FAIL") and abs(max_abs - 0.5) < 1e-3, line
    assert abs(rel_l2 - np.linalg.norm(y - want) / np.linalg.norm(y)) < 1e-2 * rel_l2, line


@pytest.mark.parametrize("args,code,message", [
    ([], 2, "usage: node check.mjs"),
    (["{tmp}"], 1, "expected a manifest"),
    (["{tmp}/nowhere"], 1, "expected a folder made by `mha export`"),
    # an empty --json ran the check and wrote nothing (exit 0); --repeats took what Number() takes ('0x10' is 16)
    (["{tmp}", "--json", ""], 2, "usage: node check.mjs"),
    (["{tmp}", "--json", "{tmp}/a.json", "--json", "{tmp}/b.json"], 2, "usage: node check.mjs"),
    (["{tmp}", "--repeats", "0x10"], 2, "usage: node check.mjs"),
    (["{tmp}", "--repeats", "1e3"], 2, "usage: node check.mjs"),
    (["{tmp}", "--repeats", " 2"], 2, "usage: node check.mjs"),
])
def test_wasm_check_errors_are_one_line(args: list[str], code: int, message: str, tmp_path: Path) -> None:
    _built()
    result = subprocess.run(["node", str(WEB / "check.mjs"), *(a.format(tmp=tmp_path) for a in args)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == code
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_bench_reads_the_wasm_medians_of_current_files_only(seed_copy: Path) -> None:
    result = _check(seed_copy, "--repeats", "1", "--json", str(seed_copy.parent / "web" / "seed.json"))
    assert result.returncode == 0, result.stdout + result.stderr
    manifest = load_manifest(seed_copy)
    wasm = wasm_medians(seed_copy, manifest)
    assert wasm is not None and wasm["onnxruntime_web"] == "1.30.0"
    cases = [c["name"] for c in json.loads((seed_copy / "golden" / "cases.json").read_text())["cases"]]
    assert set(wasm["median_ms"]) == {f for f, a in manifest.artifacts.items() if a.runtime in WEB_RUNTIMES}
    assert all(list(per) == cases and min(per.values()) > 0 for per in wasm["median_ms"].values())
    doc = json.loads((seed_copy.parent / "web" / "seed.json").read_text())
    doc["artifacts"][0]["sha256"] = "0" * 64  # as if measured on an older export of that file
    (seed_copy.parent / "web" / "seed.json").write_text(json.dumps(doc))
    assert doc["artifacts"][0]["file"] not in wasm_medians(seed_copy, manifest)["median_ms"]


# --- the browser page ------------------------------------------------------------------------------------------


@contextmanager
def _served(root: Path, log: Path) -> Iterator[str]:
    """`python -m http.server` on a free loopback port (port 0: the server picks one and prints it)."""
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-u", "-m", "http.server", "0", "--bind", "127.0.0.1",
                                 "--directory", str(root)], stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        first = proc.stdout.readline() if proc.stdout else ""  # "Serving HTTP on 127.0.0.1 port N (...) ..."
        port = re.search(r"port (\d+)", first)
        assert port, f"http.server did not start: {first!r} {log.read_text()}"
        yield f"http://127.0.0.1:{port[1]}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        if proc.stdout:
            proc.stdout.close()


def _site(tmp_path: Path, presets: dict[str, Path]) -> Path:
    """The repo root's layout (runtime/native/web/ with node_modules, artifacts/<preset>/) over the test's folders."""
    root = tmp_path / "site"
    (root / "artifacts").mkdir(parents=True)
    (root / "runtime").symlink_to(REPO / "runtime")
    for name, folder in presets.items():
        (root / "artifacts" / name).symlink_to(folder)
    return root


def _drive(url: str, screenshot: Path, json_out: Path, timeout: int = 420) -> tuple[int, dict, str]:
    """drive.mjs in its own process group, killed whole if it overruns: no chromium is left behind."""
    assert CHROMIUM.exists(), f"{CHROMIUM} is missing: run `make chromium` (apt-get install chromium)"
    _built()
    proc = subprocess.Popen(["node", str(WEB / "drive.mjs"), url, "--screenshot", str(screenshot), "--json",
                             str(json_out), "--timeout", str(timeout)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, err = proc.communicate(timeout=timeout + 60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    doc = json.loads(json_out.read_text()) if json_out.exists() else {}
    if doc.get("profile"):  # the fresh --user-data-dir: gone, and no process still uses it
        assert not Path(doc["profile"]).exists()
        assert not [p for p in Path("/proc").glob("[0-9]*/cmdline") if _cmdline_has(p, doc["profile"])]
    return proc.returncode, doc, err


def _cmdline_has(path: Path, text: str) -> bool:
    try:
        return text.encode() in path.read_bytes()
    except OSError:  # the process ended meanwhile
        return False


@pytest.mark.parametrize("preset", PRESETS)
def test_browser_page_passes_every_case(preset: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    folder: Path = request.getfixturevalue(FIXTURE[preset])
    OUT.mkdir(parents=True, exist_ok=True)
    shot, result_json = OUT / f"{preset}.png", OUT / f"{preset}.browser.json"
    for stale in (shot, result_json):
        stale.unlink(missing_ok=True)
    with _served(_site(tmp_path, {preset: folder}), tmp_path / "http.log") as base:
        # seed: one timed run after the compared one (the page's default 3 is for reading its latency column);
        # gpt2-small: the check alone (its timed runs were about half of the page's time, most in the decode forms)
        repeats = 1 if preset == "seed" else 0
        code, doc, err = _drive(f"{base}/runtime/native/web/index.html?artifact=artifacts/{preset}&repeats={repeats}",
                                shot, result_json)
    assert code == 0, err + json.dumps(doc.get("log"))
    expected = _expected_cases(folder)
    assert (doc["passed"], doc["failed"], doc["not_loadable"]) == (expected, 0, [])
    assert all(c["ok"] and c["error"] is None for a in doc["artifacts"] for c in a["cases"])
    assert doc["repeats"] == repeats
    assert all((c["median_ms"] is None) == (repeats == 0) for a in doc["artifacts"] for c in a["cases"])
    assert doc["browser"] and doc["log"] == []  # no page error, failed request or console error
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
    if preset == "seed":  # the tutorial's first row, computed in the page through mha.onnx
        x = np.stack([INPUTS.numpy(), INPUTS.numpy()]).astype(np.float32)
        python_row = OnnxRunner(folder, provider="cpu").run(x)[0, 0]
        assert np.allclose(doc["book_row"], python_row, atol=1e-6)
        assert np.array_equal(np.round(doc["book_row"], 4), np.round(EXPECTED[0].double().numpy(), 4))
    else:
        assert "book_row" not in doc


def test_browser_page_runs_the_inplace_decode_form(mid_dir: Path, tmp_path: Path) -> None:
    with _served(_site(tmp_path, {"mid": mid_dir}), tmp_path / "http.log") as base:
        code, doc, err = _drive(f"{base}/runtime/native/web/index.html?artifact=artifacts/mid&repeats=1",
                                tmp_path / "shot.png", tmp_path / "result.json", timeout=300)
    assert code == 0, err + json.dumps(doc.get("log"))
    assert (doc["passed"], doc["failed"], doc["not_loadable"]) == (_expected_cases(mid_dir), 0, [])
    inplace = next(a for a in doc["artifacts"] if a["file"] == INPLACE)
    assert inplace["loaded"] and [c["name"] for c in inplace["cases"] if c["ok"]] == ["b1_t1", "b2_t24", "b1_t48"]
    assert doc["log"] == []


def test_browser_page_checks_the_sha256(seed_copy: Path, tmp_path: Path) -> None:
    _alter(seed_copy / "mha.blocks.onnx")
    with _served(_site(tmp_path, {"seed": seed_copy}), tmp_path / "http.log") as base:
        code, doc, _ = _drive(f"{base}/runtime/native/web/index.html?artifact=artifacts/seed&repeats=1",
                              tmp_path / "shot.png", tmp_path / "result.json", timeout=180)
    assert code == 1
    blocks = next(a for a in doc["artifacts"] if a["file"] == "mha.blocks.onnx")
    assert not blocks["loaded"] and "differs from the manifest's" in blocks["error"]
    assert blocks["failed"] == len(blocks["cases"]) > 0 and doc["failed"] == blocks["failed"]


def test_browser_page_reports_a_missing_folder_in_one_line(tmp_path: Path) -> None:
    with _served(_site(tmp_path, {}), tmp_path / "http.log") as base:
        code, doc, err = _drive(f"{base}/runtime/native/web/index.html?artifact=artifacts/nowhere",
                                tmp_path / "shot.png", tmp_path / "result.json", timeout=120)
    assert code == 1
    assert "expected a manifest (made by `mha export`), found none" in doc["error"] and "\n" not in doc["error"]
    assert err.strip().startswith("error: the page reports:")


# --- the portability table (docs/portability.md) ----------------------------------------------------------


def _write_outputs(root: Path, *, wasm_not_loadable: bool = False) -> None:
    (root / "checks").mkdir(parents=True)
    (root / "web").mkdir()
    for preset in ("seed", "gpt2-small"):
        native = {"passed": 2, "failed": 1, "artifacts": [
            {"file": "mha.onnx", "not_loadable": None,
             "cases": [{"name": "b1", "ok": True}, {"name": "b2", "ok": False}]},
            {"file": "mha.pt", "not_loadable": None, "cases": [{"name": "b1", "ok": True}]}]}
        for key in ("python", "node", "c", "cpp"):
            (root / "checks" / f"{key}-{preset}.json").write_text(json.dumps(native))
        doc = {"artifacts": [{"file": "mha.onnx", "not_loadable": None, "cases": [{"ok": True}, {"ok": True}]}]}
        if wasm_not_loadable:
            doc["artifacts"].append({"file": "mha.x.onnx", "not_loadable": "NotARealOp is not a registered op",
                                     "cases": []})
        for name in (f"{preset}.json", f"{preset}.browser.json"):
            (root / "web" / name).write_text(json.dumps(doc))


def test_portability_table_counts_what_the_outputs_say(tmp_path: Path) -> None:
    _write_outputs(tmp_path, wasm_not_loadable=True)
    table = render(collect(tmp_path, gpt_presets=()))
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines() if line.startswith("| ")]
    rows = {row[0]: row[1:] for row in cells}
    assert rows["`mha.onnx`"] == ["2/4"] * 4 + ["4/4"] * 2  # one of two cases passed per preset; wasm: both
    assert rows["`mha.pt`"] == ["2/2"] * 4 + ["-"] * 2
    assert rows["`mha.x.onnx`"][4] == "not loadable on seed [1]; not loadable on gpt2-small [1]"
    assert "[1] NotARealOp is not a registered op" in table
    assert rows["all, seed"] == ["2/3"] * 4 + ["2/2"] * 2


def test_portability_refuses_a_truncated_output(tmp_path: Path) -> None:
    _write_outputs(tmp_path)
    path = tmp_path / "checks" / "c-seed.json"
    doc = json.loads(path.read_text())
    doc["artifacts"].pop()  # the counts no longer match the cases listed
    path.write_text(json.dumps(doc))
    with pytest.raises(ArtifactError, match="expected a complete check result"):
        parse_json(path)
    path.write_text(path.read_text()[:40])
    with pytest.raises(ArtifactError, match="expected the JSON of a check"):
        parse_json(path)
    path.unlink()
    with pytest.raises(ArtifactError, match="written by make native-test"):
        collect(tmp_path, gpt_presets=())


def test_portability_gpt_rows_have_no_libtorch_column(tmp_path: Path) -> None:
    """A GPT preset needs no C++ (libtorch) output; its rows and total show `-` there."""
    _write_outputs(tmp_path)
    doc = {"passed": 5, "failed": 1, "artifacts": [
        {"file": "gpt.onnx", "not_loadable": None, "cases": [{"ok": True}] * 3},
        {"file": "gpt.inplace.onnx", "not_loadable": None, "cases": [{"ok": True}] * 2 + [{"ok": False}]}]}
    for key in ("python", "node", "c"):
        (tmp_path / "checks" / f"{key}-gpt-mini.json").write_text(json.dumps(doc))
    for name in ("gpt-mini.json", "gpt-mini.browser.json"):
        (tmp_path / "web" / name).write_text(json.dumps(doc))
    table = render(collect(tmp_path, gpt_presets=("gpt-mini",)))
    rows = {r[0]: r[1:] for r in ([c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()
                                   if line.startswith("| "))}
    assert rows["`gpt.inplace.onnx`"] == ["2/3", "2/3", "2/3", "-", "2/3", "2/3"]
    assert rows["all, gpt-mini"] == ["5/6", "5/6", "5/6", "-", "5/6", "5/6"]
    (tmp_path / "checks" / "node-gpt-mini.json").unlink()
    with pytest.raises(ArtifactError, match="node check output of gpt-mini"):
        collect(tmp_path, gpt_presets=("gpt-mini",))


def test_readme_shows_a_committed_screenshot() -> None:
    readme = (REPO / "README.md").read_text()
    image = re.search(r"!\[[^\]]*\]\((docs/web-[^)]+\.png)\)", readme)
    assert image, "README.md: expected a screenshot of the page (docs/web-*.png)"
    assert (REPO / image[1]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
