"""The lossy forms: the fastest fp32 graph (gpt.inplace.onnx) with its MatMul weights in 8 or 4 bits, as the form's
method row says (mha_export.decoder.lossy.methods).

The MatMulNBits quantizer (lossy/matmulnbits.py) turns each MatMul into com.microsoft.MatMulNBits (blocks along the
input axis); accuracy_level 4 lets its kernel compute in int8 with activations quantized per block (level 1, fp32
compute, ran at 1.7 tokens/s on GPT_CONFIG_124M here: no fallback on this CPU). Chosen over quantize_dynamic
(MatMulInteger with one activation scale per tensor): on GPT_CONFIG_124M that moved logits 17x further from fp32 for a
similar speed (docs/gpt.md). The head is a MatMul on its own (E, V) copy in the graph handed to the quantizer
(graph.add_head); the token embedding is then quantized too (lossy/embedding.py: the head's own weights where they
are tied); position embeddings, LayerNorms and attention stay fp32.
"""
from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from onnx import numpy_helper

from mha_export.decoder.archs.protocol import DecoderConfig
from mha_export.decoder.graphs.inplace import inplace_model
from mha_export.decoder.lossy import scales
from mha_export.decoder.lossy.embedding import TOKENS, quantize_embedding, whole_blocks
from mha_export.decoder.lossy.methods import ACCURACY_LEVEL, BLOCK, FP32, HEAD, METHODS, QUANTIZERS, QuantPlan
from mha_export.onnx_file.check import check_model_light
from mha_export.onnx_file.save import save_streamed
from mha_runtime.decoder.forms import FORMS

__all__ = ["ACCURACY_LEVEL", "BLOCK", "FAST", "FINE", "FP32", "HEAD", "QuantPlan", "fit", "fitted_block",
           "lossy_source", "matmul_weights", "quantize_to", "weight_error"]
# Each lossy form's fast and fine plans by its width, from the method row the form names (the search's first two):
# the tests' view by width (the export reads the method rows).
FAST = {form.bits: METHODS[form.method].fast() for form in FORMS.values() if form.bits and form.method}
FINE = {form.bits: METHODS[form.method].fine() for form in FORMS.values() if form.bits and form.method}


def lossy_source(state: dict[str, torch.Tensor], cfg: DecoderConfig, *, tied: bool) -> onnx.ModelProto:
    """The fp32 graph the quantizer reads: gpt.inplace.onnx with the head as its own MatMul."""
    return inplace_model(state, cfg, tied=tied, head_matmul=True).full()


def matmul_weights(model: onnx.ModelProto) -> dict[str, str]:
    """weight initializer name -> the name of the MatMul node that reads it (the quantizer's targets)."""
    inits = {t.name for t in model.graph.initializer}
    return {n.input[1]: n.name for n in model.graph.node if n.op_type == "MatMul" and n.input[1] in inits}


def weight_error(weight: np.ndarray, bits: int) -> float:
    """Relative RMS error of `weight` (in, out) after symmetric blockwise rounding along the input axis: the
    ranking of which matrices lose most (an estimate of the quantizer's, not its exact arithmetic)."""
    padded = np.pad(weight.astype(np.float64), ((0, -weight.shape[0] % BLOCK), (0, 0)))  # zero rows to a block
    blocks = padded.reshape(-1, BLOCK, weight.shape[1])  # (in / block, block, out)
    top = 2 ** (bits - 1) - 1
    scale = np.abs(blocks).max(axis=1, keepdims=True) / top
    scale[scale == 0] = 1.0
    q = np.clip(np.round(blocks / scale), -top - 1, top) * scale
    err = float(np.sqrt(np.sum((q - blocks) ** 2)))
    norm = float(np.sqrt(np.sum(blocks ** 2)))
    return err / norm if norm else 0.0


def fitted_block(block: int, rows: int) -> int:
    """The block for a weight of `rows` input rows: the largest power of two up to `block` (and at least 16,
    MatMulNBits' smallest) that divides `rows`, so that no block is padded; 16 when none does."""
    b = block
    while b > 16 and rows % b:
        b //= 2
    return b


