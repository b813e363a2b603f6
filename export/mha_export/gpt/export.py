"""One GPT folder end to end: weights, decoder forms, tokenizer, GenAI config, validation, manifest; staged, then
moved into place (nothing under out/NAME changes unless everything was written and validated).

The fp32 forms are judged against eager PyTorch's logits; the lossy forms (int8, int4) by their quality bar
(mha_export.gpt.lossy.build). With the default variants a lossy form that cannot meet its bar is left out with one line
(`GPTExportResult.notes`), as a missing extra is; asked for by name, it fails the export."""
from __future__ import annotations

import datetime as dt
import gc
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import onnx
import onnxruntime
import torch
from safetensors.torch import save_file

from mha_export.gpt.eager import SEED, GPTModel, seeded_gpt
from mha_export.gpt.genai import genai_json
from mha_export.gpt.golden import form_generations, golden_generations, write_generations
from mha_export.gpt.graphs.concat import concat_model
from mha_export.gpt.graphs.inplace import inplace_model
from mha_export.gpt.graphs.shared import Built
from mha_export.gpt.lossy.build import LossyOutcome, build_lossy, quality_windows
from mha_export.gpt.tokenizer import TokenizerFiles, read_tokenizer
from mha_export.gpt.validate import references, validate_form
from mha_export.gpt.weights import read_gpt_weights
from mha_export.pipeline.budget import available_memory, gib
from mha_export.pipeline.export import check_folder_name
from mha_export.pipeline.progress import steps
from mha_export.pipeline.seal import file_table
from mha_runtime.artifact.atomic import staged_folder
from mha_runtime.artifact.errors import BadValueError, ConfigError, ValidationError
from mha_runtime.artifact.manifest import MANIFEST_NAME, sha256_file
from mha_runtime.gpt.config import GPT2_EOS_ID, GPTConfig
from mha_runtime.gpt.contract import (
    CONCAT_FORM,
    FORMS,
    GENAI_CONFIG,
    GPT_VARIANTS,
    INPLACE_FORM,
    PTE_FORM,
    PTE_VARIANT,
    TOKENIZER_CONFIG,
    TOKENIZER_FILE,
    WEIGHTS_FILE,
    contract_dict,
)
from mha_runtime.gpt.decoder import decoder_for, make_session
from mha_runtime.gpt.manifest import GPTArtifact, GPTManifest
from mha_runtime.gpt.quality import QUALITY_FILE, Windows

ALL_VARIANTS = "all"
PROTOBUF_LIMIT = 2 << 30
# Building and validating holds the eager model, one graph being written and one session: about 4x the fp32
# parameters at most (measured in docs/measurements/gpt.md); refused before any work when memory is short of that.
MEMORY_FACTOR = 4


def parse_gpt_variants(text: str | None) -> tuple[str, ...]:
    """Comma-separated names of GPT_VARIANTS, 'pte' (gpt.pte, on request only: not in 'all') and 'all' (the
    default: every name of GPT_VARIANTS, a lossy form that misses its bar left out with a note). int8 and int4
    need inplace (they quantize that graph)."""
    names = [n.strip() for n in (text or ALL_VARIANTS).split(",") if n.strip()]
    known = [ALL_VARIANTS, *GPT_VARIANTS, PTE_VARIANT]
    bad = [n for n in names if n not in known]
    if bad or not names:
        raise BadValueError(f"--variants: expected 'all' or some of {', '.join(known[1:])} (and 'all,pte'), got "
                          f"{text!r}")
    return tuple(n for n in known if n in names)


def check_gpt_budget(cfg: GPTConfig, *, available: int | None = None) -> None:
    """Refuse, before any work, a model whose fp32 file exceeds protobuf's 2 GiB or whose export needs more
    memory than is available."""
    params = cfg.parameters(tied=False) * 4
    if params >= PROTOBUF_LIMIT:
        raise BadValueError(f"gpt config: {gib(params)} of fp32 parameters; an ONNX file holds at most "
                          f"{gib(PROTOBUF_LIMIT)}")
    available = available_memory() if available is None else available
    if available is not None and MEMORY_FACTOR * params > available:
        raise ConfigError(f"gpt config: exporting needs about {gib(MEMORY_FACTOR * params)} of memory, "
                          f"{gib(available)} is available")


