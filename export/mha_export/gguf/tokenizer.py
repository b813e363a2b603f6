"""A GGUF's own tokenizer as the folder's tokenizer.json and tokenizer_config.json, built by a kept library:
transformers' GGUF tokenizer converter (`AutoTokenizer.from_pretrained(folder, gguf_file=name)`), which reads the
file's tokens, merges, token types and special ids, makes its control tokens special and sets the pre-tokenizer's
split where llama.cpp's `tokenizer.ggml.pre` names one it knows.

Decisions:
- tokenizer.json is the one transformers' save_pretrained writes. tokenizer_config.json is written here from what
  the converted tokenizer says: its bos, eos, unk and pad tokens, the file's add_bos_token, the chat template
  (`tokenizer.chat_template`) under "chat_template", where transformers.js and this project's runtimes read it
  (transformers 5 itself saves it as chat_template.jinja beside; it reads "chat_template" too), model_max_length
  the model's context, and tokenizer_class "PreTrainedTokenizerFast" (tokenizer.json as it is: transformers 4 and 5
  know it, transformers.js reads it as its PreTrainedTokenizer; what save_pretrained writes, "TokenizersBackend",
  transformers 4 does not know).
- The pre-tokenizer is llama.cpp's for the file's `tokenizer.ggml.pre` where transformers' converter has none of
  its own for that name (DIGITS_FIRST): llama.cpp keys its split regexes by that name (llama-vocab.cpp), and a
  `gpt2` file whose name transformers does not know gets GPT-2's ByteLevel split alone. SmolLM2's `smollm` splits
  each numeral alone first, as its own tokenizer.json does (Digits then ByteLevel); without it the ids part from
  llama.cpp's on numbers (docs/measurements/smollm2.md).
- transformers is the tests' dependency, not the export's: without it, one line says to install it or give
  --tokenizer.
"""
from __future__ import annotations

import json
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Any

from mha_runtime.artifact.errors import ConfigError, first_line
from mha_runtime.decoder.contract import TOKENIZER_FILE

TOKENIZER_CLASS = "PreTrainedTokenizerFast"
TRANSFORMERS = "transformers==5.24.0"  # the version the tests pin (pyproject.toml's dev group)
SPECIAL = ("bos_token", "eos_token", "unk_token", "pad_token")
# llama.cpp's pre names whose regexes are `\p{N}` (each digit alone) then GPT-2's (llama-vocab.cpp: SMOLLM,
# STARCODER, REFACT, COMMAND_R, CODESHELL, EXAONE, MINERVA, MELLUM2), where transformers' converter leaves GPT-2's
# ByteLevel split alone. Written as a Split by that regex, not as Digits(individual_digits=True) (SmolLM2's own
# tokenizer.json): Python's `tokenizers` splits both on every Unicode numeral, but the JS library's Digits matches
# `\d`, ASCII digits only ("٣" or "½" then tokenize otherwise in Node, wasm and the page); its Split takes `\p{N}`.
NUMERAL = r"\p{N}"
DIGITS_FIRST = frozenset({"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b",
                          "mellum2"})


def gguf_tokenizer(path: Path, fields: dict[str, Any], *, context_length: int, flag: str) -> tuple[bytes, bytes]:
    """(tokenizer.json, tokenizer_config.json) of the GGUF at `path` (`fields`: its metadata); a file without a
    tokenizer, or one transformers cannot convert, is one ConfigError line."""
    model = fields.get("tokenizer.ggml.model")
    if not isinstance(model, str) or model == "none" or "tokenizer.ggml.tokens" not in fields:
        raise ConfigError(f"{flag} {path}: the GGUF holds no tokenizer (tokenizer.ggml.model {model!r}); give "
                          "--tokenizer")
    add_bos, pre = fields.get("tokenizer.ggml.add_bos_token"), fields.get("tokenizer.ggml.pre")
    stat = Path(path).stat()
    return _converted(str(Path(path).resolve()), stat.st_mtime_ns, stat.st_size, context_length, flag,
                      add_bos if isinstance(add_bos, bool) else None, model, pre if isinstance(pre, str) else None)


def llama_cpp_split(tok: Any, model: str | None, pre: str | None) -> None:
    """Give the converted tokenizer (a transformers tokenizer) llama.cpp's pre-tokenizer for `pre` where the
    converter's is GPT-2's ByteLevel split alone and llama.cpp's splits digits first (DIGITS_FIRST)."""
    from tokenizers import Regex, pre_tokenizers

    backend = tok.backend_tokenizer
    current = json.loads(backend.to_str()).get("pre_tokenizer") or {}
    if model != "gpt2" or pre not in DIGITS_FIRST or current.get("type") != "ByteLevel":
        return
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=bool(current.get("add_prefix_space")),
                                          trim_offsets=bool(current.get("trim_offsets", True)), use_regex=True)
    numerals = pre_tokenizers.Split(Regex(NUMERAL), behavior="isolated")
    backend.pre_tokenizer = pre_tokenizers.Sequence([numerals, byte_level])


@lru_cache(maxsize=2)  # the plan checks it, the export's plan step builds it: the same file, converted once
def _converted(path: str, mtime: int, size: int, context_length: int, flag: str, add_bos: bool | None,
               model: str, pre: str | None) -> tuple[bytes, bytes]:
    del mtime, size  # the cache key: a file rewritten in between is converted again
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise ConfigError(f"{flag} {path}: building a GGUF's tokenizer needs {TRANSFORMERS} (pip install it), or "
                          "give --tokenizer") from None
    file = Path(path)
    with tempfile.TemporaryDirectory(prefix="mha-gguf-tokenizer-") as tmp:
        try:
            tok = AutoTokenizer.from_pretrained(str(file.parent), gguf_file=file.name, local_files_only=True)
            llama_cpp_split(tok, model, pre)
            tok.save_pretrained(tmp)
        except Exception as exc:  # transformers' and tokenizers' own errors, whatever the file holds
            raise ConfigError(f"{flag} {path}: transformers cannot build its tokenizer ({first_line(exc)})") from None
        data = (Path(tmp) / TOKENIZER_FILE).read_bytes()
    config: dict[str, Any] = {"tokenizer_class": TOKENIZER_CLASS, "model_max_length": context_length}
    config |= {name: getattr(tok, name) for name in SPECIAL if getattr(tok, name, None) is not None}
    if add_bos is not None:
        config["add_bos_token"] = add_bos
    if tok.chat_template:
        config["chat_template"] = tok.chat_template
    return data, (json.dumps(config, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()

