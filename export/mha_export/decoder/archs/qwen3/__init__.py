"""Qwen3, as the book's Qwen3Model builds it (llms_from_scratch.qwen3): the Llama family (archs/llama/) with RMSNorm
on each head's queries and keys before the rotation (qk_norm), a head size of its own (head_dim, which need not be
emb_dim / n_heads), no RoPE scaling, the book's own RMSNorm (`scale`) and epsilon 1e-6. The Architecture protocol
(archs/protocol.py) for it: its names, config readers and Hugging Face / GGUF names here; every computation is the
family's (llama/'s modules branch on the config's arch and qk_norm). llama.cpp's qwen3 rotates halves, as the book
does: its q/k rows are not permuted.
"""
from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from mha_export.decoder.archs.llama import (
    BUFFERS,
    HF_SIGNATURE,
    LOSSY_BARS,
    LOSSY_SCALES,
    book_shapes,
    describe,
    eager,
    gguf_map,
    gguf_metadata,
    gguf_tensors,
    graph_pieces,
    hf,
    hf_config,
    hf_names,
    pte_module,
    read_gguf,
    read_hf,
    refusal,
)
from mha_export.decoder.archs.llama.config import QWEN3_BOOK_KEYS, Qwen3Config, RotaryConfig

__all__ = ["BUFFERS", "HF_SIGNATURE", "LOSSY_BARS", "LOSSY_SCALES", "book_shapes", "describe", "eager",
           "gguf_metadata", "gguf_tensors", "graph_pieces", "hf_config", "hf_names", "pte_module", "read_gguf",
           "read_hf", "refusal"]

NAME = "qwen3"
HF_MODEL_TYPE = "qwen3"
HF_CONFIG_KEY = "max_window_layers"  # Qwen3Config's own among the family (LlamaConfig has none)
GGUF_ARCH = "qwen3"
GENAI_TYPE = "qwen3"  # onnxruntime-genai 0.18's decoder-only model type, over the config's per-layer names
BOOK_MODEL = "the book's Qwen3Model"
REFERENCE = f"{BOOK_MODEL} (llms_from_scratch.qwen3)"

# ---- config
BOOK_KEYS = QWEN3_BOOK_KEYS


def config_from_book(data: dict[str, Any]) -> Qwen3Config:
    return Qwen3Config.from_book(data)


def config_from_hf(data: dict[str, Any]) -> RotaryConfig:
    return hf.config_from_hf(data, NAME)


def config_from_gguf(fields: Mapping[str, Any]) -> RotaryConfig:
    return gguf_map.config_from_gguf(fields, GGUF_ARCH)


# ---- weights
BOOK_LAYOUT, HF_LAYOUT = "book-qwen3", "hf-qwen3"
HF_KEYS = "Hugging Face Qwen3 ('model.embed_tokens.weight', 'model.layers.N...')"

# ---- Hugging Face's clients: config.json as transformers' Qwen3Config (llama/hf.py writes it)
HF_CARRIED = ("attention_dropout", "initializer_range", "bos_token_id", "eos_token_id", "pad_token_id")
HF_DEFAULTS: Mapping[str, int | None] = MappingProxyType({"bos_token_id": None, "eos_token_id": None})  # Qwen3Config's
HF_DECIDED = MappingProxyType({"vocab_size": "vocab_size", "context_length": "max_position_embeddings",
                               "emb_dim": "hidden_size", "n_heads": "num_attention_heads",
                               "n_layers": "num_hidden_layers", "hidden_dim": "intermediate_size",
                               "n_kv_groups": "num_key_value_heads", "head_dim": "head_dim",
                               "rope_base": "rope_theta", "rms_norm_eps": "rms_norm_eps",
                               "qk_norm": "qk_norm (Qwen3's q/k norms are always there)"})
