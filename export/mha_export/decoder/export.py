"""The GPT folder's export: its steps in the one pipeline (pipeline/run.py): weights, decoder forms, tokenizer,
GenAI config, Hugging Face config (Optimum, transformers.js), validation, manifest.

The fp32 forms are judged against eager PyTorch's logits; the lossy forms (int8, int4) by their quality bar
(mha_export.decoder.lossy.build). With the default variants a lossy form that cannot meet its bar is left out with one
line (`ExportResult.notes`), as a missing extra is; asked for by name, it fails the export. The GGUF files (variant
gguf, on request) are judged by llama.cpp itself (mha_export.gguf.build), the quant types as the lossy forms."""
from __future__ import annotations

import dataclasses
import datetime as dt
import gc
import time
from collections.abc import Callable
from functools import partial
from importlib.metadata import version
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from mha_export.decoder.checkpoint import Origin, origin_for
from mha_export.decoder.eager import SEED, GPTModel, seeded_gpt
from mha_export.decoder.genai import genai_json
from mha_export.decoder.golden import form_generations, golden_generations, write_generations
from mha_export.decoder.graphs.table import GRAPHS
from mha_export.decoder.hf_files import write_hf_files
from mha_export.decoder.lossy.build import LossyOutcome, build_lossy, quality_windows
from mha_export.decoder.plan import GPTPlan, plan_gpt
from mha_export.decoder.tokenizer import TokenizerFiles, read_tokenizer
from mha_export.decoder.validate import References, references, validate_form
from mha_export.decoder.weights import read_gpt_weights
from mha_export.gguf.build import GGUFOutcome, build_ggufs
from mha_export.pipeline.progress import steps
from mha_export.pipeline.run import ExportResult, run_export
from mha_export.pipeline.seal import file_table, versions
from mha_runtime.artifact.errors import ConfigError, ValidationError
from mha_runtime.artifact.manifest import sha256_file
from mha_runtime.decoder.config import GPTConfig
from mha_runtime.decoder.contract import (
    CONCAT_FORM,
    GENAI_CONFIG,
    INPLACE_FORM,
    PTE_FORM,
    TOKENIZER_CONFIG,
    TOKENIZER_FILE,
    WEIGHTS_FILE,
    contract_dict,
)
from mha_runtime.decoder.decoder import decoder_for, make_session
from mha_runtime.decoder.forms import FORMS, GGUF_FORMS
from mha_runtime.decoder.manifest import GPTArtifact, GPTManifest
from mha_runtime.decoder.quality import QUALITY_FILE, Windows
from mha_runtime.gguf.llama_cpp import SOURCE


def load_gpt(cfg: GPTConfig, weights: Path | None) -> tuple[GPTModel, dict[str, torch.Tensor], dict[str, object]]:
    """The eager model, its state (book keys, no mask buffers) and the manifest's weights record."""
    model = seeded_gpt(cfg)
    if weights is None:
        record: dict[str, object] = {"source": f"torch.manual_seed({SEED})", "layout": "book-gpt", "tied": False}
    else:
        loaded = read_gpt_weights(weights, cfg)
        model.load_state_dict(loaded.state, strict=False)  # the masks stay the config's
        record = {"source": Path(weights).name, "sha256": sha256_file(Path(weights)), "layout": loaded.layout,
                  "tied": loaded.tied}
    state = {k: v.detach() for k, v in model.state_dict().items() if not k.endswith(".mask")}
    return model.eval(), state, record


