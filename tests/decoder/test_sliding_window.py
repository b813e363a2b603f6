"""The decoder graphs' sliding window (Layer.window), family-free: transformers' MinistralForCausalLM (Llama's
blocks and keys, with `layer_types` alternating sliding-window and full layers) with random weights is the reference,
its weights read onto the book's Llama keys and built by the Llama family's pieces with each layer's window. Both
forms' logits equal transformers' (each prefix run alone, no cache) for a prompt longer than the window, a batch of
left-padded prompts of three lengths, and token-by-token decoding well past the window; and without the window they
do not (so the window is what made them equal)."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import pytest
import torch

import mha_export.decoder.archs.llama as llama
from mha_export.decoder.archs.llama.config import LlamaConfig
from mha_export.decoder.archs.llama.graph import LlamaPieces
from mha_export.decoder.archs.llama.keys import hf_names
from mha_export.decoder.graphs.concat import concat_model
from mha_export.decoder.graphs.inplace import inplace_model
from mha_export.decoder.graphs.shared import Built, Layer
from mha_runtime.decoder.decoder import Decoder, decoder_for, make_session
from mha_runtime.decoder.shapes import DecoderShapes

WINDOW = 4
LAYER_TYPES = ("sliding_attention", "full_attention", "sliding_attention")
HF = {"vocab_size": 61, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 3, "num_attention_heads": 4,
      "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 48, "rms_norm_eps": 1e-5,
      "sliding_window": WINDOW, "layer_types": list(LAYER_TYPES),
      "rope_parameters": {"rope_type": "default", "rope_theta": 10_000.0}, "tie_word_embeddings": False}
CFG = LlamaConfig(vocab_size=61, context_length=48, emb_dim=64, n_heads=4, n_layers=3, hidden_dim=96, n_kv_groups=2,
                  rope_base=10_000.0, rms_norm_eps=1e-5)
# Three lengths, each longer than the window (a left-padded batch: 13 and 9 tokens pad to 16).
PROMPTS = [[5, 17, 42, 8, 60, 3, 33, 12, 9, 50, 27, 44, 2], [7, 1, 19, 23, 40, 11, 6, 58, 30],
           [12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32, 34, 36, 38, 40, 42]]
FOLLOW = [3, 9, 27, 21, 5, 15, 45, 15, 47, 23, 11, 33]  # fed token by token after each prompt (teacher forcing)
TOL = 1e-4


@pytest.fixture(scope="module")
def ministral() -> torch.nn.Module:
    """transformers' MinistralForCausalLM, every parameter random (the norms around 1), eager attention."""
    import transformers

    config = transformers.MinistralConfig(**HF)
    config._attn_implementation = "eager"
    torch.manual_seed(5)
    model = transformers.MinistralForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1 + 0.3 * torch.randn_like(p) if "norm" in name else 0.15 * torch.randn_like(p))
    return model


def _windowed(windows: tuple[int | None, ...]) -> Callable[..., LlamaPieces]:
    """The Llama family's graph_pieces with Layer.window set per layer."""

    class Windowed(LlamaPieces):
        def add_weights(self) -> list[Layer]:
            return [dataclasses.replace(layer, window=w) for layer, w in zip(super().add_weights(), windows,
                                                                             strict=True)]

    return lambda g, w, cfg, *, fused: Windowed(g, w, cfg, fused=fused)


def _decoders(model: torch.nn.Module, windows: tuple[int | None, ...], monkeypatch: pytest.MonkeyPatch
              ) -> dict[str, Decoder]:
    """Both forms of the model's weights (the book's keys), each layer with its window, as the runtime's decoders."""
    hf = model.state_dict()
    state = {book: hf[name] for book, name in hf_names(CFG, "model.").items()}
    monkeypatch.setattr(llama, "graph_pieces", _windowed(windows))
    built: dict[str, Built] = {"concat": concat_model(state, CFG, tied=False),
                               "inplace": inplace_model(state, CFG, tied=False)}
    return {kind: decoder_for(kind, make_session(b.full().SerializeToString()), DecoderShapes.of(CFG), kind)
            for kind, b in built.items()}


def _reference(model: torch.nn.Module, ids: list[int]) -> np.ndarray:
    """(V,) transformers' next-token logits after `ids`, the whole prefix run at once (no cache)."""
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0, -1].numpy()


def _worst(decoder: Decoder, model: torch.nn.Module, prompts: list[list[int]]) -> float:
    """The largest |ours - transformers'| over the prompts' prefill and every FOLLOW step, all rows at once."""
    got = decoder.prefill(prompts)  # (B, V)
    worst = max(float(np.abs(got[r] - _reference(model, p)).max()) for r, p in enumerate(prompts))
    for n, token in enumerate(FOLLOW):
        got = decoder.step([token] * len(prompts), [True] * len(prompts))
        worst = max(worst, *(float(np.abs(got[r] - _reference(model, [*p, *FOLLOW[:n + 1]])).max())
                             for r, p in enumerate(prompts)))
    return worst


@pytest.mark.parametrize("kind", ["concat", "inplace"])
@pytest.mark.parametrize("batch", [False, True], ids=["alone", "left-padded-batch"])
def test_a_windowed_layer_sees_the_last_w_positions_as_transformers(
        kind: str, batch: bool, ministral: torch.nn.Module, monkeypatch: pytest.MonkeyPatch) -> None:
    windows = tuple(WINDOW if t == "sliding_attention" else None for t in LAYER_TYPES)
    decoder = _decoders(ministral, windows, monkeypatch)[kind]
    groups = [PROMPTS] if batch else [[p] for p in PROMPTS]
    worst = max(_worst(decoder, ministral, prompts) for prompts in groups)
    print(f"{kind} {'batch' if batch else 'alone'}: max |logits - transformers'| {worst:.2e}")
    assert worst <= TOL


@pytest.mark.parametrize("kind", ["concat", "inplace"])
def test_without_the_window_the_logits_differ(kind: str, ministral: torch.nn.Module,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The same weights with every layer global: past the window the logits are not transformers'."""
    decoder = _decoders(ministral, (None,) * len(LAYER_TYPES), monkeypatch)[kind]
    assert _worst(decoder, ministral, [PROMPTS[0]]) > 100 * TOL
