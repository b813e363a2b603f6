"""The artifact registry: every artifact file, variant and tolerance row declared once (torch-free).

The CLI offers these names, the pipeline builds them in this order, the validator and `mha check`
judge each file with its row, and nothing else in the codebase spells a file name.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from mha_runtime.config import MHAConfig
from mha_runtime.errors import ExportError
from mha_runtime.tolerance import Tolerance

# Who loads a file: the `runtime` field of cases.json and of the manifest's artifact records.
ONNX_RUNTIME = "onnxruntime"
DECODE_RUNTIME = "onnxruntime-decode"
DECODE_INPLACE_RUNTIME = "onnxruntime-decode-inplace"
TORCHSCRIPT_RUNTIME = "torchscript"
EXECUTORCH_RUNTIME = "executorch"
# ExecuTorch plans memory at the upper bounds: the .pte takes at most this batch (its contract says so).
PTE_MAX_BATCH = 4
WEIGHTS_FILE = "weights.safetensors"

# fp32 rows. Measured max abs error against eager: about 1e-6 at gpt2-small T=1024, 1e-7 on the seed preset;
# the blocks/contrib/decode kernels only reorder sums (7e-7). DESIGN's starting point; a test pins it.
FP32 = Tolerance(atol=1e-5, rtol=1e-5)


@dataclass(frozen=True)
class ArtifactSpec:
    """One artifact file: its name, its tolerance row (`kind`) and the runtime that loads it."""

    file: str
    kind: str
    runtime: str

    @property
    def tolerance(self) -> Tolerance:
        return tolerance_for(self.kind, "cpu")

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "kind": self.kind, "runtime": self.runtime, "tolerance": self.tolerance.to_dict()}


OPTIONAL_FIELDS = frozenset({"qkv_bias", "out_proj"})


@dataclass(frozen=True)
class Variant:
    """A named way of building artifact files from the wrapper's weights.

    `builder` is "module:function" on the torch side, imported only when the variant is built, so this
    table stays importable without torch. `needs` are the variants whose files it is built from.
    `tolerances` are the rows of the tolerance table for `kind == name`, one per provider.
    """

    name: str
    summary: str
    artifacts: tuple[ArtifactSpec, ...]
    builder: str
    tolerances: dict[str, Tolerance] = field(default_factory=dict)
    needs: tuple[str, ...] = ()
    core: bool = False  # always built (the faithful pair), not a --variants choice
    low_precision: bool = False
    # The optional config fields the builder honours; a config using another one is refused before any work.
    carries: frozenset[str] = OPTIONAL_FIELDS
    # Why a config's shape cannot be built (None: it can); `all` leaves such a variant out with a note.
    refuses: Callable[[MHAConfig], str | None] | None = None

    @property
    def file(self) -> str:
        """The variant's (first) file."""
        return self.artifacts[0].file


def _one(file: str, kind: str, runtime: str = ONNX_RUNTIME) -> tuple[ArtifactSpec, ...]:
    return (ArtifactSpec(file, kind, runtime),)


