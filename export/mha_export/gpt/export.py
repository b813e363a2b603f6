"""One GPT folder end to end: weights, decoder forms, tokenizer, GenAI config, validation, manifest; staged, then
moved into place (nothing under out/NAME changes unless everything was written and validated)."""
from __future__ import annotations

import datetime as dt
import gc
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import onnx
import onnxruntime
import torch
from safetensors.torch import save_file

from mha_export.gpt.concat import concat_model
from mha_export.gpt.eager import SEED, GPTModel, seeded_gpt
from mha_export.gpt.genai import genai_json
from mha_export.gpt.golden import golden_generations, write_generations
from mha_export.gpt.graph import Built
from mha_export.gpt.inplace import inplace_model
from mha_export.gpt.quantize import int8_source, quantize_to
from mha_export.gpt.tokenizer import TokenizerFiles, read_tokenizer
from mha_export.gpt.validate import references, validate_form
from mha_export.gpt.weights import read_gpt_weights
from mha_export.pipeline.budget import available_memory, gib
from mha_export.pipeline.export import check_folder_name
from mha_export.pipeline.progress import steps
from mha_export.pipeline.seal import file_table
from mha_runtime.artifact.atomic import staged_folder
from mha_runtime.artifact.errors import ConfigError, ExportError, ValidationError
from mha_runtime.artifact.manifest import MANIFEST_NAME, sha256_file
from mha_runtime.gpt.config import GPT2_EOS_ID, GPTConfig
from mha_runtime.gpt.contract import (
    CONCAT_FORM,
    FORMS,
    GENAI_CONFIG,
    GPT_VARIANTS,
    INPLACE_FORM,
    INT8_FORM,
    PTE_FORM,
    PTE_VARIANT,
    TOKENIZER_CONFIG,
    TOKENIZER_FILE,
    WEIGHTS_FILE,
    contract_dict,
)
from mha_runtime.gpt.decoder import make_session
from mha_runtime.gpt.manifest import GPTArtifact, GPTManifest

PROTOBUF_LIMIT = 2 << 30
# Building and validating holds the eager model, one graph being written and one session: about 4x the fp32
# parameters at most (measured in docs/gpt.md); refused before any work when memory is short of that.
MEMORY_FACTOR = 4


def parse_gpt_variants(text: str | None) -> tuple[str, ...]:
    """'all' (default) or comma-separated names of GPT_VARIANTS and 'pte' (gpt.pte, on request only: not in
    'all'); int8 needs inplace (it quantizes that graph)."""
    if text is None or text == "all":
        return tuple(GPT_VARIANTS)
    names = [n.strip() for n in text.split(",") if n.strip()]
    known = [*GPT_VARIANTS, PTE_VARIANT]
    bad = [n for n in names if n not in known]
    if bad or not names:
        raise ConfigError(f"--variants: expected 'all' or some of {', '.join(known)}, got {text!r}")
    return tuple(n for n in known if n in names)


def check_gpt_budget(cfg: GPTConfig, *, available: int | None = None) -> None:
    """Refuse, before any work, a model whose fp32 file exceeds protobuf's 2 GiB or whose export needs more
    memory than is available."""
    params = cfg.parameters(tied=False) * 4
    if params >= PROTOBUF_LIMIT:
        raise ConfigError(f"gpt config: {gib(params)} of fp32 parameters; an ONNX file holds at most "
                          f"{gib(PROTOBUF_LIMIT)}")
    available = available_memory() if available is None else available
    if available is not None and MEMORY_FACTOR * params > available:
        raise ConfigError(f"gpt config: exporting needs about {gib(MEMORY_FACTOR * params)} of memory, "
                          f"{gib(available)} is available")
    if cfg.head_dim % 8:
        raise ConfigError(f"gpt config: head size {cfg.head_dim} (emb_dim / n_heads); the in-place form's "
                          "GroupQueryAttention needs a multiple of 8")


@dataclass(frozen=True)
class GPTExportResult:
    name: str
    folder: Path
    manifest: GPTManifest
    seconds: float


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


def _save(build: Callable[[], Built], path: Path) -> None:
    """Build, check the graph (not re-reading the weights: check.py), then stream it to the file (the weights are
    never copied into a ModelProto)."""
    built = build()
    built.check()
    built.save(path)
    del built
    gc.collect()


def _build(file: str, path: Path, state: dict[str, torch.Tensor], config: GPTConfig, *, tied: bool) -> None:
    if file == CONCAT_FORM:
        _save(lambda: concat_model(state, config, tied=tied), path)
    elif file == INPLACE_FORM:
        _save(lambda: inplace_model(state, config, tied=tied), path)
    else:
        raise AssertionError(file)


