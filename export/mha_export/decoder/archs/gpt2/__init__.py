"""GPT-2, as the book's GPTModel (chapter 4) builds it: learned positions, pre-norm blocks with LayerNorm (eps
1e-5), one head per key/value, q|k|v with or without biases, a tanh-GELU MLP of 4 * emb_dim, an output head tied
to the token embedding (Hugging Face) or its own (the book's). The Architecture protocol (archs/protocol.py) for it.

One package, split by concern under the module limit: this module (the protocol's members: names, config readers,
weight names, the drop-in and GGUF files), config.py (GPTConfig and the decoder presets, torch-free), graph.py (its
ONNX pieces), model.py (its eager reference, the book's GPTModel rebuilt module for module, and the cached form
gpt.pte runs); the last two import torch or onnx and are imported when used.
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from mha_export.attention.weights.gpt2 import C_ATTN_BIAS, C_ATTN_WEIGHT, C_PROJ_BIAS, C_PROJ_WEIGHT, split_qkv
from mha_export.decoder.archs.gpt2.config import GPT2_EOS_ID, LAYER_NORM_EPS, GPTConfig
from mha_runtime.artifact.errors import BadValueError, ConfigError

if TYPE_CHECKING:
    import gguf
    import numpy as np
    import torch

    from mha_export.attention.weights.load import WeightFile
    from mha_export.decoder.archs.protocol import Pieces, Tensors
    from mha_export.decoder.graphs.shared import Graph

NAME = "gpt2"
HF_MODEL_TYPE = "gpt2"
HF_CONFIG_KEY = "n_embd"
GGUF_ARCH = "gpt2"
GENAI_TYPE = "decoder"  # GenAI's generic decoder over Optimum's per-layer names (decoder/genai.py)
BOOK_MODEL = "the book's GPTModel"
REFERENCE = f"{BOOK_MODEL} (llms_from_scratch ch04)"

# ---- config
BOOK_KEYS = frozenset(f.name for f in dataclasses.fields(GPTConfig))


def config_from_book(data: dict[str, Any]) -> GPTConfig:
    return GPTConfig.from_book(data)


def config_from_hf(data: dict[str, Any]) -> GPTConfig:
    return GPTConfig.from_hf(data)


def config_from_gguf(fields: Mapping[str, Any]) -> GPTConfig:
    """llama.cpp's gpt2 keys (gpt.gguf's, written by gguf_metadata). Its loader always reads q/k/v biases, so the
    config has them (a model without them was written with zeros). The vocabulary is the token list's length,
    or `gpt2.vocab_size` in a file without a tokenizer."""
    import gguf

    def get(key: str) -> Any:
        name = key.format(arch=GGUF_ARCH)
        if name not in fields:
            raise BadValueError(f"GGUF metadata: missing {name!r} of llama.cpp's gpt2 architecture")
        return fields[name]

    tokens = fields.get(gguf.Keys.Tokenizer.LIST)
    vocab = len(tokens) if tokens is not None else get(gguf.Keys.LLM.VOCAB_SIZE)
    width, eps = get(gguf.Keys.LLM.EMBEDDING_LENGTH), get(gguf.Keys.Attention.LAYERNORM_EPS)
    if get(gguf.Keys.LLM.FEED_FORWARD_LENGTH) != 4 * width or abs(eps - LAYER_NORM_EPS) > 1e-12:
        raise BadValueError(f"GGUF metadata: feed-forward {get(gguf.Keys.LLM.FEED_FORWARD_LENGTH)} and norm epsilon "
                            f"{eps}; the book's GPT has {4 * width} (4 * embedding_length) and {LAYER_NORM_EPS}")
    return GPTConfig(vocab_size=vocab, context_length=get(gguf.Keys.LLM.CONTEXT_LENGTH), emb_dim=width,
                     n_heads=get(gguf.Keys.Attention.HEAD_COUNT), n_layers=get(gguf.Keys.LLM.BLOCK_COUNT),
                     qkv_bias=True)


def describe(cfg: GPTConfig) -> str:
    return (f"vocab_size={cfg.vocab_size}, context_length={cfg.context_length}, emb_dim={cfg.emb_dim}, "
            f"n_layers={cfg.n_layers}, qkv_bias={str(cfg.qkv_bias).lower()}")


# ---- weights: the book's keys, Hugging Face GPT-2's (GPT2LMHeadModel, GPT2Model) onto them
BOOK_LAYOUT, HF_LAYOUT = "book-gpt", "hf-gpt2"
HF_KEYS = "Hugging Face GPT-2 ('wte.weight', 'h.N...')"
HF_SIGNATURE = re.compile(r"(transformer\.)?wte\.weight")
# Buffers, not parameters: the book's causal masks, GPT-2's attn.bias / attn.masked_bias of older transformers.
BUFFERS = re.compile(r"(trf_blocks\.\d+\.att\.mask|(transformer\.)?h\.\d+\.attn\.(bias|masked_bias))")
QKV = ("W_query", "W_key", "W_value")


def book_shapes(cfg: GPTConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter of the book's GPTModel for `cfg`, with its shape."""
    e, v = cfg.emb_dim, cfg.vocab_size
    shapes: dict[str, tuple[int, ...]] = {"tok_emb.weight": (v, e), "pos_emb.weight": (cfg.context_length, e)}
    for i in range(cfg.n_layers):
        p = f"trf_blocks.{i}."
        for w in QKV:
            shapes[f"{p}att.{w}.weight"] = (e, e)
            if cfg.qkv_bias:
                shapes[f"{p}att.{w}.bias"] = (e,)
        shapes |= {f"{p}att.out_proj.weight": (e, e), f"{p}att.out_proj.bias": (e,),
                   f"{p}ff.layers.0.weight": (4 * e, e), f"{p}ff.layers.0.bias": (4 * e,),
                   f"{p}ff.layers.2.weight": (e, 4 * e), f"{p}ff.layers.2.bias": (e,)}
        for n in ("norm1", "norm2"):
            shapes |= {f"{p}{n}.scale": (e,), f"{p}{n}.shift": (e,)}
    return shapes | {"final_norm.scale": (e,), "final_norm.shift": (e,), "out_head.weight": (v, e)}


