"""`make demo` (examples.demo.train) on a tiny setting: deterministic weights, a falling loss, the plot, the
losses and a GPT folder that `mha check` passes; a second run trains nothing; bad flags are one line."""
from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from examples.demo.train import NAME, TRAIN_DIR, BookTokenizer, Settings, train, up_to_date
from gpt_sources import vocab_dir
from mha_export.decoder.corpus import SEPARATOR, pydoc_topics
from mha_export.decoder.tokenizer import read_tokenizer
from mha_runtime.artifact.manifest import sha256_file

# About 2,000 tokens: 1 layer of width 16, 28 steps of 2 x 32 tokens; 1 thread (also deterministic). Context 32:
# the golden text prompt (4 tokens) must fit beside the 16 new tokens.
TINY = Settings(emb_dim=16, n_layers=1, n_heads=2, context_length=32, batch_size=2, epochs=1, lr=5e-3,
                eval_freq=4, eval_iter=2, threads=1, max_chars=8000)
TINY_FLAGS = ["--emb-dim", "16", "--layers", "1", "--heads", "2", "--context", "32", "--batch-size", "2",
              "--epochs", "1", "--lr", "5e-3", "--eval-freq", "4", "--eval-iter", "2", "--threads", "1",
              "--max-chars", "8000", "--variants", "decoder,inplace", "--max-new-tokens", "8"]
DEMO = [sys.executable, "-m", "examples.demo.train"]


def demo(*args: object) -> subprocess.CompletedProcess[str]:
    """examples/ is not installed: run from the checkout, as `make demo` does."""
    return subprocess.run([*DEMO, *map(str, args)], capture_output=True, text=True, timeout=600,
                          cwd=Path(__file__).resolve().parents[2])


def tokenizer() -> BookTokenizer:
    return BookTokenizer(read_tokenizer(vocab_dir(), vocab_size=50257, context_length=16).tokenizer_json)


def test_the_text_is_cpython_topics_with_endoftext_between() -> None:
    corpus = pydoc_topics()
    import pydoc_data.topics as topics

    assert corpus.text.count(SEPARATOR) == len(topics.topics) - 1
    assert corpus.source["module"] == "pydoc_data.topics" and "Python Software Foundation" in corpus.source["licence"]
    ids = tokenizer().encode(corpus.text[:2000])
    assert 50256 in tokenizer().encode("a" + SEPARATOR + "b") and len(ids) > 300


def test_training_is_deterministic_and_its_loss_falls() -> None:
    corpus, tok = pydoc_topics(TINY.max_chars), tokenizer()
    first, second = train(TINY, corpus, tok, log=io.StringIO()), train(TINY, corpus, tok, log=io.StringIO())
    a, b = first.model.state_dict(), second.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert first.losses == {**second.losses, "wall_s": first.losses["wall_s"], "cpu_s": first.losses["cpu_s"]}
    train_losses, val_losses = first.losses["train_losses"], first.losses["val_losses"]
    assert train_losses[-1] < train_losses[0] - 0.5 and val_losses[-1] < val_losses[0]
    assert torch.get_num_threads() >= 1 and not torch.are_deterministic_algorithms_enabled()  # restored


def test_demo_writes_plot_losses_and_a_folder_mha_check_passes(tmp_path: Path) -> None:
    out = tmp_path / "art"
    res = demo("--out", out, *TINY_FLAGS)
    assert res.returncode == 0, res.stderr
    assert "--- greedy:" in res.stdout and "seed 123:" in res.stdout and "final loss" in res.stdout
    train_dir, folder = out / TRAIN_DIR, out / NAME
    assert (train_dir / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    losses = json.loads((train_dir / "losses.json").read_text())
    assert len(losses["train_losses"]) == len(losses["val_losses"]) == len(losses["steps"]) > 2
    settings = json.loads((train_dir / "settings.json").read_text())
    assert settings["text"]["sha256"] and settings["weights_sha256"] == sha256_file(train_dir / "model.pth")
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["weights"]["sha256"] == settings["weights_sha256"]  # the folder is these weights
    assert manifest["config"]["emb_dim"] == 16 and (folder / "tokenizer.json").is_file()
    check = subprocess.run([sys.executable, "-m", "mha_runtime", "check", folder], capture_output=True, text=True,
                           timeout=600)
    assert check.returncode == 0 and check.stdout.strip().endswith(" 0 failed"), check.stdout + check.stderr

    before = (folder / "manifest.json").read_bytes()
    again = demo("--out", out, *TINY_FLAGS)
    assert again.returncode == 0, again.stderr
    assert "training skipped" in again.stdout and "export skipped" in again.stdout
    assert (folder / "manifest.json").read_bytes() == before
    assert again.stdout.split("--- greedy:")[1] == res.stdout.split("--- greedy:")[1]  # the same sample
    digest = settings["settings_hash"]
    assert up_to_date(out, digest, {"gpt.onnx"}) == (True, True)
    assert up_to_date(out, digest, {"gpt.inplace.int8.onnx"}) == (True, False)  # a form it lacks: export again
    assert up_to_date(out, "0" * 64, {"gpt.onnx"}) == (False, False)  # other settings: train again


@pytest.mark.parametrize(("flags", "text"), [
    (["--emb-dim", "24", "--heads", "4"], "multiple of 8"),
    (["--epochs", "0"], "--epochs: expected a positive integer"),
    (["--lr", "2"], "--lr: expected a learning rate"),
    (["--bogus"], "No such option '--bogus'"),
    (["--max-chars", "50", "--variants", "decoder"], "training and"),
    (["--variants", "nope"], "--variants"),
])
def test_bad_flags_are_one_line(tmp_path: Path, flags: list[str], text: str) -> None:
    res = demo("--out", tmp_path / "art", *flags)
    assert res.returncode != 0
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and text in lines[0], res.stderr
    assert not (tmp_path / "art" / TRAIN_DIR).exists()
