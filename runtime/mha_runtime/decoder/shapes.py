"""Every shape a runtime allocates for a decoder folder, recorded in the manifest's contract (`contract.shapes`), so
that no runtime knows an architecture: layers, query and key/value heads, head size, vocabulary and context, and
per layer the rows of its in-place cache (`cache_lengths`, only where a layer keeps fewer than context_length).

An architecture's config gives them (`Shaped`: GPT-2's GPTConfig has kv_heads == n_heads); a runtime reads them back
with `DecoderShapes.from_dict`, every field checked, one line naming a bad one.

A windowed cache: a layer that sees only the last W positions (a sliding window, W < context_length) keeps W rows in
the in-place form, and GroupQueryAttention (`sliding_window_cache`) keeps them as its contract says: after T tokens
rows 0..min(T, W) - 1 hold positions T - min(T, W) .. T - 1, in order (the capacity is W exactly: ONNX Runtime's CUDA
kernel takes no other, and so the resident count is min(T, rows) for every layer, windowed or not)."""
from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from mha_runtime.artifact.errors import ArtifactError


class Shaped(Protocol):
    """What a decoder config must say for the contract (an architecture's config class)."""

    @property
    def arch(self) -> str: ...
    @property
    def n_layers(self) -> int: ...
    @property
    def n_heads(self) -> int: ...
    @property
    def kv_heads(self) -> int: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def context_length(self) -> int: ...
    @property
    def cache_lengths(self) -> tuple[int, ...] | None: ...  # per layer its in-place cache rows; None: context_length


# Bounds a runtime checks before it allocates: the export refuses past them too (decoder config limits).
MAX_HEADS = 256
MAX_CONTEXT = 1 << 20
FIELDS = ("n_layers", "n_heads", "kv_heads", "head_dim", "vocab_size", "context_length")


@dataclass(frozen=True)
class DecoderShapes:
    """The shapes of one decoder folder, as `contract.shapes` records them."""

    arch: str  # the architecture module that made the folder (export/mha_export/decoder/archs/); shown, not used
    n_layers: int
    n_heads: int  # query heads
    kv_heads: int  # key/value heads: the cache's head axis (fewer than n_heads under grouped-query attention)
    head_dim: int
    vocab_size: int
    context_length: int
    # Per layer the rows of its in-place cache (window_cache_lengths); None where every layer keeps context_length,
    # and then absent from the manifest, so a folder without windows records what it did before the field.
    cache_lengths: tuple[int, ...] | None = None

    @classmethod
    def of(cls, config: Shaped) -> DecoderShapes:
        return cls(arch=config.arch, **{f: getattr(config, f) for f in FIELDS}, cache_lengths=config.cache_lengths)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        if self.cache_lengths is None:
            del out["cache_lengths"]
        else:
            out["cache_lengths"] = list(self.cache_lengths)
        return out

    @classmethod
    def from_dict(cls, data: Any, where: str) -> DecoderShapes:
        """Read and check `contract.shapes`: positive integers, kv_heads dividing n_heads."""
        if not isinstance(data, dict):
            raise ArtifactError(f"{where}: expected an object of {', '.join(('arch', *FIELDS))}, got "
                                f"{type(data).__name__}")
        arch = data.get("arch")
        if not isinstance(arch, str) or not arch:
            raise ArtifactError(f"{where}: 'arch': expected an architecture name, got {arch!r}")
        values = {}
        for f in FIELDS:
            v = data.get(f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ArtifactError(f"{where}: {f!r}: expected a positive integer, got {v!r}")
            values[f] = v
        if values["n_heads"] > MAX_HEADS or values["context_length"] > MAX_CONTEXT:
            raise ArtifactError(f"{where}: expected n_heads <= {MAX_HEADS} and context_length <= {MAX_CONTEXT}, got "
                                f"{values['n_heads']} and {values['context_length']}")
        if values["n_heads"] % values["kv_heads"]:
            raise ArtifactError(f"{where}: n_heads {values['n_heads']} is not a multiple of kv_heads "
                                f"{values['kv_heads']}")
        extra = sorted(set(data) - {"arch", *FIELDS, CACHE_LENGTHS})
        if extra:
            raise ArtifactError(f"{where}: unknown key {extra[0]!r}")
        lengths = data.get(CACHE_LENGTHS)
        if lengths is not None:
            lengths = _cache_lengths(lengths, values["n_layers"], values["context_length"], where)
        return cls(arch=arch, **values, cache_lengths=lengths)


CACHE_LENGTHS = "cache_lengths"


def _cache_lengths(data: Any, layers: int, context: int, where: str) -> tuple[int, ...]:
    """contract.shapes.cache_lengths: one integer 1..context_length per layer."""
    if not isinstance(data, list) or len(data) != layers or not all(
            isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= context for v in data):
        raise ArtifactError(f"{where}: {CACHE_LENGTHS!r}: expected {layers} integers from 1 to context_length "
                            f"{context} (one per layer), got {json.dumps(data)[:80]}")
    return tuple(data)


def cache_rows(shapes: Shaped) -> list[int]:
    """Each layer's in-place cache rows: its cache_lengths entry, or context_length."""
    lengths = shapes.cache_lengths
    return [shapes.context_length] * shapes.n_layers if lengths is None else list(lengths)


def cache_bytes(shapes: Shaped, sequences: int = 1) -> int:
    """The in-place cache's float32 keys and values of every layer for `sequences` rows (each layer's cache_rows)."""
    return sequences * 2 * shapes.kv_heads * sum(cache_rows(shapes)) * shapes.head_dim * 4


def window_cache_lengths(windows: Sequence[int | None], context_length: int) -> tuple[int, ...] | None:
    """An architecture's cache_lengths from each layer's window (None: it sees every position): a window shorter
    than the context keeps its W rows (module docstring); None where no layer's does."""
    rows = tuple(context_length if w is None or w >= context_length else w for w in windows)
    return None if all(r == context_length for r in rows) else rows


def read_shapes(contract: dict[str, Any], config: dict[str, Any], where: str) -> DecoderShapes:
    """A manifest's shapes: its `contract.shapes`, or for a folder exported before the contract recorded them, the
    shapes its GPT-2 config implies (legacy_shapes)."""
    if "shapes" in contract:
        return DecoderShapes.from_dict(contract["shapes"], f"{where}: contract.shapes")
    return legacy_shapes(config, f"{where}: config")


def legacy_shapes(config: dict[str, Any], where: str) -> DecoderShapes:
    """The one place the Python runtime reads an architecture's config keys: a folder exported before issue 57
    has no `contract.shapes`, and then only the book's GPT-2 (keys vocab_size, context_length, emb_dim, n_heads,
    n_layers; one key/value head per query head)."""
    keys = ("vocab_size", "context_length", "emb_dim", "n_heads", "n_layers")
    bad = [k for k in keys if isinstance(config.get(k), bool) or not isinstance(config.get(k), int) or config[k] < 1]
    if bad:
        raise ArtifactError(f"{where}: no contract.shapes (a folder exported before them) and {bad[0]!r} is not a "
                            f"positive integer of the book's GPT config ({config.get(bad[0])!r}); re-export it")
    heads, width = config["n_heads"], config["emb_dim"]
    if width % heads:
        raise ArtifactError(f"{where}: emb_dim {width} is not divisible by n_heads {heads}")
    return DecoderShapes.from_dict({"arch": "gpt2", "n_layers": config["n_layers"], "n_heads": heads,
                                    "kv_heads": heads, "head_dim": width // heads,
                                    "vocab_size": config["vocab_size"],
                                    "context_length": config["context_length"]}, where)
