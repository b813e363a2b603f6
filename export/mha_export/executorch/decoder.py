"""gpt.pte: the decoder as an ExecuTorch program (XNNPACK delegate) with its key/value cache inside the program.

The module lowered is the architecture's own cached form (its `pte_module`: GPT-2's is archs/gpt2.model.CachedGPT):
one registered buffer per layer for keys and one for values, [1, K, C, D] (batch 1, C = context_length), written in
place by `index_copy_` as ExecuTorch's own LLM export does (examples/models/llama KVCache with
enable_dynamic_shape): torch.export records them as mutated buffers, ExecuTorch plans them once in the program's
memory and they persist between calls of the loaded `forward`. Why mutable buffers and not an
explicit cache in/out: through `executorch.runtime` every input and output crosses the Python binding as a
tensor (an explicit cache would carry 2 * n_layers * [1, H, C, D] into and out of every step: 75 MB each way
for GPT_CONFIG_124M), and the program would then own nothing about the cache layout; mutable buffers keep the step's
I/O at input_ids, input_pos and the logits.

forward(input_ids [1, T] int64, input_pos [1] int64) -> logits [1, V] of the last token, writing the T new
keys/values at positions input_pos .. input_pos + T - 1. T is dynamic (1 .. max_prefill_tokens = C), so one
call prefills a whole prompt; every query attends over the whole cache with an additive mask built from the
positions: a new generation is just a call at input_pos 0. The matmuls, norms and softmax run in XNNPACK; the
embedding lookups, the cache writes and the position arithmetic in ExecuTorch's portable kernels.

Bounds (batch 1, input_pos + T <= C) are recorded in the program (constant methods) and in the manifest; the
runner (mha_export.infer.decoder_pte_runner) refuses anything beyond them before the runtime sees it: the portable
index_copy would fail or write out of the planned buffer.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from mha_export.decoder.archs import arch_of
from mha_export.decoder.archs.protocol import DecoderConfig
from mha_export.decoder.eager import Eager
from mha_export.decoder.golden import form_generations
from mha_export.decoder.validate import FormReport, References, Tally, agreement, greedy_new
from mha_export.executorch.lower import lower
from mha_export.infer.decoder_pte_runner import BOUNDS_METHOD, CONFIG_METHOD, PteGPT
from mha_export.infer.pte_runner import quiet
from mha_runtime.artifact.errors import ExportError
from mha_runtime.artifact.tolerance import Tolerance
from mha_runtime.decoder.contract import PTE_FORM, pte_bounds
from mha_runtime.decoder.forms import PTE
from mha_runtime.decoder.golden import GoldenGeneration
from mha_runtime.decoder.manifest import GPTArtifact
from mha_runtime.decoder.shapes import DecoderShapes

# What may stay outside the XNNPACK delegate (ExecuTorch's portable kernels): the embedding lookups, the cache
# writes (index_copy_ becomes index_put, made in place by run_reinplace_pass), the int64 position arithmetic, its
# cast to float, the last-token slice and shape bookkeeping. Anything else is refused at export: every matmul,
# norm, GELU and softmax runs in XNNPACK.
PORTABLE_OPS = {"embedding", "index_put", "arange", "add", "_to_dim_order_copy", "slice_copy", "view_copy",
                "sym_size"}


def _op_name(target: object) -> str:
    """'aten.index_put.default' from an edge op (whose str() also carries its schema) or a plain op overload;
    'operator.mul' from Python's arithmetic on symbolic sizes (a grouped-query view's G * T rows)."""
    if getattr(target, "__module__", None) == "_operator":
        return f"operator.{getattr(target, '__name__', target)}"
    text = str(target)
    return text.split(": ")[1].rstrip(">") if text.startswith("<EdgeOpOverload: ") else text


def pte_bytes(model: Eager, cfg: DecoderConfig) -> bytes:
    """torch.export with dynamic T (1 .. context_length), lowered to XNNPACK, the cache as mutable buffers."""
    from torch.export import Dim

    def refuse(targets: list[Any]) -> None:
        compute = [o for o in sorted({_op_name(t) for t in targets})
                   if not o.startswith("operator.") and o.split(".")[1] not in PORTABLE_OPS]  # sizes: bookkeeping
        if compute:
            raise ExportError(f"{PTE_FORM}: XNNPACK did not take {len(compute)} op(s): {', '.join(compute)}")

    with quiet():
        from executorch.exir import ExecutorchBackendConfig
        from executorch.exir.passes import MemoryPlanningPass

    t = min(3, cfg.context_length)
    example = (torch.zeros(1, t, dtype=torch.int64), torch.zeros(1, dtype=torch.int64))
    dynamic = {"input_ids": {1: Dim("tokens", min=1, max=cfg.context_length)}, "input_pos": None}
    return lower(arch_of(cfg).pte_module(model, cfg).eval(), example, dynamic,
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
        for _ in range(greedy_new(program.shapes, refs.prompts) - 1):  # as many as the references have
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


def build_pte(model: Eager, cfg: DecoderConfig, refs: References,
              golden: tuple[list[GoldenGeneration], dict[str, np.ndarray]]) -> PteResult:
    """gpt.pte's bytes, judged by ExecuTorch's runtime against the eager references and the golden generations."""
    start = time.perf_counter()
    data = pte_bytes(model, cfg)
    seconds = time.perf_counter() - start
    bounds = pte_bounds(cfg)
    report = validate_pte(PteGPT(data, cfg.to_dict(), DecoderShapes.of(cfg), bounds), refs, golden, PTE.tolerance)
    artifact = GPTArtifact(kind=PTE.kind, dtype=PTE.dtype, tolerance=PTE.tolerance.to_dict(), cases=report.cases,
                           max_abs_error=report.max_abs_error, greedy_agreement=report.greedy_agreement,
                           passed=report.passed, export_seconds=round(seconds, 3), bounds=bounds)
    return PteResult(data, artifact, report.failures)
