"""The artifact registry: every artifact file, variant and tolerance row declared once (torch-free).

The CLI offers these names, the pipeline builds them in this order, the validator and `mha check`
judge each file with its row, and nothing else in the codebase spells a file name.
"""
from __future__ import annotations

import importlib.util
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from mha_runtime.artifact.errors import BadValueError, ExportError
from mha_runtime.artifact.forms import ALL, Chosen, FormRow, Table, closure, parse, select
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


@dataclass(frozen=True, kw_only=True)
class Variant(FormRow):
    """A named way of building artifact files from the wrapper's weights: a row of the forms vocabulary
    (mha_runtime.artifact.forms) whose `tolerance` is its CPU row.

    Its builder lives on the torch side, in `mha_export.attention.graphs.table.BUILDERS` under the same name (checked at
    import), so this table stays importable without torch. `needs` are the variants whose files it is built
    from. `providers` are rows of the tolerance table for `kind == name` measured on another provider; a provider
    without its own row is judged by the CPU row (see `tolerance_for`).
    """

    summary: str
    runtime: str = ONNX_RUNTIME
    # A variant of several files lists them (the first is `file`); one file is `file`, its tolerance row its name's.
    files: tuple[ArtifactSpec, ...] = ()
    providers: dict[str, Tolerance] = field(default_factory=dict)
    low_precision: bool = False
    # ONNX Runtime's optimized graph of each file is saved beside it at export (artifact/optimized_records.py): the
    # fastest fp32 forms only, since each copy holds the weights again (docs/bench.md, "offline-optimized sessions").
    offline_optimized: bool = False
    # Python modules the builder needs beyond the export package, and the install that brings them: without
    # them `all` leaves the variant out with a note naming the install, and a variant asked for by name is refused.
    requires: tuple[str, ...] = ()
    install: str | None = None
    # Why ONNX Runtime's CUDA provider cannot run this form (None: it can); measured on a GPU
    # (docs/measurements/cuda.md). `--provider cuda` refuses it in one line, `auto` runs it on the CPU.
    cuda: str | None = None

    def __post_init__(self) -> None:
        if self.files and self.files[0].file != self.file:
            raise ValueError(f"variant {self.name!r}: its first file is not {self.file!r}")

    @property
    def artifacts(self) -> tuple[ArtifactSpec, ...]:
        """Every file of the variant, each with its tolerance row and runtime."""
        return self.files or (ArtifactSpec(self.file, self.name, self.runtime),)

    def missing(self) -> str | None:
        """What this environment lacks to build the variant, or None."""
        absent = [m for m in self.requires if importlib.util.find_spec(m) is None]
        return f"needs {', '.join(absent)}: {self.install}" if absent else None


def _gqa_head_size(config: MHAConfig) -> str | None:
    if config.d_out % 8 == 0:
        return None
    return f"ONNX Runtime's GroupQueryAttention needs d_out % 8 == 0, got d_out={config.d_out}"


