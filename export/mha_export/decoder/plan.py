"""What a GPT export will build, decided and refused before any work: the variants asked for, the budget (protobuf's
2 GiB, the machine's memory) and the forms this config's shape can have."""
from __future__ import annotations

from dataclasses import dataclass

from mha_export.pipeline.budget import PROTOBUF_LIMIT, available_memory, gib
from mha_runtime.artifact.errors import BadValueError, ConfigError, ExportError, cut
from mha_runtime.decoder.config import GPTConfig
from mha_runtime.decoder.contract import INPLACE_FORM
from mha_runtime.decoder.forms import FORMS, GGUF_VARIANT, GPT_VARIANTS, PTE_VARIANT
from mha_runtime.gguf.llama_cpp import BUILD_HINT, program

ALL_VARIANTS = "all"
# Building and validating holds the eager model, one graph being written and one session: about 4x the fp32
# parameters at most (measured in docs/measurements/gpt.md); refused before any work when memory is short of that.
MEMORY_FACTOR = 4


def parse_gpt_variants(text: str | None) -> tuple[str, ...]:
    """Comma-separated names of GPT_VARIANTS, 'pte' (gpt.pte) and 'gguf' (gpt.gguf and the GGUF quant types of
    the lossy forms built), both on request only (not in 'all'), and 'all' (the default: every name of
    GPT_VARIANTS, a lossy form that misses its bar left out with a note). int8 and int4 need inplace (they quantize
    that graph)."""
    names = [n.strip() for n in (text or ALL_VARIANTS).split(",") if n.strip()]
    known = [ALL_VARIANTS, *GPT_VARIANTS, PTE_VARIANT, GGUF_VARIANT]
    bad = [n for n in names if n not in known]
    if bad or not names:
        raise BadValueError(f"--variants: expected 'all' or some of {', '.join(known[1:])} (and 'all,pte,gguf'), got "
                            f"{cut(text or '')!r}")  # a long value quoted as --name is, not whole
    return tuple(n for n in known if n in names)


def check_gpt_budget(cfg: GPTConfig) -> None:
    """Refuse, before any work, a model whose fp32 file exceeds protobuf's 2 GiB or whose export needs more
    memory than is available."""
    params = cfg.parameters(tied=False) * 4
    if params >= PROTOBUF_LIMIT:
        raise BadValueError(f"gpt config: {gib(params)} of fp32 parameters; an ONNX file holds at most "
                            f"{gib(PROTOBUF_LIMIT)}")
    available = available_memory()
    if available is not None and MEMORY_FACTOR * params > available:
        raise ConfigError(f"gpt config: exporting needs about {gib(MEMORY_FACTOR * params)} of memory, "
                          f"{gib(available)} is available")


def inplace_refusal(cfg: GPTConfig) -> str | None:
    """Why the in-place forms (and the lossy forms, built from them) cannot be built for `cfg`, or None."""
    if cfg.head_dim % 8:
        return (f"head size {cfg.head_dim} (emb_dim / n_heads) is not a multiple of 8, which the in-place form's "
                "GroupQueryAttention needs")
    return None


def gguf_refusal(cfg: GPTConfig) -> str | None:
    """Why the GGUF files cannot be built for `cfg`, or None."""
    if cfg.head_dim == 1:  # llama.cpp's gpt2 graph aborts on it (GGML_ASSERT(ggml_can_mul_mat(a, b))); 2 runs
        return "head size 1 (emb_dim / n_heads), which llama.cpp's gpt2 graph cannot run (it aborts)"
    return None


def check_gpt_forms(cfg: GPTConfig, variants: tuple[str, ...]) -> None:
    """Refuse, before any work, a form asked for by name that this config cannot have (the default set leaves it
    out with a note instead)."""
    why = inplace_refusal(cfg)
    named = [v for v in variants if v in GPT_VARIANTS and FORMS[GPT_VARIANTS[v]].kind == "inplace"]
    if why is not None and named:
        raise BadValueError(f"--variants {','.join(named)}: {why}; export the decoder variant (gpt.onnx) alone")
    why = gguf_refusal(cfg)
    if why is not None and GGUF_VARIANT in variants:  # gguf is never in 'all': always asked for by name
        raise BadValueError(f"--variants {GGUF_VARIANT}: {why}")
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


def plan_gpt(cfg: GPTConfig, variants: tuple[str, ...] | None) -> GPTPlan:
    """Every refusal of the variants for this config, then what to build."""
    check_gpt_budget(cfg)
    variants = (ALL_VARIANTS,) if variants is None else variants
    check_gpt_forms(cfg, variants)
    chosen = {f for v in variants if v not in (PTE_VARIANT, GGUF_VARIANT)
              for f in (GPT_VARIANTS.values() if v == ALL_VARIANTS else [GPT_VARIANTS[v]])}
    notes: list[str] = []
    why = inplace_refusal(cfg)
    if why is not None:  # only 'all' reaches here with in-place forms in it
        left = [f for f in FORMS if f in chosen and FORMS[f].kind == "inplace"]
        chosen -= set(left)
        notes += [f"{f}: {why}" for f in left]
    files = tuple(f for f in FORMS if f in chosen)
    pte = PTE_VARIANT in variants
    gguf = GGUF_VARIANT in variants  # llama.cpp is there (check_gpt_forms): it validates the GGUF files
    if not files and not pte and not gguf:
        raise BadValueError("--variants: nothing to build")
    if any(FORMS[f].lossy for f in files) and INPLACE_FORM not in files:
        raise BadValueError("--variants: int8 and int4 quantize the in-place graph and are measured against it; "
                            "add inplace")
    return GPTPlan(files, pte, ALL_VARIANTS in variants, tuple(notes), gguf)