REGISTRY: tuple[Variant, ...] = (
    Variant("onnx", "faithful trace of the wrapper (dynamo exporter), one self-contained file",
            _one("mha.onnx", "onnx"), "mha_export.onnx_export:build_onnx", core=True,
            # CUDA: not measured yet (no GPU lent to this project so far); kept at the fp32 CPU row until it is.
            tolerances={"cpu": FP32, "cuda": FP32}),
    Variant("torchscript", "TorchScript (torch.jit.trace), config embedded",
            _one("mha.pt", "torchscript", TORCHSCRIPT_RUNTIME), "mha_export.torchscript:build_torchscript",
            core=True, tolerances={"cpu": FP32}),  # measured 0.0 to 5e-7: the same kernels as eager
    Variant("fused", "one Q/K/V projection, scaled_dot_product_attention, opset 18",
            _one("mha.fused.onnx", "fused"), "mha_export.variants:build_fused", tolerances={"cpu": FP32}),
    Variant("attention", "the fused form at opset 23: one ONNX Attention node",
            _one("mha.attention.onnx", "attention"), "mha_export.variants:build_attention", tolerances={"cpu": FP32}),
    Variant("contrib", "ONNX Runtime's com.microsoft.Attention, one node",
            _one("mha.contrib.onnx", "contrib"), "mha_export.contrib:build_contrib", tolerances={"cpu": FP32}),
    Variant("blocks", "fused projection + causal query blocks of com.microsoft.MultiHeadAttention",
            _one("mha.blocks.onnx", "blocks"), "mha_export.blocks:build_blocks", tolerances={"cpu": FP32}),
    Variant("qblocks", "the fastest fp32 form on CPU: causal query blocks of the ONNX Attention op (opset 23)",
            _one("mha.qblocks.onnx", "qblocks"), "mha_export.qblocks:build_qblocks",
            tolerances={"cpu": FP32}),  # only the order of sums changes; measured 7.4e-7 at gpt2-small T=1024
    Variant("fp16", "float16 weights and compute, float32 I/O (onnxruntime's float16 converter)",
            _one("mha.fp16.onnx", "fp16"), "mha_export.variants:build_fp16", needs=("fused",), low_precision=True,
            # Measured over the gpt2-small sweep: max abs 9.5e-4, relative L2 3.9e-4; 5e-3 leaves 5x headroom.
            tolerances={"cpu": Tolerance(atol=5e-3, rtol=0.0)}),
    Variant("int8", "onnxruntime dynamic quantization of the blocks graph (uint8 weights)",
            _one("mha.int8.onnx", "int8"), "mha_export.variants:build_int8", needs=("blocks",), low_precision=True,
            # Judged mainly by relative L2 <= 3e-2 (measured 1.3e-2 over the gpt2-small sweep). Max abs measured
            # 2.7e-2 (outputs reach about 2.0); 0.1 is about 4x that and still catches a broken quantization
            # (signed weights on AVX2 gave 0.28 max abs, 0.28 rel L2).
            tolerances={"cpu": Tolerance(atol=0.1, rtol=0.0, rel_l2=3e-2)}),
    # The .ort files hold the same fp32 arithmetic as their sources, so they share the sources' rows.
    Variant("ort", "ORT format of mha.onnx and mha.fused.onnx (basic optimizations) for mobile builds",
            (ArtifactSpec("mha.ort", "onnx", ONNX_RUNTIME), ArtifactSpec("mha.fused.ort", "fused", ONNX_RUNTIME)),
            "mha_export.variants:build_ort", needs=("onnx", "fused")),
    Variant("pte", f"ExecuTorch program with the XNNPACK delegate (batch <= {PTE_MAX_BATCH})",
            _one("mha.pte", "pte", EXECUTORCH_RUNTIME), "mha_export.pte:build_pte",
            # Per-head bmm with an additive mask and the scale folded into W_query: only the order of sums
            # changes; measured max abs 2.6e-6 at gpt2-small T=1024 (ExecuTorch 1.5.1, XNNPACK).
            tolerances={"cpu": FP32}),
    Variant("decode", "key/value-cache form for token-by-token generation (its own I/O)",
            _one("mha.decode.onnx", "decode", DECODE_RUNTIME), "mha_export.decode:build_decode",
            tolerances={"cpu": FP32}),  # any chunking against the full-sequence output: fp32 arithmetic
    Variant("decode-inplace", "decode with one preallocated cache of context_length written in place",
            _one("mha.decode-inplace.onnx", "decode-inplace", DECODE_INPLACE_RUNTIME),
            "mha_export.decode_inplace:build_decode_inplace",
            tolerances={"cpu": FP32},  # GroupQueryAttention's fp32 sums; measured 7.4e-7 at gpt2-small T=1024
            refuses=lambda c: None if c.d_out % 8 == 0 else
            f"ONNX Runtime's GroupQueryAttention needs d_out % 8 == 0, got d_out={c.d_out}"),
)

