"""The native runners (built by `make native-build`, which `make test` runs first): bad fixtures and bad files.

The golden checks on both presets run in `make native-test`; these tests feed each runner deliberately broken
input: fixtures that break the contract or do not add up, files that differ from manifest.json, non-finite
values, near misses of each tolerance, concurrent writers. The C runner is run twice: as built and as built
with AddressSanitizer + UBSan (`c-asan`), where a memory error aborts the process.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import struct
import subprocess
import threading
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from helpers import add_zero_case, reseal

NATIVE = Path(__file__).resolve().parents[2] / "runtime" / "native"
C_BUILD = NATIVE / "c" / "build"
C_CHECK = C_BUILD / "mha_check"
C_ASAN = C_BUILD / "mha_check_asan"
JSON_FUZZ = C_BUILD / "json_fuzz_asan"
CPP_CHECK = NATIVE / "cpp-libtorch" / "build" / "mha_ts"
NODE_CLI = NATIVE / "node" / "cli.js"
NODE_ORT = NATIVE / "node" / "node_modules" / "onnxruntime-node"
COMMAND = {"c": [str(C_CHECK)], "c-asan": [str(C_ASAN)], "node": ["node", str(NODE_CLI)], "cpp": [str(CPP_CHECK)]}
BUILT = {"c": C_CHECK, "c-asan": C_ASAN, "node": NODE_ORT, "cpp": CPP_CHECK}
RUNNERS = list(COMMAND)
ONNX_RUNNERS = ["c", "c-asan", "node"]  # the ones that load .onnx (and have a `run` mode)
MODEL_OF = {"c": "mha.onnx", "c-asan": "mha.onnx", "node": "mha.onnx", "cpp": "mha.pt"}
SANITIZER_WORDS = ("AddressSanitizer", "LeakSanitizer", "UndefinedBehaviorSanitizer", "runtime error:")
CASES = "golden/cases.json"  # the golden cases every runner reads
PARSE_ERROR = "golden/cases.json: expected JSON, got a parse error ("
# the runtimes of cases.json each runner runs, and the "runtime" its --json results name
ONNX_RUNTIMES = ("onnxruntime", "onnxruntime-decode", "onnxruntime-decode-inplace")
RUNS = {"c": ONNX_RUNTIMES, "c-asan": ONNX_RUNTIMES, "node": ONNX_RUNTIMES, "cpp": ("torchscript",)}
JSON_RUNTIME = {"c": "c", "c-asan": "c", "node": "node", "cpp": "cpp"}


def _command(runner: str, *args: str | Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    assert BUILT[runner].exists(), f"{BUILT[runner]} is missing: build the native runners first (make native-build)"
    return subprocess.run([*COMMAND[runner], *map(str, args)], capture_output=True, text=True, timeout=300, env=env)


def _run(runner: str, folder: Path) -> subprocess.CompletedProcess[str]:
    return _command(runner, "check", folder)


def _no_crash(result: subprocess.CompletedProcess[str]) -> str:
    """stdout + stderr, after asserting the process exited by itself with no sanitizer report."""
    out = result.stdout + result.stderr
    assert result.returncode >= 0, f"killed by signal {-result.returncode}:\n{out}"  # a crash or a sanitizer abort
    assert not any(word in out for word in SANITIZER_WORDS), out
    return out


def _snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _refused(runner: str, folder: Path, message: str) -> str:
    """Run `check` on a hostile folder: exit 1, no crash, `message` on one line, and the folder unchanged."""
    before = _snapshot(folder)
    result = _run(runner, folder)
    out = _no_crash(result)
    assert result.returncode == 1, out
    assert message in out, out
    assert _snapshot(folder) == before
    return out


def _line_of(out: str, model: str, case: str) -> str:
    lines = [line for line in out.splitlines() if line.split()[1:3] == [model, case]]
    assert len(lines) == 1, out
    return lines[0]


# --- editing fixtures the way a buggy or hostile exporter would (the manifest resealed to match) ---------------

def _cases(folder: Path) -> dict:
    return json.loads((folder / CASES).read_text())


def _edit_cases(folder: Path, change: Callable[[dict], object], *, sealed: bool = True) -> None:
    """Change the parsed golden/cases.json in place and write it back (resealed in the manifest unless told)."""
    doc = _cases(folder)
    change(doc)
    (folder / CASES).write_text(json.dumps(doc, indent=2) + "\n")
    if sealed:
        reseal(folder, CASES)


def _case(doc: dict, name: str) -> dict:
    (case,) = [c for c in doc["cases"] if c["name"] == name]
    return case


def _write_cases_bytes(folder: Path, data: bytes) -> None:
    """golden/cases.json replaced by raw bytes (malformed JSON, another document), resealed."""
    (folder / CASES).write_bytes(data)
    reseal(folder, CASES)


def _add_case(folder: Path, name: str, shape: tuple[int, int, int], width: int) -> None:
    """Append a golden case with the given input shape to cases.json (outputs are zeros), resealed."""
    add_zero_case(folder, name, shape, width)
    reseal(folder, CASES, f"golden/{name}.x.bin", f"golden/{name}.context.bin")


def _edit_case(folder: Path, case: str, *, batch: int | None = None, tokens: int | None = None,
               schedule: list[int] | None = None, sealed: bool = True) -> None:
    """Set a case's batch / tokens (input and output shape) and every decode artifact's schedule for it in
    cases.json, unchecked."""
    def change(doc: dict) -> None:
        c = _case(doc, case)
        for axis, value in ((0, batch), (1, tokens)):
            if value is not None:
                c["input_shape"][axis] = c["output_shape"][axis] = value
        for entry in doc["artifacts"]:
            if schedule is not None and "schedules" in entry:
                entry["schedules"][case] = schedule

    _edit_cases(folder, change, sealed=sealed)


def _edit_floats(folder: Path, name: str, change: Callable[[np.ndarray], np.ndarray]) -> None:
    path = folder / "golden" / name
    path.write_bytes(np.asarray(change(np.fromfile(path, "<f4")), "<f4").tobytes())
    reseal(folder, f"golden/{name}")


def _write_floats(path: Path, values: np.ndarray) -> None:
    path.write_bytes(np.asarray(values, "<f4").tobytes())


def _resize_bin(folder: Path, name: str, nbytes: int) -> None:
    path = folder / "golden" / name
    data = path.read_bytes()
    path.write_bytes(data[:nbytes] + b"\0" * max(0, nbytes - len(data)))
    reseal(folder, f"golden/{name}")


def _flip_onnx_byte(path: Path) -> None:
    """Flip one bit of the causal-mask initializer: same size, and ONNX Runtime still loads and runs it."""
    import onnx
    import onnxruntime as ort

    data = bytearray(path.read_bytes())
    model = onnx.load_from_string(bytes(data))
    raw = max((init.raw_data for init in model.graph.initializer), key=len)
    at = bytes(data).find(raw)
    assert at >= 0 and bytes(data).count(raw) == 1
    data[at + len(raw) - 1] ^= 1
    path.write_bytes(bytes(data))
    session = ort.InferenceSession(bytes(data), providers=["CPUExecutionProvider"])
    session.run(None, {"x": np.zeros((1, 2, 3), np.float32)})  # loadable: only the sha256 can refuse it


def _flip_pt_byte(path: Path) -> None:
    """Flip one bit of a weight inside mha.pt (the zip stores tensors uncompressed; libtorch checks no CRC)."""
    import torch

    data = bytearray(path.read_bytes())
    # a weight's record, under the archive's root folder (torch.jit.save names it after the file; the exporter's
    # reproducible rewrite of mha.pt names it 'archive')
    (info,) = [i for i in zipfile.ZipFile(path).infolist() if i.filename.split("/")[1:] == ["data", "1"]]
    assert info.compress_type == zipfile.ZIP_STORED and info.file_size > 0, info
    name_len, extra_len = struct.unpack("<HH", data[info.header_offset + 26:info.header_offset + 30])
    data[info.header_offset + 30 + name_len + extra_len] ^= 1
    path.write_bytes(bytes(data))
    torch.jit.load(str(path))(torch.zeros(1, 2, 3))  # loadable: only the sha256 can refuse it


def _narrow_model(path: Path) -> None:
    """A valid model with the seed's config that breaks its promise: context = x[..., :2], width 2 instead of 4."""
    import onnx
    from onnx import TensorProto, helper

    meta = {p.key: p.value for p in onnx.load(str(path)).metadata_props}
    axes = [helper.make_tensor(n, TensorProto.INT64, [1], [v]) for n, v in (("starts", 0), ("ends", 2), ("axes", 2))]
    graph = helper.make_graph(
        [helper.make_node("Slice", ["x", "starts", "ends", "axes"], ["context"])], "narrow",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "tokens", 3])],
        [helper.make_tensor_value_info("context", TensorProto.FLOAT, ["batch", "tokens", 2])], axes)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    helper.set_model_props(model, meta)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    reseal(path.parent, path.name)


