"""A GGUF of the book's state (any source: the weights loaders map each onto it) under the llama.cpp architecture
of the config's (its GGUF_ARCH: `gpt2`), written with gguf-py (PyPI `gguf`, the library of llama.cpp's own
converter).

The architecture names the tensors as llama.cpp's loader for it reads them (its gguf_tensors: GPT-2's token_embd,
position_embd, blk.N.attn_qkv, ..., output only where the head is not the token embedding) and writes its
metadata keys (its gguf_metadata); this module writes the file: the name, those keys, the file type, the
tokenizer and the tensors at the file's type.

The quant types are the converter's policy (`--outtype q8_0`): every 2-D weight but position_embd in the type,
norms, biases and position_embd in F32, quantized by gguf.quants (bit-exact with ggml's reference quantizers:
tests/decoder/test_gpt_gguf.py compares them with ggml_quantize_chunk's). Q4_0 keeps the head (output, or token_embd
where the head is tied to it) at Q8_0, as llama-quantize's own Q4_0 keeps that matrix at a higher type (Q6_K,
which gguf-py cannot write).
"""
from __future__ import annotations

import json
import logging
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch

from mha_export.decoder.archs import arch_of
from mha_export.decoder.archs.gpt2.config import GPT2_EOS_ID
from mha_export.decoder.archs.protocol import DecoderConfig
from mha_export.gguf.tokenizer import NUMERAL
from mha_runtime.artifact.errors import ExportError
from mha_runtime.decoder.forms import Form

BLOCK = 32  # the Q8_0 and Q4_0 block: rows must be a multiple of it
Q8_0, Q4_0, F32 = gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_0, gguf.GGMLQuantizationType.F32
FILE_TYPES = {"fp32": gguf.LlamaFileType.ALL_F32, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
              "q4_0": gguf.LlamaFileType.MOSTLY_Q4_0}
TYPES = {"fp32": F32, "q8_0": Q8_0, "q4_0": Q4_0}
KEPT = {"q4_0": Q8_0}  # the head's type where it is not the file's
HIGHER = {"q8_0": F32, "q4_0": Q8_0}  # what the search for the quality bar keeps a matrix at (as the ONNX forms)
QUANTIZERS = {Q8_0: gguf.quants.Q8_0, Q4_0: gguf.quants.Q4_0}
CHUNK = 1 << 22
# gguf-py's writer logs INFO lines (endianness, the files and their sizes) through this logger: the export says
# what it wrote in its own table.
logging.getLogger("gguf.gguf_writer").setLevel(logging.WARNING)


@dataclass(frozen=True)
class Written:
    """What one GGUF file holds: its tensors' types (name -> GGML type name) and the matrices kept at a higher type
    than the file's (the head of a Q4_0 file, and those the search for the quality bar kept)."""

    types: dict[str, str]
    kept: dict[str, str]

    def plan(self, form: Form) -> dict[str, Any]:
        """The manifest's record of a quant type: how it was made, how many tensors of each type, and the
        matrices kept at a higher type (as a lossy ONNX form's plan names its kept ones)."""
        counts = {t: sum(1 for v in self.types.values() if v == t) for t in sorted(set(self.types.values()))}
        return {"method": "gguf-py quants (ggml's reference quantizers), the converter's tensor policy",
                "type": TYPES[form.dtype].name, "bits": form.bits, "block_size": BLOCK, "tensor_types": counts,
                "kept": dict(self.kept)}


def gguf_tensors(state: dict[str, torch.Tensor], cfg: DecoderConfig, *, tied: bool) -> dict[str, np.ndarray]:
    """GGUF name -> float32 array (rows first), from the book's keys: the architecture's tensor map."""
    return arch_of(cfg).gguf_tensors(state, cfg, tied=tied)


def head_tensor(tensors: dict[str, np.ndarray]) -> str:
    """The matrix llama.cpp multiplies last: output, or the token embedding where the head is tied to it."""
    return "output.weight" if "output.weight" in tensors else "token_embd.weight"


def tensor_type(name: str, array: np.ndarray, dtype: str, *, head: str) -> gguf.GGMLQuantizationType:
    """The converter's policy: 1-D tensors and position_embd in F32, every other weight in the file's type (the
    head at KEPT's type where there is one)."""
    if dtype == "fp32" or array.ndim < 2 or name == "position_embd.weight":
        return F32
    return KEPT.get(dtype, TYPES[dtype]) if name == head else TYPES[dtype]