VARIANTS: dict[str, Variant] = {v.name: v for v in REGISTRY}
CHOICES: tuple[str, ...] = tuple(v.name for v in REGISTRY if not v.core)
# Combinations people ask for that cannot be built, with the reason.
UNBUILDABLE: dict[str, str] = {
    "int8-attention": "int8 dynamic quantization of the opset-23 Attention node gives an invalid graph; "
                      "int8 is built from the blocks form (variant 'int8')",
}
# One row per (artifact kind, provider), gathered from the declarations above.
TOLERANCES: dict[tuple[str, str], Tolerance] = {
    (v.name, provider): row for v in REGISTRY for provider, row in v.tolerances.items()}


def tolerance_for(kind: str, provider: str = "cpu") -> Tolerance:
    """The row for (kind, provider); an unknown pair is a programming error, named."""
    try:
        return TOLERANCES[(kind, provider)]
    except KeyError:
        known = ", ".join(f"{k}/{p}" for k, p in TOLERANCES)
        raise KeyError(f"no tolerance row for {kind}/{provider}; rows: {known}") from None


def parse_variants(text: str | Iterable[str]) -> tuple[str, ...]:
    """'fused,int8' -> ('fused', 'int8'); 'all' -> every variant; 'none' or '' -> (). Refuses before any work."""
    names = [n.strip() for n in (text.split(",") if isinstance(text, str) else text) if n.strip()]
    if names == ["all"]:
        return CHOICES
    if names in ([], ["none"]):
        return ()
    for name in names:
        if name in UNBUILDABLE:
            raise ExportError(f"variant {name!r} cannot be built: {UNBUILDABLE[name]}")
        if name not in CHOICES:
            raise ExportError(f"unknown variant {name!r}; choose from {', '.join(CHOICES)}, 'all' or 'none'")
    return tuple(v for v in CHOICES if v in names)


def with_needs(variants: Iterable[str]) -> tuple[Variant, ...]:
    """The core pair, the chosen variants and everything they are built from, in build order."""
    chosen = {v.name for v in REGISTRY if v.core} | set(variants)
    pending = list(chosen)
    while pending:
        for need in VARIANTS[pending.pop()].needs:
            if need not in chosen:
                chosen.add(need)
                pending.append(need)
    return tuple(v for v in REGISTRY if v.name in chosen)


def buildable(config: MHAConfig, variants: tuple[str, ...]) -> tuple[tuple[str, ...], list[str]]:
    """The variants this config's shape allows, and a note for each one left out. `all` (every choice) leaves
    out what cannot be built; a variant asked for by name is refused before any work."""
    kept, notes = [], []
    for name in variants:
        reason = VARIANTS[name].refuses(config) if VARIANTS[name].refuses is not None else None
        if reason is None:
            kept.append(name)
        elif tuple(variants) == CHOICES:
            notes.append(f"variant {name!r} left out: {reason}")
        else:
            raise ExportError(f"variant {name!r} cannot be built for this config: {reason}")
    return tuple(kept), notes


def check_carries(used: Iterable[str], variants: Iterable[str]) -> None:
    """Refuse, before any work, a variant that cannot carry an optional config field the model uses."""
    for variant in with_needs(variants):
        missing = sorted(set(used) - variant.carries)
        if missing:
            raise ExportError(f"variant {variant.name!r} cannot carry {missing[0]}=true; leave it out "
                              f"(--variants without {variant.name}) or export a config without it")


def artifact_specs(variants: Iterable[str]) -> tuple[ArtifactSpec, ...]:
    """Every artifact file the chosen variants produce (the core pair first), in registry order."""
    return tuple(spec for v in with_needs(variants) for spec in v.artifacts)


def spec_for(file: str) -> ArtifactSpec:
    """The registry's entry for an artifact file name."""
    for v in REGISTRY:
        for spec in v.artifacts:
            if spec.file == file:
                return spec
    raise KeyError(f"{file}: not an artifact file of the registry")


ONNX, TORCHSCRIPT = VARIANTS["onnx"].artifacts[0], VARIANTS["torchscript"].artifacts[0]
DECODE = VARIANTS["decode"].artifacts[0]
DECODE_INPLACE = VARIANTS["decode-inplace"].artifacts[0]
PTE = VARIANTS["pte"].artifacts[0]
LOW_PRECISION_KINDS = frozenset(v.name for v in REGISTRY if v.low_precision)
