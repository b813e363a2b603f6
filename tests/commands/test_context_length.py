"""`mha export --gpt --context-length N`: the folder's context (cache rows, positions taken) below the model's own,
for a model of rotary positions (the Llama family: no weight depends on it); refused in one line for learned
positions (GPT-2's (context, width) matrix), above the model's context, and without --gpt."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from llama_sources import hf_family, save_family
from mha_runtime.cli.main import cli


def _run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["export", *args])
    return result.exit_code, result.stderr


def test_a_rotary_model_exports_at_a_shorter_context(tmp_path: Path) -> None:
    weights = save_family(hf_family("llama"), tmp_path / "hf")
    own = json.loads((weights.parent / "config.json").read_text())["max_position_embeddings"]
    code, err = _run("--gpt", "--weights", str(weights), "--name", "short", "--context-length", "16",
                     "--variants", "decoder", "--out", str(tmp_path / "out"))
    assert code == 0, err
    folder = tmp_path / "out" / "short"
    assert own > 16
    assert json.loads((folder / "manifest.json").read_text())["contract"]["shapes"]["context_length"] == 16
    assert json.loads((folder / "config.json").read_text())["max_position_embeddings"] == 16


@pytest.mark.parametrize(("args", "said"), [
    (("--gpt", "--preset", "gpt-mini", "--context-length", "64"), "positions are learned weights for 256 tokens"),
    (("--gpt", "--preset", "gpt-mini", "--context-length", "1000"), "1000 is more than the model's context 256"),
    (("--preset", "seed", "--context-length", "64"), "--context-length sets a decoder's cache rows: add --gpt"),
    (("--gpt", "--preset", "gpt-mini", "--context-length", "1"), "1 is not in the range x>=2"),
])
def test_refusals_are_one_line_before_any_work(args: tuple[str, ...], said: str, tmp_path: Path) -> None:
    code, err = _run(*args, "--out", str(tmp_path / "out"))
    assert code == 2 and said in err and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()
