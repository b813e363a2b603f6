"""The folder's tokenizer.json against tiktoken's own gpt2 encoding, and the folder under ONNX Runtime GenAI."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from gpt_sources import BOOK, tiktoken_gpt2, vocab_dir
from mha_export.decoder.tokenizer import read_tokenizer
from mha_runtime.artifact.errors import ConfigError
from mha_runtime.decoder.generate import Generator

TEXT = ("Hello, I am a language model.\n  Indented   spaces,\ttabs; 'quotes' we'll we've 3.14159 and 1,000,000\n"
        "Ünïcödé, 日本語, emoji 🤖 and combining e\u0301 — dashes…")


def test_hello_i_am(book_gpt: tuple[torch.nn.Module, Path]) -> None:
    assert Generator(book_gpt[1]).encode("Hello, I am") == [15496, 11, 314, 716]


def test_ids_equal_tiktokens_gpt2_encoding(book_gpt: tuple[torch.nn.Module, Path], tmp_path: Path) -> None:
    gen = Generator(book_gpt[1])
    reference = tiktoken_gpt2(tmp_path / "tiktoken")
    ids = gen.encode(TEXT)
    assert ids == reference.encode(TEXT)
    assert gen.tokenizer is not None and gen.tokenizer.decode(ids) == TEXT


def test_a_tokenizer_of_another_vocabulary_is_refused(tmp_path: Path) -> None:
    vocab = json.loads((vocab_dir() / "encoder.json").read_text())
    small = {k: v for k, v in vocab.items() if v < 1000}
    (tmp_path / "encoder.json").write_text(json.dumps(small))
    merges = (vocab_dir() / "vocab.bpe").read_text().split("\n")[:1]
    (tmp_path / "vocab.bpe").write_text("\n".join(merges) + "\n")
    with pytest.raises(ConfigError, match="a vocabulary of 1000 tokens, but the model's vocab_size is 50257"):
        read_tokenizer(tmp_path, vocab_size=BOOK.vocab_size, context_length=BOOK.context_length)


def _word_level(path: Path, vocab: dict[str, int], unk: str | None) -> Path:
    """A tokenizer.json made by `tokenizers` itself: a WordLevel vocabulary split on whitespace."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel(vocab, unk_token=unk))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(path))
    return path


@pytest.mark.parametrize(("gap", "unk", "message"), [
    # 100 tokens, one of them at id 5000: only the count used to be checked, and generate then blamed the prompt
    (True, "[UNK]", "token id 5000 is outside the model's vocabulary (ids 0..99)"),
    # no unknown token: the golden text prompt cannot be encoded (it was an "internal error" after the export's work)
    (False, None, "cannot encode the text 'Every effort moves you'"),
])
def test_a_tokenizer_that_does_not_fit_the_model_is_refused_in_one_line(tmp_path: Path, gap: bool, unk: str | None,
                                                                       message: str) -> None:
    vocab = {f"w{i}": i for i in range(99)} | {"[UNK]": 5000 if gap else 99}
    path = _word_level(tmp_path / "tokenizer.json", vocab, unk)
    with pytest.raises(ConfigError, match=re.escape(message)):
        read_tokenizer(path, vocab_size=100, context_length=16)


def test_onnxruntime_genai_runs_the_folder_with_the_same_greedy_ids(book_gpt: tuple[torch.nn.Module, Path]) -> None:
    import onnxruntime_genai as og

    folder = book_gpt[1]
    gen = Generator(folder)
    prompt = gen.encode("Hello, I am")
    ours = gen.generate([prompt], max_new_tokens=20, eos_id=None).ids[0]
    model = og.Model(str(folder))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt) + 20, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(prompt)
    theirs = []
    while not generator.is_done():
        generator.generate_next_token()
        theirs.append(int(generator.get_next_tokens()[0]))
    assert theirs == ours
    tokenizer = og.Tokenizer(model)  # reads tokenizer.json + tokenizer_config.json
    assert list(tokenizer.encode("Hello, I am")) == prompt


