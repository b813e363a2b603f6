"""Gemma 3 checkpoints made by the library that defines it, for the gemma3 tests: transformers' Gemma3ForCausalLM
with random weights (the norms too, which init at zero and would hide a swapped or missing norm), saved by
save_pretrained. Small shapes keep the suite fast.

HF_GEMMA3: four layers, local and global ones (window 8, local RoPE base 10,000, global 1,000,000), grouped-query
attention (4 query heads over 2 key/value heads of 16), query_pre_attn_scalar 24 (not the head size, so a scaling by
head_dim shows), an RMSNorm epsilon the book does not hard-code (1e-5), a tied head.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

LAYER_TYPES = ["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"]
HF_GEMMA3: dict[str, Any] = {
    "vocab_size": 101, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 64,
    "rms_norm_eps": 1e-5, "sliding_window": 8, "layer_types": LAYER_TYPES, "query_pre_attn_scalar": 24,
    "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
                        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}},
    "tie_word_embeddings": True, "pad_token_id": 0, "bos_token_id": 2, "eos_token_id": 1}


def hf_gemma3(seed: int = 11, **changes: Any) -> torch.nn.Module:
    """transformers' Gemma3ForCausalLM, every parameter random (norms' zero-centred w around 0), eval mode, eager
    attention, float32."""
    import transformers

    config = transformers.Gemma3TextConfig(**(HF_GEMMA3 | changes))
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = transformers.Gemma3ForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(0.0, 0.3 if name.endswith("norm.weight") else 0.15)
    return model


def save_gemma3(model: torch.nn.Module, folder: Path) -> Path:
    """save_pretrained: model.safetensors and config.json."""
    model.save_pretrained(folder)
    return folder / "model.safetensors"
