"""gpt.pte: the GPT as an ExecuTorch program (XNNPACK delegate) with its key/value cache inside the program.

The cache is one registered buffer per layer for keys and one for values, [1, H, C, D] (batch 1, C =
context_length), written in place by `index_copy_` as ExecuTorch's own LLM export does (examples/models/llama
KVCache with enable_dynamic_shape): torch.export records them as mutated buffers, ExecuTorch plans them once in
the program's memory and they persist between calls of the loaded `forward`. Why mutable buffers and not an
explicit cache in/out: through `executorch.runtime` every input and output crosses the Python binding as a
tensor (an explicit cache would carry 2 * n_layers * [1, H, C, D] into and out of every step: 75 MB each way
for GPT_CONFIG_124M), and the program would then own nothing about the cache layout; mutable buffers keep the step's
I/O at input_ids, input_pos and the logits.

forward(input_ids [1, T] int64, input_pos [1] int64) -> logits [1, V] of the last token, writing the T new
keys/values at positions input_pos .. input_pos + T - 1. T is dynamic (1 .. max_prefill_tokens = C), so one
call prefills a whole prompt; every query attends over the whole cache with an additive mask built from the
positions (keys after the query, stale rows of an earlier generation included, get -1e30, so exp gives exactly
0): a new generation is just a call at input_pos 0. The attention is plain Linear / matmul / softmax, which
XNNPACK takes; the embedding lookups, the cache writes and the position arithmetic run in ExecuTorch's portable
kernels.

Bounds (batch 1, input_pos + T <= C) are recorded in the program (constant methods) and in the manifest; the
runner (mha_export.infer.decoder_pte_runner) refuses anything beyond them before the runtime sees it: the portable
index_copy would fail or write out of the planned buffer.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from mha_export.decoder.eager import GPTModel
from mha_export.decoder.golden import form_generations
from mha_export.decoder.validate import FormReport, References, Tally, agreement, greedy_new
from mha_export.executorch.lower import causal_mask, lower
from mha_export.infer.decoder_pte_runner import BOUNDS_METHOD, CONFIG_METHOD, PteGPT
from mha_export.infer.pte_runner import quiet
from mha_runtime.artifact.errors import ExportError
from mha_runtime.artifact.tolerance import Tolerance
from mha_runtime.decoder.config import GPTConfig
from mha_runtime.decoder.contract import PTE_FORM, pte_bounds
from mha_runtime.decoder.forms import PTE
from mha_runtime.decoder.golden import GoldenGeneration
from mha_runtime.decoder.manifest import GPTArtifact

PTE_BATCH = 1  # pte_bounds' batch: the cache buffers are planned for one sequence


class LayerNorm4D(nn.Module):
    """The book's LayerNorm (population variance, eps 1e-5) in ops XNNPACK takes: the mean over the last axis as
    a mean over axes 2, 3 of a (1, T, E, 1) view (XNNPACK's global average pooling takes only that form)."""

    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        self.scale, self.shift, self.eps = norm.scale, norm.shift, norm.eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (1, T, E)
        b, t, e = x.shape
        x4 = x.view(b, t, e, 1)
        centred = x4 - x4.mean(dim=(2, 3), keepdim=True)
        var = (centred * centred).mean(dim=(2, 3), keepdim=True)
        return self.scale * (centred / torch.sqrt(var + self.eps)).view(b, t, e) + self.shift


def gelu(x: torch.Tensor) -> torch.Tensor:
    """The book's tanh GELU with x**3 as x * x * x (XNNPACK's pow takes only the power 2)."""
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * (x * x * x))))


