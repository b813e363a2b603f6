"""The artifact registry: every artifact file, variant and tolerance row declared once (torch-free).

The CLI offers these names, the pipeline builds them in this order, the validator and `mha check`
judge each file with its row, and nothing else in the codebase spells a file name.
"""
from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal

from mha_runtime.artifact.errors import BadValueError, ExportError, cut
from mha_runtime.artifact.tolerance import Tolerance
from mha_runtime.attention.config import MHAConfig

# Who loads a file: the `runtime` field of cases.json and of the manifest's artifact records.
ONNX_RUNTIME = "onnxruntime"
DECODE_RUNTIME = "onnxruntime-decode"
DECODE_INPLACE_RUNTIME = "onnxruntime-decode-inplace"
TORCHSCRIPT_RUNTIME = "torchscript"
EXECUTORCH_RUNTIME = "executorch"
# ExecuTorch plans memory at the upper bounds: the .pte takes at most this batch (its contract says so).
PTE_MAX_BATCH = 4
WEIGHTS_FILE = "weights.safetensors"

# The fp32 row (DESIGN's starting point; a test pins it). The measured errors behind every row are in
# docs/design-notes.md, "Tolerance rows".
FP32 = Tolerance(atol=1e-5, rtol=1e-5)
# fp16 weights and compute: 5x headroom over the measured error.
FP16 = Tolerance(atol=5e-3, rtol=0.0)
# int8 is judged mainly by relative L2; the max abs bound still catches a broken quantization.
INT8 = Tolerance(atol=0.1, rtol=0.0, rel_l2=3e-2)
PROVIDERS = ("cpu", "cuda")
# What ONNX Runtime 1.31's CUDA provider does with some forms (H200, docs/measurements/cuda.md).
_CUDA_MHA_ONE_TOKEN = ("ONNX Runtime's CUDA MultiHeadAttention fails on a 1-token input "
                       "('CUDA failure 1: invalid argument')")
_CUDA_INPLACE = ("its cache bound in place gives wrong outputs in a CUDA session (GroupQueryAttention has no "
                 "float32 CUDA kernel)")


@dataclass(frozen=True)
class ArtifactSpec:
    """One artifact file: its name, its tolerance row (`kind`) and the runtime that loads it."""

    file: str
    kind: str
    runtime: str

    @property
    def tolerance(self) -> Tolerance:
        """The CPU row: what the export validates with and what cases.json records."""
        return tolerance_for(self.kind, "cpu")


@dataclass(frozen=True)
class Variant:
    """A named way of building artifact files from the wrapper's weights.

    Its builder lives on the torch side, in `mha_export.attention.graphs.table.BUILDERS` under the same name (checked at
    import), so this table stays importable without torch. `needs` are the variants whose files it is built
    from. `tolerances` are the rows of the tolerance table for `kind == name`, one per provider; a provider
    without its own row is judged by the CPU row (see `tolerance_for`).
    """

    name: str
    summary: str
    artifacts: tuple[ArtifactSpec, ...]
    tolerances: dict[str, Tolerance] = field(default_factory=dict)
    needs: tuple[str, ...] = ()
    core: bool = False  # always built (the faithful pair), not a --variants choice
    low_precision: bool = False
    # ONNX Runtime's optimized graph of each file is saved beside it at export (artifact/optimized_records.py): the
    # fastest fp32 forms only, since each copy holds the weights again (docs/bench.md, "offline-optimized sessions").
    offline_optimized: bool = False
    # Why a config's shape cannot be built (None: it can); `all` leaves such a variant out with a note.
    refuses: Callable[[MHAConfig], str | None] | None = None
    # Python modules the builder needs beyond the export package, and the install that brings them: without
    # them `all` leaves the variant out with a note naming the install, and a variant asked for by name is refused.
    requires: tuple[str, ...] = ()
    install: str | None = None
    # Why ONNX Runtime's CUDA provider cannot run this form (None: it can); measured on a GPU
    # (docs/measurements/cuda.md). `--provider cuda` refuses it in one line, `auto` runs it on the CPU.
    cuda: str | None = None

    def missing(self) -> str | None:
        """What this environment lacks to build the variant, or None."""
        absent = [m for m in self.requires if importlib.util.find_spec(m) is None]
        return f"needs {', '.join(absent)}: {self.install}" if absent else None

    @property
    def file(self) -> str:
        """The variant's (first) file."""
        return self.artifacts[0].file


