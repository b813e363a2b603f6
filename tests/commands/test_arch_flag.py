"""`mha export --gpt --arch NAME`: the architecture of a config whose keys do not name it (the book's dict), checked
against what comes with the config or the weights; an unknown name, or one that disagrees, is one line, exit 2,
nothing written."""
from __future__ import annotations

import json
import types
from pathlib import Path

import pytest
from click.testing import CliRunner

from mha_export.decoder import archs
from mha_runtime.cli.main import cli

BOOK_DICT = {"vocab_size": 300, "context_length": 16, "emb_dim": 16, "n_heads": 2, "n_layers": 1}


def _export(*args: object) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["export", "--gpt", *map(str, args)])
    return result.exit_code, result.output


def _one_line(code: int, out: str, want: int, *texts: str) -> None:
    lines = out.strip().splitlines()
    assert code == want and len(lines) == 1 and lines[0].startswith("Error: "), out
    for text in texts:
        assert text in lines[0], lines[0]


def test_an_unknown_arch_names_the_supported_ones(tmp_path: Path) -> None:
    code, out = _export("--arch", "mamba", "--preset", "gpt-mini", "--out", tmp_path / "out")
    _one_line(code, out, 2, "unknown architecture: arch 'mamba'", "supported: gpt2")
    assert not (tmp_path / "out").exists()


def test_arch_names_the_architecture_of_the_books_keys(tmp_path: Path) -> None:
    """The book's config dict with --arch gpt2 exports as GPT-2 (the manifest's contract says so)."""
    config = tmp_path / "gpt.json"
    config.write_text(json.dumps(BOOK_DICT))
    code, out = _export("--arch", "gpt2", "--config", config, "--name", "x", "--variants", "decoder",
                        "--out", tmp_path / "out")
    assert code == 0, out
    manifest = json.loads((tmp_path / "out" / "x" / "manifest.json").read_text())
    assert manifest["contract"]["shapes"]["arch"] == "gpt2"


@pytest.mark.parametrize("source", ["preset", "hf-config"])
def test_an_arch_that_disagrees_with_what_names_one_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               source: str) -> None:
    """A preset and a Hugging Face config.json name their architecture (gpt2): another --arch (a second
    architecture in the table for the test) is one line naming both, exit 2, nothing written."""
    other = types.SimpleNamespace(NAME="other", HF_MODEL_TYPE="other", GGUF_ARCH="other")
    monkeypatch.setattr(archs, "ARCHS", {**archs.ARCHS, "other": other})
    hf = tmp_path / "config.json"
    hf.write_text(json.dumps({"model_type": "gpt2", "vocab_size": 300, "n_positions": 16, "n_embd": 16,
                              "n_head": 2, "n_layer": 1}))
    given = (["--preset", "gpt-mini"] if source == "preset" else ["--config", hf, "--name", "x"])
    code, out = _export("--arch", "other", *given, "--out", tmp_path / "out")
    _one_line(code, out, 2, "'--arch'", "other disagrees with", "(gpt2)")
    assert not (tmp_path / "out").exists()
