"""The GPT in JavaScript: Node.js (onnxruntime-node, runtime/native/node), onnxruntime-web's wasm backend in Node.js
(runtime/native/web/check.mjs) and the browser page (runtime/native/web/gpt.html in Debian's chromium, driven by
playwright-core), all through runtime/native/common/gpt.mjs.

Needs `make native-build` and `make web-build` (npm ci in runtime/native/node and runtime/native/web) and
/usr/bin/chromium. Every runner passes every golden generation of the book GPT (the `book_gpt` fixture); numpy's
SeedSequence + PCG64 in BigInt gives numpy's doubles bit for bit, so seeded sampling gives Python's ids; the
tokenizer (@huggingface/tokenizers) gives Python's ids; a tampered decoder or tokenizer.json is refused before
anything runs; the page streams the text that Python's ids decode to.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from test_web import OUT, _drive, _served, _site

from helpers import reseal
from mha_runtime.decoder.generate import Generator
from portability import parse_json

REPO = Path(__file__).resolve().parents[2]
NATIVE = REPO / "runtime" / "native"
NODE = ["node", str(NATIVE / "node" / "cli.js")]
WASM = ["node", str(NATIVE / "web" / "check.mjs")]
RUNNERS = {"node": NODE, "wasm": WASM}
FORMS = ("gpt.onnx", "gpt.inplace.onnx")
HARD_TEXTS = ["Every effort moves you", "héllo wörld — 日本語 😀🎉 naïve café",
              "  two  spaces\tand\ttabs\n\nnew\r\nlines   ", "<|endoftext|>", "a<|endoftext|>b <|endoftext|> c",
              "don't they'll we've I'M 1234567 3.14159", "\u00a0nbsp\u2028sep\u200bzw ﬁ Ω", "🤖" * 5, "\n", " ",
              "a . b , c 's d n't e ! f ? g ' h 've 're 'm"]  # spaces transformers' clean-up would take out
SEEDED = [(1.0, None, 7), (0.8, 40, 123), (1.5, 5, 2**63 - 1), (0.3, None, 0)]
PROMPT = [6109, 3626, 6100, 345]


def _built() -> None:
    for folder in ("node", "web"):
        tok = NATIVE / folder / "node_modules" / "@huggingface" / "tokenizers"
        assert tok.is_dir(), f"{tok} is missing: run `make native-build` and `make web-build` (npm ci)"


def _run(command: list[str], *args: object, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    _built()
    return subprocess.run([*command, *map(str, args)], capture_output=True, text=True, timeout=timeout, cwd=REPO)


def _ids(result: subprocess.CompletedProcess[str]) -> list[int]:
    assert result.returncode == 0, result.stdout + result.stderr
    line = result.stdout.strip()
    assert "\n" not in line, result.stdout
    return [int(v) for v in line.split(",")]


def _one_line_error(result: subprocess.CompletedProcess[str], text: str) -> None:
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and text in lines[0], result.stderr
    assert result.stdout == ""  # nothing ran, nothing printed


def _alter(folder: Path, name: str, tmp_path: Path) -> Path:
    """A folder of links to `folder`'s files, but `name` is a copy with one byte changed (same size)."""
    out = tmp_path / "tampered"
    for path in folder.rglob("*"):
        if path.is_file():
            dest = out / path.relative_to(folder)
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.symlink_to(path)
    target = out / name
    data = bytearray(target.read_bytes())
    target.unlink()
    data[len(data) // 2] ^= 0x01
    target.write_bytes(bytes(data))
    return out


def _python(folder: Path, prompt: list[int], *, max_new_tokens: int, temperature: float = 0.0, top_k: int | None = None,
            seed: int | None = None, eos: bool = False) -> list[int]:
    gen = Generator(folder, form="gpt.onnx")
    eos_id = gen.manifest.eos_id if eos else None
    return gen.generate([prompt], max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, seed=seed,
                        eos_id=eos_id).ids[0]


# --- numpy's random generator, in BigInt ------------------------------------------------------------------------

RNG_SCRIPT = """
import { PCG64, generateState64 } from './runtime/native/common/gpt.mjs';
const out = {};
for (const s of JSON.parse(process.argv[1])) {
  const g = new PCG64(BigInt(s));
  const state = generateState64(BigInt(s), 4).map(String);
  out[s] = { state, doubles: Array.from({ length: 2000 }, () => g.random()) };
}
console.log(JSON.stringify(out));
"""


def test_pcg64_equals_numpy_bit_for_bit() -> None:
    seeds = [0, 1, 2, 7, 123, 2**32 - 1, 2**32 + 5, 2**63 - 1, 2**64 + 1, 2**130 + 3]
    result = subprocess.run(["node", "--input-type=module", "-e", RNG_SCRIPT, json.dumps([str(s) for s in seeds])],
                            capture_output=True, text=True, timeout=120, cwd=REPO, check=True)
    got = json.loads(result.stdout)
    for seed in seeds:
        state = np.random.SeedSequence(seed).generate_state(4, np.uint64)
        assert [int(v) for v in got[str(seed)]["state"]] == [int(v) for v in state], seed
        want = np.random.Generator(np.random.PCG64(seed)).random(2000)
        doubles = np.array(got[str(seed)]["doubles"], dtype=np.float64)
        assert doubles.tobytes() == want.tobytes(), seed  # JSON's shortest repr round-trips every double exactly


# --- Node.js and wasm in Node.js ------------------------------------------------------------------------------


# The forms each runner's check runs: Node also the lossy forms (each against its own golden generations); wasm
# the fp32 forms (onnxruntime-web's MatMulNBits kernels are not the ones the lossy generations were recorded with).
CHECKED = {"node": [*FORMS, "gpt.inplace.int8.onnx", "gpt.inplace.int4.onnx"], "wasm": list(FORMS)}


def _cases(folder: Path) -> int:
    return len(json.loads((folder / "golden" / "generations.json").read_text())["cases"])


@pytest.mark.parametrize("runner", list(RUNNERS))
def test_every_golden_generation_passes(runner: str, book_gpt: tuple[torch.nn.Module, Path], tmp_path: Path) -> None:
    folder = book_gpt[1]
    out = tmp_path / f"{runner}.json"
    result = _run(RUNNERS[runner], "check", folder, "--json", out) if runner == "node" else \
        _run(WASM, folder, "--json", out)
    assert result.returncode == 0, result.stdout + result.stderr
    forms = CHECKED[runner]
    expected = _cases(folder) * len(forms)
    assert result.stdout.strip().splitlines()[-1] == f"{expected} passed, 0 failed"
    doc = json.loads(out.read_text())
    assert (doc["runtime"], doc["passed"], doc["failed"]) == (runner, expected, 0)
    assert [a["file"] for a in doc["artifacts"]] == forms
    assert all(c["ok"] and c["error"] is None and c["max_abs"] < 1e-3 for a in doc["artifacts"] for c in a["cases"])
    results = parse_json(out)  # the portability table (docs/portability.md) reads it
    assert {f: (o.cases, o.passed) for f, o in results.by_file.items()} == {f: (_cases(folder),) * 2 for f in forms}


@pytest.mark.parametrize("form", FORMS)
def test_node_greedy_ids_equal_python(form: str, book_gpt: tuple[torch.nn.Module, Path]) -> None:
    folder = book_gpt[1]
    ids = _ids(_run(NODE, "generate", folder, "--prompt-ids", ",".join(map(str, PROMPT)), "--max-new-tokens", 30,
                    "--no-eos", "--form", form))
    assert ids == _python(folder, PROMPT, max_new_tokens=30)


@pytest.mark.parametrize("temperature,top_k,seed", SEEDED)
def test_seeded_sampling_equals_python(temperature: float, top_k: int | None, seed: int,
                                       book_gpt: tuple[torch.nn.Module, Path]) -> None:
    folder = book_gpt[1]
    args = ["--prompt-ids", ",".join(map(str, PROMPT)), "--max-new-tokens", 40, "--no-eos",
            "--temperature", temperature, "--seed", seed] + (["--top-k", top_k] if top_k else [])
    want = _python(folder, PROMPT, max_new_tokens=40, temperature=temperature, top_k=top_k, seed=seed)
    assert _ids(_run(NODE, "generate", folder, *args)) == want
    assert _ids(_run(NODE, "generate", folder, *args, "--warmup", 2)) == want  # the run after two untimed ones
    if seed == 123:  # wasm too, on both forms
        for form in FORMS:
            assert _ids(_run(WASM, "generate", folder, *args, "--form", form)) == want


def test_generate_json_and_eos(book_gpt: tuple[torch.nn.Module, Path]) -> None:
    folder = book_gpt[1]
    for command in (NODE, WASM):
        result = _run(command, "generate", folder, "--prompt-ids", "1,2,3", "--max-new-tokens", 8, "--json")
        assert result.returncode == 0, result.stderr
        doc = json.loads(result.stdout)
        assert doc["ids"] == _python(folder, [1, 2, 3], max_new_tokens=8, eos=True)
        assert doc["time_to_first_token_s"] > 0 and doc["tokens_per_s"] >= 0
        assert doc["stop"] in ("max_new_tokens", "eos")


def test_generate_stops_at_any_of_the_folders_eos_ids(book_gpt: tuple[torch.nn.Module, Path], tmp_path: Path) -> None:
    """A checkpoint may give several eos ids (the manifest's eos_ids): Node and wasm stop at any of them, as `mha
    generate` does (they read eos_id alone)."""
    folder = book_gpt[1]
    free = _python(folder, [1, 2, 3], max_new_tokens=12)
    eos, other = free[3], next(i for i in range(50000, 50256) if i not in free)
    assert eos not in free[:3]
    copy = tmp_path / "eos"
    for path in folder.rglob("*"):
        if path.is_file() and path.name != "manifest.json":
            (copy / path.relative_to(folder)).parent.mkdir(parents=True, exist_ok=True)
            (copy / path.relative_to(folder)).symlink_to(path)
    doc = json.loads((folder / "manifest.json").read_text())
    (copy / "manifest.json").write_text(json.dumps(doc | {"eos_id": other, "eos_ids": [other, eos]}))
    for command in (NODE, WASM):
        result = _run(command, "generate", copy, "--prompt-ids", "1,2,3", "--max-new-tokens", 12, "--json")
        assert result.returncode == 0, result.stderr
        out = json.loads(result.stdout)
        assert (out["ids"], out["stop"]) == (free[:3], "eos"), command


TOKENIZE_SCRIPT = """
const { openGpt, gpt } = require('./runtime/native/node/gpt.js');
openGpt(process.argv[1]).then(({ tokenizer }) => {
  const texts = JSON.parse(process.argv[2]);
  const streamed = (ids) => { const s = new gpt.TextStream(tokenizer); return ids.map((i) => s.push(i)).join(''); };
  const out = texts.map((t) => ({ ids: tokenizer.encode(t), text: tokenizer.decode(tokenizer.encode(t)),
    streamed: streamed(tokenizer.encode(t)) }));
  console.log(JSON.stringify(out));
});
"""


def test_tokenizer_ids_equal_python(book_gpt: tuple[torch.nn.Module, Path]) -> None:
    folder = book_gpt[1]
    gen = Generator(folder)
    result = subprocess.run(["node", "-e", TOKENIZE_SCRIPT, str(folder), json.dumps(HARD_TEXTS)], capture_output=True,
                            text=True, timeout=120, cwd=REPO, check=True)
    for text, got in zip(HARD_TEXTS, json.loads(result.stdout), strict=True):
        assert got["ids"] == gen.encode(text), text
        assert got["text"] == gen.tokenizer.decode(gen.encode(text)) == text
        assert got["streamed"] == text  # --text's pieces, token by token
    golden = json.loads((folder / "golden" / "generations.json").read_text())
    case = next(c for c in golden["cases"] if "prompt_text" in c)
    for command in (NODE, WASM):  # --prompt TEXT goes through the tokenizer: the golden text case's ids
        ids = _ids(_run(command, "generate", folder, "--prompt", case["prompt_text"], "--max-new-tokens",
                        case["max_new_tokens"], "--no-eos"))
        assert ids == case["ids"]


@pytest.mark.parametrize("name", ["gpt.onnx", "gpt.inplace.onnx", "tokenizer.json"])
def test_a_tampered_file_is_refused_before_running(name: str, book_gpt: tuple[torch.nn.Module, Path],
                                                   tmp_path: Path) -> None:
    folder = _alter(book_gpt[1], name, tmp_path)
    for runner, command in RUNNERS.items():
        for form in FORMS if name == "tokenizer.json" else (name,):
            result = _run(command, "generate", folder, "--prompt-ids", "1,2,3", "--max-new-tokens", 4, "--form", form)
            _one_line_error(result, f"{name}: sha256 ")
            assert "differs from the manifest's" in result.stderr
        check = _run(command, "check", folder) if runner == "node" else _run(command, folder)
        assert check.returncode == 1
        if name == "tokenizer.json":  # the whole check stops before any case
            _one_line_error(check, "tokenizer.json: sha256 ")
        else:  # that form's cases fail on the sha256, the other form passes
            lines = [line for line in check.stdout.splitlines() if f" {name} " in line]
            assert len(lines) == _cases(folder), check.stdout
            assert all(line.startswith("FAIL") and "differs from the manifest's" in line for line in lines)
            passed = _cases(folder) * (len(CHECKED[runner]) - 1)
            assert check.stdout.strip().splitlines()[-1] == f"{passed} passed, {_cases(folder)} failed"


def test_a_listed_file_of_another_size_is_refused_unread(book_gpt: tuple[torch.nn.Module, Path],
                                                        tmp_path: Path) -> None:
    """A decoder replaced by a 3 GiB sparse file: refused by its size, from stat. Reading it first (as the JS
    runners did) failed on Node's 2 GiB read limit with a line that did not say what was wrong."""
    folder = _alter(book_gpt[1], "gpt.onnx", tmp_path)
    (folder / "gpt.onnx").unlink()
    with open(folder / "gpt.onnx", "wb") as f:
        f.truncate(3 * 2**30)
    for command in RUNNERS.values():
        result = _run(command, "generate", folder, "--prompt-ids", "1", "--max-new-tokens", 1, "--form", "gpt.onnx")
        _one_line_error(result, f"gpt.onnx: expected {_listed_size(book_gpt[1], 'gpt.onnx')} bytes (manifest), "
                                f"found {3 * 2**30}; file truncated or replaced")


@pytest.mark.parametrize(("field", "value", "says"), [
    # the JS sampler takes the command line's decimal strings, and the case passed as seed 123
    ("seed", "123", "expected 'seed' an integer or null, got \"123\""),
    # printed escaped, but passed where `mha check` and the C runner refuse it
    ("name", "a\n\x1b[31mred", 'name: expected printable text, got "a\\n\\u001b[31mred"'),
    ("name", "", 'name: expected printable text, got ""'),
])
@pytest.mark.parametrize("runner", list(RUNNERS))
def test_a_resealed_golden_case_python_refuses_is_one_line(runner: str, field: str, value: str, says: str,
                                                           book_gpt: tuple[torch.nn.Module, Path],
                                                           tmp_path: Path) -> None:
    """golden/generations.json edited and resealed: one line before any case runs, as the Python and C checks."""
    folder = _alter(book_gpt[1], "golden/generations.json", tmp_path)  # links, but generations.json a copy
    doc = json.loads(book_gpt[1].joinpath("golden", "generations.json").read_text())
    at = next(i for i, c in enumerate(doc["cases"]) if c["seed"] is not None)
    doc["cases"][at][field] = value
    (folder / "golden" / "generations.json").write_text(json.dumps(doc))
    (folder / "manifest.json").unlink()  # a copy of its own, resealed (the link's target is the session's folder)
    (folder / "manifest.json").write_text(book_gpt[1].joinpath("manifest.json").read_text())
    reseal(folder, "golden/generations.json")
    result = _run(RUNNERS[runner], "check", folder) if runner == "node" else _run(WASM, folder)
    _one_line_error(result, f"golden/generations.json: cases[{at}]: {says}")


@pytest.mark.parametrize(("setting", "says"), [
    ({"truncation": {"direction": "Right", "max_length": 2, "strategy": "LongestFirst", "stride": 0}},
     "it truncates what it encodes (max_length 2); expected no truncation"),
    ({"padding": {"strategy": {"Fixed": 8}, "direction": "Right", "pad_to_multiple_of": None, "pad_id": 0,
                  "pad_type_id": 0, "pad_token": "!"}}, "it pads what it encodes (padding to length 8); expected no"),
    ({"model": {"dropout": 0.5}}, "its BPE drops merges at random (dropout 0.5); expected no dropout"),
])
@pytest.mark.parametrize("runner", ["python", *RUNNERS])
def test_a_resealed_tokenizer_that_pads_cuts_or_drops_is_one_line(runner: str, setting: dict[str, dict[str, object]],
                                                                  says: str, book_gpt: tuple[torch.nn.Module, Path],
                                                                  tmp_path: Path) -> None:
    """tokenizer.json edited after the export (which refuses padding and truncation) and resealed: Python padded
    the prompt with pad ids, cut it to 2 ids or encoded it at random, while Node and wasm, whose tokenizer ignores
    all three, encoded the text. Every runner refuses it in the same words."""
    folder = _alter(book_gpt[1], "tokenizer.json", tmp_path)
    doc = json.loads(book_gpt[1].joinpath("tokenizer.json").read_text())
    for key, value in setting.items():
        doc[key] = {**doc[key], **value} if key == "model" else value
    (folder / "tokenizer.json").write_text(json.dumps(doc))
    (folder / "manifest.json").unlink()  # a copy of its own, resealed
    (folder / "manifest.json").write_text(book_gpt[1].joinpath("manifest.json").read_text())
    reseal(folder, "tokenizer.json")
    args = ["generate", folder, "--prompt", "Every effort moves you", "--max-new-tokens", 2]
    if runner == "python":
        result = subprocess.run([sys.executable, "-m", "mha_runtime", *map(str, args)], capture_output=True, text=True,
                                timeout=120, cwd=REPO)
        assert result.returncode == 1 and result.stdout == "", result.stderr
        assert result.stderr == f"Error: {folder / 'tokenizer.json'}: {says}" + result.stderr.split(says)[1]
        assert len(result.stderr.splitlines()) == 1
    else:
        _one_line_error(_run(RUNNERS[runner], *args), f"{folder}/tokenizer.json: {says}")


def test_a_resealed_tokenizer_that_makes_tokenizers_panic_is_no_traceback(book_gpt: tuple[torch.nn.Module, Path],
                                                                          tmp_path: Path) -> None:
    """A continuing_subword_prefix longer than a merge's part makes `tokenizers` panic in Rust while loading: a
    PanicException (a BaseException) that was a Python traceback after Rust's own panic lines. The merges are
    checked before `tokenizers` reads them, as `mha export --gpt --tokenizer` checks them: one line, exit 1."""
    folder = _alter(book_gpt[1], "tokenizer.json", tmp_path)
    doc = json.loads(book_gpt[1].joinpath("tokenizer.json").read_text())
    doc["model"]["continuing_subword_prefix"] = "##"
    (folder / "tokenizer.json").write_text(json.dumps(doc))
    (folder / "manifest.json").unlink()
    (folder / "manifest.json").write_text(book_gpt[1].joinpath("manifest.json").read_text())
    reseal(folder, "tokenizer.json")
    result = subprocess.run([sys.executable, "-m", "mha_runtime", "generate", str(folder), "--prompt", "hi"],
                            capture_output=True, text=True, timeout=120, cwd=REPO)
    assert result.returncode == 1 and result.stdout == "" and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"Error: {folder / 'tokenizer.json'}: merge 1 "), result.stderr
    assert "which is not in the vocabulary; expected every merged token in it" in result.stderr, result.stderr