def hf_names(cfg: GPTConfig, prefix: str) -> dict[str, str]:
    """book key -> GPT-2 key. Fused c_attn and Conv1D ([in, out]) weights are split and transposed in read_hf."""
    pre = prefix
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
        for w in QKV:
            names[f"{b}att.{w}.weight"] = f"{h}{C_ATTN_WEIGHT}"
            names[f"{b}att.{w}.bias"] = f"{h}{C_ATTN_BIAS}"
    return names


def read_hf(source: WeightFile, cfg: GPTConfig, prefix: str) -> tuple[Tensors, bool]:
    """A Hugging Face GPT-2 checkpoint onto the book's keys (checked by the caller against book_shapes): c_attn
    split into q, k, v, the Conv1D weights transposed, the head tied to wte (lm_head.weight, where saved, must be
    it)."""
    import torch

    keys = {k for k in source.keys() if not BUFFERS.fullmatch(k)}
    names = hf_names(cfg, prefix)
    extra = sorted(keys - set(names.values()) - {"lm_head.weight"})
    if extra:
        raise ConfigError(f"weights: unexpected key {extra[0]!r} for Hugging Face GPT-2 with {describe(cfg)}")
    for book, hf in names.items():
        if hf not in keys and not (book.endswith(".bias") and ".att.W_" in book):  # checked at c_attn.weight
            raise ConfigError(f"weights: missing key {hf!r} (Hugging Face GPT-2 with {describe(cfg)})")
    e, shapes = cfg.emb_dim, book_shapes(cfg)
    state: Tensors = {}
    for i in range(cfg.n_layers):
        b, h = f"trf_blocks.{i}.", f"{prefix}h.{i}."
        fused = source.get(f"{h}{C_ATTN_WEIGHT}")
        if tuple(fused.shape) != (e, 3 * e):
            raise ConfigError(f"weights: {h + C_ATTN_WEIGHT!r} has shape {list(fused.shape)}, expected "
                              f"{[e, 3 * e]} for {describe(cfg)}")
        bias = source.get(f"{h}{C_ATTN_BIAS}") if f"{h}{C_ATTN_BIAS}" in keys else None
        if (bias is not None) != cfg.qkv_bias:
            said = "holds" if bias is not None else "has no"
            raise ConfigError(f"weights: the file {said} {h + C_ATTN_BIAS!r} but the config says "
                              f"qkv_bias={str(cfg.qkv_bias).lower()}")
        if bias is not None and tuple(bias.shape) != (3 * e,):
            raise ConfigError(f"weights: {h + C_ATTN_BIAS!r} has shape {list(bias.shape)}, expected [{3 * e}]")
        for w, (weight, part) in zip(QKV, split_qkv(fused, bias), strict=True):
            state[f"{b}att.{w}.weight"] = weight  # Conv1D (in, out) -> Linear (out, in)
            if part is not None:
                state[f"{b}att.{w}.bias"] = part
        for book in ("att.out_proj.weight", "ff.layers.0.weight", "ff.layers.2.weight"):
            conv, want = source.get(names[b + book]), shapes[b + book][::-1]  # Conv1D stores (in, out)
            if tuple(conv.shape) != want:  # named as the file has it, before .T (which warns on other ranks)
                raise ConfigError(f"weights: {names[b + book]!r} has shape {list(conv.shape)}, expected {list(want)} "
                                  f"for {describe(cfg)}")
            state[b + book] = conv.T
        for book in ("att.out_proj.bias", "ff.layers.0.bias", "ff.layers.2.bias", "norm1.scale", "norm1.shift",
                     "norm2.scale", "norm2.shift"):
            state[b + book] = source.get(names[b + book])
    for book in ("tok_emb.weight", "pos_emb.weight", "final_norm.scale", "final_norm.shift"):
        state[book] = source.get(names[book])
    state["out_head.weight"] = state["tok_emb.weight"]
    if "lm_head.weight" in keys and not torch.equal(source.get("lm_head.weight"), state["tok_emb.weight"]):
        raise ConfigError("weights: 'lm_head.weight' differs from the token embedding; GPT-2's head is tied to wte")
    return state, True


