"""A GPT checkpoint onto the book's GPTModel state_dict: the book's own (chapter 5's torch.save) or Hugging Face
GPT-2 (GPT2LMHeadModel or GPT2Model; model.safetensors or pytorch_model.bin), recognised from the key names.

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

from mha_export.attention.weights.gpt2 import C_ATTN_BIAS, C_ATTN_WEIGHT, C_PROJ_BIAS, C_PROJ_WEIGHT, split_qkv
from mha_export.attention.weights.load import WeightFile
from mha_runtime.artifact.errors import ConfigError
from mha_runtime.decoder.config import GPTConfig

Tensors = dict[str, torch.Tensor]
BOOK_SIGNATURE = "tok_emb.weight"
HEAD = "out_head.weight"
HF_SIGNATURE = re.compile(r"(transformer\.)?wte\.weight")
# Buffers, not parameters: the book's causal masks, GPT-2's attn.bias / attn.masked_bias of older transformers.
BUFFERS = re.compile(r"(trf_blocks\.\d+\.att\.mask|(transformer\.)?h\.\d+\.attn\.(bias|masked_bias))")


@dataclass(frozen=True)
class GPTWeights:
    state: Tensors  # the book's GPTModel keys (without the mask buffers)
    layout: str  # "book-gpt" | "hf-gpt2"
    tied: bool  # out_head.weight is tok_emb.weight


def book_shapes(cfg: GPTConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter of the book's GPTModel for `cfg`, with its shape."""
    e, v = cfg.emb_dim, cfg.vocab_size
    shapes: dict[str, tuple[int, ...]] = {"tok_emb.weight": (v, e), "pos_emb.weight": (cfg.context_length, e)}
    for i in range(cfg.n_layers):
        p = f"trf_blocks.{i}."
        for w in ("W_query", "W_key", "W_value"):
            shapes[f"{p}att.{w}.weight"] = (e, e)
            if cfg.qkv_bias:
                shapes[f"{p}att.{w}.bias"] = (e,)
        shapes |= {f"{p}att.out_proj.weight": (e, e), f"{p}att.out_proj.bias": (e,),
                   f"{p}ff.layers.0.weight": (4 * e, e), f"{p}ff.layers.0.bias": (4 * e,),
                   f"{p}ff.layers.2.weight": (e, 4 * e), f"{p}ff.layers.2.bias": (e,)}
        for n in ("norm1", "norm2"):
            shapes |= {f"{p}{n}.scale": (e,), f"{p}{n}.shift": (e,)}
    return shapes | {"final_norm.scale": (e,), "final_norm.shift": (e,), "out_head.weight": (v, e)}


def _describe(cfg: GPTConfig) -> str:
    return (f"vocab_size={cfg.vocab_size}, context_length={cfg.context_length}, emb_dim={cfg.emb_dim}, "
            f"n_layers={cfg.n_layers}, qkv_bias={str(cfg.qkv_bias).lower()}")


def _checked(state: Tensors, cfg: GPTConfig, names: dict[str, str]) -> Tensors:
    """Each book key present with its shape, float and finite; `names` maps a book key to the file's key."""
    shapes = book_shapes(cfg)
    for key, shape in shapes.items():
        name, tensor = names.get(key, key), state.get(key)
        if tensor is None:
            raise ConfigError(f"weights: missing key {name!r} (expected shape {list(shape)} for {_describe(cfg)})")
        if tuple(tensor.shape) != shape:
            raise ConfigError(f"weights: {name!r} has shape {list(tensor.shape)}, expected {list(shape)} for "
                              f"{_describe(cfg)}")
        if not tensor.is_floating_point():
            raise ConfigError(f"weights: {name!r} has dtype {tensor.dtype}, expected floating point")
        if not torch.isfinite(tensor).all():
            raise ConfigError(f"weights: {name!r} holds NaN or inf values")
        if tensor.dtype == torch.float64 and not torch.isfinite(tensor.to(torch.float32)).all():
            raise ConfigError(f"weights: {name!r} holds values beyond float32's range (3.4e38); the export computes "
                              "in float32")
    return {k: state[k].to(torch.float32) for k in shapes}


def _book(source: WeightFile, cfg: GPTConfig) -> GPTWeights:
    keys = [k for k in source.keys() if not BUFFERS.fullmatch(k)]
    extra = sorted(set(keys) - set(book_shapes(cfg)))
    if extra:
        raise ConfigError(f"weights: unexpected key {extra[0]!r} for the book's GPTModel with {_describe(cfg)}")
    state = {k: source.get(k) for k in keys}
    tied = HEAD not in state and BOOK_SIGNATURE in state and _saved_tied(source.path)
    if tied:  # a GPT folder's own gpt.safetensors of a tied model: its head is tok_emb.weight, stored once
        state[HEAD] = state[BOOK_SIGNATURE]
    return GPTWeights(_checked(state, cfg, {}), "book-gpt", tied=tied)


