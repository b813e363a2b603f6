"""`mha bench` options: token counts, batch shapes and thread counts, parsed and cut to the config."""
from __future__ import annotations

import os
import re

from mha_runtime.artifact.errors import BadValueError
from mha_runtime.attention.config import MHAConfig
from mha_runtime.cli.options import MAX_THREADS

DEFAULT_TOKENS = (16, 64, 256, 1024)
# Batch x tokens shapes timed beside batch 1; their tokens are cut to context_length.
DEFAULT_BATCHES = ((8, 128), (32, 16))
Shape = tuple[int, int]  # (batch, tokens)


def default_threads() -> list[int]:
    """1 and 2 threads where the machine has 2 cores or more, else 1."""
    return [1, 2] if (os.cpu_count() or 1) >= 2 else [1]


# A count as typed: ASCII digits, a sign allowed (int() also takes '1_6' as 16 and other scripts' digits).
_INTEGER = re.compile(r"[+-]?[0-9]+")
_DIGITS = re.compile(r"[0-9]+")  # str.isdigit() also holds for '²', which int() refuses


def parse_counts(text: str) -> list[int]:
    """'16,64' -> [16, 64] (sorted, without repeats)."""
    pieces = [t.strip() for t in text.split(",") if t.strip()]
    try:
        if not all(_INTEGER.fullmatch(t) for t in pieces):
            raise ValueError
        return sorted({int(t) for t in pieces})
    except ValueError:  # also past int()'s digit limit
        raise ValueError(f"expected comma-separated integers, got {text!r}") from None


def parse_threads(text: str) -> list[int]:
    """'1,2' -> [1, 2]; every count at least 1."""
    counts = parse_counts(text)
    if not counts or counts[0] < 1:
        raise ValueError(f"expected comma-separated thread counts >= 1, got {text!r}")
    if counts[-1] > MAX_THREADS:
        raise ValueError(f"expected thread counts of at most {MAX_THREADS}, got {counts[-1]}")
    return counts


def parse_batches(text: str) -> list[Shape]:
    """'8x128,32x16' -> [(8, 128), (32, 16)]; 'none' -> []."""
    if text.strip() == "none":
        return []
    shapes: list[Shape] = []
    for part in (p.strip() for p in text.split(",")):
        batch, sep, tokens = part.partition("x")
        if not (sep and _DIGITS.fullmatch(batch) and _DIGITS.fullmatch(tokens) and int(batch) >= 1
                and int(tokens) >= 1):
            raise ValueError(f"expected BATCHxTOKENS pairs such as 8x128,32x16 (or 'none'), got {part!r}")
        if (int(batch), int(tokens)) not in shapes:
            shapes.append((int(batch), int(tokens)))
    return shapes


def resolve_shapes(config: MHAConfig, tokens: list[int] | None, batches: list[Shape] | None) -> list[Shape]:
    """Batch 1 at each token count, then the batch shapes; the defaults fit context_length, a count asked for
    beyond it is refused."""
    limit = config.context_length
    if tokens is None:  # the default counts that fit, and the full context
        tokens = [t for t in DEFAULT_TOKENS if t < limit] + [limit]
    outside = [t for t in tokens if not 1 <= t <= limit]
    if outside or not tokens:
        raise BadValueError(f"--tokens: expected counts in 1..context_length={limit}, got {outside or 'none'}")
    if batches is None:
        batches = [(b, min(t, limit)) for b, t in DEFAULT_BATCHES]
    wide = [f"{b}x{t}" for b, t in batches if not 1 <= t <= limit or b < 1]
    if wide:
        raise BadValueError(f"--batches: expected tokens in 1..context_length={limit}, got {', '.join(wide)}")
    shapes = [(1, t) for t in sorted(set(tokens))]
    return shapes + [s for s in dict.fromkeys(batches) if s not in shapes]


