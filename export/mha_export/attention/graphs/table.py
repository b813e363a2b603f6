"""The builder of every variant, keyed by the registry's names: real references that tools can follow.

`mha_runtime.attention.registry` declares each variant (files, needs, tolerance rows) without torch; this table
gives each name its build function, and refuses at import a name the registry lacks or a variant left without
a builder.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from mha_export.attention.graphs.blocks import build_blocks
from mha_export.attention.graphs.contrib import build_contrib
from mha_export.attention.graphs.convert import build_fp16, build_int8, build_ort
from mha_export.attention.graphs.decode import build_decode
from mha_export.attention.graphs.decode_inplace import build_decode_inplace
from mha_export.attention.graphs.onnx_trace import build_onnx
from mha_export.attention.graphs.qblocks import build_qblocks
from mha_export.attention.graphs.sdpa import build_attention, build_fused
from mha_export.attention.graphs.torchscript import build_torchscript
from mha_export.executorch.attention import build_pte
from mha_runtime.attention.registry import VARIANTS

# (wrapper, config, folder, *, opset) -> writes the variant's files into folder.
Builder = Callable[..., None]

BUILDERS: Mapping[str, Builder] = MappingProxyType({
    "onnx": build_onnx,
    "torchscript": build_torchscript,
    "fused": build_fused,
    "attention": build_attention,
    "contrib": build_contrib,
    "blocks": build_blocks,
    "qblocks": build_qblocks,
    "fp16": build_fp16,
    "int8": build_int8,
    "ort": build_ort,
    "pte": build_pte,
    "decode": build_decode,
    "decode-inplace": build_decode_inplace,
})

if set(BUILDERS) != set(VARIANTS):
    raise ImportError(f"mha_export.attention.graphs.table: builders {sorted(set(BUILDERS) - set(VARIANTS))} "
                      f"have no variant, variants {sorted(set(VARIANTS) - set(BUILDERS))} have no builder")
