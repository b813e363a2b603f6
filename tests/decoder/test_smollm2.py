"""Issue 58's proof on the first real pretrained model, SmolLM2-135M-Instruct from its Q4_1 GGUF
(tests/smollm2_folder.py): the greedy ids of every fp32 form equal transformers' on the same GGUF for 32 new tokens
on three prompts (one of them the chat prompt rendered by the folder's template), llama.cpp on the folder's gpt.gguf
gives the same ids, Optimum and transformers.js load the folder as it is and give them too; `mha generate --chat`
answers the chat prompt as transformers does and stops at the template's end of turn."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_gpt_dropin import CLIENTS, TOLERANCE, _ask, _job, _node_client, optimum_python  # noqa: F401 (fixture)

from mha_runtime.artifact.tolerance import compare
from mha_runtime.decoder.contract import CONCAT_FORM, GGUF_FORM, INPLACE_FORM
from mha_runtime.decoder.generate import Generator
from mha_runtime.decoder.manifest import load_gpt_manifest
from mha_runtime.gguf import llama_cpp
from smollm2_folder import CHAT, NEEDS_SMOLLM2, NEW, Reference, reference, smollm2_folder

pytestmark = [NEEDS_SMOLLM2, pytest.mark.slow]  # transformers' GGUF load: about two minutes on two cores


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return smollm2_folder(tmp_path_factory)


@pytest.fixture(scope="module")
def ref() -> Reference:
    return reference()


@pytest.fixture(scope="module")
def want(ref: Reference) -> dict[str, list[int]]:
    """transformers' greedy new ids per prompt."""
    return {name: ref.greedy(ids) for name, ids in ref.prompts.items()}


def test_the_folders_tokenizer_and_template_give_transformers_ids(folder: Path, ref: Reference) -> None:
    from mha_runtime.decoder.chat.folder import folder_chat, user_message

    gen = Generator(folder)
    assert gen.tokenizer is not None
    for text, ids in ref.prompts.items():
        if text != CHAT:
            assert gen.tokenizer.encode(text) == ids, text
    chat = folder_chat(folder, gen.manifest, gen.tokenizer)
    assert chat.encode(user_message(CHAT)) == ref.prompts[CHAT]
    assert ref.tokenizer.convert_tokens_to_ids("<|im_end|>") in chat.stop_ids


@pytest.mark.parametrize("form", [CONCAT_FORM, INPLACE_FORM])
def test_every_fp32_form_generates_what_transformers_does(form: str, folder: Path, ref: Reference,
                                                          want: dict[str, list[int]]) -> None:
    gen = Generator(folder, form=form)
    worst = 0.0
    for name, prompt in ref.prompts.items():
        got = gen.generate([prompt], max_new_tokens=NEW, eos_id=None).ids[0]
        assert got == want[name], (name, ref.tokenizer.decode(got), ref.tokenizer.decode(want[name]))
        first = gen.decoder().prefill([prompt])[0]
        import torch

        with torch.no_grad():
            expected = ref.model(torch.tensor([prompt])).logits[0, -1].numpy()
        worst = max(worst, float(np.abs(first - expected).max()))
        assert compare(first, expected, TOLERANCE).ok, (name, np.abs(first - expected).max())
    print(f"{form}: first-step logits max |diff| from transformers {worst:.2e}")


def test_the_chat_prompt_answers_as_transformers_does(ref: Reference, want: dict[str, list[int]]) -> None:
    """The reference itself: greedy decoding answers 'The capital of France is Paris.' and ends the turn (issue 58's
    measurement; if the weights or the template were read wrong, this is the line that changes)."""
    reply = ref.tokenizer.decode(want[CHAT])
    assert reply.startswith("The capital of France is Paris.<|im_end|>"), reply


def test_mha_generate_chat_prints_the_reply_and_stops_at_the_end_of_turn(folder: Path, ref: Reference,
                                                                          want: dict[str, list[int]]) -> None:
    out = subprocess.run([sys.executable, "-m", "mha_runtime", "generate", str(folder), "--chat", CHAT,
                          "--max-new-tokens", str(NEW)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    end = ref.tokenizer.convert_tokens_to_ids("<|im_end|>")
    expected = ref.tokenizer.decode(want[CHAT][:want[CHAT].index(end)])
    assert out.stdout.strip() == expected.strip() == "The capital of France is Paris."


@pytest.mark.skipif(llama_cpp.program() is None, reason=llama_cpp.BUILD_HINT)
def test_llama_cpp_on_the_folders_gguf_gives_the_same_ids(folder: Path, ref: Reference,
                                                         want: dict[str, list[int]]) -> None:
    assert GGUF_FORM in load_gpt_manifest(folder).artifacts
    names = list(ref.prompts)
    answers = llama_cpp.run(folder / GGUF_FORM, [llama_cpp.generate(ref.prompts[n], NEW) for n in names])
    got = {n: [int(i) for i in a["ids"]] for n, a in zip(names, answers.lines, strict=True)}  # type: ignore[union-attr]
    assert got == want


def _answers(command: list[str], folder: Path, ref: Reference, tmp: Path) -> dict[str, Any]:
    prompts = list(ref.prompts.values())
    [answer] = _ask(command, [_job(folder, tmp, prompts, NEW, batch=False, eos=False) | {"pad": 0}], tmp)
    return answer


def test_transformersjs_loads_the_folder_as_it_is(folder: Path, ref: Reference, want: dict[str, list[int]],
                                                  tmp_path: Path) -> None:
    answer = _answers(_node_client(), folder, ref, tmp_path)
    assert answer["solo"] == list(want.values())


def test_optimum_loads_the_folder_as_it_is(folder: Path, ref: Reference, want: dict[str, list[int]],
                                           optimum_python: Path, tmp_path: Path) -> None:  # noqa: F811
    answer = _answers([str(optimum_python), str(CLIENTS / "optimum_client.py")], folder, ref, tmp_path)
    assert answer["solo"] == list(want.values())


def test_the_folder_records_the_real_models_shapes_and_source(folder: Path) -> None:
    manifest = load_gpt_manifest(folder)
    s = manifest.shapes
    assert (s.arch, s.n_layers, s.n_heads, s.kv_heads, s.head_dim, s.vocab_size) == ("llama", 30, 9, 3, 64, 49152)
    assert manifest.weights["tied"] is True
    config = json.loads((folder / "config.json").read_text())
    assert (config["model_type"], config["num_key_value_heads"], config["rope_theta"]) == ("llama", 3, 100000.0)