# ---- GGUF: llama.cpp's gpt2 architecture (src/models/gpt2.cpp of the pinned tree)
def gguf_tensors(state: Tensors, cfg: GPTConfig, *, tied: bool) -> dict[str, np.ndarray]:
    """GGUF name -> float32 array (rows first) as llama.cpp's gpt2 loader reads them: token_embd (V, E),
    position_embd (C, E), per block N blk.N.attn_norm / ffn_norm weight and bias (E,), blk.N.attn_qkv weight (3E, E)
    = the book's W_query, W_key, W_value stacked, and bias (3E,), blk.N.attn_output (E, E) + (E,), blk.N.ffn_up
    (4E, E) + (4E,), blk.N.ffn_down (E, 4E) + (E,), output_norm weight and bias, and output (V, E) only where the
    head is not the token embedding (llama.cpp then uses token_embd for both). The loader requires the qkv bias: a
    model without one (qkv_bias false) gets zeros, which adds exactly nothing."""
    import numpy as np
    import torch

    def a(key: str) -> np.ndarray:
        return state[key].detach().to(torch.float32).contiguous().numpy()

    e = cfg.emb_dim
    out = {"token_embd.weight": a("tok_emb.weight"), "position_embd.weight": a("pos_emb.weight")}
    for i in range(cfg.n_layers):
        b, g = f"trf_blocks.{i}.", f"blk.{i}."
        qkv = [f"{b}att.{w}" for w in QKV]
        out |= {f"{g}attn_norm.weight": a(f"{b}norm1.scale"), f"{g}attn_norm.bias": a(f"{b}norm1.shift"),
                f"{g}attn_qkv.weight": np.concatenate([a(f"{k}.weight") for k in qkv], axis=0),
                f"{g}attn_qkv.bias": (np.concatenate([a(f"{k}.bias") for k in qkv]) if cfg.qkv_bias
                                      else np.zeros(3 * e, dtype=np.float32)),
                f"{g}attn_output.weight": a(f"{b}att.out_proj.weight"),
                f"{g}attn_output.bias": a(f"{b}att.out_proj.bias"),
                f"{g}ffn_norm.weight": a(f"{b}norm2.scale"), f"{g}ffn_norm.bias": a(f"{b}norm2.shift"),
                f"{g}ffn_up.weight": a(f"{b}ff.layers.0.weight"), f"{g}ffn_up.bias": a(f"{b}ff.layers.0.bias"),
                f"{g}ffn_down.weight": a(f"{b}ff.layers.2.weight"), f"{g}ffn_down.bias": a(f"{b}ff.layers.2.bias")}
    out |= {"output_norm.weight": a("final_norm.scale"), "output_norm.bias": a("final_norm.shift")}
    if not tied:
        out["output.weight"] = a("out_head.weight")
    return out


