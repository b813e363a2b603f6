"""Every shape a runtime allocates for a decoder folder, recorded in the manifest's contract (`contract.shapes`), so
that no runtime knows an architecture: layers, query and key/value heads, head size, vocabulary and context.

An architecture's config gives them (`Shaped`: GPT-2's GPTConfig has kv_heads == n_heads); a runtime reads them back
with `DecoderShapes.from_dict`, every field checked, one line naming a bad one."""
from __future__ import annotations

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

    @classmethod
    def of(cls, config: Shaped) -> DecoderShapes:
        return cls(arch=config.arch, **{f: getattr(config, f) for f in FIELDS})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

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
        extra = sorted(set(data) - {"arch", *FIELDS})
        if extra:
            raise ArtifactError(f"{where}: unknown key {extra[0]!r}")
        return cls(arch=arch, **values)


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
