"""The decoder's forms, declared once as rows of the forms vocabulary (mha_runtime.artifact.forms): each file's cache
kind, dtype, tolerance row against eager PyTorch and, for a lossy form, its quality bar and quantizer method; the
names of `mha export --gpt --variants` (TABLE) with what each needs and what refuses it; the on-request formats
(gpt.pte, the GGUF files)."""
from __future__ import annotations

from dataclasses import dataclass

from mha_runtime.artifact.forms import FormRow, Table
from mha_runtime.artifact.tolerance import Tolerance
from mha_runtime.decoder.contract import (
    CONCAT_FORM,
    GGUF_FORM,
    GGUF_Q4_0,
    GGUF_Q8_0,
    INPLACE_FORM,
    INT4_FORM,
    INT8_FORM,
    PTE_FORM,
)
from mha_runtime.decoder.shapes import Shaped


@dataclass(frozen=True, kw_only=True)
class Form(FormRow):
    """One decoder file: how its cache works, and what it is judged by. An fp32 form: its tolerance row against
    eager PyTorch's logits. A lossy form (max_mean_kl set): its quality bar, the mean KL divergence of its
    next-token distribution from the fp32 form's over the quality windows (mha_runtime.decoder.quality); its logits'
    distance from eager PyTorch is recorded, not judged."""

    kind: str  # "concat" | "inplace" | "executorch" | "gguf"
    dtype: str  # "fp32" | "int8" | "int4" | a GGUF quant type
    tolerance: Tolerance
    bits: int | None = None  # a lossy form's MatMul weights (the contract's width; its method row says the same)


def inplace_refusal(cfg: Shaped) -> str | None:
    """Why the in-place forms (and the lossy forms, built from them) cannot be built for `cfg`, or None."""
    if cfg.head_dim % 8:
        return (f"head size {cfg.head_dim} (emb_dim / n_heads) is not a multiple of 8, which the in-place form's "
                "GroupQueryAttention needs")
    return None


def gguf_refusal(cfg: Shaped) -> str | None:
    """Why the GGUF files cannot be built for `cfg`, or None."""
    # llama.cpp's gpt2 graph aborts on it (GGML_ASSERT(ggml_can_mul_mat(a, b))); 2 runs. Refused for every
    # architecture (the line names the config's) until llama.cpp's graph of one is seen to run it.
    if cfg.head_dim == 1:
        return f"head size 1 (emb_dim / n_heads), which llama.cpp's {cfg.arch} graph cannot run (it aborts)"
    return None


# fp32 rows: logits differ from eager by float reassociation only (worst seen 2.1e-6 on GPT_CONFIG_124M;
# docs/gpt.md). Lossy forms are judged as llama.cpp judges its quants, by how far they move the next-token
# distribution (`llama-perplexity --kl-divergence`), not by a logits tolerance: 0.1 x the logits' RMS refused a
# Hugging Face GPT-2 of the real shape whose int8 form kept 99% of top tokens (docs/measurements/gpt.md,
# "Quality of the lossy forms"). The bars, measured on the trained demo model over held-out text beside llama.cpp
# on the same weights and text: int8 0.00024 mean KL, llama.cpp Q8_0 0.00028; int4 0.0226, Q4_0 0.0269. Each bar
# is llama.cpp's figure for the same bit width there, rounded up to one significant figure.
# A lossy form's golden generations are its own (ids it produced at export); its first-step logits are
# re-checked at the fp32 rows' tolerance: the same file through the same kernels.
EXACT = Tolerance(atol=1e-3, rtol=1e-4)
LOSSY_GOLDEN = Tolerance(atol=1e-3, rtol=1e-4)
INT8_BAR, INT4_BAR = 3e-4, 3e-2
# An architecture may hold its lossy forms to its own bars (its LOSSY_BARS, measured beside llama.cpp on its real
# model), at most these: the Llama family's, from SmolLM2-135M-Instruct, where llama.cpp's Q8_0 moves the mean KL
# by 0.0038-0.0041 across window sets (docs/measurements/smollm2.md; 5e-3 leaves room for that spread) and its
# Q4_K_M by 0.053 (DESIGN.md section 9, rounded up to one significant figure). A folder records
# its bar with each lossy form (quality.bar_mean_kl); `mha check` judges by it and refuses one above the ceiling.
BAR_CEILING = {8: 5e-3, 4: 6e-2}