def _one(file: str, kind: str, runtime: str = ONNX_RUNTIME) -> tuple[ArtifactSpec, ...]:
    return (ArtifactSpec(file, kind, runtime),)


def _gqa_head_size(config: MHAConfig) -> str | None:
    if config.d_out % 8 == 0:
        return None
    return f"ONNX Runtime's GroupQueryAttention needs d_out % 8 == 0, got d_out={config.d_out}"


REGISTRY: tuple[Variant, ...] = (
    Variant("onnx", "faithful trace of the wrapper (dynamo exporter), one self-contained file",
            _one("mha.onnx", "onnx"), core=True, tolerances={"cpu": FP32}),
    Variant("torchscript", "TorchScript (torch.jit.trace), config embedded",
            _one("mha.pt", "torchscript", TORCHSCRIPT_RUNTIME), core=True, tolerances={"cpu": FP32}),
    Variant("fused", "one Q/K/V projection, scaled_dot_product_attention, opset 18",
            _one("mha.fused.onnx", "fused"), tolerances={"cpu": FP32}),
    Variant("attention", "the fused form at opset 23: one ONNX Attention node",
            _one("mha.attention.onnx", "attention"), tolerances={"cpu": FP32}),
    Variant("contrib", "ONNX Runtime's com.microsoft.Attention, one node",
            _one("mha.contrib.onnx", "contrib"), tolerances={"cpu": FP32}),
    Variant("blocks", "fused projection + causal query blocks of com.microsoft.MultiHeadAttention",
            _one("mha.blocks.onnx", "blocks"), tolerances={"cpu": FP32}, offline_optimized=True,
            cuda=_CUDA_MHA_ONE_TOKEN),
    Variant("qblocks", "the fastest fp32 form on CPU: causal query blocks of the ONNX Attention op (opset 23)",
            _one("mha.qblocks.onnx", "qblocks"), tolerances={"cpu": FP32}, offline_optimized=True),
    Variant("fp16", "float16 weights and compute, float32 I/O (onnxruntime's float16 converter)",
            _one("mha.fp16.onnx", "fp16"), needs=("fused",), low_precision=True, tolerances={"cpu": FP16}),
    Variant("int8", "onnxruntime dynamic quantization of the blocks graph (uint8 weights)",
            _one("mha.int8.onnx", "int8"), needs=("blocks",), low_precision=True, tolerances={"cpu": INT8},
            cuda=_CUDA_MHA_ONE_TOKEN),
    # The .ort files hold the same fp32 arithmetic as their sources, so they share the sources' rows.
    Variant("ort", "ORT format of mha.onnx and mha.fused.onnx (basic optimizations) for mobile builds",
            (ArtifactSpec("mha.ort", "onnx", ONNX_RUNTIME), ArtifactSpec("mha.fused.ort", "fused", ONNX_RUNTIME)),
            needs=("onnx", "fused")),
    Variant("pte", f"ExecuTorch program with the XNNPACK delegate (batch <= {PTE_MAX_BATCH})",
            _one("mha.pte", "pte", EXECUTORCH_RUNTIME), tolerances={"cpu": FP32},
            requires=("executorch",), install="pip install './export[executorch]'"),
    Variant("decode", "key/value-cache form for token-by-token generation (its own I/O)",
            _one("mha.decode.onnx", "decode", DECODE_RUNTIME), tolerances={"cpu": FP32}),
    Variant("decode-inplace", "decode with one preallocated cache of context_length written in place",
            _one("mha.decode-inplace.onnx", "decode-inplace", DECODE_INPLACE_RUNTIME), tolerances={"cpu": FP32},
            refuses=_gqa_head_size, cuda=_CUDA_INPLACE),
)

