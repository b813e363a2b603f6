"""The Llama family's configs, torch-free: the book's Llama3Model keys (LLAMA32_CONFIG_1B) and Qwen3Model keys
(QWEN_CONFIG_06_B), with `dtype` as a string (the book's configs hold a torch dtype) and the norm's epsilon (the book
hard-codes 1e-5 for Llama 3 and 1e-6 for Qwen3; Hugging Face's configs say it). One rotary decoder: RMSNorm, RoPE
(base, Llama 3's frequency scaling), grouped-query attention, SwiGLU, tied or untied head (a weights fact, as for
GPT-2); Qwen3 adds q/k RMSNorm per head and a head size that need not be width / heads."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, ClassVar

from mha_runtime.artifact.config_fields import ConfigFile, check_fields, from_fields
from mha_runtime.artifact.errors import BadValueError
from mha_runtime.decoder.shapes import MAX_CONTEXT, MAX_HEADS

# Llama 3's RoPE frequency scaling: the book's rope_freq keys (Hugging Face's rope_scaling, rope_type "llama3").
ROPE_FREQ_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_context_length")
DTYPES = ("float32", "bfloat16", "float16")


def _positive_number(label: str, name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise BadValueError(f"{label} field {name!r}: expected a positive number, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class RotaryConfig(ConfigFile):
    """What Llama 3 and Qwen3 share. Fields are the book's keys; `norm_eps` is the RMSNorm epsilon."""

    FILE_WHAT: ClassVar[str] = "a JSON file of the book's Llama 3 or Qwen3 config keys"
    LABEL: ClassVar[str] = "llama config"

    vocab_size: int
    context_length: int
    emb_dim: int
    n_heads: int
    n_layers: int
    hidden_dim: int
    n_kv_groups: int
    rope_base: int | float
    dtype: str = "float32"

    def _check(self) -> None:
        label = self.LABEL
        check_fields(self, label)
        _positive_number(label, "rope_base", self.rope_base)
        _positive_number(label, "norm_eps", self.norm_eps)
        if self.dtype not in DTYPES:
            raise BadValueError(f"{label} field 'dtype': expected one of {', '.join(DTYPES)}, got {self.dtype!r}")
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

    @property
    def norm_eps(self) -> float:
        raise NotImplementedError

    @property
    def head_dim(self) -> int:
        raise NotImplementedError

    @property
    def kv_heads(self) -> int:
        return self.n_kv_groups

    @property
    def cache_lengths(self) -> None:  # no sliding window: every layer's cache holds the context
        return None

    @property
    def arch(self) -> str:
        raise NotImplementedError

    @property
    def qk_norm(self) -> bool:
        return False

    def parameters(self, *, tied: bool) -> int:
        """Embedding, blocks (q, k, v, out, gate, up, down, two norms, q/k norms), final norm, head unless tied."""
        e, v, d = self.emb_dim, self.vocab_size, self.head_dim
        attention = e * self.n_heads * d + 2 * e * self.kv_heads * d + self.n_heads * d * e
        block = attention + 3 * e * self.hidden_dim + 2 * e + (2 * d if self.qk_norm else 0)
        return v * e + self.n_layers * block + e + (0 if tied else v * e)

    @classmethod
    def from_book(cls, data: dict[str, Any]) -> RotaryConfig:
        return from_fields(cls, data, label=cls.LABEL, noun="key", expected="expected the book's keys")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RotaryConfig:
        return cls.from_book(data)


