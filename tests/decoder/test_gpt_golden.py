"""The golden generations of a GPT folder: made at export from the eager model, equal to the book's own
`generate_text_simple` and to transformers' greedy `generate`, run by `mha check`, refused when altered."""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from gpt_sources import BOOK_FORMS
from mha_runtime.artifact.errors import ArtifactError
from mha_runtime.cli.main import cli
from mha_runtime.decoder.forms import FORMS
from mha_runtime.decoder.golden import GENERATIONS_FILE, first_logits, load_generations
from mha_runtime.decoder.golden_check import check_generations
from mha_runtime.decoder.manifest import load_gpt_manifest
from mha_runtime.decoder.quality import QUALITY_FILE


def test_greedy_golden_ids_are_the_books_generate_text_simple(book_gpt: tuple[Any, Path]) -> None:
    from llms_from_scratch.ch04 import generate_text_simple

    model, folder = book_gpt
    manifest = load_gpt_manifest(folder)
    golden = load_generations(folder, manifest)
    greedy = [c for c in golden.cases if c.temperature == 0.0]
    assert len(greedy) >= 4 and any(c.prompt_text for c in greedy)  # three lengths and the text prompt
    for case in greedy:
        with torch.no_grad():
            out = generate_text_simple(model, torch.tensor([case.prompt_ids]), case.max_new_tokens,
                                       manifest.shapes.context_length)
            logits = model(torch.tensor([case.prompt_ids]))[0, -1].numpy()
        assert out[0, len(case.prompt_ids):].tolist() == case.ids, case.name
        np.testing.assert_allclose(first_logits(folder, manifest, case, manifest.shapes.vocab_size), logits,
                                   atol=1e-5, rtol=1e-5)


def test_greedy_golden_ids_are_transformers_generate(hf_gpt: tuple[Any, Path]) -> None:
    model, folder = hf_gpt
    manifest = load_gpt_manifest(folder)
    for case in load_generations(folder, manifest).cases:
        if case.temperature:
            continue
        with torch.no_grad():
            out = model.generate(torch.tensor([case.prompt_ids]), max_new_tokens=case.max_new_tokens,
                                 do_sample=False, eos_token_id=None, pad_token_id=0)
        assert out[0, len(case.prompt_ids):].tolist() == case.ids, case.name


def test_golden_files_are_listed_and_the_text_case_is_the_tokenizers(book_gpt: tuple[Any, Path]) -> None:
    folder = book_gpt[1]
    manifest = load_gpt_manifest(folder)
    doc = json.loads((folder / GENERATIONS_FILE).read_text())
    listed = {name for name in manifest.files if name.startswith("golden/")}
    named = {GENERATIONS_FILE, QUALITY_FILE}
    for file in [GENERATIONS_FILE] + [a.generations for a in manifest.artifacts.values() if a.generations]:
        own = json.loads((folder / file).read_text())
        named |= {file} | {f"golden/{c[k]}" for c in own["cases"] for k in ("first_logits_bin", "first_logits_npy")}
    assert listed == named
    assert doc["eos_applied"] is False and doc["tolerance"]["atol"] == 1e-3
    sampled = [c for c in doc["cases"] if c["temperature"] > 0]
    assert len(sampled) == 2 and all(c["seed"] is not None for c in sampled)
    text = next(c for c in doc["cases"] if "prompt_text" in c)
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    assert tok.encode(text["prompt_text"], add_special_tokens=False).ids == text["prompt_ids"]
    for case in doc["cases"]:
        raw = np.fromfile(folder / "golden" / case["first_logits_bin"], dtype="<f4")
        assert np.array_equal(raw, np.load(folder / "golden" / case["first_logits_npy"]))


def test_mha_check_passes_every_generation_on_both_forms(book_gpt: tuple[Any, Path], tmp_path: Path) -> None:
    folder = book_gpt[1]
    results = check_generations(folder)
    cases = len(load_generations(folder, load_gpt_manifest(folder)).cases)
    # the fp32 forms (gpt.pte too where ExecuTorch is installed) and the two lossy forms, and each lossy form's quality
    total = len(BOOK_FORMS) * cases + 2
    assert {r.artifact for r in results} == set(BOOK_FORMS) and len(results) == total
    assert [r.artifact for r in results if r.case == "quality"] == [f for f in FORMS if FORMS[f].lossy]
    assert all(r.ok for r in results), [r.line() for r in results if not r.ok]
    out = CliRunner().invoke(cli, ["check", str(folder), "--json", str(tmp_path / "py.json")])
    assert out.exit_code == 0 and out.output.strip().splitlines()[-1] == f"{total} passed, 0 failed"
    doc = json.loads((tmp_path / "py.json").read_text())
    assert doc["runtime"] == "python" and doc["passed"] == total and doc["failed"] == 0


@pytest.fixture
def book_copy(book_gpt: tuple[Any, Path], tmp_path: Path) -> Path:
    return Path(shutil.copytree(book_gpt[1], tmp_path / "book"))


def test_a_golden_id_changed_fails_that_case_on_every_form(book_copy: Path) -> None:
    """An edited expectation (manifest re-sealed, so only the comparison can catch it) fails that case only."""
    import hashlib

    path = book_copy / GENERATIONS_FILE
    doc = json.loads(path.read_text())
    doc["cases"][1]["ids"][3] = (doc["cases"][1]["ids"][3] + 1) % 50257
    path.write_text(json.dumps(doc))
    manifest = json.loads((book_copy / "manifest.json").read_text())
    manifest["files"][GENERATIONS_FILE] = {"size": path.stat().st_size,
                                           "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
    (book_copy / "manifest.json").write_text(json.dumps(manifest))
    failed = [r for r in check_generations(book_copy) if not r.ok]
    fp32 = [f for f, form in BOOK_FORMS.items() if not form.lossy]  # the forms golden/generations.json is for
    assert {(r.artifact, r.case) for r in failed} == {(f, doc["cases"][1]["name"]) for f in fp32}
    assert all("ids differ from token 3" in (r.error or "") for r in failed)


@pytest.mark.parametrize("name", [GENERATIONS_FILE, "golden/greedy_t1.logits.bin"])
def test_an_altered_golden_file_is_refused_before_use(book_copy: Path, name: str) -> None:
    path = book_copy / name
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="sha256"):
        check_generations(book_copy)
    out = CliRunner().invoke(cli, ["check", str(book_copy)])
    assert out.exit_code == 1 and "sha256" in out.output and "Traceback" not in out.output
