"""What both ExecuTorch programs (`mha.pte`, `gpt.pte`) share: the additive causal mask and the lowering to
XNNPACK (export, delegate, the caller's refusal of what stayed outside, the program's bytes)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn

from mha_export.infer.pte_runner import quiet

# Additive mask value: finite, so that 0 * mask is 0 (not NaN); exp(score - 1e30 - max) is exactly 0.
NEG = -1e30


def causal_mask(keys: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
    """(Q, K) additive mask from float positions: NEG where the key is after the query, else 0 (both programs)."""
    return torch.clamp(keys - queries.unsqueeze(-1), 0.0, 1.0) * NEG


def lower(module: nn.Module, example: tuple[torch.Tensor, ...], dynamic: dict[str, Any],
          constant_methods: dict[str, Any], refuse: Callable[[list[Any]], None], backend: Any = None) -> bytes:
    """torch.export (non-strict, no grad) -> XNNPACK lowering with the constant methods -> `refuse` on the targets
    left outside the delegate (it raises the caller's own error) -> the program's bytes.
    Both programs' export: the module is built by the caller and the ExecuTorch imports are made here."""
    from torch.export import export

    with quiet():
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
        from executorch.exir import to_edge_transform_and_lower

        with torch.no_grad():
            program = export(module, example, dynamic_shapes=dynamic, strict=False)
        edge = to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()],
                                           constant_methods=constant_methods)
        refuse([n.target for n in edge.exported_program().graph_module.graph.nodes
                if n.op == "call_function" and "delegate" not in str(n.target) and "getitem" not in str(n.target)])
        return edge.to_executorch(backend).buffer
