"""The training text: the documentation topics that ship with CPython (`pydoc_data.topics`, what `help('if')`
shows), joined in key order with GPT-2's <|endoftext|> between topics. Offline, and redistributable: CPython's
LICENSE says "Python software and documentation are licensed under the Python Software Foundation License
Version 2" (the PSF licence lets anyone reproduce and distribute it, keeping its notice).

Each topic is reflowed into prose: the hard-wrapped lines of a paragraph are joined, runs of spaces (the
indentation of code and tables, which GPT-2's BPE spends one token per space on) become one, and paragraphs stay
apart by a blank line. Unreflowed, a space or a newline was every fourth token and a short training learned to
write whitespace.

The text is this interpreter's: another Python release ships other topics, so its sha256 and the Python version
are recorded with the training settings (and change their hash)."""
from __future__ import annotations

import hashlib
import platform
import re
from dataclasses import dataclass

SEPARATOR = "<|endoftext|>"
LICENCE = ("Python Software Foundation License Version 2 (CPython's LICENSE: \"Python software and "
           "documentation are licensed under the Python Software Foundation License Version 2\")")


@dataclass(frozen=True)
class Corpus:
    text: str
    source: dict[str, object]


def reflow(topic: str) -> str:
    """One line per paragraph, single spaces, paragraphs separated by one blank line."""
    paragraphs = re.split(r"\n\s*\n", topic.strip())
    return "\n\n".join(re.sub(r"\s+", " ", p).strip() for p in paragraphs if p.strip())


def pydoc_topics(max_chars: int | None = None) -> Corpus:
    """The whole topics text, or its first `max_chars` characters (the tests' tiny runs)."""
    import pydoc_data.topics as topics

    text = SEPARATOR.join(reflow(topics.topics[key]) for key in sorted(topics.topics))
    if max_chars is not None:
        text = text[:max_chars]
    return Corpus(text, {
        "module": "pydoc_data.topics", "python": platform.python_version(), "topics": len(topics.topics),
        "separator": SEPARATOR, "reflowed": True, "chars": len(text),
        "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(), "licence": LICENCE})
