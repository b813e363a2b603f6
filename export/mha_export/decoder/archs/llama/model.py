"""The Llama family's eager reference: the book's own Llama3Model and Qwen3Model (llms_from_scratch.llama3,
.qwen3, the PyPI package `make venv` installs), built from the config's book dict in float32.

The export computes in float32 whatever the config's `dtype` says (it is informational: the book's configs name
bfloat16 for memory). Where the book hard-codes what the config may differ in, the built model is set to the
config's value after building: the RMSNorm epsilon (Llama3Model's torch.nn.RMSNorm 1e-5, Qwen3Model's own RMSNorm
1e-6; a Hugging Face or GGUF config says its own, SmolLM2's 1e-5, Llama 3.2's 1e-5, Qwen3's 1e-6). The book's
Llama3Model applies Llama 3's frequency scaling when `rope_freq` is given; its Qwen3Model has none (refused by the
config readers).
"""
from __future__ import annotations

from typing import Any

import torch

from mha_export.decoder.archs.llama.config import RotaryConfig


def book_dict(cfg: RotaryConfig) -> dict[str, Any]:
    """The config as the book's model reads it: its keys, dtype a torch dtype (float32), without rms_norm_eps
    (the book's models do not read it)."""
    data = cfg.to_dict()
    data.pop("rms_norm_eps", None)
    return data | {"dtype": torch.float32}


def eager(cfg: RotaryConfig) -> torch.nn.Module:
    """The book's Llama3Model or Qwen3Model for `cfg`, initialised by the global torch seed (the caller seeds it),
    its norms' epsilon the config's."""
    if cfg.arch == "qwen3":
        from llms_from_scratch.qwen3 import Qwen3Model

        model: torch.nn.Module = Qwen3Model(book_dict(cfg))
    else:
        from llms_from_scratch.llama3 import Llama3Model

        model = Llama3Model(book_dict(cfg))
    for module in model.modules():  # torch.nn.RMSNorm (Llama3Model) and the book's RMSNorm both keep `eps`
        if hasattr(module, "eps") and (isinstance(module, torch.nn.RMSNorm) or type(module).__name__ == "RMSNorm"):
            module.eps = cfg.norm_eps
    return model
