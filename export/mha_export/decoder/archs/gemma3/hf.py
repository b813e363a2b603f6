"""Hugging Face's side of Gemma 3: a Gemma3TextConfig config.json (model_type "gemma3_text") onto the book's config,
a Gemma3ForCausalLM checkpoint onto the book's keys, and the folder's own config.json for Optimum and
transformers.js.

What config.json does not say is transformers 5.24's Gemma3TextConfig default, as `from_pretrained` would take it
(num_key_value_heads 4, head_dim 256, max_position_embeddings 131,072, query_pre_attn_scalar 256, sliding_window
4096, rms_norm_eps 1e-6; layer_types every sixth layer global, or every `sliding_window_pattern`-th). The two RoPE
bases are read where either generation writes them, as transformers 5's convert_rope_params_to_dict does:
`rope_parameters` per layer type, else 4.x's rope_theta (global, default 1e6) and rope_local_base_freq (local,
default 1e4). Anything that changes what the model computes and the book's model does not (soft-capping, biases,
another activation or RoPE type, bidirectional attention, quantized weights) is refused in one line. A multimodal
Gemma3Config (model_type "gemma3") is not this family: its text model's config.json is.
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from mha_export.decoder.archs.gemma3.config import DTYPES, LAYER_TYPES, PATTERN, Gemma3Config, pattern_layers
from mha_export.decoder.archs.gemma3.keys import BUFFERS, HEAD, HF_HEAD, describe, hf_names
from mha_runtime.artifact.errors import BadValueError, ConfigError

if TYPE_CHECKING:
    from mha_export.attention.weights.load import WeightFile
    from mha_export.decoder.archs.protocol import Tensors

REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
# Gemma3TextConfig's class defaults of the fields that decide the model (transformers 5.24).
DEFAULTS: dict[str, Any] = {"num_key_value_heads": 4, "head_dim": 256, "max_position_embeddings": 131_072,
                            "query_pre_attn_scalar": 256, "sliding_window": 4096, "rms_norm_eps": 1e-6}
THETA = {"full_attention": ("rope_theta", 1_000_000.0), "sliding_attention": ("rope_local_base_freq", 10_000.0)}
ACTIVATION = "gelu_pytorch_tanh"  # the book's GeGLU: gelu(approximate="tanh")


def _refuse(key: str, value: object, expected: str) -> BadValueError:
    return BadValueError(f"config.json: {key} {json.dumps(value)[:40]}; expected {expected}")


def _rope(data: dict[str, Any]) -> tuple[float, float]:
    """(rope_base, rope_local_base) as transformers 5 resolves them: rope_parameters[layer type]["rope_theta"], 4.x's
    rope_scaling merged into the global one, else rope_theta / rope_local_base_freq, else the defaults."""
    params = data.get("rope_parameters") or {}
    if not isinstance(params, dict) or set(params) - set(LAYER_TYPES) \
            or not all(isinstance(v, dict) or v is None for v in params.values()):
        raise _refuse("rope_parameters", params, "one object per layer type (sliding_attention, full_attention)")
    bases = []
    for kind, (old_key, default) in THETA.items():
        said = dict(params.get(kind) or {})
        if kind == "full_attention" and isinstance(data.get("rope_scaling"), dict):
            said |= data["rope_scaling"]
        rope_type = said.get("rope_type", said.get("type", "default"))
        if rope_type != "default":
            raise _refuse(f"rope_parameters.{kind}.rope_type", rope_type, "'default' (the book's Gemma 3 RoPE)")
        base = said.get("rope_theta", data.get(old_key))
        bases.append(default if base is None else base)
    return bases[0], bases[1]


def config_from_hf(data: dict[str, Any]) -> Gemma3Config:
    """The book's config of a Hugging Face Gemma3TextConfig config.json."""
    for key in REQUIRED:
        if key not in data:
            raise BadValueError(f"config.json: missing key {key!r} of a Gemma 3 config")
    said = DEFAULTS | {k: data[k] for k in DEFAULTS if k in data}
    activation = data.get("hidden_activation", data.get("hidden_act", ACTIVATION))
    if activation != ACTIVATION:
        raise _refuse("hidden_activation", activation, f"{ACTIVATION!r} (the book's GeGLU)")
    for key in ("attention_bias", "use_bidirectional_attention"):
        if data.get(key) not in (None, False):
            raise _refuse(key, data[key], "false (the book's model has no biases and attends causally)")
    for key in ("final_logit_softcapping", "attn_logit_softcapping"):
        if data.get(key) is not None:
            raise _refuse(key, data[key], "null (Gemma 3 has no soft-capping)")
    if data.get("quantization_config") is not None:
        raise BadValueError("config.json: quantization_config says the weights are quantized; expected a "
                            "float checkpoint")
    layers = data["num_hidden_layers"]
    types = data.get("layer_types")
    if types is None:
        pattern = data.get("sliding_window_pattern", data.get("_sliding_window_pattern", PATTERN))
        if isinstance(pattern, bool) or not isinstance(pattern, int) or pattern < 1:
            raise _refuse("sliding_window_pattern", pattern, "a positive integer")
        types = pattern_layers(layers, pattern) if isinstance(layers, int) else ()
    base, local_base = _rope(data)
    dtype = data.get("dtype", data.get("torch_dtype"))
    return Gemma3Config(
        vocab_size=data["vocab_size"], context_length=said["max_position_embeddings"], emb_dim=data["hidden_size"],
        n_heads=data["num_attention_heads"], n_layers=layers, hidden_dim=data["intermediate_size"],
        head_dim=said["head_dim"], n_kv_groups=said["num_key_value_heads"], rope_base=base,
        rope_local_base=local_base, sliding_window=said["sliding_window"],
        layer_types=tuple(types) if isinstance(types, list) else types,
        query_pre_attn_scalar=said["query_pre_attn_scalar"], rms_norm_eps=said["rms_norm_eps"],
        dtype=dtype if dtype in DTYPES else "float32")


