"""Gemma 3, as the book's Gemma3Model builds it (ch05/12_gemma3, the bonus chapter's notebook): the token embedding
scaled by sqrt(width), RMSNorm with (1 + w) weights before and after attention and before and after the MLP, q/k
RMSNorm, queries scaled by query_pre_attn_scalar ** -0.5, GeGLU with tanh GELU, local layers (a sliding window and
their own RoPE base) beside global ones as `layer_types` says, the head tied to the token embedding or its own. The
Architecture protocol (archs/protocol.py) for it; Gemma 3 270M is one.

One package, split by concern as llama/ is: config.py (the book's config, torch-free), keys.py (the book's and
Hugging Face's weight names), hf.py (config.json in and out, the checkpoint reader), gguf_map.py (llama.cpp's keys
and tensors, both ways), model.py (the eager reference: the book's own model), graph.py (its ONNX pieces), cached.py
(gpt.pte's module). The rotary tables are the Llama family's (llama/rope.py). This module imports no torch.

Hugging Face's name is the text model's, "gemma3_text" (Gemma3ForCausalLM, and what transformers' GGUF loader makes
of a `gemma3` file); a multimodal "gemma3" config.json (Gemma3ForConditionalGeneration) is refused as an unknown
model_type, its text_config being another file's.
"""
from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from mha_export.decoder.archs.gemma3 import gguf_map, hf
from mha_export.decoder.archs.gemma3.config import GEMMA3_BOOK_KEYS, Gemma3Config
from mha_export.decoder.archs.gemma3.gguf_map import gguf_metadata, gguf_tensors, query_scalar, read_gguf
from mha_export.decoder.archs.gemma3.hf import hf_config, read_hf
from mha_export.decoder.archs.gemma3.keys import BUFFERS, HF_SIGNATURE, book_shapes, describe, hf_names
from mha_runtime.decoder.contract import GGUF_FORM, GGUF_Q4_0, GGUF_Q8_0, INPLACE_FORM, INT4_FORM, INT8_FORM

if TYPE_CHECKING:
    import numpy as np
    import torch

    from mha_export.decoder.archs.protocol import Pieces
    from mha_export.decoder.graphs.shared import Graph

__all__ = ["BUFFERS", "HF_SIGNATURE", "book_shapes", "describe", "gguf_metadata", "gguf_tensors", "hf_config",
           "hf_names", "read_gguf", "read_hf"]

NAME = "gemma3"
HF_MODEL_TYPE = "gemma3_text"
HF_CONFIG_KEY = "hidden_activation"  # Gemma3TextConfig's own among the table's (the book's has query_pre_attn_scalar)
GGUF_ARCH = "gemma3"
GENAI_TYPE = "gemma3_text"  # onnxruntime-genai 0.18's builder writes Gemma3ForCausalLM as this model type
BOOK_MODEL = "the book's Gemma3Model"
REFERENCE = f"{BOOK_MODEL} (ch05/12_gemma3)"

# ---- config
BOOK_KEYS = GEMMA3_BOOK_KEYS


def config_from_book(data: dict[str, Any]) -> Gemma3Config:
    return Gemma3Config.from_book(data)


def config_from_hf(data: dict[str, Any]) -> Gemma3Config:
    return hf.config_from_hf(data)


def config_from_gguf(fields: Mapping[str, Any]) -> Gemma3Config:
    """llama.cpp's gemma3 keys (see gguf_map.config_from_gguf)."""
    return gguf_map.config_from_gguf(fields)


# ---- weights
BOOK_LAYOUT, HF_LAYOUT = "book-gemma3", "hf-gemma3"
HF_KEYS = "Hugging Face Gemma 3 ('model.embed_tokens.weight', 'model.layers.N...')"


# ---- the model: imported where used (torch, onnx)
def eager(cfg: Gemma3Config) -> torch.nn.Module:
    """The book's Gemma3Model(cfg) in float32, its norms' epsilon the config's (gemma3/model.py)."""
    from mha_export.decoder.archs.gemma3.model import eager as build

    return build(cfg)