@pytest.mark.parametrize("runner", ["python", *RUNNERS])
def test_golden_generations_without_a_case_are_one_line(runner: str, book_gpt: tuple[torch.nn.Module, Path],
                                                       tmp_path: Path) -> None:
    """golden/generations.json resealed with "cases": []: one line, as the C runner says it ("0 passed, 0 failed"
    was the whole answer of `mha check`, Node and wasm)."""
    folder = _alter(book_gpt[1], "golden/generations.json", tmp_path)
    doc = json.loads(book_gpt[1].joinpath("golden", "generations.json").read_text())
    (folder / "golden" / "generations.json").write_text(json.dumps({**doc, "cases": []}))
    (folder / "manifest.json").unlink()
    (folder / "manifest.json").write_text(book_gpt[1].joinpath("manifest.json").read_text())
    reseal(folder, "golden/generations.json")
    if runner == "python":
        result = _run([sys.executable, "-m", "mha_runtime", "check"], folder)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 1 and len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
        assert lines[0].endswith("golden/generations.json: expected at least one case"), lines[0]
        return
    result = _run(RUNNERS[runner], "check", folder) if runner == "node" else _run(WASM, folder)
    _one_line_error(result, "golden/generations.json: expected at least one case")


def test_a_lossy_forms_generations_outside_the_folder_is_named(book_gpt: tuple[torch.nn.Module, Path],
                                                               tmp_path: Path) -> None:
    """manifest.json's artifacts.gpt.inplace.int8.onnx.generations edited to '../../etc/passwd': Node's check says
    so, as `mha check` does (it said "<folder>/../../etc/passwd: the manifest lists no golden generations")."""
    folder = _alter(book_gpt[1], "manifest.json", tmp_path)  # links, but manifest.json a copy of its own
    doc = json.loads(book_gpt[1].joinpath("manifest.json").read_text())
    doc["artifacts"]["gpt.inplace.int8.onnx"]["generations"] = "../../etc/passwd"
    (folder / "manifest.json").write_text(json.dumps(doc))
    said = 'generations: expected a file name inside the artifact folder, got "../../etc/passwd"'
    _one_line_error(_run(NODE, "check", folder), f"manifest.json: artifacts.gpt.inplace.int8.onnx: {said}")


