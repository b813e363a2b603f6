"""The C runner on GPT folders (built by `make native-build`): `mha_check generate` and the golden generations.

`mha_check check DIR` on a GPT folder runs every golden generation of golden/generations.json through
gpt.inplace.onnx with IO binding, and each lossy form's own (int8, int4) (greedy and sampled: the C runner
implements the sampling rule with numpy's PCG64 + SeedSequence), as built and as built with AddressSanitizer +
UBSan (`c-asan`, leaks reported). `generate` prints the ids Python's `mha generate --json` gives; tampered files
and bad arguments are one line and exit 1;
gpt_example.c (the README's loop) builds and prints the same ids.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

NATIVE = Path(__file__).resolve().parents[2] / "runtime" / "native"
C_DIR = NATIVE / "c"
C_BUILD = C_DIR / "build"
BINARY = {"c": C_BUILD / "mha_check", "c-asan": C_BUILD / "mha_check_asan"}
EXAMPLE = C_BUILD / "gpt_example"
SANITIZER_WORDS = ("AddressSanitizer", "LeakSanitizer", "UndefinedBehaviorSanitizer", "runtime error:")
MHA = [sys.executable, "-m", "mha_runtime"]


def _c(runner: str, *args: object) -> subprocess.CompletedProcess[str]:
    assert BINARY[runner].exists(), f"{BINARY[runner]} is missing: build the native runners first (make native-build)"
    result = subprocess.run([str(BINARY[runner]), *map(str, args)], capture_output=True, text=True, timeout=600)
    out = result.stdout + result.stderr
    assert result.returncode >= 0, f"killed by signal {-result.returncode}:\n{out}"  # a crash or a sanitizer abort
    assert not any(word in out for word in SANITIZER_WORDS), out
    return result


def _python_generate(folder: Path, *args: object) -> dict:
    result = subprocess.run([*MHA, "generate", str(folder), *map(str, args), "--json"], capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _one_line_error(result: subprocess.CompletedProcess[str], text: str) -> str:
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and text in lines[0], result.stderr
    return lines[0]


@pytest.fixture(scope="module", params=["book", "hf"])
def gpt_folder(request: pytest.FixtureRequest) -> Path:
    """The small GPT folders of tests/conftest.py (the book's GPTModel with the tokenizer, and transformers')."""
    return request.getfixturevalue(f"{request.param}_gpt")[1]  # type: ignore[no-any-return]


@pytest.fixture
def book_copy(book_gpt: tuple[object, Path], tmp_path: Path) -> Path:
    """What the C runner reads of the book folder (manifest, gpt.inplace.onnx, golden/), a copy a test may damage."""
    folder = book_gpt[1]
    copy = tmp_path / "book"
    copy.mkdir()
    for name in ("manifest.json", "gpt.inplace.onnx", "gpt.inplace.int8.onnx", "gpt.inplace.int4.onnx"):
        shutil.copy(folder / name, copy / name)
    shutil.copytree(folder / "golden", copy / "golden")
    return copy


def _golden(folder: Path) -> list[dict]:
    return json.loads((folder / "golden" / "generations.json").read_text())["cases"]  # type: ignore[no-any-return]


def _forms(folder: Path) -> list[tuple[str, list[dict]]]:
    """(form, its golden cases) in the C runner's order: gpt.inplace.onnx, then the lossy forms, each its own."""
    artifacts = json.loads((folder / "manifest.json").read_text())["artifacts"]
    out = [("gpt.inplace.onnx", _golden(folder))]
    for form in ("gpt.inplace.int8.onnx", "gpt.inplace.int4.onnx"):
        if form in artifacts:
            out.append((form, json.loads((folder / artifacts[form]["generations"]).read_text())["cases"]))
    return out


