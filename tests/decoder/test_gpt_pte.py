"""gpt.pte (ExecuTorch, XNNPACK, the cache inside the program) against the book's GPTModel and the golden
generations: greedy ids equal ch04's generate_text_simple, first-step logits within the fp32 row, the bounds
(batch 1, prompt + new <= context_length) refused before ExecuTorch loads the program, a tampered file refused
before it is parsed, and what to install where the runner is missing.

The folder is the session's book GPT (tests/conftest.py), which has gpt.pte where ExecuTorch is installed."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from gpt_sources import BOOK
from helpers import reseal
from mha_export.decoder.plan import parse_gpt_variants
from mha_export.infer.decoder_pte_runner import PteGPT
from mha_runtime.artifact.errors import ArtifactError, ContractError
from mha_runtime.artifact.tolerance import compare
from mha_runtime.cli.main import cli
from mha_runtime.decoder.contract import INPLACE_FORM, PTE_FORM, pte_bounds
from mha_runtime.decoder.forms import PTE
from mha_runtime.decoder.generate import Generator
from mha_runtime.decoder.golden_check import check_generations
from mha_runtime.decoder.manifest import load_gpt_manifest

# What XNNPACK's fp32 kernels were measured at on this config against the book's eager logits: 1.1e-6 at most
# over every validation case and golden first step (the ONNX forms: 1.2e-6). The contract's fp32 row (atol 1e-3,
# rtol 1e-4) is what every runner is judged by; this bound only shows the row is not hiding a drift.
MEASURED_BOUND = 1e-5


def book_greedy(model: torch.nn.Module, prompt: list[int], new: int) -> list[int]:
    from llms_from_scratch.ch04 import generate_text_simple

    with torch.no_grad():
        out = generate_text_simple(model, torch.tensor([prompt]), max_new_tokens=new, context_size=BOOK.context_length)
    return out[0, len(prompt):].tolist()


def test_every_golden_generation_passes_on_gpt_pte(book_gpt: tuple[torch.nn.Module, Path]) -> None:
    _, folder = book_gpt
    results = [r for r in check_generations(folder) if r.artifact == PTE_FORM]
    assert len(results) == 6 and all(r.ok for r in results), [r.line() for r in results]
    assert max(r.max_abs for r in results) < MEASURED_BOUND


def test_manifest_and_contract_record_the_bounds(book_gpt: tuple[torch.nn.Module, Path]) -> None:
    _, folder = book_gpt
    manifest = load_gpt_manifest(folder)
    record = manifest.artifacts[PTE_FORM]
    bounds = {"batch": 1, "context_length": BOOK.context_length, "max_prefill_tokens": BOOK.context_length}
    assert record.kind == "executorch" and record.passed and record.greedy_agreement == 1.0
    assert record.bounds == bounds == manifest.contract["executorch"]["bounds"] == pte_bounds(BOOK)
    assert record.max_abs_error < MEASURED_BOUND and record.tolerance == PTE.tolerance.to_dict()
    assert "bounds" not in json.loads((folder / "manifest.json").read_text())["artifacts"][INPLACE_FORM]
    assert manifest.versions["executorch"]


@pytest.mark.parametrize("length", [1, 7, 30])
def test_greedy_ids_equal_the_books_generate_text_simple(book_gpt: tuple[torch.nn.Module, Path], length: int) -> None:
    model, folder = book_gpt
    prompt = np.random.default_rng(length).integers(0, BOOK.vocab_size, length).tolist()
    new = BOOK.context_length - length
    gen = Generator(folder, form=PTE_FORM)
    assert gen.generate([prompt], max_new_tokens=new).ids[0] == book_greedy(model, prompt, new)
    with torch.no_grad():
        expected = model(torch.tensor([prompt]))[0, -1].numpy()
    first = gen.decoder().prefill([prompt])[0]
    result = compare(first, expected, PTE.tolerance)
    assert result.ok and result.max_abs < MEASURED_BOUND, result


def test_a_whole_context_prefill_and_steps_equal_the_books_logits(book_gpt: tuple[torch.nn.Module, Path]) -> None:
    """Prefill of every length 1..context_length in one call each, then steps after a shorter prefill: the
    rows a previous call left in the cache never leak (the mask is by position)."""
    model, folder = book_gpt
    ids = np.random.default_rng(3).integers(0, BOOK.vocab_size, BOOK.context_length).tolist()
    with torch.no_grad():
        expected = model(torch.tensor([ids]))[0].numpy()  # (C, V): the book's model attends causally
    program = Generator(folder, form=PTE_FORM).pte
    assert isinstance(program, PteGPT)
    for n in (BOOK.context_length, 1, 17, BOOK.context_length - 1):
        assert compare(program.forward(ids[:n], 0), expected[n - 1], PTE.tolerance).ok, n
    program.forward(ids[:5], 0)
    for t in range(5, 12):
        assert compare(program.forward([ids[t]], t), expected[t], PTE.tolerance).ok, t


def test_sampled_ids_equal_the_inplace_onnx_form(book_gpt: tuple[torch.nn.Module, Path]) -> None:
    _, folder = book_gpt
    kwargs = dict(max_new_tokens=20, temperature=0.9, top_k=50, seed=5)
    prompt = [[464, 318, 257]]
    ours = Generator(folder, form=PTE_FORM).generate(prompt, **kwargs).ids  # type: ignore[arg-type]
    assert ours == Generator(folder, form=INPLACE_FORM).generate(prompt, **kwargs).ids  # type: ignore[arg-type]


@pytest.mark.parametrize("prompts,new,message", [
    ([[1, 2], [3, 4]], 4, "batch 2, the program's bound is batch <= 1"),
    ([[1, 2, 3]], BOOK.context_length - 2, f"prompt 3 \\+ max_new_tokens {BOOK.context_length - 2} = "
                                           f"{BOOK.context_length + 1} tokens, beyond its context_length"),
])
def test_bounds_are_refused_before_executorch_loads_the_program(book_gpt: tuple[torch.nn.Module, Path],
                                                                 prompts: list[list[int]], new: int,
                                                                 message: str) -> None:
    _, folder = book_gpt
    gen = Generator(folder, form=PTE_FORM)
    with pytest.raises(ContractError, match=message):
        gen.generate(prompts, max_new_tokens=new)
    assert isinstance(gen.pte, PteGPT) and gen.pte._method is None  # never loaded
    # The runner itself refuses a call beyond the planned cache, before ExecuTorch runs it.
    with pytest.raises(ContractError, match="beyond its context_length"):
        gen.pte.forward([1, 2], BOOK.context_length - 1)
    with pytest.raises(ContractError, match="tokens in one call"):
        gen.pte.forward([1] * (BOOK.context_length + 1), 0)
    with pytest.raises(ContractError, match="batch 2"):
        gen.pte.decoder().prefill([[1], [2]])


def test_cli_generate_runs_gpt_pte_and_refuses_its_bounds_in_one_line(book_gpt: tuple[torch.nn.Module, Path]) -> None:
    _, folder = book_gpt
    runner = CliRunner()
    args = ["generate", str(folder), "--prompt-ids", "5,6,7", "--max-new-tokens", "6", "--json"]
    ours = runner.invoke(cli, [*args, "--form", PTE_FORM])
    assert ours.exit_code == 0, ours.output
    onnx = runner.invoke(cli, args)
    assert json.loads(ours.stdout)["ids"] == json.loads(onnx.stdout)["ids"]
    for extra in (["--prompt-ids", "1,2"], ["--max-new-tokens", str(BOOK.context_length)]):
        refused = runner.invoke(cli, [*args, "--form", PTE_FORM, *extra])
        lines = refused.stderr.strip().splitlines()
        assert refused.exit_code == 2 and len(lines) == 1 and lines[0].startswith("Error: gpt.pte: "), refused.stderr
        assert refused.stdout == ""


def test_a_tampered_gpt_pte_is_refused_before_it_is_loaded(book_gpt: tuple[torch.nn.Module, Path],
                                                            tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, folder = book_gpt
    copy = tmp_path / "book"
    shutil.copytree(folder, copy)
    data = bytearray((copy / PTE_FORM).read_bytes())
    data[len(data) // 2] ^= 0x01
    (copy / PTE_FORM).write_bytes(bytes(data))

    def no_runtime(*args: object, **kwargs: object) -> None:
        raise AssertionError("the runner was reached")

    monkeypatch.setattr("mha_export.infer.decoder_pte_runner.gpt_pte_program", no_runtime)
    with pytest.raises(ArtifactError, match=r"gpt\.pte: sha256 .* differs from the manifest"):
        Generator(copy, form=PTE_FORM)
    with pytest.raises(ArtifactError, match=r"gpt\.pte: sha256"):  # mha check: one line, exit 1 (as a tampered .onnx)
        check_generations(copy)


def test_a_resealed_gpt_pte_whose_strings_are_not_utf8_is_one_line(book_gpt: tuple[torch.nn.Module, Path],
                                                                    tmp_path: Path) -> None:
    """A delegate id edited to a byte that is not UTF-8 (and resealed): ExecuTorch logs it through pybind11, which
    cannot decode it and ended the process (exit 134, nothing on stderr). A subprocess: the abort would end pytest."""
    _, folder = book_gpt
    copy = Path(shutil.copytree(folder, tmp_path / "book"))
    data = bytearray((copy / PTE_FORM).read_bytes())
    data[data.index(b"XnnpackBackend")] = 0xA7
    (copy / PTE_FORM).write_bytes(bytes(data))
    reseal(copy, PTE_FORM)
    ran = subprocess.run([sys.executable, "-m", "mha_runtime", "generate", str(copy), "--form", PTE_FORM,
                          "--prompt-ids", "1", "--max-new-tokens", "1"], capture_output=True, text=True, timeout=300)
    assert ran.returncode == 1 and ran.stdout == "", (ran.returncode, ran.stderr)
    assert ran.stderr == (f"Error: {copy / PTE_FORM}: ExecuTorch cannot load it (its delegate id "
                          "b'\\xa7nnpackBackend' is not UTF-8 text)\n")


def test_a_manifest_whose_bounds_were_edited_is_refused(book_gpt: tuple[torch.nn.Module, Path], tmp_path: Path) -> None:
    _, folder = book_gpt
    copy = tmp_path / "book"
    shutil.copytree(folder, copy)
    doc = json.loads((copy / "manifest.json").read_text())
    doc["artifacts"][PTE_FORM]["bounds"]["context_length"] = 4096
    (copy / "manifest.json").write_text(json.dumps(doc))
    with pytest.raises(ArtifactError, match=r"bounds .* in the manifest, expected"):
        Generator(copy, form=PTE_FORM)


def test_without_the_runner_it_says_what_to_install(book_gpt: tuple[torch.nn.Module, Path],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    _, folder = book_gpt
    monkeypatch.setattr("mha_runtime.executorch.decoder.entry_points", lambda group: [])
    with pytest.raises(ArtifactError, match=r"needs ExecuTorch: pip install './export\[executorch\]'"):
        Generator(folder, form=PTE_FORM)
    results = [r for r in check_generations(folder) if r.artifact == PTE_FORM]
    assert results and all(r.skipped and "pip install" in (r.error or "") for r in results)


def test_pte_is_built_on_request_only() -> None:
    assert "pte" not in parse_gpt_variants("all") and "pte" not in parse_gpt_variants(None)
    assert parse_gpt_variants("pte,inplace") == ("inplace", "pte")
