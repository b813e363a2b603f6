"""A decoder checkpoint onto the book's state_dict of its architecture: the book's own (chapter 5's torch.save) or
Hugging Face's (GPT-2: GPT2LMHeadModel or GPT2Model; model.safetensors or pytorch_model.bin), recognised from the key
names. The architecture (archs/, the config's `arch`) names its keys, their shapes and how Hugging Face's map onto
them; this module reads, dispatches and checks. A GGUF (by its magic) is dequantized and mapped by the
architecture's read_gguf (mha_export.gguf.source).

Every parameter is mapped and checked against the config; a missing, extra or misshapen key is one ConfigError
line naming the key, its shape and what the config expects. GPT-2's head is tied to wte: the result says so,
and the artifacts store that matrix once (a folder's gpt.safetensors too, without out_head.weight and with the
metadata tied "true", which reads back tied).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import torch

from mha_export.attention.weights.load import WeightFile
from mha_export.decoder.archs import arch_of
from mha_export.decoder.archs.protocol import Architecture, DecoderConfig
from mha_export.decoder.graphs.shared import HEAD_KEY
from mha_export.gguf.source import is_gguf, read_gguf_weights
from mha_runtime.artifact.errors import ConfigError

Tensors = dict[str, torch.Tensor]
# Every book model's token embedding: a checkpoint that has it is the book's layout.
BOOK_SIGNATURE = "tok_emb.weight"


@dataclass(frozen=True)
class GPTWeights:
    state: Tensors  # the book's keys of the architecture (without buffers)
    layout: str  # the architecture's BOOK_LAYOUT or HF_LAYOUT ("book-gpt" | "hf-gpt2")
    tied: bool  # out_head.weight is tok_emb.weight


def book_shapes(cfg: DecoderConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter of the book's model for `cfg`, with its shape."""
    return arch_of(cfg).book_shapes(cfg)


def _checked(state: Tensors, cfg: DecoderConfig, names: dict[str, str]) -> Tensors:
    """Each book key present with its shape, float and finite; `names` maps a book key to the file's key."""
    arch = arch_of(cfg)
    shapes = arch.book_shapes(cfg)
    for key, shape in shapes.items():
        name, tensor = names.get(key, key), state.get(key)
        if tensor is None:
            raise ConfigError(f"weights: missing key {name!r} (expected shape {list(shape)} for "
                              f"{arch.describe(cfg)})")
        if tuple(tensor.shape) != shape:
            raise ConfigError(f"weights: {name!r} has shape {list(tensor.shape)}, expected {list(shape)} for "
                              f"{arch.describe(cfg)}")
        if not tensor.is_floating_point():
            raise ConfigError(f"weights: {name!r} has dtype {tensor.dtype}, expected floating point")
        if not torch.isfinite(tensor).all():
            raise ConfigError(f"weights: {name!r} holds NaN or inf values")
        if tensor.dtype == torch.float64 and not torch.isfinite(tensor.to(torch.float32)).all():
            raise ConfigError(f"weights: {name!r} holds values beyond float32's range (3.4e38); the export computes "
                              "in float32")
    return {k: state[k].to(torch.float32) for k in shapes}


def _book(source: WeightFile, cfg: DecoderConfig, arch: Architecture) -> GPTWeights:
    keys = [k for k in source.keys() if not arch.BUFFERS.fullmatch(k)]
    extra = sorted(set(keys) - set(arch.book_shapes(cfg)))
    if extra:
        raise ConfigError(f"weights: unexpected key {extra[0]!r} for {arch.BOOK_MODEL} with {arch.describe(cfg)}")
    state = {k: source.get(k) for k in keys}
    tied = HEAD_KEY not in state and BOOK_SIGNATURE in state and _saved_tied(source.path)
    if tied:  # a folder's own gpt.safetensors of a tied model: its head is tok_emb.weight, stored once
        state[HEAD_KEY] = state[BOOK_SIGNATURE]
    elif HEAD_KEY in state and BOOK_SIGNATURE in state:  # the book's loaders tie a head by assigning tok_emb's
        head, table = state[HEAD_KEY], state[BOOK_SIGNATURE]  # parameter to it: stored once, as Hugging Face's
        tied = head.shape == table.shape and bool(torch.equal(head, table))
    return GPTWeights(_checked(state, cfg, {}), arch.BOOK_LAYOUT, tied=tied)


def _saved_tied(path: Path) -> bool:
    """Whether `path` is a safetensors file whose metadata says tied "true", as the export writes gpt.safetensors
    for a tied model (GPT-2's): without it, a missing out_head.weight stays a missing key."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as fh:
            return (fh.metadata() or {}).get("tied") == "true"
    except (SafetensorError, OSError):  # a torch.save file
        return False


def read_gpt_weights(path: Path, cfg: DecoderConfig) -> GPTWeights:
    """The book's state_dict for `cfg` from a checkpoint in either layout; refuse anything else in one line."""
    arch = arch_of(cfg)
    if is_gguf(path):  # llama.cpp's names, dequantized (mha_export.gguf.source); checked as every source
        state, tied, layout = read_gguf_weights(Path(path), cfg)
        return GPTWeights(_checked(state, cfg, {}), layout, tied=tied)
    source = WeightFile(Path(path))
    keys = source.keys()
    if BOOK_SIGNATURE in keys:
        return _book(source, cfg, arch)
    hf = next((m for m in (arch.HF_SIGNATURE.fullmatch(k) for k in keys) if m), None)
    if hf is not None:
        prefix = hf.group(1) or ""
        state, tied = arch.read_hf(source, cfg, prefix)
        # A tensor that does not fit is named by the file's key.
        return GPTWeights(_checked(state, cfg, arch.hf_names(cfg, prefix)), arch.HF_LAYOUT, tied=tied)
    sample = ", ".join(repr(k) for k in sorted(keys)[:4])
    raise ConfigError(f"weights: expected {arch.BOOK_MODEL} state_dict ({_book_hint(arch, cfg)}) or "
                      f"{arch.HF_KEYS}, got {len(keys)} keys: {sample}")


def _book_hint(arch: Architecture, cfg: DecoderConfig) -> str:
    """The book's key names for `cfg`, as a refusal names them: the embedding, then each block's prefix with its
    number as N ('trf_blocks.N...' for GPT-2 and Llama, 'blocks.N...' for Gemma 3), read from the architecture's
    own book_shapes."""
    blocks = dict.fromkeys(m.group(1) + ".N..." for k in sorted(arch.book_shapes(cfg))
                           if (m := re.match(r"([\w.]*?)\.\d+\.", k)))
    return ", ".join(repr(k) for k in (BOOK_SIGNATURE, *blocks))
