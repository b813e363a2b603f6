"""The lossy forms' quantizers and methods, as rows: a form names its method (mha_runtime.decoder.forms: `method`), a
method names its quantizer and says how (bits, block size, symmetry, accuracy level, which matrices stay higher, the
plans the search tries in order). A new quantizer is a row of QUANTIZERS and a small module beside this one (as
matmulnbits.py); another way of using one (a block size, a 4-bit method that keeps more) is a row of METHODS.

A plan (QuantPlan): the bits, block size and symmetry of most matrices; some kept at a higher precision (fp32 in the
8-bit form, 8 bits in the 4-bit form, at the plan's block size) and some in smaller blocks at the plan's bits. Each
method has a fast plan and a fine one (what they cost and give is measured in docs/measurements/gpt.md); the export
measures them in that order, then the fine plan with the matrices rounding moves most kept higher, and takes the
first that meets the form's quality bar (mha_export.decoder.lossy.build).
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

import onnx

from mha_export.decoder.graphs.shared import HEAD_MATMUL as HEAD  # the head as its own (E, V) MatMul weight
from mha_export.decoder.lossy import matmulnbits, offsets
from mha_export.decoder.lossy.embedding import TOKENS

BLOCK = 32
ACCURACY_LEVEL = 4  # int8 compute
FP32 = "fp32"


@dataclass(frozen=True)
class Quantizer:
    """A module that quantizes a graph's MatMuls: its name as the manifest records it, and its function
    (model, *, bits, block_size, symmetric, accuracy_level, exclude: MatMul node names left alone) -> model."""

    label: str
    quantize: Callable[..., onnx.ModelProto]


QUANTIZERS: Mapping[str, Quantizer] = MappingProxyType({
    "matmulnbits": Quantizer(matmulnbits.LABEL, matmulnbits.quantize),
    "offsets": Quantizer(offsets.LABEL, offsets.quantize),
})


@dataclass(frozen=True)
class QuantPlan:
    """How one lossy form is quantized, as the manifest records it: the bits, block size and symmetry of most
    matrices; `kept`: weights at a higher precision (name -> "fp32" or "int8", at the plan's block size); `finer`:
    weights in smaller blocks (name -> block size), at the plan's bits or at the higher precision they are kept at."""

    bits: int  # 8 | 4
    kept: dict[str, str] = field(default_factory=dict)
    block_size: int = BLOCK
    accuracy_level: int = ACCURACY_LEVEL
    symmetric: bool = True
    finer: dict[str, int] = field(default_factory=dict)
    # The token embedding's storage (set by fit()): dtype, and where quantized its block_size and symmetry, and
    # whether it is the head's own weights (tied).
    embedding: dict[str, Any] = field(default_factory=dict)
    quantizer: str = "matmulnbits"  # a key of QUANTIZERS
    # The block scales' storage: "fp32" (onnxruntime's quantizer's own), or "fp16" as llama.cpp stores its d, 8-bit
    # blocks rounded as its Q8_0 (lossy/scales.py); the architecture picks it (its LOSSY_SCALES).
    scales: str = FP32

    def to_dict(self) -> dict[str, Any]:
        return {"method": QUANTIZERS[self.quantizer].label, "bits": self.bits,
                "block_size": self.block_size, "symmetric": self.symmetric, "accuracy_level": self.accuracy_level,
                "kept": dict(self.kept), "finer": dict(self.finer), "embedding": dict(self.embedding),
                **({} if self.scales == FP32 else {"scales": self.scales})}  # fp32 folders' manifests as they were

    def precision(self, name: str) -> tuple[int, int, bool] | None:
        """(bits, block size, symmetric) of weight `name` under this plan (blocks as fit() leaves them), or None
        where it is kept at fp32."""
        kept = self.kept.get(name)
        block = self.finer.get(name, self.block_size)
        if kept == FP32:
            return None
        return (8, block, True) if kept == "int8" else (self.bits, block, self.symmetric)

    def label(self) -> str:
        """The plan in a few words, for the manifest's list of plans tried."""
        parts = [f"{self.bits} bits in blocks of {self.block_size}",
                 "symmetric" if self.symmetric else "float offsets" if self.quantizer == "offsets" else "asymmetric"]
        parts += [f"{n} in blocks of {b}" for n, b in self.finer.items()]
        if self.kept:
            parts.append(f"{len(self.kept)} kept at {'/'.join(sorted(set(self.kept.values())))}")
        if self.embedding:
            shared = " (the head's)" if self.embedding.get("shared_with_head") else ""
            parts.append(f"embedding {self.embedding['dtype']}{shared}")
        if self.scales != FP32:
            parts.append(f"scales in {self.scales}")
        return ", ".join(parts)


# Matrices a method names by role: the head (its own (E, V) MatMul in the graph handed to the quantizer), the token
# embedding (untied: its own table; tied, it is the head), and the first and last layers' MatMuls (graphs.shared
# names a layer's weights h<i>.*).
ROLES = ("head", "embedding", "first", "last")
_LAYER = re.compile(r"h(\d+)\.")


def role_weights(role: str, weights: Iterable[str]) -> list[str]:
    """The weights among `weights` (the plan's candidates) that `role` names."""
    weights = list(weights)
    if role in ("head", "embedding"):
        return [w for w in weights if w == (HEAD if role == "head" else TOKENS)]
    layers = {w: int(m.group(1)) for w in weights if (m := _LAYER.match(w))}
    if role not in ("first", "last") or not layers:
        return []
    edge = min(layers.values()) if role == "first" else max(layers.values())
    return [w for w, layer in layers.items() if layer == edge]


@dataclass(frozen=True)
class Method:
    """One way of quantizing a lossy form: its quantizer, the bits, block size, symmetry and accuracy level of its
    fine plan; its fast plan's block size and symmetry, with the `finer` roles at the fine plan's block size; the
    precision the search keeps a matrix at (`higher`), the roles it keeps there in every plan (`stays_higher`), and
    whether the search ranks an untied token embedding with the matrices (`ranks_embedding`)."""

    name: str
    quantizer: str
    bits: int
    higher: str  # "fp32" | "int8"
    block_size: int = BLOCK
    symmetric: bool = True
    accuracy_level: int = ACCURACY_LEVEL
    fast_block_size: int = BLOCK
    fast_symmetric: bool = True
    finer: tuple[str, ...] = ()
    stays_higher: tuple[str, ...] = ()
    ranks_embedding: bool = False
    offsets: bool = False  # an offsets plan after the fast one (offset_plan)

    def _plan(self, block: int, symmetric: bool, finer: Mapping[str, int], weights: Sequence[str]) -> QuantPlan:
        kept = {w: self.higher for role in self.stays_higher for w in role_weights(role, weights)}
        return QuantPlan(self.bits, kept, block_size=block, accuracy_level=self.accuracy_level, symmetric=symmetric,
                         finer=dict(finer), quantizer=self.quantizer)

    def fast(self, weights: Sequence[str] = (HEAD, TOKENS)) -> QuantPlan:
        """The plan measured first, the roles it names resolved among `weights` (by default the two a graph need not
        be read for: the head and an untied embedding)."""
        finer = {w: self.block_size for role in self.finer for w in role_weights(role, weights)}
        return self._plan(self.fast_block_size, self.fast_symmetric, finer, weights)

    def fine(self, weights: Sequence[str] = (HEAD, TOKENS)) -> QuantPlan:
        """The plan measured next, and the one the search keeps matrices higher in."""
        return self._plan(self.block_size, self.symmetric, {}, weights)

    def offset_plan(self, weights: Sequence[str] = (HEAD, TOKENS)) -> QuantPlan:
        """Blocks of 32 with a float offset each (the offsets quantizer: llama.cpp's Q4_1 layout), the head at 8
        bits (a tied embedding's lookup reads its blocks, which cannot carry float offsets) and the row's
        `stays_higher` roles at its higher precision."""
        kept = {w: "int8" for w in role_weights("head", weights)}
        kept |= {w: self.higher for role in self.stays_higher for w in role_weights(role, weights)}
        return QuantPlan(self.bits, kept, block_size=self.block_size, accuracy_level=self.accuracy_level,
                         symmetric=False, quantizer="offsets")

    def plans(self, ranking: Sequence[str], counts: Iterable[int], *,
              weights: Sequence[str] | None = None) -> list[QuantPlan]:
        """The search order: the fast plan, the offsets plan where the row has one, then the fine plan keeping the
        first `count` of `ranking` (the one rounding moves most first) at the higher precision, for each of
        `counts`; roles resolved among `weights` (every weight the plan may name; by default the ranking)."""
        names = ranking if weights is None else weights
        fine = self.fine(names)
        ranked = [w for w in ranking if w not in fine.kept]
        return [self.fast(names), *([self.offset_plan(names)] if self.offsets else []),
                *(replace(fine, kept=fine.kept | {w: self.higher for w in ranked[:count]}) for count in counts)]


# The fast plans: larger blocks (fewer scales to apply per weight) decode faster on MatMulNBits' int8-compute
# kernels; the head, the matrix rounding moves most, in blocks of 32 (in the 4-bit form at 4 bits too: at 8 bits, as
# llama.cpp's Q4_0 keeps its output at Q6_K, the head and the embedding it shares made the int4 file of an
# embedding-heavy model more than 0.2x the fp32 one; the search keeps it at 8 bits where the bar needs it);
# asymmetric 4-bit blocks (a zero point each) round closer at the same speed. Then the fine plans (blocks of 32,
# symmetric), then those with matrices kept. The 4-bit row tries, right after its fast plan, blocks of 32 with a
# float offset each (offset_plan: llama.cpp's Q4_1 layout, the head at 8 bits): on SmolLM2, whose weights were handed
# around as Q4_1, it moved the mean KL 16x less than llama.cpp's Q4_K_M in a smaller file, where symmetric blocks of
# 32, ORT's k_quant and 8 matrices kept at 8 bits stayed at Q4_0's level (docs/measurements/smollm2.md); it comes
# before the fine plan because it is the better 4-bit form wherever the fast one misses. Only the 4-bit search
# ranks an untied embedding: at 4 bits it was most of the trained demo model's loss, and keeping it at fp32 in the
# 8-bit form doubled the demo's int8 file for what four small matrices kept gave (docs/measurements/gpt.md, "The
# embedding quantized").
METHODS: Mapping[str, Method] = MappingProxyType({m.name: m for m in (
    Method("matmulnbits-8", "matmulnbits", 8, higher=FP32, fast_block_size=128, finer=("head",)),
    Method("matmulnbits-4", "matmulnbits", 4, higher="int8", fast_block_size=256, fast_symmetric=False,
           finer=("head",), ranks_embedding=True, offsets=True),
)})
