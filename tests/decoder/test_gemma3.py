"""Issue 59's proof on Gemma 3 270M from its Q4_K_M GGUF (tests/gemma3_folder.py): the greedy ids of every fp32 form
equal transformers' on the same GGUF for 32 new tokens on three prompts, one of them longer than the local layers'
512-token window, first-step logits within the fp32 row; llama.cpp on our gpt.gguf of the same weights gives the
same ids; the folder's tokenizer gives transformers' ids (bos first). The reference is no copy of ours:
transformers' own Gemma3ForCausalLM, its own sliding-window mask."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from gemma3_folder import CONTEXT, GGUF, LONG, NEEDS_GEMMA3, NEW, WINDOW, Reference, gemma3_folder, reference
from mha_runtime.artifact.tolerance import compare
from mha_runtime.decoder.contract import CONCAT_FORM, GGUF_FORM, INPLACE_FORM
from mha_runtime.decoder.forms import FORMS
from mha_runtime.decoder.generate import Generator
from mha_runtime.decoder.manifest import load_gpt_manifest
from mha_runtime.gguf import llama_cpp

pytestmark = [NEEDS_GEMMA3, pytest.mark.slow]  # transformers' GGUF load and a 600-token prompt: minutes
TOLERANCE = FORMS[CONCAT_FORM].tolerance  # the fp32 row


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return gemma3_folder(tmp_path_factory)


@pytest.fixture(scope="module")
def ref() -> Reference:
    return reference()


@pytest.fixture(scope="module")
def want(ref: Reference) -> dict[str, list[int]]:
    """transformers' greedy new ids per prompt."""
    return {name: ref.greedy(ids) for name, ids in ref.prompts.items()}


@pytest.fixture(scope="module")
def first(ref: Reference) -> dict[str, np.ndarray]:
    """transformers' first-step logits (V,) per prompt, computed once for both forms."""
    import torch

    with torch.no_grad():
        return {name: ref.model(torch.tensor([ids])).logits[0, -1].numpy() for name, ids in ref.prompts.items()}


def test_the_folders_tokenizer_gives_transformers_ids_bos_first(folder: Path, ref: Reference) -> None:
    gen = Generator(folder)
    assert gen.tokenizer is not None
    bos = ref.tokenizer.bos_token_id
    for text, ids in ref.prompts.items():
        assert ids[0] == bos and bos not in ids[1:], text[:40]
        assert gen.tokenizer.encode(text) == ids, text[:40]
    assert WINDOW < len(ref.prompts[LONG]) and len(ref.prompts[LONG]) + NEW <= CONTEXT


@pytest.mark.parametrize("form", [CONCAT_FORM, INPLACE_FORM])
def test_every_fp32_form_generates_what_transformers_does(form: str, folder: Path, ref: Reference,
                                                          want: dict[str, list[int]],
                                                          first: dict[str, np.ndarray]) -> None:
    gen = Generator(folder, form=form)
    worst = 0.0
    for name, prompt in ref.prompts.items():
        got = gen.generate([prompt], max_new_tokens=NEW, eos_id=None).ids[0]
        assert got == want[name], (name[:40], ref.tokenizer.decode(got), ref.tokenizer.decode(want[name]))
        ours, expected = gen.decoder().prefill([prompt])[0], first[name]
        worst = max(worst, float(np.abs(ours - expected).max()))
        assert compare(ours, expected, TOLERANCE).ok, (name[:40], np.abs(ours - expected).max())
    print(f"{form}: first-step logits max |diff| from transformers {worst:.2e}")


def test_the_long_prompt_needs_the_window(ref: Reference, want: dict[str, list[int]]) -> None:
    """The window is what the long prompt's ids hang on: transformers with every layer global (its sliding layers'
    window set past the context) answers otherwise, so a form that ignored the window could not pass the test
    above."""
    import torch

    config = ref.model.config
    before = config.sliding_window
    try:
        config.sliding_window = 4 * CONTEXT
        with torch.no_grad():
            global_logits = ref.model(torch.tensor([ref.prompts[LONG]])).logits[0, -1]
        unwindowed = ref.greedy(ref.prompts[LONG])
    finally:
        config.sliding_window = before
    with torch.no_grad():
        windowed_logits = ref.model(torch.tensor([ref.prompts[LONG]])).logits[0, -1]
    assert float((global_logits - windowed_logits).abs().max()) > 100 * TOLERANCE.atol
    assert unwindowed != want[LONG]


def _gguf(folder: Path, tmp: Path) -> Path:
    """The folder's gpt.gguf, or, where the export left it out (Gemma 3's first-step logits under llama.cpp are
    0.03-0.05 from the eager model's, beyond gpt.gguf's row of 1e-2), the file the export's writer makes of the same
    GGUF's weights and the folder's tokenizer, as build_ggufs writes it."""
    if GGUF_FORM in load_gpt_manifest(folder).artifacts:
        return folder / GGUF_FORM
    from mha_export.decoder.checkpoint import gguf_config, gguf_origin
    from mha_export.decoder.steps.load import load_gpt
    from mha_export.gguf.source import metadata
    from mha_export.gguf.write import gguf_tensors, vocabulary, write_gguf

    cfg = replace(gguf_config(metadata(GGUF), where=str(GGUF)), context_length=CONTEXT)
    origin = gguf_origin(GGUF, cfg)
    _, state, record = load_gpt(cfg, GGUF)
    vocab = vocabulary((folder / "tokenizer.json").read_bytes(), cfg.vocab_size, eos_ids=origin.eos_ids,
                       bos_id=origin.bos_id, config_json=(folder / "tokenizer_config.json").read_bytes(), source=GGUF)
    write_gguf(tmp / GGUF_FORM, gguf_tensors(state, cfg, tied=bool(record["tied"])), cfg, dtype="fp32",
               name="gemma3", vocab=vocab)
    return tmp / GGUF_FORM


@pytest.mark.skipif(llama_cpp.program() is None, reason=llama_cpp.BUILD_HINT)
def test_llama_cpp_on_our_gguf_gives_the_same_ids(folder: Path, ref: Reference, want: dict[str, list[int]],
                                                  tmp_path: Path) -> None:
    names = list(ref.prompts)
    answers = llama_cpp.run(_gguf(folder, tmp_path), [llama_cpp.generate(ref.prompts[n], NEW) for n in names])
    got = {n: [int(i) for i in a["ids"]] for n, a in zip(names, answers.lines, strict=True)}  # type: ignore[union-attr]
    assert got == want


def test_the_folder_records_the_real_models_shapes_and_window(folder: Path) -> None:
    manifest = load_gpt_manifest(folder)
    s = manifest.shapes
    assert (s.arch, s.n_layers, s.n_heads, s.kv_heads, s.head_dim, s.vocab_size, s.context_length) == (
        "gemma3", 18, 4, 1, 256, 262144, CONTEXT)
    assert manifest.weights["tied"] is True
    config = json.loads((folder / "config.json").read_text())
    assert (config["model_type"], config["sliding_window"], config["query_pre_attn_scalar"]) == ("gemma3_text",
                                                                                                  WINDOW, 256)
    assert config["layer_types"].count("full_attention") == 3  # every sixth layer global