def _narrow_pt(path: Path) -> None:
    """mha.pt replaced by a TorchScript module with the seed's config.json that returns x[..., :2] (width 2, not 4)."""
    import torch

    class Narrow(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x[..., :2]

    extra = {"config.json": ""}
    torch.jit.load(str(path), _extra_files=extra)
    torch.jit.save(torch.jit.script(Narrow()), str(path), _extra_files=extra)
    reseal(path.parent, path.name)


def _edit_model_config(folder: Path, runner: str, change: Callable[[dict], dict]) -> None:
    """Rewrite the config a model carries (ONNX metadata 'mha.config', or mha.pt's config.json), resealed."""
    if runner == "cpp":
        import torch

        extra = {"config.json": ""}
        module = torch.jit.load(str(folder / "mha.pt"), _extra_files=extra)
        config = json.dumps(change(json.loads(extra["config.json"])))
        torch.jit.save(module, str(folder / "mha.pt"), _extra_files={"config.json": config})
        reseal(folder, "mha.pt")
        return
    import onnx

    model = onnx.load(str(folder / "mha.onnx"))
    for prop in model.metadata_props:
        if prop.key == "mha.config":
            prop.value = json.dumps(change(json.loads(prop.value)))
    onnx.save(model, str(folder / "mha.onnx"))
    reseal(folder, "mha.onnx")


def _edit_manifest_text(folder: Path, old: str, new: str) -> None:
    path = folder / "manifest.json"
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


def _edit_onnx_size(folder: Path, size: int) -> None:
    """mha.onnx's manifest size set to `size` (its real size depends on the checkout's path: the exporter
    records source locations in the graph)."""
    real = (folder / "mha.onnx").stat().st_size
    _edit_manifest_text(folder, f'"size": {real},', f'"size": {size},')


# --- the golden cases -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("runner", RUNNERS)
def test_golden_cases_pass(runner: str, seed_dir: Path) -> None:
    result = _run(runner, seed_dir)
    _no_crash(result)
    assert result.returncode == 0, result.stdout + result.stderr
    last = result.stdout.strip().splitlines()[-1]
    assert last.endswith("passed, 0 failed") and not last.startswith("0 ")


@pytest.mark.parametrize("runner", RUNNERS)
@pytest.mark.parametrize("shape,message", [
    ((1, 7, 3), "expected 1 <= tokens <= context_length=6, got 7"),
    ((1, 2, 5), "expected last axis d_in=3, got 5"),
])
def test_contract_breaking_fixture_is_refused(runner: str, shape: tuple[int, int, int], message: str,
                                              seed_copy: Path) -> None:
    _add_case(seed_copy, "bad", shape, 4)
    out = _refused(runner, seed_copy, message)
    assert out.strip().splitlines()[-1].endswith(" failed") and " 0 failed" not in out


# --- `check DIR --json FILE`: the results as JSON, the same as the console's ----------------------------------------

def _case_lines(out: str) -> dict[tuple[str, str], tuple[bool, str]]:
    """The case lines of a check's stdout: (file, case) -> (ok, the rest of the line), each pair once."""
    lines = [line.split(None, 3) for line in out.splitlines() if line.startswith(("ok   ", "FAIL "))]
    found = {(file, case): (status == "ok", rest) for status, file, case, rest in lines}
    assert len(found) == len(lines), out
    return found


def _damage(folder: Path) -> None:
    """Every kind of result a check can hold: a near miss of one golden output (a compared case that fails), a bad
    decode schedule (a case refused before it runs), a model ONNX Runtime cannot load (not_loadable) and a model
    whose sha256 differs from the manifest (the artifact's error)."""
    _edit_floats(folder, "b1_t1.context.bin", lambda y: y + np.r_[1.5e-5 * (1 + abs(y[0])), np.zeros(len(y) - 1)])
    _edit_case(folder, "b1_t6", schedule=[3, 1])
    fused = folder / "mha.fused.onnx"
    fused.write_bytes(b"\x00garbage" + fused.read_bytes()[100:])
    reseal(folder, "mha.fused.onnx")
    attention = json.loads((folder / "manifest.json").read_text())["files"]["mha.attention.onnx"]["sha256"]
    _edit_manifest_text(folder, attention, "0" * 64)


@pytest.mark.parametrize("runner", RUNNERS)
@pytest.mark.parametrize("damaged", [False, True], ids=["golden", "damaged"])
def test_check_json_is_the_console_result(runner: str, damaged: bool, seed_dir: Path, tmp_path: Path) -> None:
    """passed / failed are the console's last line; the artifacts are the cases.json entries of the runner's
    runtimes, in order, each with every case in order, and each case as its console line says (ok, max_abs,
    rel_l2 to the digits printed, or the FAIL line's reason as its error)."""
    folder = seed_dir
    if damaged:
        folder = Path(shutil.copytree(seed_dir, tmp_path / "seed"))
        _damage(folder)
    out_dir = tmp_path / "results"  # not there yet: the runner makes it
    result = _command(runner, "check", folder, "--json", out_dir / "check.json")
    out = _no_crash(result)
    assert result.returncode == (1 if damaged else 0), out
    passed, failed = map(int, re.fullmatch(r"(\d+) passed, (\d+) failed", result.stdout.strip().splitlines()[-1])
                         .groups())
    assert sorted(p.name for p in out_dir.iterdir()) == ["check.json"]  # no temporary left behind
    doc = json.loads((out_dir / "check.json").read_text())
    assert doc["runtime"] == JSON_RUNTIME[runner] and doc["artifact_dir"] == str(folder)
    assert (doc["passed"], doc["failed"]) == (passed, failed), doc
    assert doc["errors"] == []

    cases = _cases(folder)
    names = [c["name"] for c in cases["cases"]]
    runtime_of = {a["file"]: a["runtime"] for a in cases["artifacts"]}
    assert [a["file"] for a in doc["artifacts"]] == [a["file"] for a in cases["artifacts"]
                                                     if a["runtime"] in RUNS[runner]]
    lines = _case_lines(result.stdout)
    assert len(lines) == passed + failed == len(names) * len(doc["artifacts"]), out
    for artifact in doc["artifacts"]:
        assert artifact["runtime"] == runtime_of[artifact["file"]]
        assert [c["name"] for c in artifact["cases"]] == names, artifact
        assert artifact["passed"] == sum(c["ok"] for c in artifact["cases"])
        assert artifact["failed"] == sum(not c["ok"] for c in artifact["cases"])
        for case in artifact["cases"]:
            ok, rest = lines[artifact["file"], case["name"]]
            assert case["ok"] is ok, (case, rest)
            if case["error"] is None:
                shown = re.match(r"max_abs=(\S+) rel_l2=(\S+)", rest)
                assert shown, rest
                for key, text in zip(("max_abs", "rel_l2"), shown.groups(), strict=True):
                    assert isinstance(case[key], (int, float)), case
                    assert abs(case[key] - float(text)) <= 6e-3 * abs(case[key]), (case, rest)  # 3 digits printed
            else:
                assert not ok and case["max_abs"] is None and case["rel_l2"] is None, case
                assert rest == case["error"], (case, rest)
    assert sum(a["passed"] for a in doc["artifacts"]) == passed
    assert doc["not_loadable"] == [{"file": a["file"], "reason": a["not_loadable"]} for a in doc["artifacts"]
                                   if a["not_loadable"]]
    by_file = {a["file"]: a for a in doc["artifacts"]}
    model = by_file[MODEL_OF[runner]]
    if not damaged:
        assert failed == 0 and doc["not_loadable"] == [] and passed == len(names) * len(doc["artifacts"])
        assert all(a["error"] is None and a["not_loadable"] is None for a in doc["artifacts"])
        return
    assert [c["ok"] for c in model["cases"]] == [name != "b1_t1" for name in names], model
    assert model["cases"][names.index("b1_t1")]["max_abs"] > 1e-5
    if runner == "cpp":
        assert (passed, failed) == (len(names) - 1, 1)
        return
    assert [entry["file"] for entry in doc["not_loadable"]] == ["mha.fused.onnx"], doc["not_loadable"]
    assert "ONNX Runtime cannot load it" in by_file["mha.fused.onnx"]["not_loadable"]
    assert by_file["mha.fused.onnx"]["error"] is None and by_file["mha.fused.onnx"]["passed"] == 0
    attention = by_file["mha.attention.onnx"]
    assert attention["not_loadable"] is None and "differs from the manifest's 000000000000..." in attention["error"]
    assert attention["passed"] == 0 and all(attention["error"] in c["error"] for c in attention["cases"])
    decode = by_file["mha.decode.onnx"]["cases"][names.index("b1_t6")]
    assert decode["error"] == "schedule 3,1 adds up to 4, expected tokens=6", decode


@pytest.mark.parametrize("runner", RUNNERS)
def test_check_json_of_a_check_that_stops_is_its_error(runner: str, seed_copy: Path, tmp_path: Path) -> None:
    """A check that stops before any case (here a malformed cases.json) writes {runtime, artifact_dir, error}."""
    _write_cases_bytes(seed_copy, (seed_copy / CASES).read_bytes()[:700])
    result = _command(runner, "check", seed_copy, "--json", tmp_path / "check.json")
    _no_crash(result)
    assert result.returncode == 1 and result.stdout == "", result.stdout
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: " + PARSE_ERROR.replace("golden/", f"{seed_copy}/golden/")), line
    doc = json.loads((tmp_path / "check.json").read_text())
    assert doc == {"runtime": JSON_RUNTIME[runner], "artifact_dir": str(seed_copy), "error": line[len("error: "):]}


@pytest.mark.parametrize("runner", ["c", "node", "wasm"])
def test_check_json_onto_a_folder_is_one_line_and_leaves_nothing_beside_it(runner: str, seed_dir: Path,
                                                                          tmp_path: Path) -> None:
    """--json FILE where FILE is a folder: one line naming it, exit 1, and no temporary file left beside it (the
    wasm check left its '<FILE>.tmp' there, with a raw "EISDIR: illegal operation on a directory, rename" line)."""
    (tmp_path / "out" / "check.json").mkdir(parents=True)
    command = ["node", str(NATIVE / "web" / "check.mjs")] if runner == "wasm" else [*COMMAND[runner], "check"]
    result = subprocess.run([*command, str(seed_dir), "--json", str(tmp_path / "out" / "check.json")],
                            capture_output=True, text=True, timeout=300)
    _no_crash(result)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [f"error: {tmp_path / 'out' / 'check.json'}: cannot write it ("
                                          f"{'Is a directory' if runner == 'c' else 'EISDIR'})"], result.stderr
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["check.json"]


@pytest.mark.parametrize("runner", ["c", "cpp", "node", "wasm"])
def test_check_json_into_a_fifo_writes_through_it(runner: str, seed_dir: Path, tmp_path: Path) -> None:
    """--json FILE where FILE is a FIFO (or a device): written through, as `mha check --json` writes it. The rename
    of a temporary file made a regular file of it (run as root, `--json /dev/full` replaced the device)."""
    fifo = tmp_path / "check.json"
    os.mkfifo(fifo)
    read: list[bytes] = []
    reader = threading.Thread(target=lambda: read.append(fifo.read_bytes()), daemon=True)
    reader.start()
    command = ["node", str(NATIVE / "web" / "check.mjs")] if runner == "wasm" else [*COMMAND[runner], "check"]
    try:
        result = subprocess.run([*command, str(seed_dir), "--json", str(fifo)], capture_output=True, text=True,
                                timeout=300)
    finally:
        reader.join(30)
        if reader.is_alive() and stat.S_ISFIFO(os.lstat(fifo).st_mode):  # never opened for writing: end the reader
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    _no_crash(result)
    assert result.returncode == 0, result.stderr
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and sorted(p.name for p in tmp_path.iterdir()) == ["check.json"]
    assert json.loads(read[0])["failed"] == 0


# --- hostile fixtures: one line, exit 1, no crash, nothing written ----------------------------------------------

def _schedule(chunks: object) -> Callable[[Path], None]:
    return lambda folder: _edit_case(folder, "b1_t6", schedule=chunks)


def _drop_schedule(doc: dict) -> None:
    for entry in doc["artifacts"]:
        if "schedules" in entry:
            del entry["schedules"]["b1_t6"]


def _golden_names(case: str, **names: str) -> Callable[[Path], None]:
    """A case's input_bin / output_bin set to `names` (in cases.json, resealed)."""
    return lambda folder: _edit_cases(folder, lambda doc: _case(doc, case).update(names))


def _shapes(case: str, **shapes: list[int]) -> Callable[[Path], None]:
    """A case's input_shape / output_shape set to `shapes` (the .bin files unchanged)."""
    return lambda folder: _edit_cases(folder, lambda doc: _case(doc, case).update(shapes))


def _models_outside(folder: Path) -> None:
    """mha.onnx's and mha.pt's entries name their file through '..' (the same file: seed_copy is <tmp>/seed)."""
    def change(doc: dict) -> None:
        for entry in doc["artifacts"]:
            if entry["file"] in ("mha.onnx", "mha.pt"):
                entry["file"] = f"../{folder.name}/{entry['file']}"

    _edit_cases(folder, change)


NOT_INSIDE = "expected a file name inside the artifact folder, got "


def _special(path: Path, kind: str) -> None:
    """`path` replaced by /dev/zero (a symbolic link to it) or by a FIFO: reading either never ends."""
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")


HOSTILE_FIXTURES: dict[str, tuple[Callable[[Path], None], list[str], dict[str, str]]] = {
    # Node read them whole (all memory, or blocked for a writer); C blocked in open() on a FIFO.
    "model-is-dev-zero": (lambda f: _special(f / "mha.onnx", "device"), ONNX_RUNNERS,
                          {"*": "mha.onnx: expected a regular file"}),
    "manifest-is-a-fifo": (lambda f: _special(f / "manifest.json", "fifo"), ONNX_RUNNERS,
                           {"*": "manifest.json: expected a regular file"}),
    # a case's name is printed in every result line: Node wrote the escape sequence and the newline out raw
    "case-name-control-characters": (lambda f: _edit_cases(f, lambda d: _case(d, "b1_t1").update(
        name="a\n\x1b[31mred")), ["c", "c-asan", "node"], {"*": "name: expected no control characters",
                                                           "node": "name: expected printable text"}),
    # name: (edit the copied seed folder, runners it applies to, {runner or "*": message})
    "schedule-sum-over": (_schedule([3, 1, 1, 1, 1]), ["c", "c-asan", "node"],
                          {"*": "schedule 3,1,1,1,1 adds up to 7, expected tokens=6"}),
    "schedule-sum-under": (_schedule([3, 1]), ["c", "c-asan", "node"],
                           {"*": "schedule 3,1 adds up to 4, expected tokens=6"}),
    "schedule-negative": (_schedule([9, -3]), ["c", "c-asan", "node"],
                          {"*": "schedule 9,-3: expected chunks of 1 to tokens=6 tokens, got '9'"}),
    "schedule-negative-inside": (_schedule([4, -1, 3]), ["c", "c-asan", "node"],
                                 {"*": "schedule 4,-1,3: expected chunks of 1 to tokens=6 tokens, got '-1'"}),
    "schedule-zero": (_schedule([3, 0, 3]), ["c", "c-asan", "node"],
                      {"*": "schedule 3,0,3: expected chunks of 1 to tokens=6 tokens, got '0'"}),
    "schedule-too-many": (_schedule([1] * 7), ["c", "c-asan", "node"],
                          {"*": "expected at most tokens=6 chunks, got 7"}),
    "schedule-fraction": (_schedule([3, 1.5, 1.5]), ["c", "c-asan", "node"],
                          {"*": "schedule 3,1.5,1.5: expected chunks of 1 to tokens=6 tokens, got '1.5'"}),
    "schedule-string": (_schedule(["6"]), ["c", "c-asan", "node"],
                        {"*": "schedule \"6\": expected chunks of 1 to tokens=6 tokens, got '\"6\"'",
                         "node": "schedule 6: expected chunks of 1 to tokens=6 tokens, got '6'"}),
    "schedule-empty": (_schedule([]), ["c", "c-asan", "node"], {"*": "schedule : expected a list of chunks"}),
    "schedule-not-a-list": (_schedule(6), ["c", "c-asan", "node"], {"*": "schedule 6: expected a list of chunks"}),
    "schedule-missing": (lambda f: _edit_cases(f, _drop_schedule), ["c", "c-asan", "node"],
                         {"*": "schedules: expected a schedule for case 'b1_t6', found none",
                          "node": "schedule null: expected a list of chunks"}),
    "batch-huge": (lambda f: _edit_case(f, "b1_t1", batch=10**15), RUNNERS,
                   {"*": "expected 3000000000000000 float32 values (12000000000000000 bytes), found 12 bytes"}),
    "batch-overflows": (lambda f: _edit_case(f, "b1_t1", batch=2**62), RUNNERS,
                        {"*": "expected batch * tokens * width float32 values to fit in memory",
                         "node": "expected input_shape and output_shape [batch, tokens, width] of integers"}),
    "batch-zero": (lambda f: _edit_case(f, "b1_t1", batch=0), RUNNERS, {"*": "expected batch >= 1, got 0"}),
    "tokens-huge": (lambda f: _edit_case(f, "b1_t1", tokens=2**40), RUNNERS,
                    {"*": "expected 1 <= tokens <= context_length=6, got 1099511627776"}),
    "input-truncated": (lambda f: _resize_bin(f, "b1_t1.x.bin", 8), RUNNERS,
                        {"*": "b1_t1.x.bin: expected 3 float32 values (12 bytes), found 8 bytes"}),
    "input-oversized": (lambda f: _resize_bin(f, "b1_t1.x.bin", 16), RUNNERS,
                        {"*": "b1_t1.x.bin: expected 3 float32 values (12 bytes), found 16 bytes"}),
    "output-truncated": (lambda f: _resize_bin(f, "b1_t6.context.bin", 40), RUNNERS,
                         {"*": "b1_t6.context.bin: expected 24 float32 values (96 bytes), found 40 bytes"}),
    "input-nan": (lambda f: _edit_floats(f, "b1_t1.x.bin", lambda x: np.r_[np.nan, x[1:]]), RUNNERS,
                  {"*": "b1_t1.x.bin: expected finite float32 values, found nan at index 0"}),
    "input-inf": (lambda f: _edit_floats(f, "b2_t3.x.bin", lambda x: np.r_[x[:4], -np.inf, x[5:]]), RUNNERS,
                  {"*": "b2_t3.x.bin: expected finite float32 values, found -inf at index 4"}),
    "golden-output-nan": (lambda f: _edit_floats(f, "b1_t1.context.bin", lambda y: np.r_[y[:2], np.nan, y[3:]]),
                          RUNNERS, {"*": "b1_t1.context.bin: expected finite float32 values, found nan at index 2"}),
    "input-altered-unsealed": (lambda f: (f / "golden" / "b1_t1.x.bin").write_bytes(b"\0" * 12), RUNNERS,
                               {"*": "b1_t1.x.bin: sha256 "}),
    "input-truncated-unsealed": (lambda f: (f / "golden" / "b1_t1.x.bin").write_bytes(b"\0" * 8), RUNNERS,
                                 {"*": "b1_t1.x.bin: expected 12 bytes (manifest), found 8"}),
    "fixtures-edited-unsealed": (lambda f: _edit_case(f, "b1_t6", schedule=[1, 1, 1, 3], sealed=False), RUNNERS,
                                 {"*": "golden/cases.json: sha256 "}),
    "fixture-not-in-manifest": (lambda f: _add_case(f, "extra", (1, 2, 3), 4) or _edit_manifest_text(
        f, '"golden/extra.x.bin"', '"golden/unlisted.x.bin"'), RUNNERS,
        {"*": "golden/extra.x.bin: expected it listed in"}),
    "manifest-wrong-model-sha256": (lambda f: _edit_manifest_text(
        f, json.loads((f / "manifest.json").read_text())["files"]["mha.onnx"]["sha256"], "0" * 64), ONNX_RUNNERS,
        {"*": "differs from the manifest's 000000000000..."}),
    "manifest-wrong-pt-sha256": (lambda f: _edit_manifest_text(
        f, json.loads((f / "manifest.json").read_text())["files"]["mha.pt"]["sha256"], "f" * 64), ["cpp"],
        {"*": "differs from the manifest's ffffffffffff..."}),
    "onnx-flipped-byte": (lambda f: _flip_onnx_byte(f / "mha.onnx"), ONNX_RUNNERS,
                          {"*": "mha.onnx: sha256 "}),
    "pt-flipped-byte": (lambda f: _flip_pt_byte(f / "mha.pt"), ["cpp"], {"*": "mha.pt: sha256 "}),
    "fused-copied-over-plain": (lambda f: shutil.copyfile(f / "mha.fused.onnx", f / "mha.onnx"), ONNX_RUNNERS,
                                {"*": "bytes (manifest), found"}),
    "fused-copied-over-plain-resized": (lambda f: _edit_onnx_size(f, (f / "mha.fused.onnx").stat().st_size)
                                        or shutil.copyfile(f / "mha.fused.onnx", f / "mha.onnx"), ONNX_RUNNERS,
                                        {"*": "mha.onnx: sha256 "}),
    "model-output-too-narrow": (lambda f: _narrow_model(f / "mha.onnx"), ONNX_RUNNERS,
                                {"*": "output 'context': expected axis 2 of size 4, got 2",
                                 "node": "output 'context': expected 4 values [1,1,4], got 2"}),
    "pt-output-too-narrow": (lambda f: _narrow_pt(f / "mha.pt"), ["cpp"],
                             {"*": "output: expected float32 [1, 1, 4], got Float [1, 1, 2]"}),
    "manifest-missing": (lambda f: (f / "manifest.json").unlink(), RUNNERS,
                         {"*": "manifest.json: expected a manifest (made by `mha export`), found none"}),
    "manifest-truncated": (lambda f: (f / "manifest.json").write_bytes((f / "manifest.json").read_bytes()[:700]),
                           RUNNERS, {"*": "manifest.json: expected JSON, got a parse error"}),
    "manifest-config-key-missing": (lambda f: _edit_manifest_text(f, '"d_in": 3,', ''), RUNNERS,
                                    {"*": "config: expected an integer field 'd_in', found none"}),
    "manifest-huge-integer": (lambda f: _edit_manifest_text(f, '"context_length": 6', '"context_length": '
                                                            '99999999999999999999999'), RUNNERS,
                              {"*": "expected 'context_length' an integer from 1 to 16777216"}),
    "manifest-huge-number": (lambda f: _edit_manifest_text(f, '"d_in": 3', '"d_in": 1e400'), RUNNERS,
                             {"*": "expected a finite number, got 1e400",
                              "node": "expected 'd_in' an integer from 1 to 16777216, got null"}),
    "manifest-long-number": (lambda f: _edit_manifest_text(f, '"d_in": 3', '"d_in": 3.' + "0" * 100),
                             ["c", "c-asan", "cpp"], {"*": "expected a number of at most 64 characters, got 102"}),
    # what cJSON lets through and common/json.c's walk over its tree refuses (Node's JSON.parse differs: C side only)
    "manifest-duplicate-key": (lambda f: _edit_manifest_text(f, '"d_in": 3,', '"d_in": 3, "d_in": 3,'),
                               ["c", "c-asan", "cpp"], {"*": "(expected unique member names, got 'd_in' twice)"}),
    "manifest-leading-zero": (lambda f: _edit_manifest_text(f, '"d_in": 3,', '"d_in": 03,'), ["c", "c-asan", "cpp"],
                              {"*": "(expected a JSON number, got 03 at byte "}),
    "manifest-nul-escape": (lambda f: _edit_manifest_text(f, '"name": "seed"', '"name": "seed\\u0000.onnx"'),
                            ["c", "c-asan", "cpp"], {"*": "(expected a string without \\u0000 at byte "}),
    "manifest-bad-hex-escape": (lambda f: _edit_manifest_text(f, '"name": "seed"', '"name": "seed\\uzzzz"'),
                                ["c", "c-asan", "cpp"], {"*": "(expected 4 hex digits after \\u at byte "}),
    "manifest-control-byte": (lambda f: _edit_manifest_text(f, '"format": 2,', '"format":\x012,'),
                              ["c", "c-asan", "cpp"], {"*": "(expected a value, got a control character at byte "}),
    "manifest-byte-order-mark": (lambda f: (f / "manifest.json").write_bytes(b"\xef\xbb\xbf" + (
        f / "manifest.json").read_bytes()), ["c", "c-asan", "cpp"],
                                 {"*": "(expected a value, got byte 0xef at byte 0)"}),
    "manifest-negative-size": (lambda f: _edit_onnx_size(f, -(f / "mha.onnx").stat().st_size), RUNNERS,
                               {"*": "files.mha.onnx: expected 'size' an integer"}),
    "manifest-format-1": (lambda f: _edit_manifest_text(f, '"format": 2', '"format": 1'), RUNNERS,
                          {"*": "expected manifest format 2, got"}),
    # golden/cases.json itself broken (resealed: only the reader can refuse it): the check stops, one line on stderr
    # cJSON says where it stopped, not why (the C runners' "near": at the byte, or one past it in a string)
    "cases-json-truncated": (lambda f: _write_cases_bytes(f, (f / CASES).read_bytes()[:700]), RUNNERS,
                             {"*": PARSE_ERROR + "expected JSON, got a syntax error near byte 699)",
                              "node": PARSE_ERROR}),
    "cases-json-trailing-garbage": (lambda f: _write_cases_bytes(f, (f / CASES).read_bytes() + b"}"), RUNNERS,
                                    {"*": PARSE_ERROR + "expected the end of the text, got '}' at byte ",
                                     "node": PARSE_ERROR}),
    "cases-json-not-an-object": (lambda f: _write_cases_bytes(f, b"[]"), RUNNERS,
                                 {"*": "golden/cases.json: expected a JSON object, got an array",
                                  "node": "golden/cases.json: expected an object with 'cases' and 'artifacts' arrays"}),
    "cases-json-no-artifacts": (lambda f: _edit_cases(f, lambda doc: doc.pop("artifacts")), RUNNERS,
                                {"*": "golden/cases.json: expected an object with 'cases' and 'artifacts' arrays, "
                                      "got an array and nothing",
                                 "node": "golden/cases.json: expected an object with 'cases' and 'artifacts' arrays"}),
    "cases-json-config-differs": (lambda f: _edit_cases(f, lambda doc: doc["config"].update(d_in=5)), RUNNERS,
                                  {"*": "golden/cases.json: config says d_in=5, the manifest says 3; the fixtures do "
                                        "not belong to this folder"}),
    "cases-json-format-2": (lambda f: _edit_cases(f, lambda doc: doc.update(format=2)), RUNNERS,
                            {"*": "golden/cases.json: expected 'format' 1, got another number"}),
    # names that leave the artifact folder, refused before anything is opened
    "input-bin-path-escape": (_golden_names("b1_t1", input_bin="../../etc/passwd"), RUNNERS,
                              {"*": "golden file: " + NOT_INSIDE + "'../../etc/passwd'",
                               "node": "golden file: " + NOT_INSIDE + '"../../etc/passwd" and "b1_t1.context.bin"'}),
    "output-bin-absolute": (_golden_names("b1_t1", output_bin="/etc/passwd"), RUNNERS,
                            {"*": "golden file: " + NOT_INSIDE + "'/etc/passwd'",
                             "node": "golden file: " + NOT_INSIDE + '"b1_t1.x.bin" and "/etc/passwd"'}),
    "model-file-path-escape": (_models_outside, RUNNERS,
                               {"*": "file: " + NOT_INSIDE + "'../seed/mha.onnx'",
                                "cpp": "file: " + NOT_INSIDE + "'../seed/mha.pt'",
                                "node": "file: " + NOT_INSIDE + '"../seed/mha.onnx"'}),
    # a case whose shapes disagree with the manifest's config (or with themselves)
    "output-width-differs": (_shapes("b1_t1", output_shape=[1, 1, 5]), RUNNERS,
                             {"*": "expected output width num_heads*d_out=4, got 5"}),
    "output-batch-differs": (_shapes("b1_t1", output_shape=[2, 1, 4]), RUNNERS,
                             {"*": "expected output [batch, tokens] = [1, 1], got [2, 1]"}),
    "input-shape-rank-2": (_shapes("b1_t1", input_shape=[1, 3]), RUNNERS,
                           {"*": "expected input_shape and output_shape [batch, tokens, width] of integers, got an "
                                 "array and an array",
                            "node": "expected input_shape and output_shape [batch, tokens, width] of integers, got "
                                    "[1,3] and [1,1,4]"}),
    "model-config-key-missing": (lambda f: None, ["c", "c-asan", "cpp"], {
        "*": "metadata 'mha.config': expected an integer field 'd_in', found none",
        "cpp": "embedded config.json: expected an integer field 'd_in', found none"}),
    "model-config-differs": (lambda f: None, ["c", "c-asan", "cpp"], {
        "*": "says d_in=5, ", "cpp": "says d_in=5, "}),
}
MODEL_CONFIG_EDITS = {"model-config-key-missing": lambda c: {k: v for k, v in c.items() if k != "d_in"},
                      "model-config-differs": lambda c: c | {"d_in": 5}}


@pytest.mark.parametrize("runner,name", [(r, n) for n, (_, runners, _) in HOSTILE_FIXTURES.items() for r in runners])
def test_hostile_fixture_is_one_line_exit_1_nothing_written(runner: str, name: str, seed_copy: Path) -> None:
    edit, _, messages = HOSTILE_FIXTURES[name]
    if name in MODEL_CONFIG_EDITS:
        _edit_model_config(seed_copy, runner, MODEL_CONFIG_EDITS[name])
    else:
        edit(seed_copy)
    message = messages.get(runner, messages["*"])
    out = _refused(runner, seed_copy, message)
    lines = [line for line in out.splitlines() if message in line]
    assert lines and all(line.startswith(("FAIL ", "error: ")) for line in lines), out


def test_hostile_schedule_no_longer_crashes_the_c_runner(seed_copy: Path) -> None:
    """The issue's reproduction: 3,1,1,1,1 for T=6 was `free(): invalid next size` (rc 134), 9,-3 a SIGSEGV."""
    for chunks in ([3, 1, 1, 1, 1], [9, -3]):
        _edit_case(seed_copy, "b1_t6", schedule=chunks)
        result = _run("c-asan", seed_copy)
        _no_crash(result)
        fails = [line for line in result.stdout.splitlines() if line.startswith("FAIL")]
        assert result.returncode == 1 and len(fails) == 1 and "mha.decode.onnx" in fails[0], result.stdout
        doc = json.loads((seed_copy / "golden" / "cases.json").read_text())
        total = len(doc["cases"]) * sum(a["runtime"].startswith("onnxruntime") for a in doc["artifacts"])
        assert result.stdout.strip().endswith(f"{total - 1} passed, 1 failed")


@pytest.mark.parametrize("runner", RUNNERS)
def test_corrupted_model_is_an_error_not_a_crash(runner: str, seed_copy: Path) -> None:
    model = seed_copy / MODEL_OF[runner]
    model.write_bytes(b"\x00garbage" + model.read_bytes()[100:])
    reseal(seed_copy, MODEL_OF[runner])  # past the sha256 check: the loader itself must fail cleanly
    message = "torch::jit::load failed" if runner == "cpp" else "ONNX Runtime cannot load it"
    _refused(runner, seed_copy, message)


@pytest.mark.parametrize("runner", RUNNERS)
def test_no_fixtures_is_a_failure(runner: str, tmp_path: Path) -> None:
    result = _run(runner, tmp_path)
    _no_crash(result)
    assert result.returncode == 1 and "expected golden fixtures" in result.stderr


@pytest.mark.parametrize("runner", RUNNERS)
def test_manifest_errors_are_one_line_on_stderr(runner: str, seed_copy: Path) -> None:
    (seed_copy / "manifest.json").write_text('{"format": 2, "config": {"d_in": 3, "d_out"')
    result = _run(runner, seed_copy)
    _no_crash(result)
    assert result.returncode == 1 and result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1 and result.stderr.startswith("error: "), result.stderr


# --- near misses: just over one bound must FAIL -----------------------------------------------------------------

@pytest.mark.parametrize("runner", RUNNERS)
def test_golden_output_just_over_atol_fails_that_case(runner: str, seed_copy: Path) -> None:
    # |got - want| ~ 6e-8 for fp32; move one value by 1.5x its bound (atol 1e-5 + rtol 1e-5 * |want|)
    _edit_floats(seed_copy, "b1_t1.context.bin", lambda y: y + np.r_[1.5e-5 * (1 + abs(y[0])), np.zeros(len(y) - 1)])
    out = _refused(runner, seed_copy, "atol=")
    model = MODEL_OF[runner]
    assert _line_of(out, model, "b1_t1").startswith("FAIL"), out
    assert _line_of(out, model, "b2_t3").startswith("ok"), out
    if runner != "cpp":  # the same value is well inside fp16's atol 5e-3: a near miss, not a broken fixture
        assert _line_of(out, "mha.fp16.onnx", "b1_t1").startswith("ok"), out


def _int8_output(folder: Path, case: str, shape: tuple[int, int, int]) -> np.ndarray:
    import onnxruntime as ort

    x = np.fromfile(folder / "golden" / f"{case}.x.bin", "<f4").reshape(shape)
    session = ort.InferenceSession(str(folder / "mha.int8.onnx"), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0].ravel()


@pytest.mark.parametrize("runner", ONNX_RUNNERS)
def test_golden_output_over_rel_l2_only_fails_int8(runner: str, seed_copy: Path) -> None:
    want = np.fromfile(seed_copy / "golden" / "b1_t6.context.bin", "<f4")
    got = _int8_output(seed_copy, "b1_t6", (1, 6, 3))
    scaled = (want * np.float32(1.06)).astype("<f4")  # every value moved a little: the L2 norm moves a lot
    diff = np.abs(got.astype(np.float64) - scaled)
    rel_l2 = np.sqrt((diff**2).sum() / (scaled.astype(np.float64) ** 2).sum())
    assert diff.max() < 0.1 * 0.8 and rel_l2 > 0.03 * 1.2  # inside int8's atol 0.1, over its rel_l2 0.03
    _write_floats(seed_copy / "golden" / "b1_t6.context.bin", scaled)
    reseal(seed_copy, "golden/b1_t6.context.bin")
    out = _refused(runner, seed_copy, "rel_l2<=0.03")
    assert _line_of(out, "mha.int8.onnx", "b1_t6").startswith("FAIL"), out
    assert _line_of(out, "mha.int8.onnx", "b2_t3").startswith("ok"), out


def test_golden_output_over_rel_l2_only_fails_torchscript(seed_copy: Path) -> None:
    """mha.pt has no rel_l2 bound of its own: give its entry one, then a change inside atol but over it."""
    def bound(doc: dict) -> None:
        (entry,) = [a for a in doc["artifacts"] if a["file"] == "mha.pt"]
        assert entry["tolerance"]["rel_l2"] is None
        entry["tolerance"]["rel_l2"] = 1e-07

    _edit_cases(seed_copy, bound)
    _edit_floats(seed_copy, "b1_t6.context.bin", lambda y: y * np.float32(1 + 1e-6))  # |diff| <= 1e-6 < atol
    out = _refused("cpp", seed_copy, "rel_l2<=1e-07")
    assert _line_of(out, "mha.pt", "b1_t6").startswith("FAIL") and "max_abs=" in _line_of(out, "mha.pt", "b1_t6")
    assert _line_of(out, "mha.pt", "b2_t3").startswith("ok"), out


# --- the in-place decode form (mha.decode-inplace.onnx), on the mid config (seed's d_out 2 cannot build it) ---------

INPLACE = "mha.decode-inplace.onnx"
GQA_CHUNK = [12, 2] + [1] * 10  # b2_t24: a chunk of 2 tokens after a past of 12, at batch 2
GQA_MESSAGE = ("schedule 12,2,1,1,1,1,1,1,1,1,1,1: a chunk of 2 tokens after a past of 12 needs batch 1 "
               "(ONNX Runtime's GroupQueryAttention), got batch 2: feed single tokens")


def _onnx_cases(folder: Path) -> tuple[int, list[str]]:
    """(the (artifact, case) pairs of cases.json the C and Node runners run, the cases the in-place form has a
    schedule for, in the order of cases.json)."""
    doc = _cases(folder)
    names = [c["name"] for c in doc["cases"]]
    count = len(names) * sum(a["runtime"] in ONNX_RUNTIMES for a in doc["artifacts"])
    inplace = [a for a in doc["artifacts"] if a["file"] == INPLACE and a["runtime"] == "onnxruntime-decode-inplace"]
    return count, [name for a in inplace for name in names if name in a["schedules"]]


@pytest.mark.parametrize("runner", ONNX_RUNNERS)
def test_golden_cases_pass_with_the_inplace_decode_form(runner: str, mid_dir: Path) -> None:
    count, inplace = _onnx_cases(mid_dir)
    assert inplace == ["b1_t1", "b2_t24", "b1_t48"]  # the mid export has the variant, with a schedule per case
    result = _run(runner, mid_dir)
    out = _no_crash(result)
    assert result.returncode == 0, out
    for case in inplace:
        assert _line_of(out, INPLACE, case).startswith("ok   "), out
    assert result.stdout.strip().splitlines()[-1] == f"{count} passed, 0 failed"


@pytest.mark.parametrize("runner", ONNX_RUNNERS)
def test_inplace_chunk_after_a_past_at_batch_2_is_refused_before_running(runner: str, mid_copy: Path) -> None:
    """GroupQueryAttention takes a chunk of more than one token after a past only at batch 1: that schedule line
    is its case's one FAIL line (validated before the run); the plain decode form runs the same schedule fine."""
    count, _ = _onnx_cases(mid_copy)
    _edit_case(mid_copy, "b2_t24", schedule=GQA_CHUNK)  # every decode artifact's schedule for that case
    out = _refused(runner, mid_copy, GQA_MESSAGE)
    fails = [line for line in out.splitlines() if line.startswith("FAIL")]
    assert fails == [_line_of(out, INPLACE, "b2_t24")] and fails[0].endswith(GQA_MESSAGE), out
    assert _line_of(out, "mha.decode.onnx", "b2_t24").startswith("ok   "), out
    assert _line_of(out, INPLACE, "b1_t48").startswith("ok   "), out  # batch 1: chunks after a past are fine
    assert out.strip().splitlines()[-1] == f"{count - 1} passed, 1 failed"


@pytest.mark.parametrize("runner", ONNX_RUNNERS)
def test_inplace_golden_output_just_over_atol_fails_that_case(runner: str, mid_copy: Path) -> None:
    """One value of b2_t24's last token (a single-token step after the prefill, batch row 2) moved by 1.5x its
    bound: the in-place form's b2_t24 FAILs, its other cases and the same value under fp16's atol stay ok."""
    def nudge(y: np.ndarray) -> np.ndarray:
        y = y.copy()
        y[-1] += np.float32(1.5e-5 * (1 + abs(y[-1])))
        return y

    _edit_floats(mid_copy, "b2_t24.context.bin", nudge)
    out = _refused(runner, mid_copy, "atol=")
    line = _line_of(out, INPLACE, "b2_t24")
    assert line.startswith("FAIL") and "atol=" in line, out
    max_abs = float(re.search(r"max_abs=(\S+)", line)[1])
    assert 1.0e-5 < max_abs < 1e-4, line  # a near miss, not a broken run
    assert _line_of(out, INPLACE, "b1_t1").startswith("ok   ") and _line_of(out, INPLACE, "b1_t48").startswith("ok   ")
    assert _line_of(out, "mha.fp16.onnx", "b2_t24").startswith("ok   "), out


# --- `run`: one input, one output file ---------------------------------------------------------------------------

def _run_one(runner: str, model: Path, x: Path, batch: str, tokens: str, out: Path) -> subprocess.CompletedProcess[str]:
    return _command(runner, "run", model, x, batch, tokens, out)


@pytest.mark.parametrize("runner", ONNX_RUNNERS)
def test_run_writes_the_golden_output(runner: str, seed_copy: Path, tmp_path: Path) -> None:
    out = tmp_path / "out" / "context.bin"
    out.parent.mkdir()
    result = _run_one(runner, seed_copy / "mha.onnx", seed_copy / "golden" / "b2_t3.x.bin", "2", "3", out)
    _no_crash(result)
    assert result.returncode == 0, result.stderr
    want = np.fromfile(seed_copy / "golden" / "b2_t3.context.bin", "<f4")
    np.testing.assert_allclose(np.fromfile(out, "<f4"), want, atol=1e-5, rtol=1e-5)
    assert sorted(p.name for p in out.parent.iterdir()) == ["context.bin"]  # no temporary left behind
    assert oct(out.stat().st_mode & 0o777) == oct(0o666 & ~_umask())


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _bad_input(kind: str, folder: Path, tmp: Path) -> tuple[Path, str, str]:
    """(input file, BATCH, TOKENS) for one hostile `run`."""
    x = np.fromfile(folder / "golden" / "b2_t3.x.bin", "<f4")
    path = tmp / "x.bin"
    values = {"nan": np.r_[x[:5], np.nan, x[6:]], "inf": np.r_[np.inf, x[1:]], "short": x[:-1], "long": np.r_[x, 1]}
    _write_floats(path, values.get(kind, x))
    args = {"tokens-over": ("2", "7"), "tokens-zero": ("2", "0"), "batch-zero": ("0", "3"), "batch-text": ("2x", "3"),
            "batch-huge": ("99999999999999999999999", "3"), "batch-negative": ("-2", "3")}
    return (path, *args.get(kind, ("2", "3")))


RUN_MESSAGES = {
    "nan": "x.bin: expected finite float32 values, found nan at index 5",
    "inf": "x.bin: expected finite float32 values, found inf at index 0",
    "short": "x.bin: expected 18 float32 values (72 bytes), found 68 bytes",
    "long": "x.bin: expected 18 float32 values (72 bytes), found 76 bytes",
    "tokens-over": "TOKENS: expected 1 <= tokens <= context_length=6, got '7'",
    "tokens-zero": "TOKENS: expected 1 <= tokens <= context_length=6, got '0'",
    "batch-zero": "BATCH: expected an integer from 1 to 1048576, got '0'",
    "batch-text": "BATCH: expected an integer from 1 to 1048576, got '2x'",
    "batch-huge": "BATCH: expected an integer from 1 to 1048576, got '99999999999999999999999'",
    "batch-negative": "BATCH: expected an integer from 1 to 1048576, got '-2'",
    "model-flipped": "mha.onnx: sha256 ",
    "model-unlisted": "mha.onnx: expected it listed in",
    "output-folder-missing": "missing/context.bin: cannot ",
}


@pytest.mark.parametrize("runner", ONNX_RUNNERS)
@pytest.mark.parametrize("kind", list(RUN_MESSAGES))
def test_run_refuses_bad_input_and_leaves_the_output_alone(runner: str, kind: str, seed_copy: Path,
                                                           tmp_path: Path) -> None:
    x, batch, tokens = _bad_input(kind, seed_copy, tmp_path)
    if kind == "model-flipped":
        _flip_onnx_byte(seed_copy / "mha.onnx")
    if kind == "model-unlisted":
        doc = json.loads((seed_copy / "manifest.json").read_text())
        doc["files"]["renamed.onnx"] = doc["files"].pop("mha.onnx")
        (seed_copy / "manifest.json").write_text(json.dumps(doc))
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = out_dir / "context.bin" if kind != "output-folder-missing" else tmp_path / "missing" / "context.bin"
    if out.parent.exists():
        out.write_bytes(b"previous result")
    result = _run_one(runner, seed_copy / "mha.onnx", x, batch, tokens, out)
    _no_crash(result)
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.strip().splitlines() == [result.stderr.strip()], result.stderr  # one line
    assert RUN_MESSAGES[kind] in result.stderr and result.stderr.startswith("error: "), result.stderr
    assert sorted(p.name for p in out_dir.iterdir()) == (["context.bin"] if out.parent == out_dir else [])
    if out.parent == out_dir:
        assert out.read_bytes() == b"previous result"


@pytest.mark.parametrize("runner", ["c", "c-asan"])
def test_c_run_of_a_lone_model_says_unverified(runner: str, seed_dir: Path, tmp_path: Path) -> None:
    shutil.copyfile(seed_dir / "mha.onnx", tmp_path / "mha.onnx")
    out = tmp_path / "context.bin"
    result = _run_one(runner, tmp_path / "mha.onnx", seed_dir / "golden" / "b2_t3.x.bin", "2", "3", out)
    _no_crash(result)
    assert result.returncode == 0, result.stderr
    assert result.stderr.startswith("warning: unverified: no manifest.json beside ") and \
        len(result.stderr.splitlines()) == 1, result.stderr
    want = np.fromfile(seed_dir / "golden" / "b2_t3.context.bin", "<f4")
    np.testing.assert_allclose(np.fromfile(out, "<f4"), want, atol=1e-5, rtol=1e-5)


def test_node_run_requires_the_manifest(seed_dir: Path, tmp_path: Path) -> None:
    shutil.copyfile(seed_dir / "mha.onnx", tmp_path / "mha.onnx")
    result = _run_one("node", tmp_path / "mha.onnx", seed_dir / "golden" / "b2_t3.x.bin", "2", "3",
                      tmp_path / "context.bin")
    assert result.returncode == 1 and "expected a manifest" in result.stderr
    assert not (tmp_path / "context.bin").exists()


@pytest.mark.parametrize("runner", ["c", "node"])
def test_concurrent_runs_on_one_output_path_all_succeed(runner: str, seed_dir: Path, tmp_path: Path) -> None:
    """8 processes write one path at once: each through its own temporary file, renamed into place."""
    # 25 MB each, so that the writes overlap: Node with one shared '<out>.tmp' passed this test 3 times of 3 at batch
    # 4096, failed it 2 times of 3 at 65536 and 4 of 4 at this size
    batch = 262144
    x = np.random.default_rng(0).standard_normal((batch, 6, 3)).astype("<f4")
    _write_floats(tmp_path / "x.bin", x)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = out_dir / "context.bin"
    assert BUILT[runner].exists()
    procs = [subprocess.Popen([*COMMAND[runner], "run", str(seed_dir / "mha.onnx"), str(tmp_path / "x.bin"),
                               str(batch), "6", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(8)]
    results = [(*p.communicate(timeout=300), p.returncode) for p in procs]
    assert [r[2] for r in results] == [0] * 8, results
    assert sorted(p.name for p in out_dir.iterdir()) == ["context.bin"]
    import onnxruntime as ort

    session = ort.InferenceSession(str(seed_dir / "mha.onnx"), providers=["CPUExecutionProvider"])
    want = session.run(None, {"x": x})[0].ravel()
    got = np.fromfile(out, "<f4")
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


# --- the C runner's own building blocks: SHA-256, the manifest reader, the sanitizer build -----------------------

NIST_VECTORS = {
    b"": "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    b"abc": "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
    b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq":
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1",
    b"abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu":
        "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1",
    b"a" * 1_000_000: "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0",
}


@pytest.mark.parametrize("runner", ["c", "c-asan"])
def test_c_sha256_matches_nist_vectors_and_hashlib(runner: str, seed_dir: Path, tmp_path: Path) -> None:
    files = []
    for i, data in enumerate(NIST_VECTORS):
        files.append(tmp_path / f"nist{i}")
        files[-1].write_bytes(data)
    rng = np.random.default_rng(7)
    for size in [*range(0, 130), 1000, 4095, 4096, 4097, 3 * 2**20 + 13]:  # every padding boundary, and large
        files.append(tmp_path / f"random{size}")
        files[-1].write_bytes(rng.integers(0, 256, size, dtype=np.uint8).tobytes())
    files += sorted(p for p in seed_dir.rglob("*") if p.is_file())
    result = _command(runner, "sha256", *files)
    _no_crash(result)
    assert result.returncode == 0, result.stderr
    digests = dict(line.split("  ", 1)[::-1] for line in result.stdout.splitlines())
    assert len(digests) == len(files)
    for path in files:
        assert digests[str(path)] == hashlib.sha256(path.read_bytes()).hexdigest(), path
    for i, want in enumerate(NIST_VECTORS.values()):
        assert digests[str(tmp_path / f"nist{i}")] == want


@pytest.mark.parametrize("document", ["manifest", "minimal-manifest"])
def test_manifest_reader_survives_fuzzing_under_asan(document: str, seed_dir: Path, tmp_path: Path) -> None:
    """Truncations, random edits and deep nesting of a real manifest (and a model config), in a sanitizer build."""
    if document == "manifest":
        source = seed_dir / "manifest.json"
    else:
        source = tmp_path / "config.json"
        source.write_text(json.dumps({"format": 2, "config": json.loads((seed_dir / "manifest.json").read_text())[
            "config"], "files": {"mha.onnx": {"size": 1, "sha256": "0" * 64}}}))
    assert JSON_FUZZ.exists(), f"{JSON_FUZZ} is missing: build the native runners first (make native-build)"
    result = subprocess.run([str(JSON_FUZZ), str(source), "3000", "11"], capture_output=True, text=True, timeout=600)
    _no_crash(result)
    assert result.returncode == 0, result.stdout + result.stderr
    inputs, accepted, refused, bad = map(int, re.findall(r"\d+", result.stdout))
    assert inputs > 3000 and refused > inputs // 2 and accepted >= 1 and bad == 0, result.stdout


@pytest.fixture(scope="module")
def decimal_comma(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment of a decimal-comma locale, de_DE.UTF-8, compiled by localedef into a private folder (the
    `locales` package's sources are part of the machine image: a missing or failing localedef is a failure)."""
    assert shutil.which("localedef"), "localedef not found: the decimal-comma test needs it (glibc's libc-bin)"
    loc = tmp_path_factory.mktemp("locale") / "loc"
    loc.mkdir()
    made = subprocess.run(["localedef", "-i", "de_DE", "-f", "UTF-8", str(loc / "de_DE.UTF-8")],
                          capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, (f"localedef -i de_DE -f UTF-8 {loc}/de_DE.UTF-8 failed (rc {made.returncode}): the "
                                  "decimal-comma test needs the `locales` package's sources (/usr/share/i18n)\n"
                                  + made.stdout + made.stderr)
    env = {**os.environ, "LOCPATH": str(loc), "LC_ALL": "de_DE.UTF-8"}
    point = subprocess.run(["locale", "-k", "decimal_point"], env=env, capture_output=True, text=True, timeout=60)
    assert point.stdout.strip() == 'decimal_point=","' and not point.stderr, \
        f"the compiled de_DE.UTF-8 is not in effect: {point.stdout!r} {point.stderr!r}"
    return env


@pytest.mark.parametrize("runner", ["c", "c-asan"])
def test_c_runner_under_a_decimal_comma_locale_reads_and_prints_as_in_c(runner: str, decimal_comma: dict[str, str],
                                                                        seed_dir: Path, seed_copy: Path,
                                                                        tmp_path: Path) -> None:
    """mha_check calls setlocale(LC_ALL, ""): under de_DE, strtod would read cases.json's 0.005 as 0 and printf write
    0,005. Its console and --json output must be byte for byte those of the "C" locale: the golden cases pass (fp16's
    atol 0.005 and int8's rel_l2 0.03 read whole), and FAIL lines print the tolerances and a schedule's 1.5 with '.'."""
    # b1_t6 scaled by 1.06: over fp16's atol (0.005) and int8's rel_l2 (0.03); a fractional schedule for b2_t3
    _edit_floats(seed_copy, "b1_t6.context.bin", lambda y: y * np.float32(1.06))
    _edit_case(seed_copy, "b2_t3", schedule=[1.5, 1.5])
    plain = {k: v for k, v in os.environ.items() if k != "LOCPATH"} | {"LC_ALL": "C"}
    outputs = {}
    for folder, rc in ((seed_dir, 0), (seed_copy, 1)):
        runs = {}
        for name, env in (("C", plain), ("de_DE", decimal_comma)):
            result = _command(runner, "check", folder, "--json", tmp_path / f"{folder.name}.{name}.json", env=env)
            _no_crash(result)
            assert result.returncode == rc, result.stdout + result.stderr
            runs[name] = (result.stdout, result.stderr, (tmp_path / f"{folder.name}.{name}.json").read_bytes())
        assert runs["de_DE"] == runs["C"], (runs["de_DE"][0], runs["C"][0])
        json.loads(runs["de_DE"][2])  # a decimal comma in a number would make it invalid JSON
        figures = re.findall(r"\b(?:max_abs|rel_l2|atol|rel_l2<)=(\S+)", runs["de_DE"][0])
        assert figures and all(float(text) >= 0 for text in figures), figures  # float() refuses "0,005"
        outputs[folder] = runs["de_DE"][0]
    count, _ = _onnx_cases(seed_dir)
    golden = outputs[seed_dir]
    assert golden.strip().splitlines()[-1] == f"{count} passed, 0 failed", golden
    for model in ("mha.fp16.onnx", "mha.int8.onnx"):
        assert _line_of(golden, model, "b1_t6").startswith("ok   "), golden
    damaged = outputs[seed_copy]
    assert _line_of(damaged, "mha.fp16.onnx", "b1_t6").startswith("FAIL"), damaged
    assert _line_of(damaged, "mha.fp16.onnx", "b1_t6").endswith(" atol=0.005"), damaged
    assert _line_of(damaged, "mha.int8.onnx", "b1_t6").endswith(" atol=0.1 rel_l2<=0.03"), damaged
    assert _line_of(damaged, "mha.onnx", "b1_t6").endswith(" atol=1e-05"), damaged
    assert _line_of(damaged, "mha.decode.onnx", "b2_t3").endswith(
        "schedule 1.5,1.5: expected chunks of 1 to tokens=3 tokens, got '1.5'"), damaged
    assert _line_of(damaged, "mha.int8.onnx", "b2_t3").startswith("ok   "), damaged


def test_sanitizer_build_is_instrumented() -> None:
    linked = subprocess.run(["ldd", str(C_ASAN)], capture_output=True, text=True, check=True).stdout
    assert "libasan" in linked and "libubsan" in linked, linked


# --- docs ---------------------------------------------------------------------------------------------------------

def test_embedding_snippets_are_the_built_examples() -> None:
    readme = (Path(__file__).resolve().parents[2] / "docs" / "embedding.md").read_text()
    examples = (NATIVE / "node" / "example.js", NATIVE / "c" / "example.c", NATIVE / "cpp-libtorch" / "example.cpp")
    for example in examples:
        assert example.read_text().strip() in readme, f"docs/embedding.md snippet differs from {example}"
