"""`mha export --gpt` and `mha generate` as a user runs them: flags, output formats, one-line refusals."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

from gpt_sources import BOOK, book_model, hf_model, save_book, save_hf, vocab_dir

MHA = [sys.executable, "-m", "mha_runtime"]


def mha(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*MHA, *map(str, args)], capture_output=True, text=True, timeout=600)


def one_line_error(result: subprocess.CompletedProcess[str], text: str) -> None:
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and text in lines[0], result.stderr
    assert "Traceback" not in result.stderr


def test_export_book_checkpoint_with_gpt_json_and_generate_json(tmp_path: Path) -> None:
    weights = save_book(book_model(seed=4), tmp_path / "ckpt")
    (tmp_path / "gpt.json").write_text(json.dumps(BOOK.to_dict()))
    out = mha("export", "--gpt", "--config", tmp_path / "gpt.json", "--weights", weights, "--name", "mine",
              "--out", tmp_path / "art", "--variants", "decoder,inplace", "--tokenizer", vocab_dir())
    assert out.returncode == 0, out.stderr
    assert "gpt.inplace.onnx" in out.stdout and "gpt.inplace.int8.onnx" not in out.stdout
    folder = tmp_path / "art" / "mine"
    res = mha("generate", folder, "--prompt-ids", "1,2,3", "--prompt-ids", "15496,11,314,716,257",
              "--max-new-tokens", "6", "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert {"prompt_ids", "ids", "time_to_first_token_s", "tokens_per_s"} <= set(doc)
    assert doc["prompt_ids"] == [[1, 2, 3], [15496, 11, 314, 716, 257]]
    assert [len(r) for r in doc["ids"]] == [6, 6] and doc["time_to_first_token_s"] > 0
    alone = json.loads(mha("generate", folder, "--prompt-ids", "1,2,3", "--max-new-tokens", "6", "--json").stdout)
    assert alone["ids"] == doc["ids"][:1]
    text = mha("generate", folder, "--prompt", "Hello, I am", "--max-new-tokens", "5")
    assert text.returncode == 0 and text.stdout.startswith("Hello, I am"), text.stderr
    summary = text.stderr.strip().splitlines()[-1]
    assert "5 tokens, time to first token" in summary and summary.endswith("; greedy)"), summary  # no seed drawn


def test_export_hf_checkpoint_finds_config_json_beside_it(tmp_path: Path) -> None:
    weights = save_hf(hf_model(seed=8), tmp_path / "hf", safetensors=True)
    out = mha("export", "--gpt", "--weights", weights, "--name", "hf", "--out", tmp_path / "art",
              "--variants", "decoder")
    assert out.returncode == 0, out.stderr
    assert "no tokenizer" in out.stderr
    res = mha("generate", tmp_path / "art" / "hf", "--prompt", "Hello")
    one_line_error(res, "has no tokenizer")


def test_generate_refusals_are_one_line(book_gpt: tuple[torch.nn.Module, Path]) -> None:
    folder = book_gpt[1]
    for args, text in [(["--prompt-ids", "1,50257"], "outside the vocabulary"),
                       (["--prompt-ids", ""], "empty prompt"),
                       (["--prompt-ids", ",".join(["5"] * 49)], "longer than context_length 48"),
                       (["--prompt-ids", "1,two"], "expected comma-separated integers"),
                       (["--prompt-ids", "1", "--top-k", "0"], "top_k"),
                       (["--prompt-ids", "1", "--temperature", "-1"], "temperature"),
                       (["--prompt-ids", "1", "--max-new-tokens", "0"], "max_new_tokens")]:
        res = mha("generate", folder, *args)
        one_line_error(res, text)
        assert res.stdout == ""
    one_line_error(mha("generate", folder.parent / "nothing", "--prompt-ids", "1"), "expected a folder")


def test_export_refusals_are_one_line(tmp_path: Path) -> None:
    (tmp_path / "gpt.json").write_text(json.dumps(BOOK.to_dict() | {"emb_dim": 66}))
    one_line_error(mha("export", "--gpt", "--config", tmp_path / "gpt.json", "--name", "x", "--out", tmp_path),
                   "emb_dim 66 is not divisible by n_heads 4")
    (tmp_path / "gpt.json").write_text(json.dumps(BOOK.to_dict() | {"context_length": 100000}))
    one_line_error(mha("export", "--gpt", "--config", tmp_path / "gpt.json", "--name", "x", "--out", tmp_path),
                   "context_length")
    one_line_error(mha("export", "--gpt", "--preset", "nope"), "unknown GPT preset 'nope'")
    tok = tmp_path / "tok.json"
    tok.write_text("{not json")
    one_line_error(mha("export", "--gpt", "--preset", "gpt-mini", "--tokenizer", tok, "--out", tmp_path),
                   "cannot read it as a GPT-2 tokenizer")
    assert not (tmp_path / "gpt-mini").exists()


def test_attention_commands_on_a_gpt_folder_point_to_generate(book_gpt: tuple[torch.nn.Module, Path]) -> None:
    shown = mha("inspect", book_gpt[1])  # inspect knows GPT folders: their forms and how each was judged
    assert shown.returncode == 0 and "gpt.inplace.int4.onnx" in shown.stdout, shown.stderr
    checked = mha("check", book_gpt[1])  # check knows GPT folders: their golden generations
    assert checked.returncode == 0 and checked.stdout.strip().splitlines()[-1].endswith("passed, 0 failed")
