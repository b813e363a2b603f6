"""Issue 59's windowed cache: a layer with a sliding window keeps only its window in the in-place form, in every
runtime that runs that form, and generation far past the window still equals transformers'.

The model is transformers' Gemma3ForCausalLM with random weights (tests/gemma3_folders.py: four layers, three local
with a window of 8 and one global, context 64), exported by the default `mha export --gpt --weights`. Its in-place
form keeps 8 rows for each local layer (contract.shapes.cache_lengths, GroupQueryAttention's sliding_window_cache)
and 64 for the global one. Python, C, Node.js (onnxruntime-node) and wasm (onnxruntime-web in Node.js) each generate
48 new tokens after a 12-token prompt on that form: the keys leave the window 52 times, and the ids must be
transformers' own. The serving engine pastes each prompt's window into a batch slot: three generations on two slots
equal transformers' too.

The C example (runtime/native/c/gpt_example.c) runs it too. Needs `make native-build` and `make web-build`.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner

from gemma3_folders import LAYER_TYPES, hf_gemma3, save_gemma3
from llama_folders import Made, _cli_export
from mha_runtime.cli.main import cli
from mha_runtime.decoder.contract import INPLACE_FORM
from mha_runtime.decoder.forms import FORMS
from mha_runtime.decoder.generate import Generator
from mha_runtime.decoder.manifest import load_gpt_manifest
from mha_runtime.serve.decoder.engine import BatchEngine
from mha_runtime.serve.decoder.job import Event, Job
from mha_runtime.serve.decoder.wire import GenerateRequest

REPO = Path(__file__).resolve().parents[2]
NATIVE = REPO / "runtime" / "native"
WINDOW, CONTEXT = 8, 64  # HF_GEMMA3's sliding_window and max_position_embeddings
PROMPT = [2, 17, 42, 8, 61, 5, 33, 12, 9, 50, 27, 44]
NEW = 48  # 12 + 48 = 60 of the 64 positions
RUNTIMES: dict[str, list[str]] = {
    "python": [sys.executable, "-m", "mha_runtime", "generate"],
    "c": [str(NATIVE / "c" / "build" / "mha_check"), "generate"],
    "node": ["node", str(NATIVE / "node" / "cli.js"), "generate"],
    "wasm": ["node", str(NATIVE / "web" / "check.mjs"), "generate"],
}


@pytest.fixture(scope="module")
def gemma(tmp_path_factory: pytest.TempPathFactory) -> Made:
    root = tmp_path_factory.mktemp("window-cache")
    model = hf_gemma3()
    start = time.perf_counter()
    folder, notes = _cli_export("hf-gemma3", save_gemma3(model, root / "hf"), root)
    return Made("hf-gemma3", "gemma3", model, model, folder, notes, time.perf_counter() - start)


@pytest.fixture(scope="module")
def want(gemma: Made) -> list[int]:
    """transformers' greedy ids (its own sliding-window cache) for PROMPT."""
    ids = gemma.greedy(PROMPT, NEW)
    assert len(ids) == NEW
    return ids


def test_the_local_layers_keep_only_their_window(gemma: Made) -> None:
    """The manifest says each layer's rows; the in-place file's cache inputs and outputs have them, and its local
    layers' GroupQueryAttention evicts (sliding_window_cache) while the global one keeps the context."""
    rows = [WINDOW if t == "sliding_attention" else CONTEXT for t in LAYER_TYPES]
    manifest = load_gpt_manifest(gemma.folder)
    assert manifest.shapes.cache_lengths == tuple(rows)
    assert json.loads((gemma.folder / "manifest.json").read_text())["contract"]["shapes"]["cache_lengths"] == rows
    model = onnx.load(gemma.folder / INPLACE_FORM, load_external_data=False)
    dims = {v.name: [d.dim_value or d.dim_param for d in v.type.tensor_type.shape.dim]
            for v in [*model.graph.input, *model.graph.output]}
    for i, n in enumerate(rows):
        for name in (f"past_key_values.{i}.key", f"past_key_values.{i}.value", f"present.{i}.key",
                     f"present.{i}.value"):
            assert dims[name][1:] == [2, n, 16], name
    nodes = [n for n in model.graph.node if n.op_type == "GroupQueryAttention"]
    evicting = [any(a.name == "sliding_window_cache" and a.i == 1 for a in n.attribute) for n in nodes]
    assert evicting == [t == "sliding_attention" for t in LAYER_TYPES]


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_every_runtime_generates_far_past_the_window(runtime: str, gemma: Made, want: list[int]) -> None:
    assert Path(RUNTIMES["c"][0]).exists(), "build first: make native-build web-build"
    tail = ["--json"] if runtime == "python" else []  # Python prints text; --json gives its ids
    form = [] if runtime == "c" else ["--form", INPLACE_FORM]  # the C runner has only the in-place form
    done = subprocess.run([*RUNTIMES[runtime], str(gemma.folder), "--prompt-ids", ",".join(map(str, PROMPT)),
                           "--max-new-tokens", str(NEW), "--no-eos", *form, *tail],
                          capture_output=True, text=True, timeout=600, cwd=REPO)
    assert done.returncode == 0, f"{runtime}: {done.stdout}{done.stderr}"
    out = done.stdout.strip()
    got = json.loads(out)["ids"][0] if runtime == "python" else [int(v) for v in out.split(",")]
    assert got == want