@dataclass(frozen=True, kw_only=True)
class LlamaConfig(RotaryConfig):
    """The book's Llama3Model config (LLAMA32_CONFIG_1B's keys): head size emb_dim / n_heads."""

    rope_freq: dict[str, int | float] | None = None
    rms_norm_eps: int | float = 1e-5

    def __post_init__(self) -> None:
        if self.emb_dim % self.n_heads:
            raise BadValueError(f"{self.LABEL}: emb_dim {self.emb_dim} is not divisible by n_heads {self.n_heads}")
        self._check()
        if self.rope_freq is not None:
            if not isinstance(self.rope_freq, dict) or sorted(self.rope_freq) != sorted(ROPE_FREQ_KEYS):
                raise BadValueError(f"{self.LABEL} field 'rope_freq': expected null or an object of "
                                    f"{', '.join(ROPE_FREQ_KEYS)}, got {self.rope_freq!r}")
            for key, value in self.rope_freq.items():
                _positive_number(self.LABEL, f"rope_freq.{key}", value)

    @property
    def norm_eps(self) -> float:
        return float(self.rms_norm_eps)

    @property
    def head_dim(self) -> int:
        return self.emb_dim // self.n_heads

    @property
    def arch(self) -> str:
        return "llama"


@dataclass(frozen=True, kw_only=True)
class Qwen3Config(RotaryConfig):
    """The book's Qwen3Model config (QWEN_CONFIG_06_B's keys): `head_dim` its own (null: emb_dim / n_heads),
    `qk_norm` RMSNorm on each head's queries and keys before the rotation."""

    LABEL: ClassVar[str] = "qwen3 config"

    head_dim_: int | None = None  # the book's key "head_dim" (to_dict / from_book rename it)
    qk_norm_: bool = True  # the book's key "qk_norm"
    rms_norm_eps: int | float = 1e-6

    def __post_init__(self) -> None:
        if self.head_dim_ is None and self.emb_dim % self.n_heads:
            raise BadValueError(f"{self.LABEL}: head_dim is null and emb_dim {self.emb_dim} is not divisible by "
                                f"n_heads {self.n_heads}")
        if self.head_dim_ is not None and (isinstance(self.head_dim_, bool) or not isinstance(self.head_dim_, int)
                                           or self.head_dim_ < 1):
            raise BadValueError(f"{self.LABEL} field 'head_dim': expected null or a positive integer, got "
                                f"{self.head_dim_!r}")
        if not isinstance(self.qk_norm_, bool):
            raise BadValueError(f"{self.LABEL} field 'qk_norm': expected true or false, got {self.qk_norm_!r}")
        self._check()

    @property
    def norm_eps(self) -> float:
        return float(self.rms_norm_eps)

    @property
    def head_dim(self) -> int:
        return self.emb_dim // self.n_heads if self.head_dim_ is None else self.head_dim_

    @property
    def qk_norm(self) -> bool:
        return self.qk_norm_

    @property
    def arch(self) -> str:
        return "qwen3"

    def to_dict(self) -> dict[str, Any]:
        data = super().to_dict()
        data["head_dim"], data["qk_norm"] = data.pop("head_dim_"), data.pop("qk_norm_")
        return data

    @classmethod
    def from_book(cls, data: dict[str, Any]) -> Qwen3Config:
        inner = sorted(k for k in data if k in ("head_dim_", "qk_norm_"))
        if inner:
            raise BadValueError(f"{cls.LABEL}: unknown key {inner[0]!r}; expected the book's keys "
                                f"{sorted(QWEN3_BOOK_KEYS)}")
        renamed = {{"head_dim": "head_dim_", "qk_norm": "qk_norm_"}.get(k, k): v for k, v in data.items()}
        try:
            return from_fields(cls, renamed, label=cls.LABEL, noun="key", expected="expected the book's keys")
        except BadValueError as exc:  # name the book's keys, not the fields behind them
            raise BadValueError(str(exc).replace("head_dim_", "head_dim").replace("qk_norm_", "qk_norm")) from None


# The book's keys of each (the table's BOOK_KEYS).
LLAMA_BOOK_KEYS = frozenset(f.name for f in dataclasses.fields(LlamaConfig))
QWEN3_BOOK_KEYS = frozenset(f.name.rstrip("_") for f in dataclasses.fields(Qwen3Config))
