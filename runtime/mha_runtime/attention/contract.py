"""The I/O contract, defined once: names, symbolic axes, dtype and limits, and its input check."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from mha_runtime.artifact.errors import ContractError
from mha_runtime.attention.config import MHAConfig

INPUT_NAME = "x"
OUTPUT_NAME = "context"
BATCH_AXIS = "batch"
TOKENS_AXIS = "tokens"
DTYPE = "float32"
# The decode form (key/value cache): extra inputs and outputs, and its axes.
PAST_KEY, PAST_VALUE = "past_key", "past_value"
PRESENT_KEY, PRESENT_VALUE = "present_key", "present_value"
PAST_AXIS, NEW_AXIS = "past_tokens", "new_tokens"
TOTAL_AXIS = f"{PAST_AXIS} + {NEW_AXIS}"
# Keys under which the ONNX file's metadata_props carry the config and the contract.
META_CONFIG = "mha.config"
META_CONTRACT = "mha.contract"
# Floating dtypes the Python runner casts to float32 (either byte order); anything else is refused.
CASTABLE = ("float16", "float32", "float64")


@dataclass(frozen=True)
class IOContract:
    """What goes in and what comes out of every artifact built from one config."""

    config: MHAConfig

    @property
    def input_shape(self) -> list[str | int]:
        return [BATCH_AXIS, TOKENS_AXIS, self.config.d_in]

    @property
    def output_shape(self) -> list[str | int]:
        return [BATCH_AXIS, TOKENS_AXIS, self.config.d_model]

    def to_dict(self) -> dict[str, Any]:
        return {
            "input": {"name": INPUT_NAME, "dtype": DTYPE, "shape": self.input_shape},
            "output": {"name": OUTPUT_NAME, "dtype": DTYPE, "shape": self.output_shape},
            "limits": {"batch_min": 1, "tokens_min": 1, "tokens_max": self.config.context_length},
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)


def metadata(config: MHAConfig, contract_json: str | None = None) -> dict[str, str]:
    """An ONNX file's metadata_props: the config and the I/O contract (the main one unless another is given)."""
    return {META_CONFIG: config.to_json(), META_CONTRACT: contract_json or IOContract(config).to_json()}


PAST_TOKENS = "past_tokens"  # the in-place decode form's (batch,) int32 input: rows of the buffer in use


@dataclass(frozen=True)
class DecodeContract:
    """The decode form's I/O: x plus the cache in, context plus the grown cache out."""

    IN_PLACE: ClassVar[bool] = False
    config: MHAConfig

    def signature(self) -> dict[str, list[str | int]]:
        """Names and shapes, inputs first, in graph order."""
        c = self.config
        past, total = (c.context_length, c.context_length) if self.IN_PLACE else (PAST_AXIS, TOTAL_AXIS)
        inputs = {INPUT_NAME: [BATCH_AXIS, NEW_AXIS, c.d_in], PAST_KEY: [BATCH_AXIS, c.num_heads, past, c.d_out],
                  PAST_VALUE: [BATCH_AXIS, c.num_heads, past, c.d_out]}
        return inputs | ({PAST_TOKENS: [BATCH_AXIS]} if self.IN_PLACE else {}) | {
            OUTPUT_NAME: [BATCH_AXIS, NEW_AXIS, c.d_model], PRESENT_KEY: [BATCH_AXIS, c.num_heads, total, c.d_out],
            PRESENT_VALUE: [BATCH_AXIS, c.num_heads, total, c.d_out]}

    def to_json(self) -> str:
        sig = self.signature()
        outputs = (OUTPUT_NAME, PRESENT_KEY, PRESENT_VALUE)
        doc: dict[str, Any] = {
            "inputs": [{"name": n, "dtype": "int32" if n == PAST_TOKENS else DTYPE, "shape": s}
                       for n, s in sig.items() if n not in outputs],
            "outputs": [{"name": n, "dtype": DTYPE, "shape": sig[n]} for n in outputs],
            "limits": {"batch_min": 1, "new_tokens_min": 1, "past_tokens_min": 0,
                       "past_plus_new_max": self.config.context_length}}
        if self.IN_PLACE:
            doc["limits"]["new_tokens_after_a_past_needs_batch"] = 1
            doc["in_place"] = "bind present_key/present_value to the past_key/past_value buffers"
        return json.dumps(doc, sort_keys=True)