def test_the_c_example_sizes_each_layer_by_its_own_input(gemma: Made, want: list[int]) -> None:
    """runtime/native/c/gpt_example.c (the README's C loop) reads every layer's rows from the file itself."""
    example = NATIVE / "c" / "build" / "gpt_example"
    done = subprocess.run([str(example), str(gemma.folder / INPLACE_FORM), str(NEW), *map(str, PROMPT)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert [int(v) for v in done.stdout.strip().split(",")] == want


def _before_the_window(folder: Path, out: Path) -> Path:
    """A copy of `folder` as the export made it before the windowed cache: each in-place form with every layer's cache
    at the context (benchmarks.window_cache makes that graph), no cache_lengths, the manifest's signature and the
    file's size and sha256 to match."""
    from benchmarks.window_cache import every_cache_at_context
    from mha_runtime.artifact.manifest import sha256_file

    shutil.copytree(folder, out, symlinks=True)
    manifest = json.loads((out / "manifest.json").read_text())
    for file in (f for f, form in FORMS.items() if form.kind == "inplace" and f in manifest["artifacts"]):
        onnx.save(every_cache_at_context(onnx.load(out / file), CONTEXT), out / file)
        manifest["files"][file] = {"size": (out / file).stat().st_size, "sha256": sha256_file(out / file)}
    del manifest["contract"]["shapes"]["cache_lengths"]
    for name, (_, shape) in manifest["contract"]["inplace"]["signature"].items():
        if name.startswith(("past_key_values.", "present.")):
            shape[2] = CONTEXT
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out


@pytest.mark.parametrize("windowed", [True, False], ids=["windowed", "exported-before-the-window"])
def test_mha_validate_sizes_the_cache_by_the_folders_own_shapes(gemma: Made, want: list[int], windowed: bool,
                                                               tmp_path: Path) -> None:
    """`mha validate` rebuilds eager PyTorch from the config, whose windows now give cache_lengths: the decoders it
    drives are sized by the folder's own contract.shapes, so a folder exported before the field validates too, and
    generates transformers' ids."""
    folder = gemma.folder if windowed else _before_the_window(gemma.folder, tmp_path / "old")
    result = CliRunner().invoke(cli, ["validate", str(folder)])
    assert result.exit_code == 0, result.output
    assert result.output.strip().splitlines()[-1].endswith(" passed, 0 failed")
    assert load_gpt_manifest(folder).shapes.cache_lengths == (None if not windowed else
                                                             load_gpt_manifest(gemma.folder).shapes.cache_lengths)
    gen = Generator(folder, form=INPLACE_FORM)
    assert gen.generate([PROMPT], max_new_tokens=NEW, eos_id=None).ids[0] == want


def test_the_serving_engine_pastes_windows_into_its_slots(gemma: Made) -> None:
    """Three prompts longer than the window on two slots (the third waits for a free one): each answer is
    transformers' greedy continuation."""
    prompts = [PROMPT, [*PROMPT[3:], 7, 7, 90, 1, 64], [2, *range(30, 50)]]
    wants = [gemma.greedy(p, 24) for p in prompts]
    done = [threading.Event() for _ in prompts]
    answers: list[dict[str, object]] = [{} for _ in prompts]

    def emit(i: int) -> Callable[[Event], None]:
        def on(event: Event) -> None:
            if event[0] != "token":
                answers[i] = {"kind": event[0], **event[1]}
                done[i].set()
        return on

    engine = BatchEngine(Generator(gemma.folder, form=INPLACE_FORM).decoder(), max_batch=2, eos_id=None,
                         tokenizer=None)
    try:
        for i, p in enumerate(prompts):
            engine.submit(Job(GenerateRequest(p, 24), emit(i)))
        assert all(d.wait(120) for d in done), "a generation never finished"
    finally:
        engine.close()
    assert [a.get("kind") for a in answers] == ["done"] * 3, answers
    assert [a["ids"] for a in answers] == wants
