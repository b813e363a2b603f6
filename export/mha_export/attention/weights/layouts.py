"""Weight layouts: which checkpoint a file is, and pure mappings from its tensors to the wrapper's state_dict.

Four layouts, recognised from the key names:
- `wrapper`: the wrapper's own state_dict (`heads.{h}.W_query.weight`, ..., `out_proj.*`).
- `book-mha`: the book's chapter-3 `MultiHeadAttention` (`W_query.weight` of width num_heads * d_out, split
  per head in order, `out_proj.*`).
- `book-gpt`: the same inside the book's `GPTModel` state_dict (`trf_blocks.{N}.att.*`).
- `hf-gpt2`: Hugging Face `GPT2Model` (`h.{N}.attn.c_attn.*`, `h.{N}.attn.c_proj.*`) or `GPT2LMHeadModel`
  (`transformer.h.{N}...`). `Conv1D` stores weights as [in, out], q|k|v side by side on the output axis.

Each mapping checks what the tensors determine (d_in, total width, qkv_bias, out_proj) against the config and
names the first key that does not fit.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from mha_export.attention.weights.gpt2 import split_qkv
from mha_runtime.artifact.errors import BadValueError, ConfigError
from mha_runtime.attention.config import MHAConfig

Tensors = dict[str, torch.Tensor]
PROJECTIONS = ("query", "key", "value")


@dataclass(frozen=True)
class Layout:
    """A checkpoint layout: how to spot it, where one layer's keys live, and the mapping of those keys."""

    name: str
    signature: re.Pattern[str]  # a key only this layout has; group "layer" when the file holds several layers
    prefix: Callable[[re.Match[str]], str]  # the key prefix of the layer a signature match belongs to
    keys: frozenset[str]  # every key one layer may hold, relative to its prefix
    mapping: Callable[[Tensors, MHAConfig, str], Tensors]  # (the layer's tensors, config, their key prefix)
    masks: re.Pattern[str]  # the layer's mask buffers, relative to its prefix


@dataclass(frozen=True)
class Located:
    """One layer of a file: the layout, the layer index (None for a single-layer layout), its key prefix."""

    layout: Layout
    layer: int | None
    prefix: str
    layers: int


