"""Gemma 3's eager reference (archs/gemma3/model.py, the book's Gemma3Model rebuilt) against transformers'
Gemma3ForCausalLM: a random checkpoint read through the architecture's config.json and weight readers gives
transformers' logits on a prompt longer than the sliding window, and transformers' greedy tokens (its generate runs
a sliding-window cache); the GGUF tensors round-trip; gpt.pte's cached module is the eager model."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from gemma3_folders import HF_GEMMA3, hf_gemma3, save_gemma3
from mha_export.decoder.archs import ARCHS, config_from_dict
from mha_export.decoder.weights import read_gpt_weights

GEMMA3 = ARCHS["gemma3"]
PROMPT = 20  # tokens: past the window of 8
NEW = 16
LOGITS_ATOL = 1e-5


def _ours(folder: Path) -> tuple[torch.nn.Module, object]:
    cfg = config_from_dict(json.loads((folder / "config.json").read_text()))
    read = read_gpt_weights(folder / "model.safetensors", cfg)
    assert (read.layout, read.tied) == (GEMMA3.HF_LAYOUT, True)
    model = GEMMA3.eager(cfg).eval()
    model.load_state_dict(read.state, strict=True)
    return model, cfg


def test_a_transformers_checkpoint_in_the_books_model_gives_its_logits(tmp_path: Path) -> None:
    hf = hf_gemma3()
    save_gemma3(hf, tmp_path)
    ours, cfg = _ours(tmp_path)
    assert cfg.layer_types == tuple(HF_GEMMA3["layer_types"]) and cfg.sliding_window == 8
    ids = torch.randint(0, cfg.vocab_size, (2, PROMPT), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        got, want = ours(ids), hf(ids).logits
    worst = (got - want).abs().max().item()
    assert worst <= LOGITS_ATOL, worst
    assert want.abs().max().item() > 1.0  # the logits are not all near zero
    # The window matters: the same model without one gives other logits past position 8.
    hf_full = hf_gemma3(layer_types=["full_attention"] * 4)
    with torch.no_grad():
        assert (hf_full(ids).logits[:, 9:] - want[:, 9:]).abs().max().item() > 1e-2


def test_greedy_tokens_are_transformers(tmp_path: Path) -> None:
    hf = hf_gemma3(seed=5)
    save_gemma3(hf, tmp_path)
    ours, _ = _ours(tmp_path)
    prompt = torch.randint(3, HF_GEMMA3["vocab_size"], (1, PROMPT), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        want = hf.generate(prompt, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False)[0, PROMPT:].tolist()
        ids = prompt
        for _ in range(NEW):
            ids = torch.cat([ids, ours(ids)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert ids[0, PROMPT:].tolist() == want
    assert len(set(want)) > 1  # not one token repeated


def test_gguf_tensors_round_trip(tmp_path: Path) -> None:
    """read_gguf(gguf_tensors(state)) is the state: every matrix exactly, every norm within float32's rounding of
    1 + w (2^-24), and exactly where w is a multiple of 2^-23 (as bfloat16 weights of magnitude 2^-16 and up are)."""
    hf = hf_gemma3(tie_word_embeddings=False)
    save_gemma3(hf, tmp_path)
    cfg = config_from_dict(json.loads((tmp_path / "config.json").read_text()))
    state = read_gpt_weights(tmp_path / "model.safetensors", cfg).state
    tensors = GEMMA3.gguf_tensors(state, cfg, tied=False)
    assert "output.weight" in tensors and np.allclose(tensors["blk.0.attn_norm.weight"],
                                                      1 + state["blocks.0.input_layernorm.scale"].numpy())
    back, tied = GEMMA3.read_gguf(tensors, cfg)
    assert not tied and set(back) == set(state)
    for key, tensor in state.items():
        if key.endswith(".scale"):
            assert (back[key] - tensor).abs().max().item() <= 2.0 ** -24, key
        else:
            assert torch.equal(back[key], tensor), key
    coarse = {k: (v * 2 ** 16).round() / 2 ** 16 if k.endswith(".scale") else v for k, v in state.items()}
    back, _ = GEMMA3.read_gguf(GEMMA3.gguf_tensors(coarse, cfg, tied=False), cfg)
    assert all(torch.equal(back[k], v) for k, v in coarse.items())


def test_the_cached_module_is_the_eager_model_past_the_window(tmp_path: Path) -> None:
    """gpt.pte's module (CachedGemma3) against the eager model: a prompt prefilled in two calls, greedy steps to
    position 19 (past the window of 8 on the local layers), then a second sequence from position 0 over the first
    one's stale rows. Measured 2.6e-6 (and 3.1e-6 through ExecuTorch's XNNPACK lowering, 212 s: not run here)."""
    save_gemma3(hf_gemma3(seed=7), tmp_path)
    ours, cfg = _ours(tmp_path)
    cached = GEMMA3.pte_module(ours, cfg).eval()
    worst = 0.0
    with torch.no_grad():
        for prompt in ([5, 9, 3, 7, 11, 2, 4, 8, 10, 12, 6], [7] * 6):
            ids = list(prompt)
            cached(torch.tensor([ids[:4]]), torch.tensor([0]))
            out = cached(torch.tensor([ids[4:]]), torch.tensor([4]))
            while len(ids) < PROMPT:
                want = ours(torch.tensor([ids]))[0, -1]
                worst = max(worst, (out[0] - want).abs().max().item())
                ids.append(int(want.argmax()))
                out = cached(torch.tensor([ids[-1:]]), torch.tensor([len(ids) - 1]))
    assert worst <= LOGITS_ATOL, worst
