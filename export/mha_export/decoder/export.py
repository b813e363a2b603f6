"""The decoder folder's export: its steps in the one pipeline (mha_export.pipeline.run), each a function of the step
before it, a module each under mha_export.decoder.steps:

    plan      every refusal before any work; the forms, gpt.pte and GGUF files to build   -> steps.plan.Plan
    load      the weights, eager PyTorch's references and golden generations, gpt.pte     -> steps.load.Loaded
    build     the builder table (steps.files.FILES): weights, exact and lossy forms, GGUF,
              tokenizer, golden, quality windows, drop-in files, gpt.pte                   -> steps.files.Built
    validate  every file judged; the failures raised together                              -> steps.validate.Validated
    seal      the manifest, every file hashed                                              -> pipeline.run.Sealed

The fp32 forms are judged against eager PyTorch's logits; the lossy forms (int8, int4) by their quality bar
(mha_export.decoder.lossy.build). With the default variants a lossy form that cannot meet its bar is left out with one
line (`ExportResult.notes`), as a missing extra is; asked for by name, it fails the export. The GGUF files (variant
gguf, on request) are judged by llama.cpp itself (mha_export.gguf.build), the quant types as the lossy forms."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mha_export.decoder.archs.protocol import DecoderConfig
from mha_export.decoder.checkpoint import Origin
from mha_export.decoder.steps import plan as plan_step
from mha_export.decoder.steps.files import build
from mha_export.decoder.steps.load import load, load_gpt
from mha_export.decoder.steps.seal import seal
from mha_export.decoder.steps.validate import validate
from mha_export.pipeline.run import ExportResult, run_export

__all__ = ["GPTExport", "export_gpt", "load_gpt"]


@dataclass(frozen=True)
class GPTExport:
    """The decoder folder's steps in the one pipeline, over one request. `variants` None or with 'all': the default
    set, where a lossy form that misses its bar is left out (named in the notes); named variants must all be built
    and pass. `origin`: the eos ids, bos and Hugging Face fields; None: read from beside the weights."""

    name: str
    config: DecoderConfig
    weights: Path | None
    tokenizer: Path | None
    variants: tuple[str, ...] | None
    origin: Origin | None = None

    def plan(self) -> plan_step.Plan:
        return plan_step.plan(self.name, config=self.config, weights=self.weights, tokenizer=self.tokenizer,
                              variants=self.variants, origin=self.origin)

    load = staticmethod(load)
    build = staticmethod(build)
    validate = staticmethod(validate)
    seal = staticmethod(seal)


def export_gpt(name: str, out_root: Path, *, config: DecoderConfig, weights: Path | None = None,
               tokenizer: Path | None = None, variants: tuple[str, ...] | None = None,
               progress: bool = False, announce: Callable[[], None] | None = None,
               origin: Origin | None = None) -> ExportResult:
    """Export a GPT folder through the one pipeline (refusals first, staged, placed when valid). `announce` is
    called once every input is checked (the weights read): the work starts. `origin`: what a Hugging Face
    checkpoint says beside its weights (eos ids, generation defaults); None: the architecture's default eos."""
    kind = GPTExport(name, config, weights, tokenizer, variants, origin)
    return run_export(name, out_root, kind, progress=progress, announce=announce)
