"""The quality windows of a tokenizer that puts BOS first (Gemma's): each starts with BOS, as llama-perplexity runs
its chunks for a GGUF that adds one (tools/perplexity/perplexity.cpp: BOS prepended to the whole text, then each
chunk's first token overwritten with it), so that a folder's windows are llama.cpp's token for token; one without
(SmolLM2's) is cut as it was. The tokenizers library's TemplateProcessing puts the BOS, as tokenizer.json does."""
from __future__ import annotations

from types import SimpleNamespace
from typing import cast

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, processors

from mha_export.decoder.archs.protocol import DecoderConfig
from mha_export.decoder.lossy.build import HELD_OUT_TEXT, TEXT_TOKENS, quality_windows

BOS = 2


def _tokenizer(bos: bool) -> Tokenizer:
    """Every byte of the text its own token (ids from 3 on), <bos> = 2 put first by the post-processor if `bos`."""
    text = HELD_OUT_TEXT.read_text(encoding="utf-8")
    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": BOS} | {c: 3 + i for i, c in enumerate(sorted(set(text)))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")  # every character a word
    if bos:
        tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", BOS)])
    return tok


@pytest.mark.parametrize("bos", [True, False])
def test_every_window_starts_as_llama_perplexity_starts_its_chunk(bos: bool) -> None:
    tok = _tokenizer(bos)
    cfg = cast(DecoderConfig, SimpleNamespace(arch="gemma3", context_length=256))  # all quality_windows reads
    windows = quality_windows(cfg, lambda text: list(tok.encode(text).ids))
    width = len(windows.ids[0])
    assert width == 256 and len(windows.ids) == -(-TEXT_TOKENS // width)
    plain = list(tok.encode(HELD_OUT_TEXT.read_text(encoding="utf-8").removesuffix("\n"),
                            add_special_tokens=False).ids)
    tokens = [BOS, *plain] if bos else plain  # perplexity.cpp: tokenized with add_special where the GGUF adds BOS
    chunks = [tokens[i * width:(i + 1) * width] for i in range(len(windows.ids))]
    if bos:
        chunks = [[BOS, *c[1:]] for c in chunks]
    assert windows.ids == chunks
    assert all(w[0] == BOS for w in windows.ids) == bos
