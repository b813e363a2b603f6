"""Every runtime sizes a decoder by the manifest's contract.shapes, never by its architecture's config keys: Python
(`mha generate`), C (`mha_check generate`), Node.js (onnxruntime-node) and wasm (onnxruntime-web in Node.js).

No folder with fewer key/value heads than query heads exists yet (the Llama-family issue brings the first), so the
book GPT's folder is edited instead: a manifest saying twice its query heads over its own key/value heads is a
grouped-query decoder each runtime must run unchanged, with the same ids (a runtime that sized its cache by n_heads
is refused by the file's own input shapes); kv_heads that do not divide n_heads, or that the model's inputs do not
have, are one line from each before anything runs; a folder exported before contract.shapes (kind "gpt") still runs.

Needs `make native-build` and `make web-build`.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
NATIVE = REPO / "runtime" / "native"
PROMPT = "15496,11,314"
NEW = 6
# How each runtime generates greedy ids from a folder's in-place form (wasm: its default, the Concat form gpt.onnx).
RUNTIMES: dict[str, list[str]] = {
    "python": [sys.executable, "-m", "mha_runtime", "generate"],
    "c": [str(NATIVE / "c" / "build" / "mha_check"), "generate"],
    "node": ["node", str(NATIVE / "node" / "cli.js"), "generate"],
    "wasm": ["node", str(NATIVE / "web" / "check.mjs"), "generate"],
}
FILES = ("manifest.json", "gpt.onnx", "gpt.inplace.onnx", "tokenizer.json", "tokenizer_config.json")


def _generate(runtime: str, folder: Path, *form: str) -> subprocess.CompletedProcess[str]:
    """`form`: ("--form", FILE), or nothing for the runtime's default (the C runner has only the in-place form)."""
    tail = ["--json"] if runtime == "python" else []  # Python prints text; --json gives its ids
    form = () if runtime == "c" else form
    return subprocess.run([*RUNTIMES[runtime], str(folder), "--prompt-ids", PROMPT, "--max-new-tokens", str(NEW),
                           "--no-eos", *form, *tail], capture_output=True, text=True, timeout=600, cwd=REPO)


def _ids(runtime: str, result: subprocess.CompletedProcess[str]) -> list[int]:
    assert result.returncode == 0, f"{runtime}: {result.stdout}{result.stderr}"
    if runtime == "python":
        return json.loads(result.stdout)["ids"][0]  # type: ignore[no-any-return]
    return [int(v) for v in result.stdout.strip().split(",")]


def _refused(runtime: str, result: subprocess.CompletedProcess[str], text: str) -> None:
    """One line on stderr naming `text`, exit 1, nothing generated."""
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1 and text in lines[0], f"{runtime}: {result.stderr}"
    assert result.stdout == "", runtime


def _edited(folder: Path, tmp_path: Path, edit: Callable[[dict[str, Any]], object]) -> Path:
    """A copy of what generate reads of `folder`, its manifest edited (manifest.json is not listed in itself)."""
    out = tmp_path / "edited"
    out.mkdir()
    for name in FILES:
        if (folder / name).is_file():
            shutil.copy(folder / name, out / name)
    manifest = json.loads((out / "manifest.json").read_text())
    edit(manifest)
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out


def _cache_heads(manifest: dict[str, Any], heads: int) -> None:
    """Every cache input and output of both forms' signatures at `heads` key/value heads."""
    for kind in ("concat", "inplace"):
        for name, (_, shape) in manifest["contract"][kind]["signature"].items():
            if name.startswith(("past_key_values.", "present.")):
                shape[1] = heads