def fit(plan: QuantPlan, model: onnx.ModelProto, *, tied: bool) -> QuantPlan:
    """`plan` for this model's weights: a weight whose input rows its block does not divide gets the block
    fitted_block gives, recorded in `finer` (a block of 256 on a 64-row matrix would be three quarters padding);
    the token embedding's storage: the head's where `tied`, else its own (TOKENS in the plan like a matrix, its
    block fitted to its width E)."""
    names = matmul_weights(model)
    finer = dict(plan.finer)
    for t in model.graph.initializer:
        rows = t.dims[0] if t.name in names else t.dims[1] if t.name == TOKENS and not tied else 0  # (in, out), (V, E)
        if rows and plan.kept.get(t.name) != FP32:
            block = finer.get(t.name, plan.block_size)
            if fitted_block(block, rows) != block:
                finer[t.name] = fitted_block(block, rows)
    fitted = replace(plan, finer=finer)
    precision = fitted.precision(HEAD if tied else TOKENS)
    width = next(t.dims[1] for t in model.graph.initializer if t.name == TOKENS)  # (V, E)
    if precision is not None and not whole_blocks(width, precision[1]):  # stays fp32 (lossy/embedding.py)
        unnamed = {k: v for k, v in finer.items() if k != TOKENS}  # the plan names no weight it leaves alone
        return replace(fitted, finer=unnamed, kept={k: v for k, v in plan.kept.items() if k != TOKENS},
                       embedding={"dtype": FP32, "shared_with_head": False})
    embedding: dict[str, Any] = ({"dtype": FP32} if precision is None else
                                 {"dtype": f"int{precision[0]}", "block_size": precision[1],
                                  "symmetric": precision[2]})
    return replace(fitted, embedding=embedding | {"shared_with_head": tied})



def _passes(plan: QuantPlan, weights: list[str]) -> list[tuple[int, int, bool, set[str]]]:
    """(bits, block, symmetric, weights) of each quantizer pass the plan takes, its main one first."""
    main = {w for w in weights if w not in plan.kept and w not in plan.finer}
    out = [(plan.bits, plan.block_size, plan.symmetric, main)]
    for block in sorted(set(plan.finer.values())):
        out.append((plan.bits, block, plan.symmetric, {w for w, b in plan.finer.items()
                                                       if b == block and w not in plan.kept}))
    for block in sorted({plan.finer.get(w, plan.block_size) for w, p in plan.kept.items() if p == "int8"}):
        out.append((8, block, True, {w for w, p in plan.kept.items() if p == "int8"
                                     and plan.finer.get(w, plan.block_size) == block}))
    return out


def quantize_to(source: onnx.ModelProto, path: Path, plan: QuantPlan, *, tied: bool) -> None:
    """Quantize `source` in place by `plan` (its fp32 MatMul weights are replaced) and save it to `path`, streamed
    (the bytes equal onnx.save's, whose serialized copy of the whole model was the export's peak:
    docs/measurements/gpt.md). The caller keeps no other copy of the weights, so the peak is about the fp32 model
    once. One quantizer pass per group of `_passes`; weights kept at fp32 are in none; then the token embedding
    (lossy/embedding.py), stored as the plan says (`tied`: the head's weights); scales in fp16 where the plan says
    (lossy/scales.py: its 8-bit blocks for every 8-bit symmetric pass, then every other scale halved)."""
    targets = matmul_weights(source)
    unknown = sorted((set(plan.kept) | set(plan.finer)) - set(targets) - ({TOKENS} if not tied else set()))
    if unknown:
        raise AssertionError(f"plan names weights the graph does not quantize: {unknown}")
    logger = logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer")
    level = logger.level
    logger.setLevel(logging.WARNING)  # it logs two INFO lines per MatMul
    model = source
    try:
        for bits, block, symmetric, group in _passes(plan, list(targets)):
            group &= set(targets)  # TOKENS is not a MatMul weight: quantize_embedding stores it
            if group:
                half = plan.scales == scales.FP16 and bits == 8 and symmetric
                model = (scales.quantize if half else QUANTIZERS[plan.quantizer].quantize)(
                    model, bits=bits, block_size=block, symmetric=symmetric, accuracy_level=plan.accuracy_level,
                    exclude=[n for w, n in targets.items() if w not in group])
    finally:
        logger.setLevel(level)
    width = next(t.dims[1] for t in model.graph.initializer if t.name == TOKENS)  # (V, E)
    # Untied: its own precision, its block fitted to E unless the plan says; tied: the head's (read from its node).
    own = plan.precision(TOKENS)  # its block fitted to E as fit() fits it (a fitted plan: the same block)
    precision = None if own is None else (own[0], fitted_block(own[1], width), own[2])
    stored = quantize_embedding(model, head=HEAD, tied=tied, precision=precision)
    if plan.embedding and stored != plan.embedding:
        raise AssertionError(f"the embedding is stored as {stored}, the plan says {plan.embedding}")
    if plan.scales == scales.FP16:
        scales.half_scales(model)
    check_model_light(model)  # the graph, not a second copy of the weights (check.py)
    arrays = [(t.name, numpy_helper.to_array(t)) for t in model.graph.initializer]
    model.graph.ClearField("initializer")
    save_streamed(model, arrays, path)