def graph_pieces(g: Graph, w: dict[str, np.ndarray], cfg: Gemma3Config, *, fused: bool) -> Pieces:
    from mha_export.decoder.archs.gemma3.graph import Gemma3Pieces  # type: ignore[import-not-found, unused-ignore]

    return Gemma3Pieces(g, w, cfg, fused=fused)  # type: ignore[no-any-return, unused-ignore]


def pte_module(model: torch.nn.Module, cfg: Gemma3Config) -> torch.nn.Module:
    """gpt.pte's module: the book model's weights (shared) over a cache per layer (gemma3/cached.py)."""
    from mha_export.decoder.archs.gemma3.cached import CachedGemma3

    return CachedGemma3(model, cfg)


def refusal(cfg: Gemma3Config, file: str) -> str | None:
    """Why `cfg` cannot have the form `file`: llama.cpp scales queries by the head size, not by
    query_pre_attn_scalar; its Q8_0 and Q4_0 blocks of 32 run along every matrix's input axis (emb_dim, checked for
    every architecture, the feed-forward width and n_heads * head_dim here). GroupQueryAttention's and llama.cpp's
    head-size rules are the forms' own."""
    if file in (INPLACE_FORM, INT8_FORM, INT4_FORM) and cfg.head_dim % 16:
        # ONNX Runtime 1.32's GroupQueryAttention rotates in the kernel (do_rotary) only at a head size that is a
        # multiple of 16 ("head_size shall be a multiple of 16"); the forms' own rule checks 8.
        return f"head size {cfg.head_dim} is not a multiple of 16, which GroupQueryAttention's rotary needs"
    if file in (GGUF_FORM, GGUF_Q8_0, GGUF_Q4_0):
        want = query_scalar(cfg.emb_dim, cfg.n_heads, cfg.head_dim, cfg.n_layers)
        if cfg.query_pre_attn_scalar != want:
            return (f"query_pre_attn_scalar {cfg.query_pre_attn_scalar} is not {want}, the one llama.cpp's gemma3 "
                    "scales queries by")
    if file in (GGUF_Q8_0, GGUF_Q4_0):
        for what, width in (("hidden_dim", cfg.hidden_dim), ("n_heads * head_dim", cfg.n_heads * cfg.head_dim)):
            if width % 32:
                return f"{what} {width} is not a multiple of 32, the Q8_0 and Q4_0 block"
    return None


# Gemma 3 270M beside llama.cpp on the same weights and windows (held_out.txt, 4 windows of 1,024): its Q8_0 0.00287,
# its Q4_K_M 0.00498 (docs/measurements/gemma3.md), rounded up to one significant figure. Our int8 fine plan
# measured 0.00297 there; no 4-bit plan came near Q4_K_M (best 0.078), which is mostly Q5_0 and Q8_0 on this model.
LOSSY_BARS: Mapping[int, float] = MappingProxyType({8: 3e-3, 4: 5e-3})
# Block scales in fp16 and 8-bit blocks rounded as llama.cpp's Q8_0 (lossy/scales.py): with onnxruntime's fp32
# scales the 168M-weight tied embedding alone is 9 bits a weight, and the int8 file was larger than Q8_0's
# (docs/measurements/gemma3.md).
LOSSY_SCALES = "fp16"


# ---- Hugging Face's clients: config.json as transformers' Gemma3TextConfig (gemma3/hf.py writes it)
HF_CARRIED = ("attention_dropout", "initializer_range", "bos_token_id", "eos_token_id", "pad_token_id")
HF_DEFAULTS = MappingProxyType({"bos_token_id": 2, "eos_token_id": 1})  # Gemma3TextConfig's
HF_DECIDED = MappingProxyType({"vocab_size": "vocab_size", "context_length": "max_position_embeddings",
                               "emb_dim": "hidden_size", "n_heads": "num_attention_heads",
                               "n_layers": "num_hidden_layers", "hidden_dim": "intermediate_size",
                               "n_kv_groups": "num_key_value_heads", "head_dim": "head_dim",
                               "rope_base": "rope_theta", "rope_local_base": "rope_local_base_freq",
                               "sliding_window": "sliding_window", "layer_types": "layer_types",
                               "query_pre_attn_scalar": "query_pre_attn_scalar", "rms_norm_eps": "rms_norm_eps"})