def _saved_tied(path: Path) -> bool:
    """Whether `path` is a safetensors file whose metadata says tied "true", as the export writes gpt.safetensors
    for a tied model (GPT-2's): without it, a missing out_head.weight stays a missing key."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as fh:
            return (fh.metadata() or {}).get("tied") == "true"
    except (SafetensorError, OSError):  # a torch.save file
        return False


def _hf_names(cfg: GPTConfig, pre: str) -> dict[str, str]:
    """book key -> GPT-2 key. Fused c_attn and Conv1D ([in, out]) weights are split and transposed in _hf."""
    names = {"tok_emb.weight": f"{pre}wte.weight", "pos_emb.weight": f"{pre}wpe.weight",
             "final_norm.scale": f"{pre}ln_f.weight", "final_norm.shift": f"{pre}ln_f.bias",
             "out_head.weight": f"{pre}wte.weight"}
    for i in range(cfg.n_layers):
        b, h = f"trf_blocks.{i}.", f"{pre}h.{i}."
        names |= {f"{b}att.out_proj.weight": f"{h}{C_PROJ_WEIGHT}", f"{b}att.out_proj.bias": f"{h}{C_PROJ_BIAS}",
                  f"{b}ff.layers.0.weight": f"{h}mlp.c_fc.weight", f"{b}ff.layers.0.bias": f"{h}mlp.c_fc.bias",
                  f"{b}ff.layers.2.weight": f"{h}mlp.c_proj.weight", f"{b}ff.layers.2.bias": f"{h}mlp.c_proj.bias",
                  f"{b}norm1.scale": f"{h}ln_1.weight", f"{b}norm1.shift": f"{h}ln_1.bias",
                  f"{b}norm2.scale": f"{h}ln_2.weight", f"{b}norm2.shift": f"{h}ln_2.bias"}
        for w in ("W_query", "W_key", "W_value"):
            names[f"{b}att.{w}.weight"] = f"{h}{C_ATTN_WEIGHT}"
            names[f"{b}att.{w}.bias"] = f"{h}{C_ATTN_BIAS}"
    return names


def _hf(source: WeightFile, cfg: GPTConfig, pre: str) -> GPTWeights:
    keys = {k for k in source.keys() if not BUFFERS.fullmatch(k)}
    names = _hf_names(cfg, pre)
    allowed = set(names.values()) | {"lm_head.weight"}
    extra = sorted(keys - allowed)
    if extra:
        raise ConfigError(f"weights: unexpected key {extra[0]!r} for Hugging Face GPT-2 with {_describe(cfg)}")
    e, shapes = cfg.emb_dim, book_shapes(cfg)
    state: Tensors = {}
    for book, hf in names.items():
        if hf not in keys:
            if book.endswith(".bias") and ".att.W_" in book:  # checked once, at c_attn.weight
                continue
            raise ConfigError(f"weights: missing key {hf!r} (Hugging Face GPT-2 with {_describe(cfg)})")
    for i in range(cfg.n_layers):
        b, h = f"trf_blocks.{i}.", f"{pre}h.{i}."
        fused = source.get(f"{h}{C_ATTN_WEIGHT}")
        if tuple(fused.shape) != (e, 3 * e):
            raise ConfigError(f"weights: {h + C_ATTN_WEIGHT!r} has shape {list(fused.shape)}, expected "
                              f"{[e, 3 * e]} for {_describe(cfg)}")
        bias = source.get(f"{h}{C_ATTN_BIAS}") if f"{h}{C_ATTN_BIAS}" in keys else None
        if (bias is not None) != cfg.qkv_bias:
            state = "holds" if bias is not None else "has no"
            raise ConfigError(f"weights: the file {state} {h + C_ATTN_BIAS!r} but the config says "
                              f"qkv_bias={str(cfg.qkv_bias).lower()}")
        if bias is not None and tuple(bias.shape) != (3 * e,):
            raise ConfigError(f"weights: {h + C_ATTN_BIAS!r} has shape {list(bias.shape)}, expected [{3 * e}]")
        for w, (weight, part) in zip(("W_query", "W_key", "W_value"), split_qkv(fused, bias), strict=True):
            state[f"{b}att.{w}.weight"] = weight  # Conv1D (in, out) -> Linear (out, in)
            if part is not None:
                state[f"{b}att.{w}.bias"] = part
        for book in ("att.out_proj.weight", "ff.layers.0.weight", "ff.layers.2.weight"):
            conv, want = source.get(names[b + book]), shapes[b + book][::-1]  # Conv1D stores (in, out)
            if tuple(conv.shape) != want:  # named as the file has it, before .T (which warns on other ranks)
                raise ConfigError(f"weights: {names[b + book]!r} has shape {list(conv.shape)}, expected {list(want)} "
                                  f"for {_describe(cfg)}")
            state[b + book] = conv.T
        for book in ("att.out_proj.bias", "ff.layers.0.bias", "ff.layers.2.bias", "norm1.scale", "norm1.shift",
                     "norm2.scale", "norm2.shift"):
            state[b + book] = source.get(names[b + book])
    for book in ("tok_emb.weight", "pos_emb.weight", "final_norm.scale", "final_norm.shift"):
        state[book] = source.get(names[book])
    state["out_head.weight"] = state["tok_emb.weight"]
    if "lm_head.weight" in keys and not torch.equal(source.get("lm_head.weight"), state["tok_emb.weight"]):
        raise ConfigError("weights: 'lm_head.weight' differs from the token embedding; GPT-2's head is tied to wte")
    # A tensor that does not fit is named by the file's key (the Conv1D weights were checked above, as stored).
    reverse = {k: names.get(k, k) for k in shapes}
    return GPTWeights(_checked(state, cfg, reverse), "hf-gpt2", tied=True)


def read_gpt_weights(path: Path, cfg: GPTConfig) -> GPTWeights:
    """The book's state_dict for `cfg` from a checkpoint in either layout; refuse anything else in one line."""
    source = WeightFile(Path(path))
    keys = source.keys()
    if BOOK_SIGNATURE in keys:
        return _book(source, cfg)
    hf = next((m for m in (HF_SIGNATURE.fullmatch(k) for k in keys) if m), None)
    if hf is not None:
        return _hf(source, cfg, hf.group(1) or "")
    sample = ", ".join(repr(k) for k in sorted(keys)[:4])
    raise ConfigError(f"weights: expected the book's GPTModel state_dict ('tok_emb.weight', 'trf_blocks.N...') or "
                      f"Hugging Face GPT-2 ('wte.weight', 'h.N...'), got {len(keys)} keys: {sample}")
