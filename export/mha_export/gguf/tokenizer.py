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
- Checked on SmolLM2's GGUF against llama.cpp's own tokenizer on the same file (digits, contractions, whitespace,
  non-ASCII): the same ids.
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


def gguf_tokenizer(path: Path, fields: dict[str, Any], *, context_length: int, flag: str) -> tuple[bytes, bytes]:
    """(tokenizer.json, tokenizer_config.json) of the GGUF at `path` (`fields`: its metadata); a file without a
    tokenizer, or one transformers cannot convert, is one ConfigError line."""
    model = fields.get("tokenizer.ggml.model")
    if not isinstance(model, str) or model == "none" or "tokenizer.ggml.tokens" not in fields:
        raise ConfigError(f"{flag} {path}: the GGUF holds no tokenizer (tokenizer.ggml.model {model!r}); give "
                          "--tokenizer")
    add_bos = fields.get("tokenizer.ggml.add_bos_token")
    stat = Path(path).stat()
    return _converted(str(Path(path).resolve()), stat.st_mtime_ns, stat.st_size, context_length, flag,
                      add_bos if isinstance(add_bos, bool) else None)


@lru_cache(maxsize=2)  # the plan checks it, the export's plan step builds it: the same file, converted once
def _converted(path: str, mtime: int, size: int, context_length: int, flag: str, add_bos: bool | None
               ) -> tuple[bytes, bytes]:
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