def candidates(tensors: dict[str, np.ndarray], dtype: str) -> list[str]:
    """The matrices a quant type stores in its own type, the one its rounding moves most first (relative RMS error
    of the exact round trip through gguf-py): what the search for the quality bar keeps higher, in order."""
    qtype, head = TYPES[dtype], head_tensor(tensors)
    names = [n for n, a in tensors.items() if tensor_type(n, a, dtype, head=head) == qtype]
    errors = {n: round_trip_error(tensors[n], qtype) for n in names}
    return sorted(names, key=lambda n: -errors[n])


def round_trip_error(array: np.ndarray, qtype: gguf.GGMLQuantizationType) -> float:
    quant = QUANTIZERS[qtype]
    rows = max(1, CHUNK // array.shape[-1])
    err = norm = 0.0
    for i in range(0, array.shape[0], rows):
        chunk = array[i:i + rows].astype(np.float64)
        back = quant.dequantize_rows(quant.quantize_rows(array[i:i + rows])).astype(np.float64)
        err += float(np.sum((back - chunk) ** 2))
        norm += float(np.sum(chunk ** 2))
    return (err / norm) ** 0.5 if norm else 0.0


def quantize(array: np.ndarray, qtype: gguf.GGMLQuantizationType) -> np.ndarray:
    """gguf-py's quantizer on row groups of about 4M values (its own `quantize` goes 16 rows at a time: 1.6 s for
    GPT-2's token embedding at 64 columns; the bytes are the same)."""
    quant = QUANTIZERS[qtype]
    rows = max(1, CHUNK // array.shape[-1])
    return np.concatenate([quant.quantize_rows(array[i:i + rows]) for i in range(0, array.shape[0], rows)])


def quant_refusal(cfg: DecoderConfig) -> str | None:
    """Why this config cannot have the quant types, or None."""
    if cfg.emb_dim % BLOCK:
        return f"emb_dim {cfg.emb_dim} is not a multiple of {BLOCK}, the Q8_0 and Q4_0 block"
    return None


# The tokenizer's GGUF keys: a value, its type and, for an array, its items' type (gguf-py's add_key_value).
Keys = dict[str, tuple[Any, gguf.GGUFValueType, "gguf.GGUFValueType | None"]]
# Written from the folder's own bos and eos ids (its manifest's), not copied from a source GGUF.
FOLDER_IDS = ("tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id")
# llama.cpp's pre names for a tokenizer.json's split regex as its tokenizer.json files spell it (the "original regex
# from tokenizer.json" of llama-vocab.cpp): Llama 3's and Qwen2's. Any other pre-tokenizer is written "gpt-2".
SPLITS = {
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
    r"\s+(?!\S)|\s+": "llama-bpe",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
    r"\s+(?!\S)|\s+": "qwen2",
}


@dataclass(frozen=True)
class Vocabulary:
    """gpt.gguf's tokenizer: GPT-2's byte-level BPE from the folder's tokenizer.json (tokens, types, merges, llama.cpp's
    pre name for its pre-tokenizer), or the keys of the GGUF the folder's tokenizer was built from (`copied`), and
    the folder's bos, eos and chat template."""

    tokens: list[str]
    types: list[int]
    merges: list[str]
    eos: int | None
    bos: int | None = None
    eot: int | None = None  # a second eos id (a chat model's end of turn): llama.cpp stops at it too
    pre: str = "gpt-2"
    chat_template: str | None = None
    copied: Keys | None = None


def pre_name(doc: dict[str, Any]) -> str:
    """llama.cpp's `tokenizer.ggml.pre` for a tokenizer.json's pre-tokenizer: ByteLevel alone is GPT-2's, each numeral
    split first (Digits, or a Split by `\\p{N}`) then ByteLevel SmolLM2's (`smollm`), a Split by a regex SPLITS knows
    then ByteLevel that name."""
    pre = doc.get("pre_tokenizer") or {}
    steps = (pre.get("pretokenizers") or []) if pre.get("type") == "Sequence" else [pre]
    kinds = [step.get("type") for step in steps]
    numerals = steps[0].get("individual_digits") if kinds[:1] == ["Digits"] else \
        (steps[0].get("pattern") or {}).get("Regex") == NUMERAL and steps[0].get("behavior") == "Isolated"
    if kinds in (["Digits", "ByteLevel"], ["Split", "ByteLevel"]) and numerals and steps[1].get("use_regex", True):
        return "smollm"
    if kinds == ["Split", "ByteLevel"] and not steps[1].get("use_regex", True):
        return SPLITS.get((steps[0].get("pattern") or {}).get("Regex"), "gpt-2")
    return "gpt-2"


def source_keys(path: Path, vocab_size: int) -> Keys:
    """Every `tokenizer.*` key of the GGUF at `path` as it is (the model, pre name, tokens, scores, token types,
    merges, add_bos and the others, the chat template) but the bos, eos and end-of-turn ids (FOLDER_IDS): llama.cpp
    tokenizes our gpt.gguf as the original (a SentencePiece vocabulary's scores included)."""
    from mha_export.gguf.source import reader

    keys: Keys = {}
    for name, field in reader(path).fields.items():  # the export's one parse of the file (262,144 tokens: seconds)
        if name.startswith("tokenizer.") and name not in FOLDER_IDS:
            value = field.contents()
            sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
            keys[name] = (value.item() if hasattr(value, "item") else value, field.types[0], sub)
    tokens = keys.get("tokenizer.ggml.tokens", ([], None, None))[0]
    if len(tokens) != vocab_size:
        raise ExportError(f"gpt.gguf: {path.name} holds {len(tokens)} tokens, the model's vocab_size is {vocab_size}")
    return keys


def tokenizer_source(weights: Path | None, tokenizer: Any) -> Path | None:
    """`weights` where it is a GGUF the folder's tokenizer was built from (`tokenizer`: decoder.tokenizer's
    TokenizerFiles, whose source names that file and its sha256), else None."""
    from mha_export.gguf.source import is_gguf
    from mha_runtime.artifact.manifest import sha256_file

    if weights is None or tokenizer is None or not is_gguf(weights):
        return None
    said = tokenizer.source.get(Path(weights).name)
    return Path(weights) if said is not None and said == sha256_file(Path(weights)) else None


def vocabulary(tokenizer_json: bytes, vocab_size: int, *, eos_ids: tuple[int, ...] | None = None,
               bos_id: int | None = None, config_json: bytes | None = None, source: Path | None = None
               ) -> Vocabulary:
    """GPT-2's byte-level BPE from the folder's tokenizer.json, as the converter writes it (tokens by id, special
    tokens CONTROL, merges as "a b"), or the tokenizer keys of `source`, the GGUF it was built from; bos and eos the
    folder's (`eos_ids`, `bos_id`: the checkpoint's, as the manifest's), or GPT-2's <|endoftext|> where none are
    given; the chat template of its tokenizer_config.json (`config_json`). llama.cpp keeps one eos and one
    end-of-turn id: a third eos id and on are the other runtimes' only (docs/gpt.md)."""
    config = json.loads(config_json) if config_json else {}
    template = config.get("chat_template") if isinstance(config, dict) else None
    template = template if isinstance(template, str) else None
    if source is not None:
        eos_ids = eos_ids or ()
        return Vocabulary([], [], [], eos_ids[0] if eos_ids else None, bos_id, eos_ids[1] if len(eos_ids) > 1 else None,
                          chat_template=template, copied=source_keys(source, vocab_size))
    doc = json.loads(tokenizer_json)
    model = doc.get("model") or {}
    if model.get("type") != "BPE" or not isinstance(model.get("vocab"), dict):
        raise ExportError("gpt.gguf: the tokenizer is not a byte-level BPE (GPT-2's kind); llama.cpp's gpt2 "
                          "tokenizer could not reproduce it")
    by_id: dict[int, tuple[str, int]] = {i: (t, int(gguf.TokenType.NORMAL)) for t, i in model["vocab"].items()}
    for added in doc.get("added_tokens") or []:
        kind = gguf.TokenType.CONTROL if added.get("special") else gguf.TokenType.USER_DEFINED
        by_id[int(added["id"])] = (added["content"], int(kind))
    if sorted(by_id) != list(range(vocab_size)):
        raise ExportError(f"gpt.gguf: the tokenizer's ids are not 0..{vocab_size - 1}")
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]
    if eos_ids is None:
        gpt2 = GPT2_EOS_ID if by_id.get(GPT2_EOS_ID, ("", 0))[0] == "<|endoftext|>" else None
        eos_ids, bos_id = (() if gpt2 is None else (gpt2,)), gpt2
    return Vocabulary([by_id[i][0] for i in range(vocab_size)], [by_id[i][1] for i in range(vocab_size)], merges,
                      eos_ids[0] if eos_ids else None, bos_id, eos_ids[1] if len(eos_ids) > 1 else None,
                      pre_name(doc), template)


class _Writer(gguf.GGUFWriter):
    """gguf-py's writer with its arrays of strings (the 50,257 tokens and 50,000 merges) packed in one join: gguf-py
    packs them item by item, seconds a file. The bytes are the same (tests/decoder/test_gpt_gguf.py)."""

    def _pack_val(self, val: Any, vtype: gguf.GGUFValueType, add_vtype: bool,
                  sub_type: gguf.GGUFValueType | None = None) -> bytes:
        if (vtype == gguf.GGUFValueType.ARRAY and self.endianess == gguf.GGUFEndian.LITTLE and val
                and all(isinstance(v, str) for v in val)):
            items = [v.encode("utf-8") for v in val]
            head = struct.pack("<I", vtype) if add_vtype else b""
            return head + struct.pack("<IQ", gguf.GGUFValueType.STRING, len(items)) + b"".join(
                struct.pack("<Q", len(b)) + b for b in items)
        return super()._pack_val(val, vtype, add_vtype, sub_type)


def _write_vocabulary(w: gguf.GGUFWriter, vocab: Vocabulary) -> None:
    """The tokenizer's keys: a source GGUF's as they were, or GPT-2's BPE with the folder's pre name; then the
    folder's bos and eos; then the chat template where the source's keys did not hold it."""
    copied = vocab.copied or {}
    for key, (value, vtype, sub) in copied.items():
        w.add_key_value(key, value, vtype, sub)
    if not copied:
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(vocab.pre)
        w.add_token_list(vocab.tokens)
        w.add_token_types(vocab.types)
        w.add_token_merges(vocab.merges)
    if vocab.bos is not None:
        w.add_bos_token_id(vocab.bos)
    if vocab.eos is not None:
        w.add_eos_token_id(vocab.eos)
    if vocab.eot is not None:
        w.add_eot_token_id(vocab.eot)
    if not copied:
        w.add_add_bos_token(False)  # GPT-2 and the book put nothing before the prompt
    if vocab.chat_template is not None and "tokenizer.chat_template" not in copied:
        w.add_chat_template(vocab.chat_template)


def write_gguf(path: Path, tensors: dict[str, np.ndarray], cfg: DecoderConfig, *, dtype: str, name: str,
               vocab: Vocabulary | None, keep: dict[str, gguf.GGMLQuantizationType] | None = None) -> Written:
    """One GGUF file: the architecture's keys, the tokenizer (or, without one, llama.cpp's "none" vocabulary of
    vocab_size ids) and the tensors at `dtype` ("fp32", "q8_0", "q4_0"), those named in `keep` at the type given."""
    arch = arch_of(cfg)
    w = _Writer(str(path), arch.GGUF_ARCH)  # general.architecture
    w.add_name(name)
    arch.gguf_metadata(w, cfg)
    w.add_file_type(FILE_TYPES[dtype])
    if vocab is None:
        w.add_tokenizer_model("none")
        w.add_vocab_size(cfg.vocab_size)
    else:
        _write_vocabulary(w, vocab)
    types: dict[str, str] = {}
    head, keep = head_tensor(tensors), keep or {}
    for tensor_name, array in tensors.items():
        qtype = keep[tensor_name] if tensor_name in keep else tensor_type(tensor_name, array, dtype, head=head)
        types[tensor_name] = qtype.name
        if qtype == F32:
            w.add_tensor(tensor_name, array)
        else:
            data = quantize(array, qtype)
            w.add_tensor(tensor_name, data, raw_dtype=qtype)  # the shape: from the bytes per row
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    main = TYPES[dtype].name
    return Written(types, {n: t for n, t in types.items() if (dtype != "fp32" and t not in (main, F32.name))
                           or n in keep})
