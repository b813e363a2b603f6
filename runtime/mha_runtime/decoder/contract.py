"""The GPT's I/O contract, defined once: names, dtypes and axes of its two decoder forms.

`gpt.onnx` speaks Optimum's GPT-2 names (code written for Optimum or transformers.js exports drives it):
input_ids (B, T) int64, attention_mask (B, P + T) int64, position_ids (B, T) int64 and per layer
past_key_values.{i}.key/.value (B, H, P, D) in; logits (B, T, V) and present.{i}.key/.value (B, H, P + T, D) out.
The cache grows by Concat; P may be 0 (the same file prefills).

`gpt.inplace.onnx` keeps one preallocated cache per layer, (B, H, context_length, D), bound as both
past_key_values.{i}.* and present.{i}.* (IO binding): ONNX Runtime writes each step's rows into it in place. A layer
with a sliding window shorter than the context keeps only its W rows (contract.shapes.cache_lengths; shapes.py says
which rows hold which positions).
Its other inputs are input_ids (B, T) and past_tokens (B,) int32, each row's own count of cached tokens (rows may
differ: no padding); its output is next_token_logits (B, V), the logits of each row's last token only.

`gpt.pte` (ExecuTorch, XNNPACK; built only on request, `--variants ...,pte`) keeps its cache inside the program
(mutable buffers [1, H, context_length, D] per layer): forward(input_ids (1, T) int64, input_pos (1,) int64) ->
next_token_logits (1, V), writing the T new rows at input_pos .. input_pos + T - 1. Its bounds (pte_bounds) are
in the manifest and are refused before the runtime.

A folder with a chat template records the ids a chat's reply ends at (`contract.chat.end_of_turn_ids`, chat_contract):
the export finds them (mha_runtime.decoder.chat.turns), every runtime reads them here; a folder without a template
has no "chat" entry, so its manifest is what it was before the field existed.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from mha_runtime.artifact.errors import ArtifactError
from mha_runtime.decoder.shapes import DecoderShapes, Shaped, cache_rows

INPUT_IDS = "input_ids"
ATTENTION_MASK = "attention_mask"
POSITION_IDS = "position_ids"
LOGITS = "logits"
PAST_TOKENS = "past_tokens"
INPUT_POS = "input_pos"
NEXT_LOGITS = "next_token_logits"
# Optimum's axis names.
BATCH = "batch_size"
TOKENS = "sequence_length"
PAST = "past_sequence_length"
TOTAL = "past_sequence_length + sequence_length"
Signed = tuple[str, list[Any]]  # (dtype, shape) of one input or output

CONCAT_FORM = "gpt.onnx"
INPLACE_FORM = "gpt.inplace.onnx"
INT8_FORM = "gpt.inplace.int8.onnx"
INT4_FORM = "gpt.inplace.int4.onnx"
GENAI_CONFIG = "genai_config.json"
# The folder as a Hugging Face GPT-2 ONNX model (export/mha_export/decoder/hf_files.py): what Optimum's
# ORTModelForCausalLM and transformers.js read. ONNX_MODEL is transformers.js' default path (and Optimum's standard
# name), a relative symbolic link to gpt.onnx (a hard link where the filesystem has no symbolic links).
HF_CONFIG = "config.json"
GENERATION_CONFIG = "generation_config.json"
ONNX_MODEL = "onnx/model.onnx"
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
WEIGHTS_FILE = "gpt.safetensors"
META_GPT_CONFIG = "mha_export.gpt_config"
META_GPT_CONTRACT = "mha_export.gpt_contract"


def past_key(layer: int) -> str:
    return f"past_key_values.{layer}.key"


def past_value(layer: int) -> str:
    return f"past_key_values.{layer}.value"


def present_key(layer: int) -> str:
    return f"present.{layer}.key"


def present_value(layer: int) -> str:
    return f"present.{layer}.value"


# The file names of the on-request formats (their rows: mha_runtime.decoder.forms).
PTE_FORM = "gpt.pte"
GGUF_FORM = "gpt.gguf"
GGUF_Q8_0 = "gpt.q8_0.gguf"
GGUF_Q4_0 = "gpt.q4_0.gguf"


def pte_bounds(config: Shaped) -> dict[str, int]:
    """What gpt.pte can take: ExecuTorch plans its memory (the cache included) at these upper bounds."""
    return {"batch": 1, "context_length": config.context_length, "max_prefill_tokens": config.context_length}


def pte_signature(config: Shaped) -> dict[str, Signed]:
    """name -> (dtype, shape) of gpt.pte's forward inputs, then its output (the cache is inside the program)."""
    return {INPUT_IDS: ("int64", [1, TOKENS]), INPUT_POS: ("int64", [1]),
            NEXT_LOGITS: ("float32", [1, config.vocab_size])}


def _signature(config: Shaped, inputs: dict[str, Signed], past: Callable[[int], list[Any]],
               output: tuple[str, Signed], present: Callable[[int], list[Any]]) -> dict[str, Signed]:
    """The inputs, every layer's past key and value, the output, every layer's present key and value (`past(i)`
    and `present(i)`: layer i's cache shape)."""
    layers = range(config.n_layers)
    sig = inputs | {name(i): ("float32", past(i)) for i in layers for name in (past_key, past_value)}
    sig[output[0]] = output[1]
    return sig | {name(i): ("float32", present(i)) for i in layers for name in (present_key, present_value)}


