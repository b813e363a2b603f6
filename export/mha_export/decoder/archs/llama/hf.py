"""Hugging Face's side of the Llama family: a LlamaConfig / Qwen3Config config.json onto the book's config, a
LlamaForCausalLM / Qwen3ForCausalLM checkpoint onto the book's keys, and the folder's own config.json for Optimum
and transformers.js.

What config.json does not say is transformers' class default, as `from_pretrained` would take it (transformers
5.24: LlamaConfig's rms_norm_eps 1e-6, max_position_embeddings 2048, key/value heads = heads; Qwen3Config's
head_dim 128, num_key_value_heads 32, max_position_embeddings 32768; both rope_theta 10,000). The RoPE base and
Llama 3's scaling are read where either generation writes them: transformers 5's `rope_parameters`, 4.x's
`rope_theta` and `rope_scaling` (which 5 still reads, and prefers). Anything else that changes what the model
computes and the book's model does not (biases, another activation, another RoPE type, sliding windows, a head
size of its own for Llama, quantized weights) is refused in one line.
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from mha_export.decoder.archs.llama.config import DTYPES, LlamaConfig, Qwen3Config, RotaryConfig
from mha_export.decoder.archs.llama.keys import BUFFERS, HEAD, HF_HEAD, describe, hf_names
from mha_runtime.artifact.errors import BadValueError, ConfigError

if TYPE_CHECKING:
    from mha_export.attention.weights.load import WeightFile
    from mha_export.decoder.archs.protocol import Tensors

REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
# transformers' class defaults of the fields that decide the model (PreTrainedConfig's default_theta for both).
DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {"max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "num_key_value_heads": None,
              "head_dim": None},
    "qwen3": {"max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "num_key_value_heads": 32, "head_dim": 128},
}
DEFAULT_THETA = 10_000.0
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM"}
LLAMA3_KEYS = {"factor": "factor", "low_freq_factor": "low_freq_factor", "high_freq_factor": "high_freq_factor",
               "original_context_length": "original_max_position_embeddings"}  # book key -> Hugging Face key


def _refuse(key: str, value: object, expected: str) -> BadValueError:
    return BadValueError(f"config.json: {key} {json.dumps(value)[:40]}; expected {expected}")


def _rope(data: dict[str, Any], arch: str, context: int) -> tuple[int | float, dict[str, int | float] | None]:
    """(rope_base, the book's rope_freq) as transformers 5 resolves them: `rope_scaling` over `rope_parameters`,
    the dict's rope_theta over the top-level one over the default."""
    params = data.get("rope_scaling") or data.get("rope_parameters") or {}
    if not isinstance(params, dict) or any(isinstance(v, dict) for v in params.values()):
        raise _refuse("rope_parameters", params, "one RoPE for every layer (a flat object)")
    base = params.get("rope_theta", data.get("rope_theta"))
    base = DEFAULT_THETA if base is None else base
    partial = params.get("partial_rotary_factor", data.get("partial_rotary_factor", 1.0))
    if partial not in (None, 1, 1.0):
        raise _refuse("partial_rotary_factor", partial, "1.0 (the book's RoPE rotates the whole head)")
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "default":
        return base, None
    if kind != "llama3" or arch != "llama":
        supported = "'default' or 'llama3'" if arch == "llama" else "'default'"
        raise _refuse("rope_type", kind, f"{supported} (the book's {arch} RoPE)")
    freq = {book: params.get(hf, context if book == "original_context_length" else None)
            for book, hf in LLAMA3_KEYS.items()}
    missing = next((LLAMA3_KEYS[k] for k, v in freq.items() if v is None), None)
    if missing is not None:
        raise BadValueError(f"config.json: rope_scaling of rope_type 'llama3' has no {missing!r}")
    return base, freq


def config_from_hf(data: dict[str, Any], arch: str) -> RotaryConfig:
    """The book's config of a Hugging Face LlamaConfig (arch "llama") or Qwen3Config ("qwen3") config.json."""
    family = "Llama" if arch == "llama" else "Qwen3"
    for key in REQUIRED:
        if key not in data:
            raise BadValueError(f"config.json: missing key {key!r} of a {family} config")
    said = DEFAULTS[arch] | {k: data[k] for k in DEFAULTS[arch] if k in data}
    activation = data.get("hidden_act", "silu")
    if activation != "silu":
        raise _refuse("hidden_act", activation, "'silu' (the book's SwiGLU)")
    for key in ("attention_bias", "mlp_bias", "use_sliding_window"):
        if data.get(key, False) is not False:
            raise _refuse(key, data[key], "false (the book's model has no biases and attends to every position)")
    layers = data.get("layer_types")
    if layers is not None and set(layers) - {"full_attention"}:
        raise _refuse("layer_types", sorted(set(layers) - {"full_attention"}), "full_attention only")
    if data.get("quantization_config") is not None:
        raise BadValueError("config.json: quantization_config says the weights are quantized; expected a "
                            "float checkpoint")
    heads, width = data["num_attention_heads"], data["hidden_size"]
    kv = said["num_key_value_heads"] if said["num_key_value_heads"] is not None else heads
    context = said["max_position_embeddings"]
    base, freq = _rope(data, arch, context)
    dtype = data.get("dtype", data.get("torch_dtype"))
    common: dict[str, Any] = {
        "vocab_size": data["vocab_size"], "context_length": context, "emb_dim": width, "n_heads": heads,
        "n_layers": data["num_hidden_layers"], "hidden_dim": data["intermediate_size"], "n_kv_groups": kv,
        "rope_base": base, "dtype": dtype if dtype in DTYPES else "float32", "rms_norm_eps": said["rms_norm_eps"]}
    if arch == "qwen3":
        return Qwen3Config(**common, head_dim_=said["head_dim"], qk_norm_=True)
    head_dim = said["head_dim"]
    if head_dim is not None and isinstance(width, int) and isinstance(heads, int) and heads > 0 \
            and head_dim * heads != width:
        raise _refuse("head_dim", head_dim, f"null or {width // heads} (hidden_size / num_attention_heads, the "
                      "book's Llama3Model's head size)")
    return LlamaConfig(**common, rope_freq=freq)


def read_hf(source: WeightFile, cfg: RotaryConfig, prefix: str) -> tuple[Tensors, bool]:
    """A LlamaForCausalLM / Qwen3ForCausalLM checkpoint onto the book's keys (shapes checked by the caller): the
    same matrices under other names. The head is tied where the file has no lm_head.weight (transformers saves a
    tied one once) or one equal to the token embedding."""
    import torch

    family = f"Hugging Face {'Llama' if cfg.arch == 'llama' else 'Qwen3'}"
    keys = {k for k in source.keys() if not BUFFERS.fullmatch(k)}
    names = hf_names(cfg, prefix)
    extra = sorted(keys - set(names.values()))
    if extra:
        raise ConfigError(f"weights: unexpected key {extra[0]!r} for {family} with {describe(cfg)}")
    missing = sorted(set(names.values()) - keys - {HF_HEAD})
    if missing:
        raise ConfigError(f"weights: missing key {missing[0]!r} ({family} with {describe(cfg)})")
    state: Tensors = {book: source.get(hf) for book, hf in names.items() if book != HEAD}
    tied = HF_HEAD not in keys
    if not tied:
        head = source.get(HF_HEAD)
        tied = head.shape == state["tok_emb.weight"].shape and torch.equal(head, state["tok_emb.weight"])
        state[HEAD] = head
    if tied:
        state[HEAD] = state["tok_emb.weight"]
    return state, tied


def hf_config(cfg: RotaryConfig, *, tied: bool, eos_id: int | None) -> dict[str, Any]:
    """transformers' LlamaConfig / Qwen3Config fields of the model, in the names transformers 4.57 (Optimum 2.1's)
    and 5 both read: rope_theta and rope_scaling (5 moves them into rope_parameters on load). head_dim is written:
    transformers.js sizes the cache by it. A Qwen3 without q/k norms has no Hugging Face equivalent; its config.json
    still sizes the clients' cache right, and they run the ONNX graph, not Qwen3's code."""
    scaling = None
    if cfg.arch == "llama" and getattr(cfg, "rope_freq", None):
        freq = cfg.rope_freq  # type: ignore[attr-defined]
        scaling = {"rope_type": "llama3"} | {hf: freq[book] for book, hf in LLAMA3_KEYS.items()}
    fields: dict[str, Any] = {
        "architectures": [ARCHITECTURES[cfg.arch]], "model_type": cfg.arch,
        "vocab_size": cfg.vocab_size, "max_position_embeddings": cfg.context_length, "hidden_size": cfg.emb_dim,
        "intermediate_size": cfg.hidden_dim, "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.kv_heads, "head_dim": cfg.head_dim,
        "hidden_act": "silu", "rms_norm_eps": cfg.norm_eps, "rope_theta": cfg.rope_base, "rope_scaling": scaling,
        "attention_bias": False, "attention_dropout": 0.0, "initializer_range": 0.02,
        "tie_word_embeddings": tied, "use_cache": True, "torch_dtype": "float32",
        "bos_token_id": eos_id, "eos_token_id": eos_id,
        "transformers.js_config": {"dtype": "fp32"},  # keeps a browser on onnx/model.onnx (its default is q8)
    }
    if cfg.arch == "llama":
        fields |= {"mlp_bias": False, "pretraining_tp": 1}
    else:
        fields |= {"use_sliding_window": False, "sliding_window": None, "max_window_layers": cfg.n_layers,
                   "layer_types": ["full_attention"] * cfg.n_layers}
    return fields
