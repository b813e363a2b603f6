"""What a GPT export will build, decided and refused before any work: the variants asked for, the budget (protobuf's
2 GiB, the machine's memory) and the forms this config's shape can have."""
from __future__ import annotations

from dataclasses import dataclass, replace

from mha_export.decoder.archs import arch_of
from mha_export.decoder.archs.protocol import DecoderConfig
from mha_export.pipeline.budget import LIBRARIES, PROTOBUF_LIMIT, available_memory, gib
from mha_runtime.artifact.errors import BadValueError, ConfigError, ExportError
from mha_runtime.artifact.forms import ALL, Chosen, Selection, parse, select
from mha_runtime.decoder.forms import FORMS, GGUF_FORMS, GGUF_VARIANT, PTE_VARIANT, TABLE, Form, folder_bar
from mha_runtime.gguf.llama_cpp import BUILD_HINT, program

ALL_VARIANTS = ALL
# Building and validating holds the eager model, one graph being written and one session: about 4x the fp32
# parameters at most (measured in docs/measurements/gpt.md); refused before any work when memory is short of that.
MEMORY_FACTOR = 4
# The validation's longest case: a batch of 3 prompts of context_length tokens, whose (context_length, vocab_size)
# float32 logits the eager model and gpt.onnx each make one prompt at a time; about 4.1 such arrays at the peak
# (fitted on three exports of 64M-128M parameters: docs/measurements/gpt.md, "The export's budget counts the
# validation's logits"); 6 counted, as margin.
LOGIT_ARRAYS = 6


@dataclass(frozen=True)
class DecoderBudget:
    """Bytes a decoder export holds at its peak, by part (pipeline.budget's LIBRARIES for the imported ones)."""

    weights: int  # MEMORY_FACTOR x the fp32 parameters
    logits: int  # LOGIT_ARRAYS x the validation's (context_length, vocab_size) float32 logits of one prompt
    libraries: int = LIBRARIES

    @property
    def peak(self) -> int:
        return self.libraries + self.weights + self.logits


def decoder_budget(cfg: DecoderConfig) -> DecoderBudget:
    return DecoderBudget(weights=MEMORY_FACTOR * cfg.parameters(tied=False) * 4,
                         logits=LOGIT_ARRAYS * cfg.context_length * cfg.vocab_size * 4)


def parse_gpt_variants(text: str | None) -> tuple[str, ...]:
    """Comma-separated names of the decoder's forms (mha_runtime.decoder.forms.TABLE): 'all' (the default: every
    form but those on request, a lossy form that misses its bar left out with a note), the ONNX forms' names, 'pte'
    (gpt.pte) and 'gguf' (gpt.gguf and the GGUF quant types of the lossy forms built), both on request only. 'all'
    first where asked, then the names in table order."""
    chosen = parse(text or ALL, TABLE)
    return (ALL,) * chosen.every + chosen.names


def _select(cfg: DecoderConfig, variants: tuple[str, ...]) -> Selection[Form]:
    """The forms' own rules (mha_runtime.decoder.forms), then the architecture's (its `refusal` of a form's file)."""
    arch = arch_of(cfg)
    return select(TABLE, Chosen(ALL in variants, tuple(v for v in variants if v != ALL)), cfg,
                  also=lambda form: arch.refusal(cfg, form.file))


def folder_form(file: str, cfg: DecoderConfig) -> Form:
    """The row of `file` (an ONNX form or a GGUF quant type) for this config: a lossy form held to its
    architecture's bar for its width (LOSSY_BARS) where it names one, within the contract's ceiling."""
    form = FORMS.get(file) or GGUF_FORMS[file]
    bar = arch_of(cfg).LOSSY_BARS.get(form.bits or 0) if form.lossy else None
    if bar is None:
        return form
    assert folder_bar(form, bar) == bar, f"{cfg.arch}'s bar {bar} for {file} is above the contract's ceiling"
    return replace(form, max_mean_kl=bar)


def check_gpt_budget(cfg: DecoderConfig) -> None:
    """Refuse, before any work, a model whose fp32 file exceeds protobuf's 2 GiB or whose export needs more
    memory than is available."""
    params = cfg.parameters(tied=False) * 4
    if params >= PROTOBUF_LIMIT:
        raise BadValueError(f"gpt config: {gib(params)} of fp32 parameters; an ONNX file holds at most "
                            f"{gib(PROTOBUF_LIMIT)}")
    available = available_memory()
    need = decoder_budget(cfg)
    if available is not None and need.peak > available:
        raise ConfigError(f"gpt config: exporting needs about {gib(need.peak)} of memory (libraries "
                          f"{gib(need.libraries)}, weights {gib(need.weights)}, the validation's logits "
                          f"{gib(need.logits)}), {gib(available)} is available")


def check_gpt_forms(cfg: DecoderConfig, variants: tuple[str, ...]) -> None:
    """Refuse, before any work, a form asked for by name that this config cannot have (the default set leaves it
    out with a note instead), and the GGUF files where llama.cpp, which validates them, is not built."""
    refused = _select(cfg, variants).refused
    if refused:
        why = refused[0][1]
        named = [form for form, reason, _ in refused if reason == why]
        advice = "; export the decoder variant (gpt.onnx) alone" if named[0].file in FORMS else ""
        raise BadValueError(f"--variants {','.join(f.name for f in named)}: {why}{advice}")
    if GGUF_VARIANT in variants and program() is None:
        # Named, so it must be built or the export fails (as a lossy form named that misses its bar): left out with
        # a note, `--variants inplace,gguf` exited 0 without the GGUF asked for. A missing build, not a bad value:
        # exit 1, before any work.
        raise ExportError(f"--variants {GGUF_VARIANT}: {BUILD_HINT}; nothing was exported")


@dataclass(frozen=True)
class GPTPlan:
    """The forms to build in registry order (the lossy ones last: they read gpt.inplace.onnx), whether gpt.pte is
    asked for, whether a lossy miss is a note ('all') or a failure (named), what the default set left out, and
    whether the GGUF files are built (asked for: llama.cpp, which validates them, is then there)."""

    files: tuple[str, ...]
    pte: bool
    lenient: bool
    notes: tuple[str, ...]
    gguf: bool = False


def plan_gpt(cfg: DecoderConfig, variants: tuple[str, ...] | None) -> GPTPlan:
    """Every refusal of the variants for this config, then what to build."""
    check_gpt_budget(cfg)
    variants = (ALL,) if variants is None else variants
    check_gpt_forms(cfg, variants)
    selection = _select(cfg, variants)
    built = {form.name for form in selection.rows}
    files = tuple(form.file for form in selection.rows if form.file in FORMS)
    if not built:
        raise BadValueError("--variants: nothing to build")
    for _, need in selection.unmet[:1]:
        needing = " and ".join(form.name for form in TABLE.rows if need in form.needs)
        raise BadValueError(f"--variants: {needing} quantize the in-place graph and are measured against it; "
                            f"add {need}")
    notes = tuple(f"{form.file}: {why}" for form, why in selection.left_out)  # only 'all' leaves forms out
    return GPTPlan(files, PTE_VARIANT in built, ALL in variants, notes, GGUF_VARIANT in built)