def folder_bar(form: Form, recorded: object) -> float | None:
    """The bar a folder's lossy form is judged by: the one it records, where that is a number in (0, the width's
    ceiling]; None for anything else (the record check names it)."""
    ceiling = BAR_CEILING.get(form.bits or 0)
    if isinstance(recorded, bool) or not isinstance(recorded, (int, float)) or ceiling is None:
        return None
    return float(recorded) if 0 < recorded <= ceiling else None
# int8 and int4 quantize gpt.inplace.onnx and are measured against it: the folder ships it too (`needs`, named).
DECODER = Form(name="decoder", file=CONCAT_FORM, kind="concat", dtype="fp32", tolerance=EXACT)
INPLACE = Form(name="inplace", file=INPLACE_FORM, kind="inplace", dtype="fp32", tolerance=EXACT,
               refuses=inplace_refusal)
INT8 = Form(name="int8", file=INT8_FORM, kind="inplace", dtype="int8", tolerance=LOSSY_GOLDEN, needs=("inplace",),
            max_mean_kl=INT8_BAR, bits=8, method="matmulnbits-8")
INT4 = Form(name="int4", file=INT4_FORM, kind="inplace", dtype="int4", tolerance=LOSSY_GOLDEN, needs=("inplace",),
            max_mean_kl=INT4_BAR, bits=4, method="matmulnbits-4")
# gpt.pte: on request only (not in 'all'): ExecuTorch is an optional extra, its export takes far longer than the
# ONNX forms', and it runs batch 1 only (FORMS' forms are all checked at batch 3).
# fp32 row: XNNPACK's logits were within 1.2e-6 of eager on gpt-mini and the tests' book GPT
# (tests/decoder/test_gpt_pte.py).
PTE = Form(name="pte", file=PTE_FORM, kind="executorch", dtype="fp32", tolerance=EXACT, on_request=True)
# The GGUF files for llama.cpp (`--variants ...,gguf`; on request only, not in 'all'): gpt.gguf (fp32) and, beside
# each lossy ONNX form the folder ships, llama.cpp's quant type of the same width (its row needs gguf and that
# form), named as llama.cpp names it (its users know Q8_0 and Q4_0; they are not our MatMulNBits forms), lower case
# like the other files, `.gguf` last for the tools that list GGUF files. Checked by llama.cpp itself
# (mha_runtime.gguf.llama_cpp): gpt.gguf reproduces the greedy golden generations, its first-step logits within
# GGUF's row (docs/gpt.md, "gpt.gguf"); a quant type is judged by the same quality bar as the ONNX form of its width
# and reproduces its own generations; its method is llama.cpp's quant type (its dtype).
# gpt.gguf's row, the errors measured and why: docs/gpt.md, "gpt.gguf".
GGUF = Form(name="gguf", file=GGUF_FORM, kind="gguf", dtype="fp32", tolerance=Tolerance(atol=1e-2, rtol=1e-3),
            on_request=True, refuses=gguf_refusal)
GGUF_ROWS = (GGUF,
             Form(name="q8_0", file=GGUF_Q8_0, kind="gguf", dtype="q8_0", tolerance=LOSSY_GOLDEN,
                  needs=("gguf", "int8"), max_mean_kl=INT8_BAR, bits=8),
             Form(name="q4_0", file=GGUF_Q4_0, kind="gguf", dtype="q4_0", tolerance=LOSSY_GOLDEN,
                  needs=("gguf", "int4"), max_mean_kl=INT4_BAR, bits=4))

# How `mha export --gpt --variants` reads (mha_runtime.artifact.forms.parse): no 'none' (a decoder folder holds a
# form), a form's needs named too (a lossy form is measured against the in-place form the folder ships).
TABLE: Table[Form] = Table(
    (DECODER, INPLACE, INT8, INT4, PTE, GGUF), pull_needs=False,
    unknown="--variants: expected 'all' or some of {choices} (and 'all,{extras}'), got {text}")
# The ONNX forms by file, in build order (the lossy ones last: they read gpt.inplace.onnx).
FORMS: dict[str, Form] = {f.file: f for f in (DECODER, INPLACE, INT8, INT4)}
# The ONNX forms' variant names of `mha export --gpt --variants`.
GPT_VARIANTS = {f.name: f.file for f in FORMS.values()}
# The fastest fp32 form.
FASTEST = INPLACE_FORM
PTE_VARIANT = PTE.name
GGUF_VARIANT = GGUF.name
GGUF_FORMS: dict[str, Form] = {f.file: f for f in GGUF_ROWS}
# the lossy ONNX form -> its GGUF quant type
GGUF_QUANTS = {TABLE[f.needs[1]].file: f.file for f in GGUF_ROWS[1:]}
