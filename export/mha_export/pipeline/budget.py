"""What an export will take, from the config alone: refused before any work when it cannot fit or be built.

The estimate is the libraries' own footprint (torch, ONNX Runtime, onnx, ExecuTorch once imported) plus the three
things that grow with the shape: the weights (held by the eager wrapper, its fused and per-head copies, each ONNX
graph in memory and serialized, the validating session), the wrapper's per-head (context, context) float masks
(held by the model and copied by the tracer before they are deduplicated), and the validation sweep's attention
scores at batch 3 and context_length tokens (one artifact's session at a time, beside the eager model). The
factors are fitted above the peaks measured (docs/design-notes.md, "Export budget").
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from mha_runtime.artifact.errors import BadValueError, ConfigError
from mha_runtime.attention.config import MHAConfig

FLOAT = 4
LIBRARIES = 768 * 2**20
WEIGHT_COPIES = 12
MASK_COPIES = 4
# Batch 3 x six (context, context) float score tensors per head: the session's and the eager model's buffers.
SCORE_COPIES = 3 * 6
# mha.onnx is one self-contained protobuf, which cannot exceed 2 GiB.
PROTOBUF_LIMIT = 2**31
# The traced graph folds each head's mask into one shared constant only up to this many elements
# (FOLD_LIMIT in graphs/onnx_trace.py): a longer context would store one mask per head.
MAX_CONTEXT = 4096
# The graphs are traced at 2 <= tokens < context_length (model/example.py: a size-1 or full token axis is frozen).
MIN_CONTEXT = 3
# The faithful trace holds a subgraph per head (about 20 nodes each): past a few hundred heads tracing, the
# graph passes and validation take minutes to hours, so a config with more is refused by name.
MAX_HEADS = 256


@dataclass(frozen=True)
class Estimate:
    """Bytes an export of one config needs at its peak, by part, and the size of its largest file."""

    weights: int
    masks: int
    validation: int
    largest_file: int
    libraries: int = LIBRARIES

    @property
    def peak(self) -> int:
        return self.libraries + self.weights + self.masks + self.validation


def parameters(config: MHAConfig) -> int:
    """Learned values: per head W_query, W_key, W_value (and biases), plus the output projection."""
    per_head = 3 * config.d_in * config.d_out + (3 * config.d_out if config.qkv_bias else 0)
    projection = config.d_model * config.d_model + config.d_model if config.out_proj else 0
    return config.num_heads * per_head + projection


def estimate(config: MHAConfig) -> Estimate:
    weights = parameters(config) * FLOAT
    square = config.context_length ** 2
    return Estimate(weights=WEIGHT_COPIES * weights, masks=MASK_COPIES * config.num_heads * square * FLOAT,
                    validation=SCORE_COPIES * config.num_heads * square * FLOAT,
                    largest_file=weights + square)  # the fp32 weights and one folded bool mask


def available_memory() -> int | None:
    """MemAvailable from /proc/meminfo (what can be allocated without swapping), else free physical pages."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return None


def gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**28 else f"{n / 2**20:.0f} MiB"


def check_budget(config: MHAConfig, *, available: int | None = None) -> Estimate:
    """Refuse, in one line, a config the graph builders do not support or whose export cannot fit in memory."""
    if config.context_length < MIN_CONTEXT:
        raise BadValueError(f"context_length {config.context_length}: the graph builders need at least {MIN_CONTEXT} "
                            "(the token axis is traced at 2 <= tokens < context_length to stay dynamic)")
    if config.context_length > MAX_CONTEXT:
        raise BadValueError(f"context_length {config.context_length}: the graph builders support at most "
                          f"{MAX_CONTEXT} (the causal mask is folded into one constant of at most {MAX_CONTEXT}^2 "
                          "elements)")
    if config.num_heads > MAX_HEADS:
        raise BadValueError(f"num_heads {config.num_heads}: the faithful trace supports at most {MAX_HEADS} heads "
                          "(one subgraph per head)")
    need = estimate(config)
    if need.largest_file > PROTOBUF_LIMIT:
        raise BadValueError(f"config {config.to_json()}: mha.onnx would be about {gib(need.largest_file)}, over the "
                          f"{gib(PROTOBUF_LIMIT)} a self-contained ONNX file (one protobuf) can hold")
    free = available_memory() if available is None else available
    if free is not None and need.peak > free:
        raise ConfigError(f"config {config.to_json()}: the export needs about {gib(need.peak)} (libraries "
                          f"{gib(need.libraries)}, weights {gib(need.weights)}, masks {gib(need.masks)}, validation "
                          f"{gib(need.validation)}); this machine has {gib(free)} available")
    return need