VARIANTS: dict[str, Variant] = {v.name: v for v in REGISTRY}
CHOICES: tuple[str, ...] = tuple(v.name for v in REGISTRY if not v.core)
# `--variants all`: every choice this config and environment can build; the rest left out with a note.
ALL = "all"
# What `--variants` gives: ALL, or the names asked for (each then refused when it cannot be built).
Selection = tuple[str, ...] | Literal["all"]
# Combinations people ask for that cannot be built, with the reason.
UNBUILDABLE: dict[str, str] = {
    "int8-attention": "int8 dynamic quantization of the opset-23 Attention node gives an invalid graph; "
                      "int8 is built from the blocks form (variant 'int8')",
}
# One row per (artifact kind, provider), gathered from the declarations above.
TOLERANCES: dict[tuple[str, str], Tolerance] = {
    (v.name, provider): row for v in REGISTRY for provider, row in v.tolerances.items()}


def tolerance_for(kind: str, provider: str = "cpu") -> Tolerance:
    """The row for (kind, provider). A provider without a row of its own for that kind is judged by the CPU row:
    on an H200 every form CUDA runs stayed within its CPU row (docs/measurements/cuda.md), so CUDA declares none;
    a measured row would replace one by declaring it. An unknown kind or provider is a programming error, named."""
    if provider not in PROVIDERS:
        raise KeyError(f"no tolerance rows for provider {provider!r}; providers: {', '.join(PROVIDERS)}")
    row = TOLERANCES.get((kind, provider)) or TOLERANCES.get((kind, "cpu"))
    if row is None:
        known = ", ".join(f"{k}/{p}" for k, p in TOLERANCES)
        raise KeyError(f"no tolerance row for {kind}/{provider}; rows: {known}")
    return row


def parse_variants(text: str | Iterable[str]) -> Selection:
    """'fused,int8' -> ('fused', 'int8'); 'all' -> ALL; 'none' or '' -> (). Refuses before any work."""
    names = [n.strip() for n in (text.split(",") if isinstance(text, str) else text) if n.strip()]
    if names == [ALL]:
        return ALL
    if names in ([], ["none"]):
        return ()
    for name in names:
        if name in UNBUILDABLE:
            raise BadValueError(f"variant {name!r} cannot be built: {UNBUILDABLE[name]}")
        if name not in CHOICES:
            raise BadValueError(f"unknown variant {cut(name)!r}; choose from {', '.join(CHOICES)}, 'all' or 'none'")
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


def buildable(config: MHAConfig, variants: Selection) -> tuple[tuple[str, ...], list[str]]:
    """The variants this config's shape and this environment allow, and a note for each one left out. ALL leaves
    out what cannot be built; a variant asked for by name (itself or as another's need) is refused before any
    work."""
    kept, notes = [], []
    for variant in with_needs(CHOICES if variants == ALL else variants):
        shape = variant.refuses(config) if variant.refuses is not None else None
        reason = shape or variant.missing()
        if reason is None:
            kept.append(variant.name)
        elif variants == ALL:
            notes.append(f"variant {variant.name!r} left out: {reason}")
        else:
            if shape:  # the config's values rule it out: a usage error; a missing extra is not
                raise BadValueError(f"variant {variant.name!r} cannot be built for this config: {reason}")
            raise ExportError(f"variant {variant.name!r} cannot be built here: {reason}")
    return tuple(v for v in kept if v in CHOICES), notes


def artifact_specs(variants: Iterable[str]) -> tuple[ArtifactSpec, ...]:
    """Every artifact file the chosen variants produce (the core pair first), in registry order."""
    return tuple(spec for v in with_needs(variants) for spec in v.artifacts)


def cpu_only(kind: str) -> str | None:
    """Why the form of this artifact kind cannot run on ONNX Runtime's CUDA provider, or None."""
    variant = VARIANTS.get(kind)
    return variant.cuda if variant is not None else None


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
OFFLINE_OPTIMIZED_FILES = frozenset(spec.file for v in REGISTRY if v.offline_optimized for spec in v.artifacts)