def _listed_size(folder: Path, name: str) -> int:
    return int(json.loads((folder / "manifest.json").read_text())["files"][name]["size"])


@pytest.mark.parametrize("args,code,message", [
    (["generate", "{dir}"], 1, "give the prompt as --prompt TEXT or as --prompt-ids 1,2,3"),
    (["generate", "{dir}", "--prompt-ids", "1,x"], 1, "--prompt-ids: expected comma-separated integers, got 'x'"),
    (["generate", "{dir}", "--prompt-ids", "1,99999999"], 1, "token id 99999999 is outside the vocabulary"),
    # 1 <= prompt + new tokens <= context_length: a prompt of context_length ids got a 49th position in 48
    (["generate", "{dir}", "--prompt-ids", ",".join(["1"] * 48)], 1,
     "prompt: 48 tokens fill context_length 48, leaving no room for a new token; give at most 47"),
    (["generate", "{dir}", "--prompt-ids", "1", "--temperature", "-1"], 1, "temperature: expected 0 (greedy) or a"),
    (["generate", "{dir}", "--prompt-ids", "1", "--temperature", "1e-39"], 1, "temperature: expected 0 (greedy) or a"),
    (["generate", "{dir}", "--prompt-ids", "1", "--top-k", "0"], 1, "top_k: expected an integer in 1..50257"),
    (["generate", "{dir}", "--prompt-ids", "1", "--seed", "-3"], 1, "seed: expected an integer >= 0"),
    (["generate", "{dir}", "--prompt-ids", "1", "--max-new-tokens", "0"], 1, "max_new_tokens: expected an integer"),
    (["generate", "{dir}/nowhere", "--prompt-ids", "1"], 1, "expected a folder made by `mha export"),
    (["generate", "{dir}", "--prompt-ids", "1", "--form", "gpt.x.onnx"], 1, "no decoder gpt.x.onnx listed"),
    # an empty --form ran the default form; `mha generate --form ''` refuses it too (exit 2: a bad value)
    (["generate", "{dir}", "--prompt-ids", "1", "--form", ""], 1, "no decoder  listed in the manifest; it holds "),
    (["generate", "{dir}", "--prompt-ids", "1", "--warmup", "-1"], 1, "--warmup: expected an integer from 0 to 100"),
    # onnxruntime-node started 100,000 threads and never returned; `mha generate` and the C runner stop at 1024
    (["generate", "{dir}", "--prompt-ids", "1", "--threads", "100000"], 1,
     "--threads: expected an integer from 1 to 1024, got 100000"),
    # the streamed text and then the JSON object on one stdout, which was then neither
    (["generate", "{dir}", "--prompt", "hi", "--json", "--text"], 1, "--json and --text: expected one of the two"),
    # `mha generate` makes a batch of a repeated prompt; the last one ran alone, the others dropped without a word
    (["generate", "{dir}", "--prompt", "a", "--prompt", "b"], 1, "--prompt: given twice (this runner runs one prompt)"),
    (["generate", "{dir}", "--prompt-ids", "1", "--prompt-ids", "2"], 1, "--prompt-ids: given twice (this runner"),
    # bytes that are not UTF-8 (passed as Python's surrogateescape gives them): Node made them U+FFFD and generated
    # from that text, where `mha generate` refuses them; a real U+FFFD before them is text
    (["generate", "{dir}", "--prompt", "ab\udcffcd"], 1,
     "prompt: expected text (valid Unicode), got the byte 0xff, not UTF-8, at byte 2"),
    (["generate", "{dir}", "--prompt", "ok\ufffdx\udcef\udcbf", "--json"], 1,
     "got the byte 0xef, not UTF-8, at byte 6"),
])
@pytest.mark.parametrize("runner", list(RUNNERS))
def test_refusals_are_one_line(runner: str, args: list[str], code: int, message: str,
                               book_gpt: tuple[torch.nn.Module, Path]) -> None:
    result = _run(RUNNERS[runner], *(a.format(dir=book_gpt[1]) for a in args))
    assert result.returncode == code
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr


