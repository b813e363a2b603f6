"""The one config object (a frozen dataclass) and its named presets."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from mha_runtime.artifact.config_fields import ConfigFile, check_fields, from_fields, json_object
from mha_runtime.artifact.errors import BadValueError


@dataclass(frozen=True, kw_only=True)
class MHAConfig(ConfigFile):
    """Shape of the tutorial's MultiHeadAttentionWrapper (chapter 3)."""

    FILE_WHAT: ClassVar[str] = "a JSON file of config fields"

    d_in: int
    d_out: int  # per head
    num_heads: int
    context_length: int
    dropout: float = 0.0
    qkv_bias: bool = False
    # The wrapper followed by Linear(H * d_out, H * d_out) with bias: the book's MultiHeadAttention.out_proj,
    # GPT-2's c_proj.
    out_proj: bool = False

    def __post_init__(self) -> None:
        check_fields(self, "config")

    @property
    def d_model(self) -> int:
        """Width of the output: heads concatenated on the last axis."""
        return self.num_heads * self.d_out

    def to_dict(self) -> dict[str, Any]:
        """Every field; `out_proj` only when true, so that configs without it write the bytes they always did
        (the config is in every artifact's metadata)."""
        data = dataclasses.asdict(self)
        if not self.out_proj:
            del data["out_proj"]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MHAConfig:
        return from_fields(cls, data, label="config", noun="field", expected="expected only")

    @classmethod
    def from_json(cls, text: str) -> MHAConfig:
        """The config an artifact carries in its metadata."""
        return cls.from_dict(json_object(text, "config"))


PRESETS: dict[str, MHAConfig] = {
    # The tutorial's toy example: "Your journey starts with one step", 6 tokens of width 3.
    "seed": MHAConfig(d_in=3, d_out=2, num_heads=2, context_length=6),
    # One GPT-2 small attention layer: 12 heads of 64, context 1024.
    "gpt2-small": MHAConfig(d_in=768, d_out=64, num_heads=12, context_length=1024),
}


def preset(name: str) -> MHAConfig:
    """Look up a named preset, or say which names exist."""
    try:
        return PRESETS[name]
    except KeyError:
        raise BadValueError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}") from None