class GPTExport:
    """The GPT folder's steps in the one pipeline. `variants` None or with 'all': the default set, where a lossy
    form that misses its bar is left out (named in `notes`); named variants must all be built and pass."""

    def __init__(self, name: str, *, config: GPTConfig, weights: Path | None, tokenizer: Path | None,
                 variants: tuple[str, ...] | None, origin: Origin | None = None) -> None:
        self.name, self.config, self.weights_path, self.tokenizer_path = name, config, weights, tokenizer
        self.origin_given = origin  # the eos ids, bos and HF fields; None: read in check() from beside the weights
        self.variants = variants
        self.notes: tuple[str, ...] = ()
        self.failures: list[str] = []

    def check(self) -> None:
        self.plan: GPTPlan = plan_gpt(self.config, self.variants)
        self.notes = self.plan.notes
        self.origin: Origin = self.origin_given or origin_for(self.config, self.weights_path, None)
        self.tok: TokenizerFiles | None = None
        if self.tokenizer_path is not None:
            self.tok = read_tokenizer(self.tokenizer_path, vocab_size=self.config.vocab_size,
                                      context_length=self.config.context_length)

    def load(self) -> None:
        """The weights, the references every form is judged against, the golden generations and gpt.pte (from the
        eager model, judged by executorch.runtime); the eager model is not kept."""
        config = self.config
        model, self.state, self.record = load_gpt(config, self.weights_path)
        self.tied = bool(self.record["tied"])
        self.encode = None if self.tok is None else _encoder(self.tok.tokenizer_json)
        self.refs = references(model, config) if self.plan.files or self.plan.pte else None  # gguf alone: none
        self.golden = golden_generations(model, config, self.encode)
        _check_finite(self.refs, self.golden[1])
        self.pte = None
        if self.plan.pte:
            from mha_export.executorch.decoder import build_pte

            self.pte = build_pte(model, config, self.refs, self.golden)
        del model

    def build(self, stage: Path, *, progress: bool, label: str) -> None:
        config, tied, state = self.config, self.tied, self.state
        weights_state = {k: v.contiguous() for k, v in state.items() if not (tied and k == "out_head.weight")}
        save_file(weights_state, str(stage / WEIGHTS_FILE), metadata={"tied": str(tied).lower()})
        del weights_state
        self.seconds: dict[str, float] = {}
        self.lossy: dict[str, LossyOutcome] = {}
        notes = list(self.notes)
        windows = quality_windows(config, self.encode) if any(FORMS[f].lossy for f in self.plan.files) else None
        for file in steps(list(self.plan.files), label=label, unit="form", enabled=progress):
            begin = time.perf_counter()
            if FORMS[file].lossy:  # after gpt.inplace.onnx (registry order): measured against it
                assert windows is not None
                outcome = _build_lossy(file, stage, state, config, tied=tied, windows=windows)
                if outcome.ok:
                    self.lossy[file] = outcome
                else:
                    (stage / file).unlink()
                    (notes if self.plan.lenient else self.failures).append(outcome.miss_line())
            else:  # the graph checked without its weights' bytes (onnx_file/check.py), then streamed to the file
                built = GRAPHS[file](state, config, tied=tied)
                built.check()
                built.save(stage / file)
                del built
                gc.collect()
            self.seconds[file] = time.perf_counter() - begin
        self.gguf = self._build_ggufs(stage, windows, notes) if self.plan.gguf else None
        self.notes = tuple(notes)
        self.files = [f for f in self.plan.files if not FORMS[f].lossy or f in self.lossy]
        self.state = {}  # validation runs on the files alone: free the weights first
        gc.collect()
        if self.tok is not None:
            (stage / TOKENIZER_FILE).write_bytes(self.tok.tokenizer_json)
            (stage / TOKENIZER_CONFIG).write_bytes(self.tok.config_json)
        write_generations(stage, *self.golden, config, FORMS[INPLACE_FORM].tolerance)
        if windows is not None and self.lossy:
            (stage / QUALITY_FILE).write_bytes(windows.to_json())
        origin = self.origin
        if CONCAT_FORM in self.files and origin.eos_ids:  # GenAI takes 0 for an unset eos: none without one
            (stage / GENAI_CONFIG).write_bytes(genai_json(config, origin.eos_ids, origin.bos_id))
        if CONCAT_FORM in self.files:  # Optimum's and transformers.js' view of gpt.onnx
            note = write_hf_files(stage, config, origin=origin, tied=tied)
            self.notes += () if note is None else (note,)
        if self.pte is not None:
            (stage / PTE_FORM).write_bytes(self.pte.data)

    def _build_ggufs(self, stage: Path, windows: Windows | None, notes: list[str]) -> GGUFOutcome:
        """gpt.gguf and the quant types of the lossy forms built, written from the state and run by llama.cpp
        (mha_export.gguf.build); a quant type that misses its bar is left out with a note ('all') or fails
        the export (named), as the lossy ONNX forms."""
        outcome = build_ggufs(stage, self.state, self.config, tied=self.tied, name=self.name,
                              tokenizer_json=None if self.tok is None else self.tok.tokenizer_json,
                              lossy=list(self.lossy), cases=self.golden[0], eager=self.golden[1], windows=windows,
                              eos_ids=self.origin.eos_ids, bos_id=self.origin.bos_id)
        notes += outcome.notes
        (notes if self.plan.lenient else self.failures).extend(outcome.misses)
        return outcome

    def _record_ggufs(self, stage: Path, outcome: GGUFOutcome) -> None:
        """What llama.cpp made of the GGUF files; a quant type's own generations written beside eager's."""
        self.failures += outcome.failures
        for file, artifact in outcome.artifacts.items():
            if file in outcome.own:
                generations = write_generations(stage, *outcome.own[file], self.config, GGUF_FORMS[file].tolerance,
                                                form=file)
                artifact = dataclasses.replace(artifact, generations=generations)
            self.artifacts[file] = artifact

    def validate(self, stage: Path, *, progress: bool, label: str) -> None:
        config = self.config
        self.artifacts: dict[str, GPTArtifact] = {}
        for file in steps(self.files, label=label, unit="form", enabled=progress):
            form = FORMS[file]
            # From the path: ONNX Runtime reads the file itself (from bytes, a second copy of the weights
            # would be held while it parses them).
            session = make_session(str(stage / file), where=str(stage / file))
            report = validate_form(session, form, self.refs, config, tolerance=form.tolerance)
            self.failures += report.failures
            extra: dict[str, object] = {}
            if file in self.lossy:  # its own golden generations, and how it was made and measured
                own = form_generations(partial(decoder_for, form.kind, session, config, file), self.golden[0],
                                       prefix=form.dtype)
                generations = write_generations(stage, *own, config, form.tolerance, form=file)
                outcome = self.lossy[file]
                extra = {"quality": outcome.quality.to_dict() | {"bar_mean_kl": form.max_mean_kl},
                         "quantization": outcome.plan.to_dict() | {"tries": outcome.tries},
                         "generations": generations}
            self.artifacts[file] = GPTArtifact(
                kind=form.kind, dtype=form.dtype, tolerance=form.tolerance.to_dict(), cases=report.cases,
                max_abs_error=report.max_abs_error, greedy_agreement=report.greedy_agreement,
                passed=report.passed, export_seconds=round(self.seconds[file], 3), **extra)  # type: ignore[arg-type]
            del session
            gc.collect()
        if self.gguf is not None:  # run by llama.cpp itself in the build step
            self._record_ggufs(stage, self.gguf)
        if self.pte is not None:
            self.artifacts[PTE_FORM] = self.pte.artifact
            self.failures += self.pte.failures
        if self.failures:
            raise _failed(self.failures)

    def seal(self, stage: Path) -> GPTManifest:
        config, tok = self.config, self.tok
        return GPTManifest(
            name=self.name, created=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), config=config,
            contract=contract_dict(config, executorch=self.pte is not None),
            versions=versions() | ({} if self.pte is None else {"executorch": version("executorch")})
            | ({} if self.gguf is None else {"gguf": version("gguf"), "llama.cpp": SOURCE}),
            weights=self.record | {"parameters": config.parameters(tied=self.tied)},
            tokenizer=None if tok is None else {"file": TOKENIZER_FILE, "vocab_size": tok.vocab_size,
                                                "built_from": tok.source},
            eos_id=self.origin.eos_id, eos_ids=list(self.origin.eos_ids), artifacts=self.artifacts,
            files=file_table(stage))