@pytest.mark.parametrize("text", [True, False])
@pytest.mark.parametrize("runner", list(RUNNERS))
def test_a_closed_or_full_stdout_exits_1(runner: str, text: bool, book_gpt: tuple[torch.nn.Module, Path]) -> None:
    """A pipe whose reader has gone: exit 1 quietly, as `mha generate` (click's rule); Node's EPIPE was a stack
    trace, the wasm runner's went unseen (exit 0). /dev/full: one error line, exit 1 (the ids exited 0)."""
    import os

    _built()
    args = [*RUNNERS[runner], "generate", str(book_gpt[1]), "--prompt", "Every effort", "--max-new-tokens", "8",
            *(["--text"] if text else [])]
    read, write = os.pipe()
    os.close(read)  # closed before the runner starts: its first write fails, whatever the timing
    try:
        closed = subprocess.run(args, stdout=write, stderr=subprocess.PIPE, text=True, timeout=120, cwd=REPO)
    finally:
        os.close(write)
    # quiet: at most the summary line, which the ids (written whole at the end) come before
    assert closed.returncode == 1 and len(closed.stderr.splitlines()) <= 1, closed.stderr
    assert "error" not in closed.stderr.lower() and (not text or closed.stderr == ""), closed.stderr
    with open("/dev/full", "w") as full:
        result = subprocess.run(args, stdout=full, stderr=subprocess.PIPE, text=True, timeout=120, cwd=REPO)
    assert result.returncode == 1, result.stderr
    assert result.stderr.splitlines()[-1] == "error: stdout: cannot write (ENOSPC)", result.stderr
    assert "at " not in result.stderr  # no stack trace