@pytest.mark.parametrize("runner", ["c", "c-asan"])
def test_check_passes_every_golden_generation(runner: str, gpt_folder: Path, tmp_path: Path) -> None:
    cases = _golden(gpt_folder)
    assert any(c["temperature"] == 0 for c in cases) and any(c["temperature"] > 0 for c in cases)
    forms = _forms(gpt_folder)
    assert [f for f, _ in forms] == ["gpt.inplace.onnx", "gpt.inplace.int8.onnx", "gpt.inplace.int4.onnx"]
    result = _c(runner, "check", gpt_folder, "--json", tmp_path / "c.json")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.strip().splitlines()
    total = sum(len(c) for _, c in forms)
    assert lines[-1] == f"{total} passed, 0 failed"
    assert [line.split()[1:3] for line in lines[:-1]] == [[f, c["name"]] for f, cs in forms for c in cs]
    assert all(line.startswith("ok   ") for line in lines[:-1])
    report = json.loads((tmp_path / "c.json").read_text())
    assert report["runtime"] == "c" and report["passed"] == total and report["failed"] == 0
    assert report["onnxruntime"] and report["errors"] == [] and report["not_loadable"] == []
    assert [a["file"] for a in report["artifacts"]] == [f for f, _ in forms]
    for artifact, (_, own) in zip(report["artifacts"], forms, strict=True):
        assert artifact["error"] is None and [c["name"] for c in artifact["cases"]] == [c["name"] for c in own]
        assert all(c["ok"] and c["max_abs"] < 1e-3 for c in artifact["cases"])


def test_generate_prints_the_golden_ids(gpt_folder: Path) -> None:
    for case in _golden(gpt_folder):
        sampling = ["--temperature", case["temperature"], "--seed", case["seed"] or 0]
        if case["top_k"] is not None:
            sampling += ["--top-k", case["top_k"]]
        result = _c("c", "generate", gpt_folder, "--prompt-ids", ",".join(map(str, case["prompt_ids"])),
                    "--max-new-tokens", case["max_new_tokens"], "--no-eos", *sampling)
        assert result.returncode == 0, result.stderr
        assert result.stdout == ",".join(map(str, case["ids"])) + "\n", case["name"]


@pytest.mark.parametrize("args", [
    ("--prompt-ids", "15496,11,314,716", "--max-new-tokens", "12"),
    ("--prompt-ids", "1", "--max-new-tokens", "20"),
    ("--prompt-ids", "464,3290", "--max-new-tokens", "10", "--temperature", "0.9", "--top-k", "50", "--seed", "11"),
    ("--prompt-ids", "7,8,9", "--max-new-tokens", "10", "--temperature", "1.3", "--seed", "4294967297"),
])
def test_generate_equals_python(book_gpt: tuple[object, Path], args: tuple[str, ...]) -> None:
    folder = book_gpt[1]
    python = _python_generate(folder, *args)
    for runner in ("c", "c-asan"):
        c = _c(runner, "generate", folder, *args)
        assert c.returncode == 0, c.stderr
        assert c.stdout == ",".join(map(str, python["ids"][0])) + "\n"
    out = json.loads(_c("c", "generate", folder, *args, "--json").stdout)
    assert out["ids"] == python["ids"][0] and out["prompt_ids"] == python["prompt_ids"][0]
    warm = _c("c", "generate", folder, *args, "--warmup", "2")  # the reported run after two untimed ones
    assert warm.stdout == ",".join(map(str, python["ids"][0])) + "\n"
    assert out["time_to_first_token_s"] > 0 and out["tokens_per_s"] > 0 and out["stop"] == python["stops"][0]


@pytest.mark.parametrize("runner", ["c", "c-asan"])
@pytest.mark.parametrize(("args", "message"), [
    (("--prompt-ids", "1,x,3"), "--prompt-ids: expected comma-separated integers, got 'x'"),
    (("--prompt-ids", "1,,3"), "--prompt-ids: expected comma-separated integers, got ''"),
    (("--prompt-ids", "1.5"), "expected comma-separated integers"),
    (("--prompt-ids", "99999999999999999999999"), "expected comma-separated integers"),
    (("--prompt-ids", "50257"), "token id 50257 is outside the vocabulary (0..50256)"),
    (("--prompt-ids", "-1"), "token id -1 is outside the vocabulary"),
    (("--prompt-ids", ",".join(["1"] * 49)), "49 tokens, longer than context_length 48"),
    # 1 <= prompt + new tokens <= context_length: the words of `mha generate`, serve and Node for a prompt with no room
    (("--prompt-ids", ",".join(["1"] * 48)), "prompt: 48 tokens fill context_length 48, leaving no room for a new"),
    (("--prompt-ids", ",".join(["1"] * 500)), "longer than context_length 48"),
    (("--prompt-ids", ",".join(["1"] * 40), "--max-new-tokens", "9"), "pass context_length 48 (at most 8 new)"),
    (("--prompt-ids", "1", "--max-new-tokens", "0"), "--max-new-tokens: expected an integer >= 1, got '0'"),
    (("--prompt-ids", "1", "--max-new-tokens", "many"), "--max-new-tokens: expected an integer >= 1"),
    (("--prompt-ids", "1", "--temperature", "-0.5"), "--temperature: expected 0 (greedy) or a number in 0.0001..10000"),
    (("--prompt-ids", "1", "--temperature", "hot"), "--temperature: expected 0 (greedy) or a number in"),
    (("--prompt-ids", "1", "--temperature", "1e-39"), "--temperature: expected 0 (greedy) or a number in"),
    (("--prompt-ids", "1", "--top-k", "0"), "--top-k: expected an integer >= 1"),
    (("--prompt-ids", "1", "--top-k", "50258"), "--top-k: expected an integer in 1..50257"),
    (("--prompt-ids", "1", "--seed", "-3"), "--seed: expected an integer >= 0"),
    (("--prompt-ids",), "--prompt-ids: expected a value after it"),
    ((), "expected the prompt as --prompt-ids 1,2,3"),
    (("--prompt-ids", "1", "--bogus"), "unexpected argument '--bogus'"),
    (("--prompt-ids", "1", "--prompt-ids", "2"), "--prompt-ids: given twice"),
    (("--prompt-ids", "1", "--warmup", "101"), "--warmup: expected an integer from 0 to 100, got '101'"),
])
def test_generate_refuses_bad_arguments(runner: str, book_gpt: tuple[object, Path], args: tuple[str, ...],
                                        message: str) -> None:
    _one_line_error(_c(runner, "generate", book_gpt[1], *args), message)