REGISTRY: tuple[Variant, ...] = (
    Variant(name="onnx", file="mha.onnx", core=True, tolerance=FP32,
            summary="faithful trace of the wrapper (dynamo exporter), one self-contained file"),
    Variant(name="torchscript", file="mha.pt", runtime=TORCHSCRIPT_RUNTIME, core=True, tolerance=FP32,
            summary="TorchScript (torch.jit.trace), config embedded"),
    Variant(name="fused", file="mha.fused.onnx", tolerance=FP32,
            summary="one Q/K/V projection, scaled_dot_product_attention, opset 18"),
    Variant(name="attention", file="mha.attention.onnx", tolerance=FP32,
            summary="the fused form at opset 23: one ONNX Attention node"),
    Variant(name="contrib", file="mha.contrib.onnx", tolerance=FP32,
            summary="ONNX Runtime's com.microsoft.Attention, one node"),
    Variant(name="blocks", file="mha.blocks.onnx", tolerance=FP32, offline_optimized=True, cuda=_CUDA_MHA_ONE_TOKEN,
            summary="fused projection + causal query blocks of com.microsoft.MultiHeadAttention"),
    Variant(name="qblocks", file="mha.qblocks.onnx", tolerance=FP32, offline_optimized=True,
            summary="the fastest fp32 form on CPU: causal query blocks of the ONNX Attention op (opset 23)"),
    Variant(name="fp16", file="mha.fp16.onnx", needs=("fused",), low_precision=True, tolerance=FP16,
            summary="float16 weights and compute, float32 I/O (onnxruntime's float16 converter)"),
    Variant(name="int8", file="mha.int8.onnx", needs=("blocks",), low_precision=True, tolerance=INT8,
            cuda=_CUDA_MHA_ONE_TOKEN, summary="onnxruntime dynamic quantization of the blocks graph (uint8 weights)"),
    # The .ort files hold the same fp32 arithmetic as their sources, so they share the sources' rows.
    Variant(name="ort", file="mha.ort", needs=("onnx", "fused"),
            files=(ArtifactSpec("mha.ort", "onnx", ONNX_RUNTIME), ArtifactSpec("mha.fused.ort", "fused", ONNX_RUNTIME)),
            summary="ORT format of mha.onnx and mha.fused.onnx (basic optimizations) for mobile builds"),
    Variant(name="pte", file="mha.pte", runtime=EXECUTORCH_RUNTIME, tolerance=FP32,
            requires=("executorch",), install="pip install './export[executorch]'",
            summary=f"ExecuTorch program with the XNNPACK delegate (batch <= {PTE_MAX_BATCH})"),
    Variant(name="decode", file="mha.decode.onnx", runtime=DECODE_RUNTIME, tolerance=FP32,
            summary="key/value-cache form for token-by-token generation (its own I/O)"),
    Variant(name="decode-inplace", file="mha.decode-inplace.onnx", runtime=DECODE_INPLACE_RUNTIME, tolerance=FP32,
            refuses=_gqa_head_size, cuda=_CUDA_INPLACE,
            summary="decode with one preallocated cache of context_length written in place"),
)

VARIANTS: dict[str, Variant] = {v.name: v for v in REGISTRY}
# How `mha export --variants` reads (mha_runtime.artifact.forms.parse): the variants in build order, 'none' for the
# core pair alone, needs built with what needs them, and combinations people ask for that cannot be built.
TABLE: Table[Variant] = Table(
    REGISTRY, unknown="unknown variant {name}; choose from {choices}, 'all' or 'none'", none=True, unbuildable={
        "int8-attention": "int8 dynamic quantization of the opset-23 Attention node gives an invalid graph; "
                          "int8 is built from the blocks form (variant 'int8')"})
CHOICES: tuple[str, ...] = TABLE.choices
UNBUILDABLE = TABLE.unbuildable
# What `--variants` gives: ALL (every choice this config and environment can build; the rest left out with a note),
# or the names asked for (each then refused when it cannot be built).
Selection = tuple[str, ...] | Literal["all"]
# One row per (artifact kind, provider), gathered from the declarations above.
TOLERANCES: dict[tuple[str, str], Tolerance] = {
    (v.name, provider): row for v in REGISTRY
    for provider, row in ({} if v.tolerance is None else {"cpu": v.tolerance} | v.providers).items()}


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
    chosen = parse(text, TABLE)
    return ALL if chosen.every else chosen.names


def _chosen(variants: Selection | Iterable[str]) -> Chosen:
    return Chosen(True, ()) if variants == ALL else Chosen(False, tuple(variants))


def with_needs(variants: Iterable[str]) -> tuple[Variant, ...]:
    """The core pair, the chosen variants and everything they are built from, in build order."""
    return closure(TABLE, variants)


def buildable(config: MHAConfig, variants: Selection) -> tuple[tuple[str, ...], list[str]]:
    """The variants this config's shape and this environment allow, and a note for each one left out. ALL leaves
    out what cannot be built; a variant asked for by name (itself or as another's need) is refused before any
    work."""
    selection = select(TABLE, _chosen(variants), config)
    for variant, reason, shape in selection.refused[:1]:
        if shape:  # the config's values rule it out: a usage error; a missing extra is not
            raise BadValueError(f"variant {variant.name!r} cannot be built for this config: {reason}")
        raise ExportError(f"variant {variant.name!r} cannot be built here: {reason}")
    notes = [f"variant {variant.name!r} left out: {reason}" for variant, reason in selection.left_out]
    return tuple(v.name for v in selection.rows if not v.core), notes


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
