"""The decoder export's build step and its builder table: the weights, one row per form (exact graphs, then the lossy
forms, measured against the staged gpt.inplace.onnx), the GGUF files, the tokenizer's files, the golden generations,
the quality windows, the drop-in files (genai_config.json; config.json and generation_config.json for Optimum and
transformers.js) and gpt.pte.

A lossy form or a GGUF quant type that cannot meet its bar is left out with a note (the default set) or is a
failure (named in --variants), raised after validation with every other failure."""
from __future__ import annotations

import gc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType

from mha_export.decoder.genai import genai_json
from mha_export.decoder.golden import write_generations
from mha_export.decoder.graphs.shared import HEAD_KEY
from mha_export.decoder.graphs.table import GRAPHS
from mha_export.decoder.hf_files import write_hf_files
from mha_export.decoder.lossy.build import LossyOutcome, build_lossy, quality_windows
from mha_export.decoder.plan import folder_form
from mha_export.decoder.steps.load import Eager, Loaded
from mha_export.decoder.steps.plan import Plan
from mha_export.gguf.build import GGUFOutcome, build_ggufs
from mha_export.gguf.write import tokenizer_source
from mha_export.pipeline.builders import FileRow, always, write_files, write_weights
from mha_export.pipeline.run import Stage
from mha_runtime.decoder.contract import (
    CONCAT_FORM,
    GENAI_CONFIG,
    HF_CONFIG,
    INPLACE_FORM,
    PTE_FORM,
    TOKENIZER_CONFIG,
    TOKENIZER_FILE,
    WEIGHTS_FILE,
)
from mha_runtime.decoder.decoder import decoder_for, make_session
from mha_runtime.decoder.forms import FORMS
from mha_runtime.decoder.golden import GENERATIONS_FILE
from mha_runtime.decoder.quality import QUALITY_FILE, Windows


@dataclass(frozen=True)
class Built:
    """The staged files and what building them came to: the ONNX forms written and kept (registry order), each
    lossy form's plan and quality, what llama.cpp made of the GGUF files, the notes, the failures found so far
    (a named lossy form's miss), and each form's build time. No weights: validation runs on the files alone."""

    plan: Plan
    eager: Eager
    windows: Windows | None  # the quality windows, where a lossy form is planned
    files: tuple[str, ...] = ()
    lossy: Mapping[str, LossyOutcome] = field(default_factory=lambda: MappingProxyType({}))
    gguf: GGUFOutcome | None = None
    notes: tuple[str, ...] = ()
    failures: tuple[str, ...] = ()
    seconds: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))


def _weights(loaded: Loaded, built: Built, folder: Path) -> Built:
    """gpt.safetensors: the state, a tied head stored once (as the embedding)."""
    tied = loaded.eager.tied
    write_weights(folder / WEIGHTS_FILE, {k: v for k, v in loaded.state.items()
                                          if not (tied and k == HEAD_KEY)},
                  metadata={"tied": str(tied).lower()})
    return built


def _exact(file: str) -> FileRow[Loaded, Built]:
    """An fp32 form's row: the graph checked without its weights' bytes (onnx_file/check.py), then streamed to the
    file."""
    def write(loaded: Loaded, built: Built, folder: Path) -> Built:
        graph = GRAPHS[file](loaded.state, loaded.plan.config, tied=loaded.eager.tied)
        graph.check()
        graph.save(folder / file)
        del graph
        gc.collect()
        return replace(built, files=(*built.files, file))

    return FileRow(file, lambda loaded: file in loaded.plan.forms.files, write)


def _lossy(file: str) -> FileRow[Loaded, Built]:
    """A lossy form's row, after gpt.inplace.onnx's (registry order): measured against it, kept when it meets its
    bar, else deleted and named (a note in the default set, a failure when asked for by name)."""
    def write(loaded: Loaded, built: Built, folder: Path) -> Built:
        config = loaded.plan.config
        assert built.windows is not None
        reference = make_session(str(folder / INPLACE_FORM), where=str(folder / INPLACE_FORM))
        outcome = build_lossy(folder_form(file, config), loaded.state, config, folder / file, tied=loaded.eager.tied,
                              reference=lambda: decoder_for("inplace", reference, config, INPLACE_FORM),
                              windows=built.windows)
        if outcome.ok:
            return replace(built, files=(*built.files, file), lossy=MappingProxyType({**built.lossy, file: outcome}))
        (folder / file).unlink()
        return _missed(built, [outcome.miss_line()], lenient=loaded.plan.forms.lenient)

    return FileRow(file, lambda loaded: file in loaded.plan.forms.files, write)


