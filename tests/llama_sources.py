"""Llama-family checkpoints made by the library that defines them, for the llama/qwen3 tests: transformers'
LlamaForCausalLM and Qwen3ForCausalLM with random weights (the norms too, which init at ones and would hide a
swapped or missing norm), saved by save_pretrained. Small shapes keep the suite fast.

- HF_LLAMA: grouped-query attention (4 query heads over 2 key/value heads), Llama 3's RoPE frequency scaling with
  three frequencies between its bounds, an RMSNorm epsilon the book does not hard-code (1e-4), an untied head.
- HF_QWEN3: q/k norms, head_dim 16 = 2 * hidden_size / heads, grouped-query attention, a tied head, epsilon 1e-5.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 10_000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 16.0, "original_max_position_embeddings": 256}
HF_LLAMA: dict[str, Any] = {
    "vocab_size": 97, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "max_position_embeddings": 512, "rms_norm_eps": 1e-4, "rope_parameters": LLAMA3_ROPE,
    "tie_word_embeddings": False}
HF_QWEN3: dict[str, Any] = {
    "vocab_size": 89, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 48, "rms_norm_eps": 1e-5,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1_000_000.0}, "tie_word_embeddings": True}


def hf_family(arch: str, seed: int = 11, **changes: Any) -> torch.nn.Module:
    """transformers' LlamaForCausalLM ("llama") or Qwen3ForCausalLM ("qwen3"), every parameter random, eval mode,
    eager attention."""
    import transformers

    if arch == "llama":
        config = transformers.LlamaConfig(**(HF_LLAMA | changes))
        cls: Any = transformers.LlamaForCausalLM
    else:
        config = transformers.Qwen3Config(**(HF_QWEN3 | changes))
        cls = transformers.Qwen3ForCausalLM
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = cls(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                p.copy_(1 + 0.3 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.15)
    return model


def save_family(model: torch.nn.Module, folder: Path, *, safetensors: bool = True) -> Path:
    """save_pretrained (model.safetensors, config.json); or the state_dict as pytorch_model.bin (transformers 5 no
    longer writes it: it was torch.save of the state_dict, a tied lm_head.weight included)."""
    model.save_pretrained(folder)
    if safetensors:
        return folder / "model.safetensors"
    (folder / "model.safetensors").unlink()
    torch.save(model.state_dict(), folder / "pytorch_model.bin")
    return folder / "pytorch_model.bin"
