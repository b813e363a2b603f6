"""The export's eager reference for the Llama family (archs/llama/model.py, a rebuild so the export needs no package
of the book's) against the book's own Llama3Model and Qwen3Model (llms_from_scratch): the same state_dict keys, and
the same logits from the same weights."""
from __future__ import annotations

from typing import Any

import pytest
import torch

from mha_export.decoder.archs import config_from_dict
from mha_export.decoder.eager import seeded_gpt

LLAMA: dict[str, Any] = {"vocab_size": 97, "context_length": 64, "emb_dim": 64, "n_heads": 4, "n_layers": 2,
                         "hidden_dim": 96, "n_kv_groups": 2, "rope_base": 500_000.0, "dtype": "bfloat16",
                         "rope_freq": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                       "original_context_length": 16}}
QWEN3: dict[str, Any] = {"vocab_size": 97, "context_length": 64, "emb_dim": 64, "n_heads": 4, "n_layers": 2,
                         "hidden_dim": 96, "head_dim": 32, "qk_norm": True, "n_kv_groups": 1,
                         "rope_base": 1_000_000.0, "dtype": "bfloat16"}


def _book(doc: dict[str, Any]) -> torch.nn.Module:
    cfg = dict(doc, dtype=torch.float32)
    if "qk_norm" in doc:
        from llms_from_scratch.qwen3 import Qwen3Model

        return Qwen3Model(cfg)
    from llms_from_scratch.llama3 import Llama3Model

    return Llama3Model(cfg)


@pytest.mark.parametrize("doc", [LLAMA, QWEN3], ids=["llama", "qwen3"])
def test_the_rebuild_is_the_books_model(doc: dict[str, Any]) -> None:
    ours = seeded_gpt(config_from_dict(doc))
    book = _book(doc).eval()
    state = ours.state_dict()
    assert set(state) == set(book.state_dict())
    with torch.no_grad():  # norms off 1 so that a norm applied to the wrong tensor shows
        for name, tensor in state.items():
            if "norm" in name:
                tensor.uniform_(0.5, 1.5)
    book.load_state_dict(state)
    ids = torch.randint(0, doc["vocab_size"], (2, 40), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        got, want = ours(ids), book(ids)
    # float reassociation only (the rotary tables in float64 here, the book's in float32): measured 8.3e-7 (llama) and
    # 4.8e-7 (qwen3) on logits up to 2.2
    assert torch.allclose(got, want, atol=1e-5, rtol=0), (got - want).abs().max()
