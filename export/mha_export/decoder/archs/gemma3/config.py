"""Gemma 3's config, torch-free: the book's Gemma3Model keys (ch05/12_gemma3's GEMMA3_CONFIG_270M), with `dtype` as
a string (the book's dict holds a torch dtype) and the RMSNorm epsilon (the book hard-codes 1e-6; Hugging Face's
config and the GGUF say it). Per layer, `layer_types` says local ("sliding_attention": a window of the last
`sliding_window` positions, RoPE base `rope_local_base`) or global ("full_attention": causal, `rope_base`), as
transformers' Gemma3TextConfig.layer_types does. The head is tied or not as the weights say (as for GPT-2 and Llama).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, ClassVar

from mha_runtime.artifact.config_fields import ConfigFile, check_fields, from_fields
from mha_runtime.artifact.errors import BadValueError
from mha_runtime.decoder.shapes import MAX_CONTEXT, MAX_HEADS, window_cache_lengths

SLIDING, FULL = "sliding_attention", "full_attention"
LAYER_TYPES = (SLIDING, FULL)
DTYPES = ("float32", "bfloat16", "float16")
PATTERN = 6  # transformers' and llama.cpp's default: five local layers, then a global one


def pattern_layers(n_layers: int, pattern: int) -> tuple[str, ...]:
    """Every `pattern`-th layer global, the others local (transformers' sliding_window_pattern, llama.cpp's
    set_swa_pattern: layer i is local where i % pattern < pattern - 1); pattern 0 makes every layer local
    (llama.cpp's)."""
    return tuple(SLIDING if pattern == 0 or i % pattern < pattern - 1 else FULL for i in range(n_layers))


def _positive_number(label: str, name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise BadValueError(f"{label} field {name!r}: expected a positive number, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class Gemma3Config(ConfigFile):
    """The book's Gemma3Model config. Fields are the book's keys; `rms_norm_eps` is every RMSNorm's epsilon (the
    q/k norms' too). `layer_types` is kept as a tuple (a list in JSON)."""

    FILE_WHAT: ClassVar[str] = "a JSON file of the book's Gemma 3 config keys"
    LABEL: ClassVar[str] = "gemma3 config"

    vocab_size: int
    context_length: int
    emb_dim: int
    n_heads: int
    n_layers: int
    hidden_dim: int
    head_dim: int
    n_kv_groups: int
    rope_base: int | float  # global layers
    rope_local_base: int | float  # local layers
    sliding_window: int
    layer_types: tuple[str, ...]
    query_pre_attn_scalar: int | float  # queries are scaled by its -0.5 power (not head_dim's)
    qk_norm: bool = True
    rms_norm_eps: int | float = 1e-6
    dtype: str = "float32"

    def __post_init__(self) -> None:
        label = self.LABEL
        if isinstance(self.layer_types, list):  # JSON's list, the book's list
            object.__setattr__(self, "layer_types", tuple(self.layer_types))
        check_fields(self, label)
        for name in ("rope_base", "rope_local_base", "query_pre_attn_scalar", "rms_norm_eps"):
            _positive_number(label, name, getattr(self, name))
        if self.dtype not in DTYPES:
            raise BadValueError(f"{label} field 'dtype': expected one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.qk_norm is not True:
            raise BadValueError(f"{label} field 'qk_norm': expected true (Gemma 3's q/k norms are always there), "
                                f"got {self.qk_norm!r}")
        types = self.layer_types
        if not isinstance(types, tuple) or len(types) != self.n_layers:
            raise BadValueError(f"{label} field 'layer_types': expected a list of n_layers ({self.n_layers}) "
                                f"entries, got {str(list(types) if isinstance(types, tuple) else types)[:60]}")
        bad = next((t for t in types if t not in LAYER_TYPES), None)
        if bad is not None:
            raise BadValueError(f"{label} field 'layer_types': unknown layer type {str(bad)[:40]!r}; expected "
                                f"{SLIDING!r} or {FULL!r}")
        if self.n_heads % self.n_kv_groups:
            raise BadValueError(f"{label}: n_heads {self.n_heads} is not a multiple of n_kv_groups "
                                f"{self.n_kv_groups}")
        if self.head_dim % 2:
            raise BadValueError(f"{label}: head size {self.head_dim} is odd; rotary positions rotate pairs")
        if self.context_length < 2:
            raise BadValueError(f"{label} field 'context_length': expected at least 2 (one prompt token and one new "
                                f"token), got {self.context_length}")
        if self.context_length > MAX_CONTEXT or self.n_heads > MAX_HEADS:
            raise BadValueError(f"{label}: expected context_length <= {MAX_CONTEXT} and n_heads <= {MAX_HEADS}, got "
                                f"{self.context_length} and {self.n_heads}")

    # ---- what the contract and the graph builders read
    @property
    def arch(self) -> str:
        return "gemma3"

    @property
    def kv_heads(self) -> int:
        return self.n_kv_groups

    @property
    def norm_eps(self) -> float:
        return float(self.rms_norm_eps)

    def is_local(self, layer: int) -> bool:
        """Whether block `layer` attends within the sliding window (and rotates with rope_local_base)."""
        return self.layer_types[layer] == SLIDING

    def rope_base_of(self, layer: int) -> float:
        """Block `layer`'s RoPE base: rope_local_base for a local layer, rope_base for a global one."""
        return float(self.rope_local_base if self.is_local(layer) else self.rope_base)

    def window_of(self, layer: int) -> int | None:
        """How many positions (the query's own included) block `layer` sees: sliding_window, or None (all)."""
        return self.sliding_window if self.is_local(layer) else None

    @property
    def cache_lengths(self) -> tuple[int, ...] | None:
        """The local layers' in-place caches keep only their window (when it is shorter than the context)."""
        return window_cache_lengths([self.window_of(i) for i in range(self.n_layers)], self.context_length)

    def parameters(self, *, tied: bool) -> int:
        """Embedding, blocks (q, k, v, out, gate, up, down, four norms, q/k norms), final norm, head unless tied."""
        e, v, d = self.emb_dim, self.vocab_size, self.head_dim
        attention = e * self.n_heads * d + 2 * e * self.kv_heads * d + self.n_heads * d * e
        block = attention + 3 * e * self.hidden_dim + 4 * e + 2 * d
        return v * e + self.n_layers * block + e + (0 if tied else v * e)

    # ---- JSON: the book's keys, layer_types a list
    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["layer_types"] = list(self.layer_types)
        return data

    @classmethod
    def from_book(cls, data: dict[str, Any]) -> Gemma3Config:
        return from_fields(cls, data, label=cls.LABEL, noun="key", expected="expected the book's keys")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Gemma3Config:
        return cls.from_book(data)


GEMMA3_BOOK_KEYS = frozenset(f.name for f in dataclasses.fields(Gemma3Config))