def inplace_refusal(cfg: GPTConfig) -> str | None:
    """Why the in-place forms (and the lossy forms, built from them) cannot be built for `cfg`, or None."""
    if cfg.head_dim % 8:
        return (f"head size {cfg.head_dim} (emb_dim / n_heads) is not a multiple of 8, which the in-place form's "
                "GroupQueryAttention needs")
    return None


def check_gpt_forms(cfg: GPTConfig, variants: tuple[str, ...]) -> None:
    """Refuse, before any work, a form asked for by name that this config cannot have (the default set leaves it
    out with a note instead)."""
    why = inplace_refusal(cfg)
    named = [v for v in variants if v in GPT_VARIANTS and FORMS[GPT_VARIANTS[v]].kind == "inplace"]
    if why is not None and named:
        raise BadValueError(f"--variants {','.join(named)}: {why}; export the decoder variant (gpt.onnx) alone")


@dataclass(frozen=True)
class GPTExportResult:
    name: str
    folder: Path
    manifest: GPTManifest
    seconds: float
    notes: tuple[str, ...] = ()  # one line per default form left out


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
    """Build, check the graph (not re-reading the weights: onnx_file/check.py), then stream it to the file (the
    weights are never copied into a ModelProto)."""
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
               tokenizer: Path | None = None, variants: tuple[str, ...] | None = None,
               progress: bool = False, announce: Callable[[], None] | None = None) -> GPTExportResult:
    """Export a GPT folder. `variants` None or with 'all': the default set, where a lossy form that misses its bar
    is left out (named in `notes`); named variants must all be built and pass. `announce` is called once every
    input is checked (the weights read): the work starts."""
    start = time.perf_counter()
    check_folder_name(name)
    check_gpt_budget(config)
    variants = (ALL_VARIANTS,) if variants is None else variants
    check_gpt_forms(config, variants)
    lenient = ALL_VARIANTS in variants
    chosen = {f for v in variants if v != PTE_VARIANT for f in (GPT_VARIANTS.values() if v == ALL_VARIANTS
                                                               else [GPT_VARIANTS[v]])}
    notes: list[str] = []
    if inplace_refusal(config) is not None:  # only 'all' reaches here with in-place forms in it
        left = [f for f in FORMS if f in chosen and FORMS[f].kind == "inplace"]
        chosen -= set(left)
        notes += [f"{f}: {inplace_refusal(config)}" for f in left]
    files = [f for f in FORMS if f in chosen]  # registry order: the lossy forms last (they read gpt.inplace.onnx)
    want_pte = PTE_VARIANT in variants
    if not files and not want_pte:
        raise BadValueError("--variants: nothing to build")
    if any(FORMS[f].lossy for f in files) and INPLACE_FORM not in files:
        raise BadValueError("--variants: int8 and int4 quantize the in-place graph and are measured against it; "
                          "add inplace")
    tok: TokenizerFiles | None = None
    if tokenizer is not None:
        tok = read_tokenizer(tokenizer, vocab_size=config.vocab_size, context_length=config.context_length)
    model, state, record = load_gpt(config, weights)
    if announce is not None:  # every check of the inputs is behind: the work starts
        announce()
    tied = bool(record["tied"])
    eos = GPT2_EOS_ID if config.vocab_size > GPT2_EOS_ID else None
    encode = None if tok is None else _encoder(tok.tokenizer_json)
    refs = references(model, config)  # every form is judged against these; the eager model is not needed after
    golden = golden_generations(model, config, encode)
    pte = None
    if want_pte:  # from the eager model, judged by executorch.runtime; written into the stage below
        from mha_export.executorch.gpt import build_pte

        pte = build_pte(model, config, refs, golden)
    del model
    failures: list[str] = []
    with staged_folder(Path(out_root) / name) as stage:
        weights_state = {k: v.contiguous() for k, v in state.items() if not (tied and k == "out_head.weight")}
        save_file(weights_state, str(stage / WEIGHTS_FILE), metadata={"tied": str(tied).lower()})
        del weights_state
        seconds: dict[str, float] = {}
        lossy: dict[str, LossyOutcome] = {}
        windows = quality_windows(config, encode) if any(FORMS[f].lossy for f in files) else None
        for file in steps(files, label=f"building {name}", unit="form", enabled=progress):
            begin = time.perf_counter()
            if FORMS[file].lossy:  # after gpt.inplace.onnx (registry order): measured against it
                assert windows is not None
                outcome = _build_lossy(file, stage, state, config, tied=tied, windows=windows)
                if outcome.ok:
                    lossy[file] = outcome
                else:
                    (stage / file).unlink()
                    (notes if lenient else failures).append(outcome.miss_line())
            else:
                _build(file, stage / file, state, config, tied=tied)
            seconds[file] = time.perf_counter() - begin
        files = [f for f in files if not FORMS[f].lossy or f in lossy]
        state = None  # validation runs on the files alone: free the weights first
        gc.collect()
        if tok is not None:
            (stage / TOKENIZER_FILE).write_bytes(tok.tokenizer_json)
            (stage / TOKENIZER_CONFIG).write_bytes(tok.config_json)
        write_generations(stage, *golden, config, FORMS[INPLACE_FORM].tolerance)
        if windows is not None and lossy:
            (stage / QUALITY_FILE).write_bytes(windows.to_json())
        if CONCAT_FORM in files and eos is not None:
            (stage / GENAI_CONFIG).write_bytes(genai_json(config, eos))
        artifacts = {}
        if pte is not None:
            (stage / PTE_FORM).write_bytes(pte.data)
        for file in steps(files, label=f"validating {name}", unit="form", enabled=progress):
            form = FORMS[file]
            # From the path: ONNX Runtime reads the file itself (from bytes, a second copy of the weights
            # would be held while it parses them).
            session = make_session(str(stage / file), where=str(stage / file))
            report = validate_form(session, form, refs, config, tolerance=form.tolerance)
            failures += report.failures
            extra: dict[str, object] = {}
            if file in lossy:  # its own golden generations, and how it was made and measured
                own = form_generations(partial(decoder_for, form.kind, session, config, file), golden[0],
                                       prefix=form.dtype)
                generations = write_generations(stage, *own, config, form.tolerance, form=file)
                extra = {"quality": lossy[file].quality.to_dict() | {"bar_mean_kl": form.max_mean_kl},
                         "quantization": lossy[file].plan.to_dict() | {"tries": lossy[file].tries},
                         "generations": generations}
            artifacts[file] = GPTArtifact(kind=form.kind, dtype=form.dtype, tolerance=form.tolerance.to_dict(),
                                          cases=report.cases, max_abs_error=report.max_abs_error,
                                          greedy_agreement=report.greedy_agreement, passed=report.passed,
                                          export_seconds=round(seconds[file], 3), **extra)  # type: ignore[arg-type]
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
    return GPTExportResult(name, Path(out_root) / name, manifest, time.perf_counter() - start, tuple(notes))


def _build_lossy(file: str, stage: Path, state: dict[str, torch.Tensor], config: GPTConfig, *, tied: bool,
                 windows: Windows) -> LossyOutcome:
    """The lossy form `file`, measured against the staged gpt.inplace.onnx."""
    reference = make_session(str(stage / INPLACE_FORM), where=str(stage / INPLACE_FORM))
    return build_lossy(FORMS[file], state, config, stage / file, tied=tied,
                       reference=lambda: decoder_for("inplace", reference, config, INPLACE_FORM), windows=windows)


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