def read_hf(source: WeightFile, cfg: Gemma3Config, prefix: str) -> tuple[Tensors, bool]:
    """A Gemma3ForCausalLM / Gemma3TextModel checkpoint onto the book's keys (shapes checked by the caller): the
    same tensors under other names. The head is tied where the file has no lm_head.weight (transformers saves a
    tied one once) or one equal to the token embedding."""
    import torch

    keys = {k for k in source.keys() if not BUFFERS.fullmatch(k)}
    names = hf_names(cfg, prefix)
    extra = sorted(keys - set(names.values()))
    if extra:
        raise ConfigError(f"weights: unexpected key {extra[0]!r} for Hugging Face Gemma 3 with {describe(cfg)}")
    missing = sorted(set(names.values()) - keys - {HF_HEAD})
    if missing:
        raise ConfigError(f"weights: missing key {missing[0]!r} (Hugging Face Gemma 3 with {describe(cfg)})")
    state: Tensors = {book: source.get(hf) for book, hf in names.items() if book != HEAD}
    tied = HF_HEAD not in keys
    if not tied:
        head = source.get(HF_HEAD)
        tied = head.shape == state["tok_emb.weight"].shape and torch.equal(head, state["tok_emb.weight"])
        state[HEAD] = head
    if tied:
        state[HEAD] = state["tok_emb.weight"]
    return state, tied


def hf_config(cfg: Gemma3Config, *, tied: bool, eos_id: int | None) -> dict[str, Any]:
    """transformers' Gemma3TextConfig fields of the model, in the names transformers 4.57 (Optimum 2.1's) and 5
    both read: rope_theta and rope_local_base_freq (5 moves them into rope_parameters on load), layer_types (the
    config's tuple: a list in JSON) and sliding_window as they are. head_dim is written: transformers.js sizes the
    cache by it."""
    return {
        "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
        "vocab_size": cfg.vocab_size, "max_position_embeddings": cfg.context_length, "hidden_size": cfg.emb_dim,
        "intermediate_size": cfg.hidden_dim, "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.kv_heads, "head_dim": cfg.head_dim,
        "hidden_activation": ACTIVATION, "rms_norm_eps": cfg.norm_eps, "rope_theta": cfg.rope_base,
        "rope_local_base_freq": cfg.rope_local_base, "rope_scaling": None, "sliding_window": cfg.sliding_window,
        "layer_types": cfg.layer_types, "query_pre_attn_scalar": cfg.query_pre_attn_scalar,
        "final_logit_softcapping": None, "attn_logit_softcapping": None, "attention_bias": False,
        "attention_dropout": 0.0, "initializer_range": 0.02, "tie_word_embeddings": tied, "use_cache": True,
        "torch_dtype": "float32", "bos_token_id": 2 if cfg.vocab_size > 2 else None, "eos_token_id": eos_id,
        "pad_token_id": 0,
        "transformers.js_config": {"dtype": "fp32"},  # keeps a browser on onnx/model.onnx (its default is q8)
    }
