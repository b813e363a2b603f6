"""The folder's tokenizer.json, whatever its model (byte-level BPE, or a scored vocabulary with byte fallback),
through Hugging Face `tokenizers` (no hand-written tokenizer)."""
from __future__ import annotations

import json

from mha_runtime.artifact.errors import ArtifactError, ConfigError, ContractError, first_line


def setting_problem(tok: object) -> str | None:
    """What in a loaded tokenizer.json makes its encode not the text's ids alone, or None. `mha export --gpt
    --tokenizer` refuses padding and truncation; a file edited and resealed after it can hold them, or BPE dropout:
    the prompt was padded with pad ids, cut, or encoded at random, silently, where the JS runners (which ignore all
    three) encoded the text. runtime/native/common/gpt/tokenizer.mjs refuses the same in the same words."""
    padding, truncation = tok.padding, tok.truncation  # type: ignore[attr-defined]
    if padding is not None:
        length = padding.get("length")
        to = "the longest of a batch" if length is None else f"length {length}"
        return f"it pads what it encodes (padding to {to}); expected no padding, which would add pad ids to prompts"
    if truncation is not None:
        return (f"it truncates what it encodes (max_length {truncation.get('max_length')}); expected no truncation, "
                "which would cut long prompts silently")
    dropout = getattr(tok.model, "dropout", None)  # type: ignore[attr-defined]
    if dropout:
        return (f"its BPE drops merges at random (dropout {dropout:g}); expected no dropout, which would encode a "
                "prompt differently on each run")
    return None


def merge_problem(vocab: dict[str, object], merges: list[tuple[str, ...]], prefix: str = "") -> str | None:
    """A merge 'a b' whose joined token is not in the vocabulary, or None: `tokenizers` (0.23) panics in Rust on it
    ("range end index ... out of range"), which prints its own lines on stderr and raises a PanicException that no
    `except Exception` catches. Merges are checked in the order it reads them, up to the first with a part that is
    not in the vocabulary, which it refuses itself in one line. `prefix` is a BPE model's
    continuing_subword_prefix, cut from `b` (by its bytes, as tokenizers does) before joining."""
    for number, merge in enumerate(merges, 1):
        if len(merge) != 2 or not all(isinstance(part, str) and part in vocab for part in merge):
            return None
        a, b = merge
        cut = len(prefix.encode())
        try:
            joined = a + b.encode()[cut:].decode() if cut <= len(b.encode()) else None
        except UnicodeDecodeError:  # the cut falls inside a character
            joined = None
        if joined not in vocab:
            return f"merge {number} {a + ' ' + b!r} makes {joined!r}, which is not in the vocabulary; expected every " \
                   "merged token in it"
    return None


def bpe_json_problem(data: bytes) -> str | None:
    """A tokenizer.json's BPE merges, by `merge_problem`; anything else in it is left to `tokenizers` to judge."""
    try:
        model = json.loads(data).get("model")
    except (ValueError, AttributeError, RecursionError):  # not JSON, not an object: tokenizers says so in one line
        return None
    if not isinstance(model, dict) or model.get("type") != "BPE" or not isinstance(model.get("vocab"), dict):
        return None
    merges = model.get("merges")
    if not isinstance(merges, list):
        return None
    pairs = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) if isinstance(m, list) else () for m in merges]
    prefix = model.get("continuing_subword_prefix")
    return merge_problem(model["vocab"], pairs, prefix if isinstance(prefix, str) else "")


class GPTTokenizer:
    """Text <-> ids. The vocabulary must be the model's: a tokenizer of another size is refused on load."""

    def __init__(self, data: bytes, *, vocab_size: int, where: str) -> None:
        from tokenizers import Tokenizer

        problem = bpe_json_problem(data)  # before tokenizers, which panics on it
        if problem is not None:
            raise ArtifactError(f"{where}: {problem}")
        try:
            self._tok = Tokenizer.from_str(data.decode("utf-8"))
        except BaseException as exc:  # tokenizers raises its own Exception type, and on some edited files panics
            # in Rust (a continuing_subword_prefix longer than a merge's part): a PanicException, which derives from
            # BaseException only and was a traceback (Rust's own panic lines still come first on stderr)
            if not isinstance(exc, Exception) and type(exc).__name__ != "PanicException":
                raise
            raise ArtifactError(f"{where}: not a tokenizers JSON file ({first_line(exc)})") from None
        size = self._tok.get_vocab_size(with_added_tokens=True)
        if size != vocab_size:
            raise ConfigError(f"{where}: a vocabulary of {size} tokens, expected the model's vocab_size {vocab_size}")
        problem = setting_problem(self._tok)
        if problem is not None:
            raise ArtifactError(f"{where}: {problem}")

    def encode(self, text: str, *, specials: bool = True) -> list[int]:
        """Ids of `text`, with what tokenizer.json's own post-processor puts around a prompt (`specials`: a BOS
        where its TemplateProcessing puts one, as transformers' tokenizer(text) does; nothing where it has none);
        specials=False for a rendered chat template, which writes the ones it wants. Text that is not
        Unicode (a lone surrogate, as a shell passes undecodable bytes) is one ContractError line."""
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ContractError(f"prompt: expected text (valid Unicode), got a lone surrogate {text[exc.start]!r} "
                                f"at character {exc.start}") from None
        return list(self._tok.encode(text, add_special_tokens=specials).ids)

    def decode(self, ids: list[int]) -> str:
        return str(self._tok.decode(ids, skip_special_tokens=False))


class TextStream:
    """The text of a growing id list, piece by piece: a piece that ends inside a UTF-8 character waits."""

    def __init__(self, tokenizer: GPTTokenizer) -> None:
        self.tokenizer, self.ids, self.sent = tokenizer, list[int](), 0

    def push(self, token: int) -> str:
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids)
        if text.endswith("\ufffd"):  # an incomplete byte sequence so far
            return ""
        piece, self.sent = text[self.sent:], len(text)
        return piece

    def end(self) -> str:
        """What push held back when the ids end inside a UTF-8 character: the decode's U+FFFD, so the streamed text
        is the whole decode of the ids (it was left out)."""
        text = self.tokenizer.decode(self.ids)
        piece, self.sent = text[self.sent:], len(text)
        return piece
