"""The training text: the documentation topics that ship with CPython (`pydoc_data.topics`, what `help('if')`
shows), joined in key order with GPT-2's <|endoftext|> between topics. Offline, and redistributable: CPython's
LICENSE says "Python software and documentation are licensed under the Python Software Foundation License
Version 2" (the PSF licence lets anyone reproduce and distribute it, keeping its notice).

The text is this interpreter's: another Python release ships other topics, so its sha256 and the Python version
are recorded with the training settings (and change their hash)."""
from __future__ import annotations

import hashlib
import platform
from dataclasses import dataclass

SEPARATOR = "<|endoftext|>"
LICENCE = ("Python Software Foundation License Version 2 (CPython's LICENSE: \"Python software and "
           "documentation are licensed under the Python Software Foundation License Version 2\")")


@dataclass(frozen=True)
class Corpus:
    text: str
    source: dict[str, object]


def pydoc_topics(max_chars: int | None = None) -> Corpus:
    """The whole topics text, or its first `max_chars` characters (the tests' tiny runs)."""
    import pydoc_data.topics as topics

    text = SEPARATOR.join(topics.topics[key] for key in sorted(topics.topics))
    if max_chars is not None:
        text = text[:max_chars]
    return Corpus(text, {
        "module": "pydoc_data.topics", "python": platform.python_version(), "topics": len(topics.topics),
        "separator": SEPARATOR, "chars": len(text), "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
        "licence": LICENCE})