# --- the browser page -----------------------------------------------------------------------------------------


def _page(folder: Path, tmp_path: Path, query: str, shot: Path) -> tuple[int, dict, str]:
    with _served(_site(tmp_path, {"gpt": folder}), tmp_path / "http.log") as base:
        return _drive(f"{base}/runtime/native/web/gpt.html?artifact=artifacts/gpt&{query}", shot,
                      tmp_path / "result.json", timeout=400)


def test_browser_page_passes_every_golden_generation(book_gpt: tuple[torch.nn.Module, Path], tmp_path: Path) -> None:
    code, doc, err = _page(book_gpt[1], tmp_path, "check=1", tmp_path / "check.png")
    assert code == 0, err + json.dumps(doc.get("log"))
    expected = _cases(book_gpt[1]) * len(FORMS)
    assert (doc["runtime"], doc["passed"], doc["failed"], doc["not_loadable"]) == ("browser", expected, 0, [])
    assert all(c["ok"] for a in doc["artifacts"] for c in a["cases"]) and doc["log"] == []


def test_browser_page_streams_the_text_of_pythons_ids(book_gpt: tuple[torch.nn.Module, Path], tmp_path: Path) -> None:
    folder = book_gpt[1]
    OUT.mkdir(parents=True, exist_ok=True)
    shot = OUT / "gpt-page.png"
    shot.unlink(missing_ok=True)
    prompt, n = "Every effort moves you", 24
    code, doc, err = _page(folder, tmp_path, f"prompt={prompt.replace(' ', '%20')}&max_new_tokens={n}&autorun=1", shot)
    assert code == 0 and "error" not in doc, err + json.dumps(doc.get("log"))
    gen = Generator(folder)
    want = _python(folder, gen.encode(prompt), max_new_tokens=n, eos=True)
    assert doc["prompt_ids"] == gen.encode(prompt) and doc["ids"] == want
    assert doc["text"] == gen.tokenizer.decode(want)  # the visible text: the decode of Python's ids
    chars = [t["chars"] for t in doc["trace"]]
    assert len(chars) == len(want) and chars == sorted(chars) and chars[-1] == len(doc["text"])
    assert len(set(chars)) > len(chars) // 2  # it grew token by token, not once at the end
    assert doc["time_to_first_token_s"] > 0 and doc["tokens_per_s"] > 0 and doc["log"] == []
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("name,query", [("tokenizer.json", "autorun=1"), ("gpt.onnx", "autorun=1"),
                                        ("tokenizer.json", "check=1")])