def export_gpt(name: str, out_root: Path, *, config: GPTConfig, weights: Path | None = None,
               tokenizer: Path | None = None, variants: tuple[str, ...] | None = None,
               progress: bool = False, announce: Callable[[], None] | None = None,
               origin: Origin | None = None) -> ExportResult:
    """Export a GPT folder through the one pipeline (refusals first, staged, placed when valid). `announce` is
    called once every input is checked (the weights read): the work starts. `origin`: what a Hugging Face
    checkpoint says beside its weights (eos ids, generation defaults); None: GPT-2's eos, as always."""
    kind = GPTExport(name, config=config, weights=weights, tokenizer=tokenizer, variants=variants, origin=origin)
    return run_export(name, out_root, kind, progress=progress, announce=announce)


def _failed(failures: list[str]) -> ValidationError:
    """The error of failed forms: one failure is one line (a named lossy form's miss: the figure and the bar), not a
    count and then that line; several keep the count and a line each."""
    error = ValidationError(failures)
    if len(failures) == 1:
        error.args = (f"validation failed: {failures[0]}",)
    return error


def _check_finite(refs: References | None, golden: dict[str, np.ndarray]) -> None:
    """Refuse weights whose eager logits are NaN or inf: finite values that overflow float32 in the forward pass.
    Every form would then fail validation against them, one line per case, after all of the work."""
    arrays = [*golden.values(), *([] if refs is None else [refs.first, *(case.expected for case in refs.cases)])]
    if not all(np.isfinite(a).all() for a in arrays):
        raise ConfigError("weights: eager PyTorch's logits are NaN or inf with these weights (their values overflow "
                          "float32 in the forward pass); no exported form could be checked against them")


def _build_lossy(file: str, stage: Path, state: dict[str, torch.Tensor], config: GPTConfig, *, tied: bool,
                 windows: Windows) -> LossyOutcome:
    """The lossy form `file`, measured against the staged gpt.inplace.onnx."""
    reference = make_session(str(stage / INPLACE_FORM), where=str(stage / INPLACE_FORM))
    return build_lossy(FORMS[file], state, config, stage / file, tied=tied,
                       reference=lambda: decoder_for("inplace", reference, config, INPLACE_FORM), windows=windows)


def _encoder(tokenizer_json: bytes) -> Callable[[str], list[int]]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(tokenizer_json.decode("utf-8"))
    return lambda text: list(tok.encode(text, add_special_tokens=False).ids)