def test_generate_refuses_a_folder_that_is_not_a_gpt(tmp_path: Path, seed_dir: Path) -> None:
    _one_line_error(_c("c", "generate"), "expected a decoder folder")
    _one_line_error(_c("c", "generate", tmp_path, "--prompt-ids", "1"), "expected a manifest")
    _one_line_error(_c("c", "generate", seed_dir, "--prompt-ids", "1"), 'expected a decoder manifest (kind "decoder"')


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


def _edit_manifest(folder: Path, edit) -> None:  # type: ignore[no-untyped-def]
    manifest = json.loads((folder / "manifest.json").read_text())
    edit(manifest)
    (folder / "manifest.json").write_text(json.dumps(manifest))


def _assert_refused(folder: Path, message: str, check_message: str | None = None) -> None:
    """generate: one line, exit 1, nothing printed; check: every case FAILs with the reason (or one line)."""
    for runner in ("c", "c-asan"):
        _one_line_error(_c(runner, "generate", folder, "--prompt-ids", "1,2,3"), message)
        result = _c(runner, "check", folder)
        assert result.returncode == 1
        assert (check_message or message) in result.stdout + result.stderr
        assert "ok   gpt.inplace.onnx " not in result.stdout  # (the lossy forms are files of their own)


def test_tampered_model_is_refused_before_it_runs(book_copy: Path) -> None:
    _flip(book_copy / "gpt.inplace.onnx", (book_copy / "gpt.inplace.onnx").stat().st_size // 2)
    _assert_refused(book_copy, "gpt.inplace.onnx: sha256 ")
    _assert_refused(book_copy, "differs from the manifest's")


def test_truncated_or_missing_model_is_refused(book_copy: Path) -> None:
    model = book_copy / "gpt.inplace.onnx"
    model.write_bytes(model.read_bytes()[:1000])
    _assert_refused(book_copy, "file truncated or replaced")
    model.unlink()
    _assert_refused(book_copy, "listed in the manifest but missing")


def test_generate_stops_at_any_of_the_folders_eos_ids(book_gpt: tuple[object, Path], book_copy: Path) -> None:
    """A checkpoint may give several eos ids (the manifest's eos_ids): the C runner stops at any of them, as `mha
    generate` does (it read eos_id alone); a folder made before eos_ids stops at its one eos_id."""
    args = ("--prompt-ids", "15496,11,314,716", "--max-new-tokens", "12")
    free = _python_generate(book_gpt[1], *args, "--no-eos")["ids"][0]
    eos, other = free[3], next(i for i in range(50000, 50256) if i not in free)
    assert eos not in free[:3]
    _edit_manifest(book_copy, lambda m: m.update(eos_id=other, eos_ids=[other, eos]))
    for runner in ("c", "c-asan"):
        out = json.loads(_c(runner, "generate", book_copy, *args, "--json").stdout)
        assert (out["ids"], out["stop"]) == (free[:3], "eos"), runner
    _edit_manifest(book_copy, lambda m: (m.pop("eos_ids"), m.update(eos_id=eos)))  # an older folder
    out = json.loads(_c("c", "generate", book_copy, *args, "--json").stdout)
    assert (out["ids"], out["stop"]) == (free[:3], "eos")


@pytest.mark.parametrize(("edit", "message"), [
    (lambda m: m["files"]["gpt.inplace.onnx"].update(sha256="0" * 64), "differs from the manifest's 000000000000"),
    (lambda m: m["files"].pop("gpt.inplace.onnx"), "gpt.inplace.onnx: expected it listed in"),
    (lambda m: m["config"].update(n_layers=3), "the model does not belong to this folder"),
    # every size is contract.shapes', checked before a buffer; config is only compared (the line above)
    (lambda m: m["contract"]["shapes"].update(vocab_size=0), "shapes: expected 'vocab_size' an integer from 1"),
    (lambda m: m["contract"]["shapes"].update(kv_heads=3), "shapes: n_heads 4 is not a multiple of kv_heads 3"),
    (lambda m: m["contract"]["shapes"].update(kv_heads=2), "'past_key_values.0.key': expected axis 1 of size 2 (the "
                                                           "manifest's contract.shapes), got 4"),
    (lambda m: m["contract"]["shapes"].update(head_dim=1 << 16, context_length=1 << 20),
     "a cache of [1, 4, 1048576, 65536] floats per layer is over the runner's bound"),
    (lambda m: m["artifacts"].pop("gpt.inplace.onnx"), "expected gpt.inplace.onnx among the manifest's artifacts"),
    (lambda m: m.update(eos_id=60000), "expected 'eos_id' an integer from 0 to 50256"),
    (lambda m: m.update(eos_ids=[50256, 60000]), "expected 'eos_ids' a list of at most 64 token ids from 0 to 50256"),
    (lambda m: m.update(eos_ids=[7]), "'eos_id' is not the first of 'eos_ids'"),  # one definition, not two
])
def test_altered_manifest_is_refused(book_copy: Path, edit, message: str) -> None:  # type: ignore[no-untyped-def]
    _edit_manifest(book_copy, edit)
    _assert_refused(book_copy, message)


def test_manifest_of_another_kind_is_refused(book_copy: Path) -> None:
    """generate wants a decoder manifest; check reads an attention folder's golden cases, which this folder lacks."""
    _edit_manifest(book_copy, lambda m: m.update(kind="attention"))
    _assert_refused(book_copy, 'expected a decoder manifest (kind "decoder", format 1)', "expected golden fixtures")


def test_a_folder_exported_before_contract_shapes_still_runs(book_gpt: tuple[object, Path], book_copy: Path) -> None:
    """Kind "gpt" and no contract.shapes (a folder exported before them): the shapes come from its GPT-2 config, in
    the one legacy reader, and the ids are the same."""
    args = ("--prompt-ids", "15496,11,314", "--max-new-tokens", "6", "--no-eos")
    want = _c("c", "generate", book_gpt[1], *args).stdout
    assert json.loads((book_gpt[1] / "manifest.json").read_text())["kind"] == "decoder"
    _edit_manifest(book_copy, lambda m: (m.update(kind="gpt"), m["contract"].pop("shapes")))
    for runner in ("c", "c-asan"):
        assert _c(runner, "generate", book_copy, *args).stdout == want
    assert _c("c-asan", "check", book_copy).returncode == 0


def test_manifest_that_is_not_json_is_refused(book_copy: Path) -> None:
    (book_copy / "manifest.json").write_text('{"kind": "gpt", ')
    for runner in ("c", "c-asan"):
        _one_line_error(_c(runner, "generate", book_copy, "--prompt-ids", "1"), "expected JSON, got a parse error")
    (book_copy / "manifest.json").unlink()
    _one_line_error(_c("c", "generate", book_copy, "--prompt-ids", "1"), "expected a manifest")


def test_altered_golden_files_fail_the_check(book_copy: Path, tmp_path: Path) -> None:
    cases = _golden(book_copy)
    total = sum(len(c) for _, c in _forms(book_copy))
    _flip(book_copy / "golden" / cases[0]["first_logits_bin"], 10)
    result = _c("c-asan", "check", book_copy, "--json", tmp_path / "r.json")
    assert result.returncode == 1
    lines = result.stdout.strip().splitlines()
    assert lines[0].split()[:3] == ["FAIL", "gpt.inplace.onnx", cases[0]["name"]]
    assert "differs from the manifest's" in lines[0]
    assert lines[-1] == f"{total - 1} passed, 1 failed"
    assert json.loads((tmp_path / "r.json").read_text())["failed"] == 1
    _flip(book_copy / "golden" / "generations.json", 5)
    result = _c("c-asan", "check", book_copy, "--json", tmp_path / "r.json")
    assert result.returncode == 1 and result.stdout == ""
    assert "golden/generations.json: sha256" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert "golden/generations.json: sha256" in json.loads((tmp_path / "r.json").read_text())["error"]


def test_golden_case_that_breaks_the_contract_fails_alone(book_copy: Path) -> None:
    """A case with ids outside the vocabulary or a prompt past the context is one FAIL line; the rest still run."""
    doc = json.loads((book_copy / "golden" / "generations.json").read_text())
    doc["cases"][0]["prompt_ids"] = [50257]
    doc["cases"][1]["prompt_ids"] = [1] * 48
    text = json.dumps(doc).encode()
    (book_copy / "golden" / "generations.json").write_bytes(text)
    _edit_manifest(book_copy, lambda m: m["files"]["golden/generations.json"].update(
        sha256=hashlib.sha256(text).hexdigest(), size=len(text)))
    result = _c("c-asan", "check", book_copy)
    lines = result.stdout.strip().splitlines()
    assert "expected token ids in 0..50256" in lines[0] and "pass context_length 48" in lines[1]
    total = sum(len(c) for _, c in _forms(book_copy))
    assert lines[-1] == f"{total - 2} passed, 2 failed" and result.returncode == 1


def test_a_lossy_forms_own_golden_id_changed_fails_that_case_only(book_copy: Path) -> None:
    """The lossy forms are checked against their own generations: one of int4's ids edited (the manifest
    re-sealed, so only the comparison can catch it) fails that one case of that form."""
    file = json.loads((book_copy / "manifest.json").read_text())["artifacts"]["gpt.inplace.int4.onnx"]["generations"]
    doc = json.loads((book_copy / file).read_text())
    doc["cases"][0]["ids"][-1] = (doc["cases"][0]["ids"][-1] + 1) % 50257
    text = json.dumps(doc).encode()
    (book_copy / file).write_bytes(text)
    _edit_manifest(book_copy, lambda m: m["files"][file].update(sha256=hashlib.sha256(text).hexdigest(),
                                                                size=len(text)))
    result = _c("c", "check", book_copy)
    failed = [line for line in result.stdout.splitlines() if line.startswith("FAIL")]
    assert len(failed) == 1 and failed[0].split()[1:3] == ["gpt.inplace.int4.onnx", doc["cases"][0]["name"]]
    assert "ids differ from token" in failed[0] and result.returncode == 1


def test_attention_check_is_unchanged(seed_dir: Path) -> None:
    result = _c("c-asan", "check", seed_dir)
    assert result.returncode == 0 and result.stdout.strip().splitlines()[-1].endswith(" passed, 0 failed")


def test_example_builds_and_generates_the_same_ids(book_gpt: tuple[object, Path], tmp_path: Path) -> None:
    include = C_BUILD / "apt" / "root" / "usr" / "include" / "onnxruntime"
    assert (include / "onnxruntime_c_api.h").exists() and EXAMPLE.exists(), "build first (make native-build)"
    built = tmp_path / "gpt_example"
    subprocess.run(["gcc", "-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", f"-I{include}",
                    str(C_DIR / "gpt_example.c"), "-o", str(built), f"-L{C_BUILD / 'lib'}", "-lonnxruntime",
                    f"-Wl,-rpath,{C_BUILD / 'lib'}"], check=True, capture_output=True, timeout=300)
    folder = book_gpt[1]
    for binary in (built, EXAMPLE):
        out = subprocess.run([str(binary), str(folder / "gpt.inplace.onnx"), "12", "15496", "11", "314"],
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        want = _c("c", "generate", folder, "--prompt-ids", "15496,11,314", "--max-new-tokens", "12", "--no-eos")
        assert out.stdout == want.stdout
    for args, said in ((["-5", "1"], "N_NEW: expected an integer from 1 to"), (["3", "abc"], "ID: expected an integer"),
                       (["3", "-1"], "ID: expected an integer from 0 to")):  # atoi: a segfault, 0, a wrapped id
        bad = subprocess.run([str(built), str(folder / "gpt.inplace.onnx"), *args], capture_output=True, text=True,
                             timeout=300)
        assert bad.returncode == 1 and bad.stderr.startswith(f"error: {said}") and bad.stdout == "", bad.stderr