class CachedBlock(nn.Module):
    """The book's TransformerBlock over a [1, H, C, D] cache per key/value, written at `positions`."""

    def __init__(self, block: nn.Module, cfg: GPTConfig) -> None:
        super().__init__()
        att, ff = block.att, block.ff.layers
        self.h, self.d, self.e, self.c = cfg.n_heads, cfg.head_dim, cfg.emb_dim, cfg.context_length
        self.W_query, self.W_key, self.W_value, self.out_proj = att.W_query, att.W_key, att.W_value, att.out_proj
        self.fc, self.proj = ff[0], ff[2]
        self.norm1, self.norm2 = LayerNorm4D(block.norm1), LayerNorm4D(block.norm2)
        shape = (PTE_BATCH, cfg.n_heads, cfg.context_length, cfg.head_dim)
        self.register_buffer("k_cache", torch.zeros(shape), persistent=False)
        self.register_buffer("v_cache", torch.zeros(shape), persistent=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape  # (1, T, E)
        a = self.norm1(x)
        q, k, v = (w(a).view(b, t, self.h, self.d).transpose(1, 2) for w in (self.W_query, self.W_key, self.W_value))
        self.k_cache.index_copy_(2, positions, k)  # (1, H, C, D): rows positions[0] .. positions[-1]
        self.v_cache.index_copy_(2, positions, v)
        keys = self.k_cache.view(self.h, self.c, self.d)  # batch 1: rank-3 bmm, which XNNPACK takes
        values = self.v_cache.view(self.h, self.c, self.d)
        scores = torch.bmm(q.reshape(self.h, t, self.d), keys.transpose(1, 2)) * (self.d ** -0.5) + mask  # (H, T, C)
        context = torch.bmm(torch.softmax(scores, dim=-1), values)  # (H, T, D)
        x = x + self.out_proj(context.transpose(0, 1).reshape(b, t, self.e))
        return x + self.proj(gelu(self.fc(self.norm2(x))))


class CachedGPT(nn.Module):
    """The eager GPTModel's weights (shared, not copied) with a cache per layer; eval only (no dropout)."""

    def __init__(self, model: GPTModel, cfg: GPTConfig) -> None:
        super().__init__()
        self.tok_emb, self.pos_emb, self.out_head = model.tok_emb, model.pos_emb, model.out_head
        self.final_norm = LayerNorm4D(model.final_norm)
        self.blocks = nn.ModuleList(CachedBlock(b, cfg) for b in model.trf_blocks)
        self.register_buffer("key_pos", torch.arange(cfg.context_length, dtype=torch.float32), persistent=False)

    def forward(self, input_ids: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        t = input_ids.shape[1]
        positions = input_pos + torch.arange(t, dtype=torch.int64)  # (T,)
        mask = causal_mask(self.key_pos, positions.to(torch.float32))  # (T, C)
        x = self.tok_emb(input_ids) + self.pos_emb(positions)  # (1, T, E)
        for block in self.blocks:
            x = block(x, positions, mask)
        last = x[:, -1:]  # (1, 1, E): only the last token reaches the head
        return self.out_head(self.final_norm(last)).view(1, -1)  # (1, V)


# What may stay outside the XNNPACK delegate (ExecuTorch's portable kernels): the embedding lookups, the cache
# writes (index_copy_ becomes index_put, made in place by run_reinplace_pass), the int64 position arithmetic, its
# cast to float, the last-token slice and shape bookkeeping. Anything else is refused at export: every matmul,
# norm, GELU and softmax runs in XNNPACK.
PORTABLE_OPS = {"embedding", "index_put", "arange", "add", "_to_dim_order_copy", "slice_copy", "view_copy",
                "sym_size"}


def _op_name(target: object) -> str:
    """'aten.index_put.default' from an edge op (whose str() also carries its schema) or a plain op overload."""
    text = str(target)
    return text.split(": ")[1].rstrip(">") if text.startswith("<EdgeOpOverload: ") else text


def pte_bytes(model: GPTModel, cfg: GPTConfig) -> bytes:
    """torch.export with dynamic T (1 .. context_length), lowered to XNNPACK, the cache as mutable buffers."""
    from torch.export import Dim

    def refuse(targets: list[Any]) -> None:
        compute = [o for o in sorted({_op_name(t) for t in targets}) if o.split(".")[1] not in PORTABLE_OPS]
        if compute:
            raise ExportError(f"{PTE_FORM}: XNNPACK did not take {len(compute)} op(s): {', '.join(compute)}")

    with quiet():
        from executorch.exir import ExecutorchBackendConfig
        from executorch.exir.passes import MemoryPlanningPass

    t = min(3, cfg.context_length)
    example = (torch.zeros(1, t, dtype=torch.int64), torch.zeros(1, dtype=torch.int64))
    dynamic = {"input_ids": {1: Dim("tokens", min=1, max=cfg.context_length)}, "input_pos": None}
    return lower(CachedGPT(model, cfg).eval(), example, dynamic,
                 {CONFIG_METHOD: cfg.to_json(), BOUNDS_METHOD: list(pte_bounds(cfg).values())}, refuse,
                 ExecutorchBackendConfig(memory_planning_pass=MemoryPlanningPass(alloc_graph_input=False),
                                         run_reinplace_pass=True))


def validate_pte(program: PteGPT, refs: References, golden: tuple[list[GoldenGeneration], dict[str, np.ndarray]],
                 tolerance: Tolerance) -> FormReport:
    """The export's references, row by row (batch 1 is the bound): prefills at every length, a shorter prefill and
    single steps, greedy tokens; then every golden generation (first-step logits and ids, sampled ones too)."""
    tally = Tally(PTE_FORM, tolerance)
    check, failures = tally.check, tally.failures

    for case in refs.cases:
        for r, row in enumerate(case.ids):
            n, split = len(row), case.split
            check(program.forward(row, 0), case.expected[r, -1], f"prefill T={n}")
            if split < n:
                program.forward(row[:split], 0)
                for t in range(split, n):
                    check(program.forward([row[t]], t), case.expected[r, t - split + 1], f"step at position {t}")
    shares = []
    for prompt, first, expected in zip(refs.prompts, refs.first, refs.greedy, strict=True):
        logits = program.forward(prompt, 0)
        check(logits, first, f"prefill T={len(prompt)}")
        ids = [int(np.argmax(logits))]
        for _ in range(greedy_new(program.config, refs.prompts) - 1):  # as many as the references have
            ids.append(int(np.argmax(program.forward([ids[-1]], len(prompt) + len(ids) - 1))))
        shares.append(agreement(ids, expected))
    share = float(np.mean(shares))
    if share < 1.0:
        failures.append(f"{PTE_FORM}: greedy tokens differ from eager PyTorch (agreement {share:.2f})")
    cases_golden, logits_golden = golden
    own, own_logits = form_generations(program.decoder, cases_golden, prefix=PTE_FORM)
    for case, got in zip(cases_golden, own, strict=True):
        check(own_logits[case.name], logits_golden[case.name], f"golden {case.name} first step")
        if got.ids != case.ids:
            failures.append(f"{PTE_FORM} golden {case.name}: ids {got.ids} differ from the golden {case.ids}")
    return FormReport(tally.cases, tally.worst, share, not failures, tuple(failures))


@dataclass(frozen=True)
class PteResult:
    data: bytes
    artifact: GPTArtifact
    failures: tuple[str, ...]


def build_pte(model: GPTModel, cfg: GPTConfig, refs: References,
              golden: tuple[list[GoldenGeneration], dict[str, np.ndarray]]) -> PteResult:
    """gpt.pte's bytes, judged by ExecuTorch's runtime against the eager references and the golden generations."""
    start = time.perf_counter()
    data = pte_bytes(model, cfg)
    seconds = time.perf_counter() - start
    bounds = pte_bounds(cfg)
    report = validate_pte(PteGPT(data, cfg, bounds), refs, golden, PTE.tolerance)
    artifact = GPTArtifact(kind=PTE.kind, dtype=PTE.dtype, tolerance=PTE.tolerance.to_dict(), cases=report.cases,
                           max_abs_error=report.max_abs_error, greedy_agreement=report.greedy_agreement,
                           passed=report.passed, export_seconds=round(seconds, 3), bounds=bounds)
    return PteResult(data, artifact, report.failures)
