"""GPT-2's config (the gpt2 architecture, archs/gpt2/): the book's GPT_CONFIG_124M keys, read from gpt.json or from
a Hugging Face config.json, and the decoder presets. Torch-free: the CLI reads it before anything heavy loads."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, ClassVar

from mha_runtime.artifact.config_fields import ConfigFile, check_fields, from_fields
from mha_runtime.artifact.errors import BadValueError

# GPT-2's <|endoftext|>, written as eos_token_id into genai_config.json and used by `mha generate --eos`.
GPT2_EOS_ID = 50256
GPT2_VOCAB = 50257
# GPT2Config's flags that change what the model computes, with the one value the book's GPT has: any other would
# be exported as the book's GPT and be silently wrong.
FIXED_HF: dict[str, tuple[bool, str]] = {
    "scale_attn_weights": (True, "the book's attention divides the scores by sqrt(head_dim)"),
    "scale_attn_by_inverse_layer_idx": (False, "the book's attention does not scale by the layer's index"),
    "tie_word_embeddings": (True, "GPT-2's tied output head"),
}
# The book's LayerNorm epsilon and GPT-2's layer_norm_epsilon.
LAYER_NORM_EPS = 1e-5
# Refused before any work: larger shapes do not fit the artifacts' 2 GiB protobuf or this machine's memory.
MAX_CONTEXT = 4096
MAX_HEADS = 256


@dataclass(frozen=True, kw_only=True)
class GPTConfig(ConfigFile):
    """The book's GPTModel config (chapter 4, GPT_CONFIG_124M)."""

    FILE_WHAT: ClassVar[str] = "a JSON file of the book's GPT config keys"

    vocab_size: int
    context_length: int
    emb_dim: int
    n_heads: int
    n_layers: int
    drop_rate: float = 0.0
    qkv_bias: bool = False

    def __post_init__(self) -> None:
        check_fields(self, "gpt config")
        if self.emb_dim % self.n_heads:
            raise BadValueError(f"gpt config: emb_dim {self.emb_dim} is not divisible by n_heads {self.n_heads}")
        if self.context_length < 2:
            raise BadValueError(f"gpt config field 'context_length': expected at least 2 (one prompt token and one new "
                              f"token), got {self.context_length}")
        if self.context_length > MAX_CONTEXT:
            raise BadValueError(f"gpt config field 'context_length': expected at most {MAX_CONTEXT}, "
                              f"got {self.context_length}")
        if self.n_heads > MAX_HEADS:
            raise BadValueError(f"gpt config field 'n_heads': expected at most {MAX_HEADS}, got {self.n_heads}")

    @property
    def head_dim(self) -> int:
        return self.emb_dim // self.n_heads

    @property
    def kv_heads(self) -> int:  # GPT-2 gives every query head its own key/value head
        return self.n_heads

    @property
    def arch(self) -> str:
        return "gpt2"

    @property
    def cache_lengths(self) -> None:  # no sliding window: every layer's cache holds the context
        return None

    def parameters(self, *, tied: bool) -> int:
        """Parameter count: embeddings, blocks, final norm, and the head unless it is the token embedding."""
        e, v = self.emb_dim, self.vocab_size
        attention = 3 * e * e + (3 * e if self.qkv_bias else 0) + e * e + e
        block = attention + 2 * (2 * e) + (e * 4 * e + 4 * e) + (4 * e * e + e)
        return v * e + self.context_length * e + self.n_layers * block + 2 * e + (0 if tied else v * e)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GPTConfig:
        """The book's keys, or a Hugging Face GPT-2 config.json (recognised by `n_embd`)."""
        if "n_embd" in data:
            return cls.from_hf(data)
        return cls.from_book(data)

    @classmethod
    def from_book(cls, data: dict[str, Any]) -> GPTConfig:
        """The book's GPT_CONFIG_124M keys (gpt.json; every artifact's metadata)."""
        return from_fields(cls, data, label="gpt config", noun="key", expected="expected the book's keys")

    @classmethod
    def from_hf(cls, data: dict[str, Any]) -> GPTConfig:
        """A Hugging Face GPT2Config: GPT-2 always has q/k/v biases; other activations or epsilons are refused."""
        for key in ("vocab_size", "n_positions", "n_embd", "n_head", "n_layer"):
            if key not in data:
                raise BadValueError(f"config.json: missing key {key!r} of a GPT-2 config")
        activation = data.get("activation_function", "gelu_new")
        if activation not in ("gelu_new", "gelu_pytorch_tanh"):
            raise BadValueError(f"config.json: activation_function {activation!r}; expected GPT-2's 'gelu_new'")
        eps = data.get("layer_norm_epsilon", LAYER_NORM_EPS)
        if eps != LAYER_NORM_EPS:
            raise BadValueError(f"config.json: layer_norm_epsilon {eps!r}; expected {LAYER_NORM_EPS} (the book's)")
        for key, (want, what) in FIXED_HF.items():
            got = data.get(key, want)
            if got is not want:  # JSON's true/false only: 1, "true" or null are not what transformers reads as set
                raise BadValueError(f"config.json: {key} {json.dumps(got)[:40]}; expected {json.dumps(want)} ({what})")
        config = cls(vocab_size=data["vocab_size"], context_length=data["n_positions"], emb_dim=data["n_embd"],
                     n_heads=data["n_head"], n_layers=data["n_layer"], drop_rate=0.0, qkv_bias=True)
        inner = data.get("n_inner")  # transformers' feed-forward width, 4 * n_embd when null
        if inner is not None and (type(inner) is not int or inner != 4 * config.emb_dim):
            raise BadValueError(f"config.json: n_inner {json.dumps(inner)[:40]}; expected null or "
                                f"{4 * config.emb_dim} (the book's feed-forward width, 4 * n_embd)")
        return config


GPT_PRESETS: dict[str, GPTConfig] = {
    # make export: GPT-2's vocabulary (the real tokenizer applies), 2 layers of width 64: seconds to export.
    "gpt-mini": GPTConfig(vocab_size=GPT2_VOCAB, context_length=256, emb_dim=64, n_heads=4, n_layers=2),
    # The book's GPT_CONFIG_124M (make bench, random weights).
    "gpt-124m": GPTConfig(vocab_size=GPT2_VOCAB, context_length=1024, emb_dim=768, n_heads=12, n_layers=12,
                          drop_rate=0.1),
}


def gpt_preset(name: str) -> GPTConfig:
    try:
        return GPT_PRESETS[name]
    except KeyError:
        raise BadValueError(f"unknown GPT preset {name!r}; choose one of {', '.join(GPT_PRESETS)}") from None
