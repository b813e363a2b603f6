"""The decoder's forms, declared once: each file's cache kind, dtype, tolerance row against eager PyTorch and, for a
lossy form, its quality bar; the variant names of `mha export --gpt --variants`; the on-request formats (gpt.pte,
the GGUF files)."""
from __future__ import annotations

from dataclasses import dataclass

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


@dataclass(frozen=True)
class Form:
    """One decoder file: how its cache works, and what it is judged by. An fp32 form: its tolerance row against
    eager PyTorch's logits. A lossy form (max_mean_kl set): its quality bar, the mean KL divergence of its
    next-token distribution from the fp32 form's over the quality windows (mha_runtime.decoder.quality); its logits'
    distance from eager PyTorch is recorded, not judged."""

    file: str
    kind: str  # "concat" | "inplace"
    dtype: str  # "fp32" | "int8" | "int4"
    tolerance: Tolerance
    max_mean_kl: float | None = None
    bits: int | None = None  # a lossy form's MatMul weights

    @property
    def lossy(self) -> bool:
        return self.max_mean_kl is not None

    def meets_bar(self, mean_kl: float) -> bool:
        """Within the quality bar (a NaN never is)."""
        return self.max_mean_kl is not None and mean_kl <= self.max_mean_kl


# fp32 rows: logits differ from eager by float reassociation only (worst seen 2.1e-6 on GPT_CONFIG_124M;
# docs/gpt.md). Lossy forms are judged as llama.cpp judges its quants, by how far they move the next-token
# distribution (`llama-perplexity --kl-divergence`), not by a logits tolerance: 0.1 x the logits' RMS refused a
# Hugging Face GPT-2 of the real shape whose int8 form kept 99% of top tokens (docs/measurements/gpt.md,
# "Quality of the lossy forms"). The bars, measured on the trained demo model over held-out text beside llama.cpp
# on the same weights and text: int8 0.00024 mean KL, llama.cpp Q8_0 0.00028; int4 0.0226, Q4_0 0.0269. Each bar
# is llama.cpp's figure for the same bit width there, rounded up to one significant figure.
# A lossy form's golden generations are its own (ids it produced at export); its first-step logits are
# re-checked at the fp32 rows' tolerance: the same file through the same kernels.
LOSSY_GOLDEN = Tolerance(atol=1e-3, rtol=1e-4)
FORMS: dict[str, Form] = {
    CONCAT_FORM: Form(CONCAT_FORM, "concat", "fp32", tolerance=Tolerance(atol=1e-3, rtol=1e-4)),
    INPLACE_FORM: Form(INPLACE_FORM, "inplace", "fp32", tolerance=Tolerance(atol=1e-3, rtol=1e-4)),
    INT8_FORM: Form(INT8_FORM, "inplace", "int8", tolerance=LOSSY_GOLDEN, max_mean_kl=3e-4, bits=8),
    INT4_FORM: Form(INT4_FORM, "inplace", "int4", tolerance=LOSSY_GOLDEN, max_mean_kl=3e-2, bits=4),
}
# The variant names of `mha export --gpt --variants`.
GPT_VARIANTS = {"decoder": CONCAT_FORM, "inplace": INPLACE_FORM, "int8": INT8_FORM, "int4": INT4_FORM}
# The fastest fp32 form, and what each form needs built before it.
FASTEST = INPLACE_FORM
# gpt.pte: not in FORMS nor in GPT_VARIANTS ('all'): ExecuTorch is an optional extra, its export takes far longer
# than the ONNX forms', and it runs batch 1 only (FORMS' forms are all checked at batch 3).
# fp32 row: XNNPACK's logits were within 1.2e-6 of eager on gpt-mini and the tests' book GPT
# (tests/decoder/test_gpt_pte.py).
PTE = Form(PTE_FORM, "executorch", "fp32", tolerance=Tolerance(atol=1e-3, rtol=1e-4))
PTE_VARIANT = "pte"
# The GGUF files for llama.cpp (`--variants ...,gguf`; on request only, not in 'all'): gpt.gguf (fp32) and, beside
# each lossy ONNX form the folder ships, llama.cpp's quant type of the same width, named as llama.cpp names it (its
# users know Q8_0 and Q4_0; they are not our MatMulNBits forms), lower case like the other files, `.gguf` last for
# the tools that list GGUF files. Checked by llama.cpp itself (mha_runtime.gguf.llama_cpp): gpt.gguf reproduces
# the greedy golden generations, its first-step logits within GGUF's row (docs/gpt.md, "gpt.gguf"); a quant type
# is judged by the same quality bar as the ONNX form of its width and reproduces its own generations.
GGUF_VARIANT = "gguf"
# gpt.gguf's row, the errors measured and why: docs/gpt.md, "gpt.gguf".
GGUF = Form(GGUF_FORM, "gguf", "fp32", tolerance=Tolerance(atol=1e-2, rtol=1e-3))
GGUF_FORMS: dict[str, Form] = {
    GGUF_FORM: GGUF,
    GGUF_Q8_0: Form(GGUF_Q8_0, "gguf", "q8_0", tolerance=LOSSY_GOLDEN, max_mean_kl=FORMS[INT8_FORM].max_mean_kl,
                    bits=8),
    GGUF_Q4_0: Form(GGUF_Q4_0, "gguf", "q4_0", tolerance=LOSSY_GOLDEN, max_mean_kl=FORMS[INT4_FORM].max_mean_kl,
                    bits=4),
}
GGUF_QUANTS = {INT8_FORM: GGUF_Q8_0, INT4_FORM: GGUF_Q4_0}  # the lossy ONNX form -> its GGUF quant type