def read_gguf(tensors: Mapping[str, np.ndarray], cfg: GPTConfig) -> tuple[Tensors, bool]:
    """gguf_tensors undone: llama.cpp's gpt2 tensors (float32, rows first) onto the book's keys, attn_qkv's rows
    split into W_query, W_key, W_value (as its bias); the head is token_embd where the file has no output.weight.
    Shapes are checked by the caller; a missing or unknown tensor is one line naming it."""
    import torch

    block = ("attn_norm", "attn_qkv", "attn_output", "ffn_norm", "ffn_up", "ffn_down")
    want = ["token_embd.weight", "position_embd.weight", "output_norm.weight", "output_norm.bias",
            *(f"blk.{i}.{n}.{p}" for i in range(cfg.n_layers) for n in block for p in ("weight", "bias"))]
    extra = sorted(set(tensors) - {*want, "output.weight"})
    missing = [n for n in want if n not in tensors]
    if extra or missing:
        said = f"unexpected tensor {extra[0]!r}" if extra else f"missing tensor {missing[0]!r}"
        raise ConfigError(f"weights: {said} for llama.cpp's gpt2 with {describe(cfg)}")

    def t(name: str) -> torch.Tensor:
        return torch.from_numpy(tensors[name])

    state: Tensors = {"tok_emb.weight": t("token_embd.weight"), "pos_emb.weight": t("position_embd.weight"),
                      "final_norm.scale": t("output_norm.weight"), "final_norm.shift": t("output_norm.bias")}
    for i in range(cfg.n_layers):
        b, g = f"trf_blocks.{i}.", f"blk.{i}."
        for w, weight, bias in zip(QKV, t(f"{g}attn_qkv.weight").chunk(3), t(f"{g}attn_qkv.bias").chunk(3),
                                   strict=True):  # (3E, E) rows and (3E,): q, k, v
            state |= {f"{b}att.{w}.weight": weight, f"{b}att.{w}.bias": bias}
        for book, name in (("norm1.scale", "attn_norm.weight"), ("norm1.shift", "attn_norm.bias"),
                           ("att.out_proj.weight", "attn_output.weight"), ("att.out_proj.bias", "attn_output.bias"),
                           ("norm2.scale", "ffn_norm.weight"), ("norm2.shift", "ffn_norm.bias"),
                           ("ff.layers.0.weight", "ffn_up.weight"), ("ff.layers.0.bias", "ffn_up.bias"),
                           ("ff.layers.2.weight", "ffn_down.weight"), ("ff.layers.2.bias", "ffn_down.bias")):
            state[b + book] = t(g + name)
    tied = "output.weight" not in tensors
    state["out_head.weight"] = state["tok_emb.weight"] if tied else t("output.weight")
    return state, tied


def gguf_metadata(writer: gguf.GGUFWriter, cfg: GPTConfig) -> None:
    """The gpt2 architecture's keys, in the order gpt.gguf has always had them."""
    writer.add_context_length(cfg.context_length)
    writer.add_embedding_length(cfg.emb_dim)
    writer.add_block_count(cfg.n_layers)
    writer.add_feed_forward_length(4 * cfg.emb_dim)
    writer.add_head_count(cfg.n_heads)
    writer.add_layer_norm_eps(LAYER_NORM_EPS)