def export_gpt(name: str, out_root: Path, *, config: GPTConfig, weights: Path | None = None,
               tokenizer: Path | None = None, variants: tuple[str, ...] = tuple(GPT_VARIANTS),
               progress: bool = False) -> GPTExportResult:
    start = time.perf_counter()
    check_folder_name(name)
    check_gpt_budget(config)
    chosen = {GPT_VARIANTS[v] for v in variants if v != PTE_VARIANT}
    files = [f for f in FORMS if f in chosen]  # registry order: int8 last (it frees the torch weights)
    want_pte = PTE_VARIANT in variants
    if not files and not want_pte:
        raise ExportError("--variants: nothing to build")
    if INT8_FORM in files and INPLACE_FORM not in files:
        raise ConfigError("--variants: int8 quantizes the in-place graph; add inplace")
    tok: TokenizerFiles | None = None
    if tokenizer is not None:
        tok = read_tokenizer(tokenizer, vocab_size=config.vocab_size, context_length=config.context_length)
    model, state, record = load_gpt(config, weights)
    tied = bool(record["tied"])
    eos = GPT2_EOS_ID if config.vocab_size > GPT2_EOS_ID else None
    refs = references(model, config)  # every form is judged against these; the eager model is not needed after
    golden = golden_generations(model, config, None if tok is None else _encoder(tok.tokenizer_json))
    pte = None
    if want_pte:  # from the eager model, judged by executorch.runtime; written into the stage below
        from mha_export.gpt.pte import build_pte

        pte = build_pte(model, config, refs, golden)
    del model
    with staged_folder(Path(out_root) / name) as stage:
        weights_state = {k: v.contiguous() for k, v in state.items() if not (tied and k == "out_head.weight")}
        save_file(weights_state, str(stage / WEIGHTS_FILE), metadata={"tied": str(tied).lower()})
        seconds: dict[str, float] = {}
        for file in steps(files, label=f"building {name}", unit="form", enabled=progress):
            begin = time.perf_counter()
            if file == INT8_FORM:  # last in registry order: the torch weights are freed once its source is built
                source = int8_source(state, config, tied=tied)
                del state, weights_state
                gc.collect()
                quantize_to(source, stage / file)
                del source
            else:
                _build(file, stage / file, state, config, tied=tied)
            seconds[file] = time.perf_counter() - begin
        state = weights_state = None  # validation runs on the files alone: free the weights first
        gc.collect()
        if tok is not None:
            (stage / TOKENIZER_FILE).write_bytes(tok.tokenizer_json)
            (stage / TOKENIZER_CONFIG).write_bytes(tok.config_json)
        write_generations(stage, *golden, config, FORMS[INPLACE_FORM].tolerance)
        if CONCAT_FORM in files and eos is not None:
            (stage / GENAI_CONFIG).write_bytes(genai_json(config, eos))
        artifacts, failures = {}, []
        if pte is not None:
            (stage / PTE_FORM).write_bytes(pte.data)
        for file in steps(files, label=f"validating {name}", unit="form", enabled=progress):
            form = FORMS[file]
            # From the path: ONNX Runtime reads the file itself (from bytes, a second copy of the weights
            # would be held while it parses them).
            session = make_session(str(stage / file), where=str(stage / file))
            tolerance = form.tolerance_for(refs.logit_rms())
            report = validate_form(session, form, refs, config, tolerance=tolerance)
            failures += report.failures
            artifacts[file] = GPTArtifact(kind=form.kind, dtype=form.dtype, tolerance=tolerance.to_dict(),
                                          cases=report.cases, max_abs_error=report.max_abs_error,
                                          greedy_agreement=report.greedy_agreement, passed=report.passed,
                                          export_seconds=round(seconds[file], 3))
            del session
            gc.collect()
        if pte is not None:
            artifacts[PTE_FORM] = pte.artifact
            failures += pte.failures
        if failures:
            raise ValidationError([_Line(f) for f in failures])
        manifest = GPTManifest(
            name=name, created=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), config=config,
            contract=contract_dict(config, executorch=pte is not None),
            versions={"torch": torch.__version__, "onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__,
                      **({} if pte is None else {"executorch": _executorch_version()})},
            weights=record | {"parameters": config.parameters(tied=tied)},
            tokenizer=None if tok is None else {"file": TOKENIZER_FILE, "vocab_size": tok.vocab_size,
                                                "built_from": tok.source},
            eos_id=eos, artifacts=artifacts, files=file_table(stage))
        (stage / MANIFEST_NAME).write_text(json.dumps(manifest.to_dict(), indent=2) + "\n")
    return GPTExportResult(name, Path(out_root) / name, manifest, time.perf_counter() - start)


def _executorch_version() -> str:
    from importlib.metadata import version

    return version("executorch")


def _encoder(tokenizer_json: bytes) -> Callable[[str], list[int]]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(tokenizer_json.decode("utf-8"))
    return lambda text: list(tok.encode(text, add_special_tokens=False).ids)


@dataclass(frozen=True)
class _Line:
    text: str

    def line(self) -> str:
        return self.text