def test_browser_page_refuses_a_tampered_file(name: str, query: str, book_gpt: tuple[torch.nn.Module, Path],
                                              tmp_path: Path) -> None:
    folder = _alter(book_gpt[1], name, tmp_path)
    code, doc, _ = _page(folder, tmp_path, query, tmp_path / "shot.png")
    assert code == 1
    assert f"{name}: sha256 " in doc["error"] and "differs from the manifest's" in doc["error"]
    assert "\n" not in doc["error"]
    assert "ids" not in doc and "passed" not in doc  # nothing ran


@pytest.mark.slow  # on the folders `make test` writes first (gpt-mini by native-test, gpt-demo by make demo)
@pytest.mark.parametrize("preset", ["gpt-mini", "gpt-demo"])
def test_browser_page_on_the_made_folders_writes_the_portability_result(preset: str, tmp_path: Path) -> None:
    """The page's golden check on artifacts/<preset>, saved as artifacts/web/<preset>.browser.json for the
    portability table (docs/portability.md); on the trained demo model, also the README's screenshot."""
    folder = REPO / "artifacts" / preset
    if not (folder / "golden" / "generations.json").is_file():
        pytest.skip(f"{folder}: not made yet ({'make demo' if preset == 'gpt-demo' else 'make export'})")
    OUT.mkdir(parents=True, exist_ok=True)
    result = OUT / f"{preset}.browser.json"
    result.unlink(missing_ok=True)
    with _served(_site(tmp_path, {preset: folder}), tmp_path / "http.log") as base:
        code, doc, err = _drive(f"{base}/runtime/native/web/gpt.html?artifact=artifacts/{preset}&check=1",
                                tmp_path / "check.png", result, timeout=400)
        assert code == 0, err + json.dumps(doc.get("log"))
        assert doc["failed"] == 0 and doc["passed"] == _cases(folder) * len(FORMS)
        assert parse_json(result).by_file.keys() == set(FORMS)
        if preset == "gpt-demo":
            shot = OUT / "gpt-demo.png"
            query = "prompt=The%20module&max_new_tokens=40&temperature=0.8&top_k=40&seed=3&autorun=1"
            code, doc, err = _drive(f"{base}/runtime/native/web/gpt.html?artifact=artifacts/{preset}&{query}", shot,
                                    tmp_path / "run.json", timeout=400)
            assert code == 0 and len(doc["ids"]) > 0, err
            assert doc["ids"] == _python(folder, doc["prompt_ids"], max_new_tokens=40, temperature=0.8, top_k=40,
                                         seed=3, eos=True)