# ---- the model: imported where used (torch, onnx)
def eager(cfg: GPTConfig) -> torch.nn.Module:
    """The book's GPTModel(cfg), initialised by the global torch seed (the caller seeds it)."""
    from mha_export.decoder.archs.gpt2.model import GPTModel

    return GPTModel(cfg)


def graph_pieces(g: Graph, w: dict[str, np.ndarray], cfg: GPTConfig, *, fused: bool) -> Pieces:
    from mha_export.decoder.archs.gpt2.graph import GPT2Pieces

    return GPT2Pieces(g, w, cfg, fused=fused)


def pte_module(model: torch.nn.Module, cfg: GPTConfig) -> torch.nn.Module:
    """gpt.pte's module: the GPTModel's weights (shared) over a cache per layer (gpt2.model.CachedGPT)."""
    from mha_export.decoder.archs.gpt2.model import CachedGPT

    return CachedGPT(model, cfg)


def refusal(cfg: GPTConfig, file: str) -> str | None:
    """None: every form GPT-2 has takes every config the forms' own rules let through (mha_runtime.decoder.forms:
    GroupQueryAttention's head size, llama.cpp's head size 1, checked there for any architecture)."""
    return None


# The forms' own bars (mha_runtime.decoder.forms: measured beside llama.cpp on the trained demo GPT-2).
LOSSY_BARS: Mapping[int, float] = MappingProxyType({})
LOSSY_SCALES = "fp32"  # onnxruntime's quantizer's scales: the folders' lossy files as they were


# ---- Hugging Face's clients: config.json as transformers' GPT2Config (decoder/hf_files.py writes it)
HF_CARRIED = ("resid_pdrop", "embd_pdrop", "attn_pdrop", "summary_first_dropout", "initializer_range", "bos_token_id",
              "eos_token_id", "pad_token_id")
HF_DEFAULTS = MappingProxyType({"bos_token_id": GPT2_EOS_ID, "eos_token_id": GPT2_EOS_ID})  # GPT2Config's
# drop_rate only matters in training; GPT-2's config.json has no qkv_bias (its q/k/v always have biases).
HF_DECIDED = MappingProxyType({"vocab_size": "vocab_size", "context_length": "n_positions",
                               "emb_dim": "n_embd", "n_heads": "n_head", "n_layers": "n_layer",
                               "qkv_bias": "qkv_bias (GPT-2 always has q/k/v biases)"})


def hf_config(cfg: GPTConfig, *, tied: bool, eos_id: int | None) -> dict[str, Any]:
    """transformers' GPT2Config fields of the model (GPT2Config().to_dict()'s keys that describe it). The book's
    GPTModel is GPT-2's architecture; its two differences are carried by the weights: without `qkv_bias` its q/k/v
    biases are zero, and its own output head is `tie_word_embeddings: false`. `transformers.js_config.dtype` fp32
    keeps a browser (whose default is q8, `onnx/model_quantized.onnx`) on `onnx/model.onnx`."""
    return {
        "architectures": ["GPT2LMHeadModel"], "model_type": HF_MODEL_TYPE,
        "vocab_size": cfg.vocab_size, "n_positions": cfg.context_length, "n_ctx": cfg.context_length,
        "n_embd": cfg.emb_dim, "n_head": cfg.n_heads, "n_layer": cfg.n_layers, "n_inner": 4 * cfg.emb_dim,
        "activation_function": "gelu_new", "layer_norm_epsilon": LAYER_NORM_EPS,
        "resid_pdrop": cfg.drop_rate, "embd_pdrop": cfg.drop_rate, "attn_pdrop": cfg.drop_rate,
        "initializer_range": 0.02, "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False, "tie_word_embeddings": tied, "use_cache": True,
        "bos_token_id": eos_id, "eos_token_id": eos_id,
        "transformers.js_config": {"dtype": "fp32"},
    }