class InPlaceDecodeContract(DecodeContract):
    """The in-place decode form: the cache is one buffer of context_length rows that each step writes into.

    past_key/past_value and present_key/present_value are the same (batch, H, context_length, d_out) buffer
    (bind one OrtValue to both to write in place; rows at and after past_tokens are never read); past_tokens
    says how many rows hold keys and values already.
    """

    IN_PLACE = True


def check_input(x: Any, config: MHAConfig, *, past_tokens: int = 0) -> np.ndarray:
    """Return `x` as a C-contiguous float32 array (B, T, d_in), or raise ContractError saying why not.

    With `past_tokens` (decode), T may be at most context_length - past_tokens.
    float16 and float64 are cast to float32 (numpy's default float64 would otherwise be refused
    for nothing); integer, bool and complex inputs are refused.
    """
    if not isinstance(x, np.ndarray):
        raise ContractError(f"input {INPUT_NAME!r}: expected a numpy array, got {type(x).__name__}")
    if isinstance(x, np.ma.MaskedArray):  # its masked entries would hide NaNs from the finiteness check
        raise ContractError(f"input {INPUT_NAME!r}: expected a plain numpy array, got a masked array "
                            "(fill it first: x.filled(value))")
    if x.ndim != 3:
        raise ContractError(
            f"input {INPUT_NAME!r}: expected rank 3 [batch, tokens, {config.d_in}], "
            f"got rank {x.ndim} with shape {list(x.shape)}"
        )
    batch, tokens, width = x.shape
    if width != config.d_in:
        raise ContractError(
            f"input {INPUT_NAME!r}: expected last axis d_in={config.d_in}, got {width} (shape {list(x.shape)})"
        )
    if batch < 1:
        raise ContractError(f"input {INPUT_NAME!r}: expected batch >= 1, got {batch}")
    if past_tokens and not 1 <= tokens <= config.context_length - past_tokens:
        raise ContractError(
            f"input {INPUT_NAME!r}: expected 1 <= new tokens <= context_length - past_tokens = "
            f"{config.context_length} - {past_tokens} = {config.context_length - past_tokens}, got {tokens}"
        )
    if not 1 <= tokens <= config.context_length:
        raise ContractError(
            f"input {INPUT_NAME!r}: expected 1 <= tokens <= context_length={config.context_length}, got {tokens}"
        )
    if x.dtype.name not in CASTABLE:
        raise ContractError(f"input {INPUT_NAME!r}: expected dtype float32 (or float16/float64, cast), got {x.dtype}")
    if x.dtype != np.float32:  # float16, float64, or a non-native byte order
        with np.errstate(over="ignore"):  # overflow becomes inf, refused just below
            x = x.astype(np.float32)
    if not np.isfinite(x).all():
        bad = int(np.size(x) - np.count_nonzero(np.isfinite(x)))
        raise ContractError(f"input {INPUT_NAME!r}: expected finite float32 values, got {bad} NaN/inf value(s)")
    return np.ascontiguousarray(x)


def check_output(out: np.ndarray, x: np.ndarray) -> np.ndarray:
    """`out` if every value is finite; otherwise ContractError naming the input's magnitude (finite inputs
    around 1e19 overflow float32 attention scores into NaN)."""
    if not np.isfinite(out).all():
        bad = int(out.size - np.count_nonzero(np.isfinite(out)))
        raise ContractError(f"output {OUTPUT_NAME!r}: {bad} NaN/inf value(s) from a finite input of max |x| = "
                            f"{float(np.abs(x).max()):.3g}; inputs that large overflow float32 attention scores: "
                            "scale the input down")
    return out