@dataclass(frozen=True)
class _Layer:
    """One layer's tensors by their relative key, and the prefix that names them as the file does."""

    tensors: Tensors
    config: MHAConfig
    prefix: str

    def name(self, key: str) -> str:
        return f"{self.prefix}{key}"

    def has(self, key: str) -> bool:
        return key in self.tensors

    def expect(self, key: str, shape: tuple[int, ...], why: str) -> torch.Tensor:
        """tensors[key] of `shape`, or ConfigError naming the key, its shape and what the config expects."""
        if key not in self.tensors:
            raise ConfigError(f"weights: missing key {self.name(key)!r} ({why})")
        tensor = self.tensors[key]
        if tuple(tensor.shape) != shape:
            c = self.config
            raise ConfigError(f"weights: {self.name(key)!r} has shape {list(tensor.shape)}, expected {list(shape)} "
                              f"for d_in={c.d_in}, num_heads={c.num_heads}, d_out={c.d_out}")
        return tensor

    def flags(self, bias_key: str, proj_key: str) -> None:
        """The file's biases and projection must be what the config asks for: never dropped, never invented."""
        for key, field, wanted in ((bias_key, "qkv_bias", self.config.qkv_bias),
                                   (proj_key, "out_proj", self.config.out_proj)):
            if self.has(key) != wanted:
                state = "holds" if self.has(key) else "has no"
                raise ConfigError(f"weights: the file {state} {self.name(key)!r} but the config says "
                                  f"{field}={str(wanted).lower()}; set \"{field}\": {str(self.has(key)).lower()} "
                                  "in the config")

    def width(self, key: str, axis: int, parts: int = 1) -> None:
        """The total width (num_heads * d_out, times `parts` for fused q|k|v) must split evenly into heads."""
        tensor = self.tensors.get(key)
        if tensor is not None and tensor.dim() == 2:
            size, heads = tensor.shape[axis], self.config.num_heads
            if size % parts or (size // parts) % heads:
                raise ConfigError(f"weights: {self.name(key)!r} has width {size}, not divisible into {parts} x "
                                  f"num_heads={heads} heads")

    def out_proj(self, weight: str, bias: str, *, transpose: bool) -> Tensors:
        if not self.config.out_proj:
            return {}
        width = self.config.d_model
        w = self.expect(weight, (width, width), "out_proj is true in the config")
        b = self.expect(bias, (width,), "the output projection has a bias")
        return {"out_proj.weight": w.T if transpose else w, "out_proj.bias": b}


def wrapper_state(tensors: Tensors, config: MHAConfig, prefix: str = "") -> Tensors:
    """The wrapper's own keys, as they are (mask buffers are derived from the config and left out)."""
    layer = _Layer(tensors, config, prefix)
    layer.flags("heads.0.W_query.bias", "out_proj.weight")
    state: Tensors = {}
    for h in range(config.num_heads):
        for p in PROJECTIONS:
            key = f"heads.{h}.W_{p}"
            state[f"{key}.weight"] = layer.expect(f"{key}.weight", (config.d_out, config.d_in),
                                                  f"one per head, {config.num_heads} heads")
            if config.qkv_bias:
                state[f"{key}.bias"] = layer.expect(f"{key}.bias", (config.d_out,), "qkv_bias is true")
    extra = sorted(set(tensors) - set(state) - {"out_proj.weight", "out_proj.bias"}
                   - {k for k in tensors if k.endswith(".mask")})
    if extra:
        raise ConfigError(f"weights: unexpected key {layer.name(extra[0])!r}; the config has {config.num_heads} "
                          "heads" + ("" if config.qkv_bias else " and no qkv bias"))
    return state | layer.out_proj("out_proj.weight", "out_proj.bias", transpose=False)


def book_mha_state(tensors: Tensors, config: MHAConfig, prefix: str = "") -> Tensors:
    """The book's MultiHeadAttention: W_query (H * d_out, d_in), rows h*d_out .. (h+1)*d_out are head h."""
    layer = _Layer(tensors, config, prefix)
    layer.flags("W_query.bias", "out_proj.weight")
    layer.width("W_query.weight", 0)
    qkv = [(layer.expect(f"W_{p}.weight", (config.d_model, config.d_in), "the book's layout"),
            layer.expect(f"W_{p}.bias", (config.d_model,), "qkv_bias is true") if config.qkv_bias else None)
           for p in PROJECTIONS]
    return _per_head(qkv, config) | layer.out_proj("out_proj.weight", "out_proj.bias", transpose=False)


def hf_gpt2_state(tensors: Tensors, config: MHAConfig, prefix: str = "") -> Tensors:
    """GPT-2's Conv1D c_attn split into q, k and v (weights/gpt2.py), head h of each at rows h*d_out ..
    (h+1)*d_out of Linear's (out, in); c_proj transposed likewise."""
    layer = _Layer(tensors, config, prefix)
    layer.flags("c_attn.bias", "c_proj.weight")
    layer.width("c_attn.weight", 1, parts=3)
    width = config.d_model
    weight = layer.expect("c_attn.weight", (config.d_in, 3 * width), "GPT-2's fused q|k|v")
    bias = layer.expect("c_attn.bias", (3 * width,), "qkv_bias is true") if config.qkv_bias else None
    state = _per_head(split_qkv(weight, bias), config)
    return state | layer.out_proj("c_proj.weight", "c_proj.bias", transpose=True)


def _per_head(qkv: list[tuple[torch.Tensor, torch.Tensor | None]], config: MHAConfig) -> Tensors:
    """q, k and v as one Linear each, weight (H * d_out, d_in) and bias (H * d_out,) or None: head h is rows
    h*d_out .. (h+1)*d_out of each, the wrapper's heads.{h}.W_{p}."""
    state: Tensors = {}
    for p, (weight, bias) in zip(PROJECTIONS, qkv, strict=True):
        for h in range(config.num_heads):
            rows = slice(h * config.d_out, (h + 1) * config.d_out)
            state[f"heads.{h}.W_{p}.weight"] = weight[rows]  # (d_out, d_in)
            if bias is not None:
                state[f"heads.{h}.W_{p}.bias"] = bias[rows]
    return state


BOOK_KEYS = frozenset(f"{m}.{t}" for m in ("W_query", "W_key", "W_value", "out_proj") for t in ("weight", "bias")) | {
    "mask"}


LAYOUTS: tuple[Layout, ...] = (
    Layout("wrapper", re.compile(r"heads\.\d+\.W_query\.weight"), lambda m: "",  # keys: per head, see layer_keys
           frozenset(), wrapper_state, re.compile(r"heads\.\d+\.mask")),
    Layout("book-mha", re.compile(r"W_query\.weight"), lambda m: "", BOOK_KEYS, book_mha_state,
           re.compile("mask")),
    Layout("book-gpt", re.compile(r"trf_blocks\.(?P<layer>\d+)\.att\.W_query\.weight"),
           lambda m: f"trf_blocks.{m['layer']}.att.", BOOK_KEYS, book_mha_state, re.compile("mask")),
    Layout("hf-gpt2", re.compile(r"(?P<pre>transformer\.)?h\.(?P<layer>\d+)\.attn\.c_attn\.weight"),
           lambda m: f"{m['pre'] or ''}h.{m['layer']}.attn.",
           frozenset({"c_attn.weight", "c_attn.bias", "c_proj.weight", "c_proj.bias", "bias", "masked_bias"}),
           hf_gpt2_state, re.compile("bias|masked_bias")),
)


def _sample(keys: Iterable[str]) -> str:
    keys = sorted(keys)
    return ", ".join(repr(k) for k in keys[:6]) + (f" and {len(keys) - 6} more" if len(keys) > 6 else "")


def locate(keys: Iterable[str], layer: int | None) -> Located:
    """Recognise the layout from the key names and pick the layer; refuse none, several, or a bad --layer."""
    keys = list(keys)
    found: dict[str, dict[int | None, str]] = {}
    for layout in LAYOUTS:
        for key in keys:
            match = layout.signature.fullmatch(key)
            if match:
                index = int(match["layer"]) if "layer" in layout.signature.groupindex else None
                found.setdefault(layout.name, {})[index] = layout.prefix(match)
    if not found:
        raise ConfigError(f"weights: no known layout (the wrapper's state_dict, the book's MultiHeadAttention or "
                          f"GPTModel, Hugging Face GPT-2) fits the {len(keys)} keys seen: {_sample(keys)}")
    if len(found) > 1:
        raise ConfigError(f"weights: the keys fit more than one layout ({', '.join(sorted(found))}); keep one model "
                          f"per file (keys seen: {_sample(keys)})")
    (name, layers), = found.items()
    layout = next(lo for lo in LAYOUTS if lo.name == name)
    if None in layers:  # a single-layer layout
        if layer not in (None, 0):
            raise BadValueError(f"--layer {layer}: the file holds one attention layer ({name} layout); drop --layer")
        return Located(layout, None, "", 1)
    indices = sorted(i for i in layers if i is not None)
    count = max(indices) + 1
    if layer is None:
        if len(indices) > 1:
            raise BadValueError(f"weights: the file holds {len(indices)} layers ({name} layout, 0..{count - 1}); "
                                "choose one with --layer N")
        layer = indices[0]
    if layer not in layers:
        raise BadValueError(f"--layer {layer} is out of range: the file holds {len(indices)} layers "
                            f"({name} layout, 0..{count - 1})")
    return Located(layout, layer, layers[layer], len(indices))


def layer_keys(located: Located, keys: Iterable[str]) -> list[str]:
    """The keys of the chosen layer (every key, for a single-layer layout); refuse any that is not the layout's."""
    keys = list(keys)
    mine = [k for k in keys if k.startswith(located.prefix)]
    layout = located.layout
    for key in mine:
        rest = key[len(located.prefix):]
        if layout.name == "wrapper":
            if not (re.fullmatch(r"heads\.\d+\.(W_query|W_key|W_value)\.(weight|bias)|heads\.\d+\.mask", rest)
                    or rest in ("out_proj.weight", "out_proj.bias")):
                raise ConfigError(f"weights: unexpected key {key!r} for the wrapper's state_dict")
        elif rest not in layout.keys:
            raise ConfigError(f"weights: unexpected key {key!r} in the {layout.name} layout "
                              f"(expected only {', '.join(sorted(layout.keys))} under {located.prefix or 'the top'})")
    return mine


def check_masks(located: Located, tensors: Tensors, config: MHAConfig) -> None:
    """Mask buffers in the file must be causal: an upper-triangular 'future' mask (wrapper, book) or a
    lower-triangular 'allowed' mask (GPT-2's attn.bias); GPT-2's masked_bias is a constant and ignored."""
    for key, tensor in tensors.items():
        rest = key[len(located.prefix):]
        if not located.layout.masks.fullmatch(rest) or rest == "masked_bias":
            continue
        if located.layout.name == "wrapper" and tuple(tensor.shape) != (config.context_length,) * 2:
            raise ConfigError(f"weights: {key!r} has shape {list(tensor.shape)}, expected "
                              f"{[config.context_length] * 2} for context_length={config.context_length}")
        # GPT-2 stores its mask as (1, 1, n, n): leading axes of size 1 drop; any other shape stays as it is
        # and is refused below as not the causal mask.
        square = tensor.reshape(tensor.shape[-2:]) if tensor.dim() >= 2 and tensor.shape[:-2].numel() == 1 \
            else tensor
        n = square.shape[-1] if square.dim() == 2 else 0
        future = torch.triu(torch.ones(n, n, dtype=torch.bool), diagonal=1)
        causal = ~future if rest == "bias" else future  # GPT-2's bias marks the allowed pairs, a mask the future
        if not (square.dim() == 2 and square.shape[0] == n and torch.equal(square.bool(), causal)):
            raise ConfigError(f"weights: {key!r} is not the causal mask this model requires")
        if n < config.context_length:
            raise ConfigError(f"weights: {key!r} covers {n} positions, fewer than context_length="
                              f"{config.context_length}")


def to_wrapper_state(located: Located, tensors: Tensors, config: MHAConfig) -> Tensors:
    """The chosen layer's tensors (prefix stripped, float32) mapped to the wrapper's state_dict."""
    check_masks(located, tensors, config)
    relative = {k[len(located.prefix):]: v for k, v in tensors.items()}
    state = located.layout.mapping(relative, config, located.prefix)
    return {k: v.detach().to(torch.float32).contiguous() for k, v in state.items()}