def _ggufs(loaded: Loaded, built: Built, folder: Path) -> Built:
    """gpt.gguf and the quant types of the lossy forms kept, written from the state and run by llama.cpp
    (mha_export.gguf.build); a quant type that misses its bar is left out with a note ('all') or fails the export
    (named), as the lossy ONNX forms."""
    plan, eager = loaded.plan, loaded.eager
    cases, logits = eager.golden
    outcome = build_ggufs(folder, loaded.state, plan.config, tied=eager.tied, name=plan.name,
                          tokenizer_json=None if plan.tokenizer is None else plan.tokenizer.tokenizer_json,
                          lossy=list(built.lossy), cases=cases, eager=logits, windows=built.windows,
                          eos_ids=plan.origin.eos_ids, bos_id=plan.origin.bos_id,
                          tokenizer_config=None if plan.tokenizer is None else plan.tokenizer.config_json,
                          tokenizer_gguf=tokenizer_source(plan.weights, plan.tokenizer))
    built = replace(built, gguf=outcome, notes=(*built.notes, *outcome.notes))
    return _missed(built, outcome.misses, lenient=plan.forms.lenient)


def _missed(built: Built, lines: Sequence[str], *, lenient: bool) -> Built:
    """Forms that missed their bar with every plan (deleted): notes in the default set, failures when named."""
    if lenient:
        return replace(built, notes=(*built.notes, *lines))
    return replace(built, failures=(*built.failures, *lines))


def _tokenizer(loaded: Loaded, built: Built, folder: Path) -> Built:
    assert loaded.plan.tokenizer is not None
    (folder / TOKENIZER_FILE).write_bytes(loaded.plan.tokenizer.tokenizer_json)
    (folder / TOKENIZER_CONFIG).write_bytes(loaded.plan.tokenizer.config_json)
    return built


def _golden(loaded: Loaded, built: Built, folder: Path) -> Built:
    """Eager PyTorch's golden generations, judged at the fastest fp32 form's row."""
    write_generations(folder, *loaded.eager.golden, loaded.plan.config, FORMS[INPLACE_FORM].tolerance)
    return built


def _quality(loaded: Loaded, built: Built, folder: Path) -> Built:
    """The windows the lossy forms kept were measured over (none kept: no file)."""
    if built.windows is not None and built.lossy:
        (folder / QUALITY_FILE).write_bytes(built.windows.to_json())
    return built


def _genai(loaded: Loaded, built: Built, folder: Path) -> Built:
    origin = loaded.plan.origin
    (folder / GENAI_CONFIG).write_bytes(genai_json(loaded.plan.config, origin.eos_ids, origin.bos_id))
    return built


def _hf(loaded: Loaded, built: Built, folder: Path) -> Built:
    """Optimum's and transformers.js' view of gpt.onnx."""
    note = write_hf_files(folder, loaded.plan.config, origin=loaded.plan.origin, tied=loaded.eager.tied)
    return built if note is None else replace(built, notes=(*built.notes, note))


def _pte(loaded: Loaded, built: Built, folder: Path) -> Built:
    """gpt.pte's bytes, made and judged in the load step (from the eager model)."""
    assert loaded.eager.pte is not None
    (folder / PTE_FORM).write_bytes(loaded.eager.pte.data)
    return built


def _concat(loaded: Loaded) -> bool:
    return CONCAT_FORM in loaded.plan.forms.files


def _lossy_planned(plan: Plan) -> bool:
    return any(FORMS[f].lossy for f in plan.forms.files)


# The decoder's builder table, in build order. The forms in registry order (the lossy ones last: they read the
# staged gpt.inplace.onnx), then the GGUF files (beside the lossy forms kept), while the state is held; the rest
# read the plan and eager PyTorch's values. GenAI takes 0 for an unset eos: no genai_config.json without one.
FILES: tuple[FileRow[Loaded, Built], ...] = (
    FileRow(WEIGHTS_FILE, always, _weights),
    *((_lossy if form.lossy else _exact)(file) for file, form in FORMS.items()),
    FileRow("GGUF files", lambda loaded: loaded.plan.forms.gguf, _ggufs),
    FileRow(TOKENIZER_FILE, lambda loaded: loaded.plan.tokenizer is not None, _tokenizer),
    FileRow(GENERATIONS_FILE, always, _golden),
    FileRow(QUALITY_FILE, lambda loaded: _lossy_planned(loaded.plan), _quality),
    FileRow(GENAI_CONFIG, lambda loaded: _concat(loaded) and bool(loaded.plan.origin.eos_ids), _genai),
    FileRow(HF_CONFIG, _concat, _hf),
    FileRow(PTE_FORM, lambda loaded: loaded.plan.forms.pte, _pte),
)
if unbuilt := [f for f, form in FORMS.items() if not form.lossy and f not in GRAPHS]:
    raise ImportError(f"mha_export.decoder.steps.files: the fp32 forms {unbuilt} have no graph builder (GRAPHS)")


def build(loaded: Loaded, stage: Stage) -> Built:
    """Every row of the table this export wants, in order; the forms' build times kept for the manifest."""
    plan = loaded.plan
    windows = quality_windows(plan.config, loaded.eager.encode) if _lossy_planned(plan) else None
    written = write_files(FILES, loaded, Built(plan, loaded.eager, windows, notes=plan.forms.notes), stage)
    return replace(written.made, seconds=written.seconds)