def concat_signature(config: Shaped) -> dict[str, Signed]:
    """name -> (dtype, shape) of every input, then every output, of gpt.onnx."""
    h, d = config.kv_heads, config.head_dim
    return _signature(config, {INPUT_IDS: ("int64", [BATCH, TOKENS]), ATTENTION_MASK: ("int64", [BATCH, TOTAL]),
                               POSITION_IDS: ("int64", [BATCH, TOKENS])}, lambda _: [BATCH, h, PAST, d],
                      (LOGITS, ("float32", [BATCH, TOKENS, config.vocab_size])), lambda _: [BATCH, h, TOTAL, d])


def inplace_signature(config: Shaped) -> dict[str, Signed]:
    """name -> (dtype, shape) of every input, then every output, of gpt.inplace.onnx (and its lossy forms): layer
    i's buffer holds its cache_rows (context_length, or a window's rows)."""
    rows = cache_rows(config)

    def buffer(i: int) -> list[Any]:
        return [BATCH, config.kv_heads, rows[i], config.head_dim]

    return _signature(config, {INPUT_IDS: ("int64", [BATCH, TOKENS]), PAST_TOKENS: ("int32", [BATCH])}, buffer,
                      (NEXT_LOGITS, ("float32", [BATCH, config.vocab_size])), buffer)


def n_inputs(kind: str, config: Shaped) -> int:
    return (3 if kind == "concat" else 2) + 2 * config.n_layers


# The manifest's contract entry of a folder with a chat template, and its one field.
CHAT = "chat"
END_OF_TURN = "end_of_turn_ids"


def chat_contract(end_of_turn_ids: Sequence[int]) -> dict[str, Any]:
    """contract.chat: the ids a reply to a chat (messages rendered with the folder's template) ends at."""
    return {END_OF_TURN: list(end_of_turn_ids),
            "stop": "a reply to messages rendered with the folder's chat template ends at the first of these ids: the "
                    "eos ids, tokenizer_config.json's eos_token and the special token the template closes each "
                    "turn with"}


def read_end_of_turn(contract: dict[str, Any], vocab_size: int, where: str) -> tuple[int, ...] | None:
    """contract.chat.end_of_turn_ids as ids, or None in a folder made before the field (or without a template);
    anything else there is one ArtifactError line."""
    chat = contract.get(CHAT)
    if chat is None:
        return None
    ids = chat.get(END_OF_TURN) if isinstance(chat, dict) else None
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < vocab_size
                                            for i in ids):
        raise ArtifactError(f"{where}: contract.chat.{END_OF_TURN}: expected a list of token ids below "
                            f"vocab_size {vocab_size}, got {json.dumps(ids)[:60]}")
    return tuple(ids)


def contract_dict(config: Shaped, *, executorch: bool = False,
                  end_of_turn: Sequence[int] | None = None) -> dict[str, Any]:
    """The contract as the manifest records it, for programs that drive the files without this package; the
    gpt.pte entry only in a folder that has it, the chat entry only in one with a chat template (`end_of_turn`)."""
    out = _contract_dict(config)
    if end_of_turn is not None:
        out[CHAT] = chat_contract(end_of_turn)
    if executorch:
        h, c, d = config.kv_heads, config.context_length, config.head_dim
        out["executorch"] = {"file": PTE_FORM, "signature": pte_signature(config), "bounds": pte_bounds(config),
                             "cache": f"inside the program: mutable buffers [1, {h}, {c}, {d}] per layer for keys "
                                      "and values, kept between calls; a call at input_pos p writes rows "
                                      "p .. p + T - 1 and attends to rows 0 .. p + T - 1; a new sequence starts "
                                      "at input_pos 0"}
    return out


# The in-place cache's rule for a folder with windowed layers (appended to contract.inplace.cache).
WINDOWED = ("; a layer whose buffer has fewer rows than context_length (shapes.cache_lengths, a sliding window's W) "
            "keeps only the last W positions: after a call that brings row b to P tokens, its rows 0 .. min(P, W) - 1 "
            "hold positions P - min(P, W) .. P - 1, in order (GroupQueryAttention's sliding_window_cache)")


def _contract_dict(config: Shaped) -> dict[str, Any]:
    return {"shapes": DecoderShapes.of(config).to_dict(),
            "concat": {"file": CONCAT_FORM, "signature": concat_signature(config),
                       "masking": "attention_mask 1 = real token, 0 = padding; position_ids count real tokens"},
            "inplace": {"file": INPLACE_FORM, "signature": inplace_signature(config),
                        "cache": "bind one buffer per past/present pair; row b's new tokens go to rows "
                                 "past_tokens[b] .. past_tokens[b] + T - 1; T > 1 after a past only at batch 1"
                                 + ("" if config.cache_lengths is None else WINDOWED)},
            "sampling": "top-k (keep logits >= the k-th largest), then divide by temperature, then softmax; "
                        "temperature 0: argmax. Draw: u = PCG64(seed).random() per row and step, the first id "
                        "whose cumulative probability exceeds u"}


def id_problem(ids: list[Any], vocab_size: int, show: Callable[[Any], str]) -> str | None:
    """What is wrong with a prompt's token ids, in words, or None; `show` writes a value as the caller's format
    does (repr in Python, JSON on the wire). Lists, not next(..., None): a None among the ids is found too."""
    bad = [t for t in ids if isinstance(t, bool) or not isinstance(t, int)]
    if bad:
        return f"expected integer token ids, got {show(bad[0])}"
    outside = [t for t in ids if not 0 <= t < vocab_size]
    if outside:
        return f"token id {show(outside[0])} is outside the vocabulary (0..{vocab_size - 1})"
    return None