@pytest.fixture(scope="module")
def book(book_gpt: tuple[object, Path]) -> tuple[Path, list[int]]:
    """The book GPT's folder and its greedy ids (Python's, which every runtime reproduces)."""
    folder = book_gpt[1]
    for built in (RUNTIMES["c"][0], NATIVE / "node" / "node_modules", NATIVE / "web" / "node_modules"):
        assert Path(built).exists(), f"{built} is missing: build first (make native-build web-build)"
    return folder, _ids("python", _generate("python", folder))


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_grouped_query_manifest_runs_by_its_kv_heads(runtime: str, book: tuple[Path, list[int]],
                                                       tmp_path: Path) -> None:
    """n_heads doubled over the file's own key/value heads: two query heads per key/value head, as a Llama's
    manifest says it. The cache is [B, kv_heads, C, head_dim], so the ids are the folder's own."""
    folder, want = book
    shapes = json.loads((folder / "manifest.json").read_text())["contract"]["shapes"]
    assert shapes["kv_heads"] == shapes["n_heads"] == 4
    edited = _edited(folder, tmp_path, lambda m: m["contract"]["shapes"].update(n_heads=8))
    assert _ids(runtime, _generate(runtime, edited)) == want


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_kv_heads_that_do_not_divide_the_query_heads_are_refused(runtime: str, book: tuple[Path, list[int]],
                                                                 tmp_path: Path) -> None:
    edited = _edited(book[0], tmp_path, lambda m: m["contract"]["shapes"].update(kv_heads=3))
    _refused(runtime, _generate(runtime, edited), "contract.shapes: n_heads 4 is not a multiple of kv_heads 3")


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_cache_the_model_does_not_have_is_refused_before_it_runs(runtime: str, book: tuple[Path, list[int]],
                                                                   tmp_path: Path) -> None:
    """kv_heads 2, and the manifest's signatures saying so too: only the model's own inputs disagree."""
    def edit(m: dict[str, Any]) -> None:
        m["contract"]["shapes"].update(kv_heads=2)
        _cache_heads(m, 2)

    result = _generate(runtime, _edited(book[0], tmp_path, edit))
    said = "expected axis 1 of size 2" if runtime == "c" else "expected float32 ["
    _refused(runtime, result, said)
    assert "past_key_values.0.key" in result.stderr and "contract.shapes" in result.stderr


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_folder_exported_before_contract_shapes_runs(runtime: str, book: tuple[Path, list[int]],
                                                       tmp_path: Path) -> None:
    """Kind "gpt" and no contract.shapes: each runtime's one legacy reader derives them from the GPT-2 config."""
    folder, want = book
    edited = _edited(folder, tmp_path, lambda m: (m.update(kind="gpt"), m["contract"].pop("shapes")))
    assert _ids(runtime, _generate(runtime, edited)) == want


def test_the_c_legacy_reader_bounds_the_head_size_it_derives(book: tuple[Path, list[int]], tmp_path: Path) -> None:
    """An old folder's head size is emb_dim / n_heads: the C reader holds it to its head-size bound too, before a
    buffer, as it holds contract.shapes' head_dim."""
    def edit(m: dict[str, Any]) -> None:
        m.update(kind="gpt")
        m["contract"].pop("shapes")
        m["config"].update(emb_dim=1 << 17, n_heads=1)

    _refused("c", _generate("c", _edited(book[0], tmp_path, edit)), "head size 131072 is over the runner's bound")


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_cache_lengths_not_one_per_layer_are_refused(runtime: str, book: tuple[Path, list[int]],
                                                     tmp_path: Path) -> None:
    """contract.shapes.cache_lengths (a windowed layer's rows) must name every layer, each within the context."""
    edited = _edited(book[0], tmp_path, lambda m: m["contract"]["shapes"].update(cache_lengths=[4]))
    _refused(runtime, _generate(runtime, edited), "'cache_lengths': expected 2 integers from 1 to context_length")


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_window_the_model_does_not_have_is_refused_before_it_runs(runtime: str, book: tuple[Path, list[int]],
                                                                    tmp_path: Path) -> None:
    """Every layer said to keep 8 rows, the manifest's in-place signature saying so too: only the model's own
    inputs (context_length rows) disagree, and every runtime sizes its buffers by the manifest, so it must refuse."""
    def edit(m: dict[str, Any]) -> None:
        shapes = m["contract"]["shapes"]
        shapes["cache_lengths"] = [8] * shapes["n_layers"]
        for name, (_, shape) in m["contract"]["inplace"]["signature"].items():
            if name.startswith(("past_key_values.", "present.")):
                shape[2] = 8

    result = _generate(runtime, _edited(book[0], tmp_path, edit), "--form", "gpt.inplace.onnx")
    said = "expected axis 2 of size 8" if runtime == "c" else "expected float32 ["
    _refused(runtime, result, said)
    assert "past_key_values.0.key" in result.stderr