def _bpe_files(folder: Path, vocab: dict[str, int], merges: list[str]) -> Path:
    folder.mkdir()
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    return folder


def _bpe_json(path: Path, vocab: dict[str, int], merges: list[str]) -> Path:
    """A tokenizer.json as `tokenizers` writes a BPE model, with these vocab and merges."""
    from tokenizers import Tokenizer, models

    data = json.loads(Tokenizer(models.BPE(vocab={"a": 0}, merges=[])).to_str())
    data["model"] |= {"vocab": vocab, "merges": [m.split(" ") for m in merges]}
    path.write_text(json.dumps(data))
    return path


# Letters a..z and a few merges of them, 30 tokens: a vocabulary small enough to break by hand.
LETTERS = {chr(ord("a") + i): i for i in range(26)} | {"Ġ": 26, "ab": 27, "abc": 28, "Ġa": 29}
MERGES = ["a b", "ab c", "Ġ a"]


@pytest.mark.parametrize("make", [_bpe_files, _bpe_json], ids=["vocab.json+merges.txt", "tokenizer.json"])
@pytest.mark.parametrize(("vocab", "merges", "message"), [
    # the merged token is missing: tokenizers panicked in Rust (its lines on stderr, a PanicException past every
    # `except Exception`: a traceback)
    ({k: v for k, v in LETTERS.items() if k != "abc"}, MERGES, "merge 2 'ab c' makes 'abc', which is not in the"),
    # the part of a merge is missing: tokenizers' own line, as before
    (LETTERS, [*MERGES, "zz q"], "Token `zz` out of vocabulary"),
])
def test_a_bpe_vocabulary_its_merges_do_not_fit_is_one_line(tmp_path: Path, capfd: pytest.CaptureFixture[str],
                                                            make: object, vocab: dict[str, int], merges: list[str],
                                                            message: str) -> None:
    source = make(tmp_path / "tok.json" if make is _bpe_json else tmp_path / "bpe", vocab, merges)  # type: ignore[operator]
    with pytest.raises(ConfigError, match=re.escape(message)):
        read_tokenizer(source, vocab_size=len(vocab), context_length=16)
    assert capfd.readouterr().err == ""


def test_bpe_files_that_give_two_tokens_one_id_are_refused(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """tokenizer.json keeps one token per id: 'abc' was dropped from it, and reading it back panicked in Rust."""
    source = _bpe_files(tmp_path / "bpe", LETTERS | {"abc": 5}, MERGES)
    with pytest.raises(ConfigError, match=re.escape("vocab.json gives 'f' and 'abc' the same id 5")):
        read_tokenizer(source, vocab_size=30, context_length=16)
    assert capfd.readouterr().err == ""


@pytest.mark.parametrize(("setting", "message"), [
    ({"padding": {"length": 12}}, "it pads what it encodes (padding to length 12)"),
    ({"padding": {}}, "it pads what it encodes (padding to the longest of a batch)"),
    ({"truncation": {"max_length": 3}}, "it truncates what it encodes (max_length 3)"),
    ({"dropout": {"dropout": 0.5}}, "its BPE drops merges at random (dropout 0.5)"),
])
def test_a_tokenizer_json_that_pads_or_truncates_is_refused(tmp_path: Path, setting: dict[str, dict[str, float]],
                                                            message: str) -> None:
    """Padding and truncation saved in a tokenizer.json apply to every encode: exported as they were, `mha generate`
    padded each prompt with pad ids, or cut it, and generated from that, silently."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(_bpe_json(tmp_path / "plain.json", LETTERS, MERGES)))
    (key, options), = setting.items()
    if key == "padding":
        tok.enable_padding(pad_id=0, pad_token="a", **options)
    elif key == "truncation":
        tok.enable_truncation(**options)
    else:
        tok.model.dropout = options["dropout"]
    tok.save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(ConfigError, match=re.escape(message)):
        read_tokenizer(tmp_path / "tokenizer.json", vocab_size=30, context_length=16)
    read_tokenizer(tmp_path / "plain.json", vocab_size=30, context_length=16)  # the same without it
