"""The golden generations of a GPT folder, defined once: what every runtime must reproduce (torch-free).

`golden/generations.json` (listed in the manifest with its sha256, as is each logits file):

    {"format": 1, "kind": "gpt-generations", "reference": ..., "vocab_size": V, "context_length": C,
     "tolerance": {"atol", "rtol", "rel_l2"}, "sampling": the rule and the random generator, in words,
     "cases": [{"name", "prompt_ids", "prompt_text" (only in a case whose prompt is text, with the folder's
                tokenizer: a runner with a tokenizer checks encode(prompt_text) == prompt_ids),
                "max_new_tokens", "temperature", "top_k", "seed", "ids",
                "first_logits_bin", "first_logits_npy", "first_logits_shape": [V]}]}

A lossy form (int8, int4) has its own file, named by its manifest entry's "generations"
(golden/generations.<dtype>.json, logits files golden/<dtype>.<case>.logits.*): the same prompts and settings, the
ids and first-step logits that form gave at export (its tolerance is the fp32 rows': the same file, the same
kernels).

`ids` are eager PyTorch's (the book's GPTModel): greedy, or sampled by the rule below from eager logits. A runner
passes a case when its new ids equal `ids` exactly and its logits of the prompt's last token (the first step)
are within `tolerance` of the little-endian float32 `first_logits_bin` (`first_logits_npy` holds the same
numbers as .npy). The eos id is not applied: every case yields max_new_tokens ids.

Sampling (temperature > 0): keep the logits >= the k-th largest (ties stay), divide by the temperature, softmax
in float32; then draw u = the next double of numpy's PCG64 seeded with SeedSequence(seed) (`random()`: the
top 53 bits of the next 64-bit output, times 2**-53), one generator per generation, one draw per token; the
token is the first whose float64 cumulative probability exceeds u times the total.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mha_runtime.artifact.errors import ArtifactError
from mha_runtime.artifact.fields import get, plain_name, record
from mha_runtime.artifact.manifest import read_verified
from mha_runtime.artifact.tolerance import Tolerance
from mha_runtime.decoder.contract import INPLACE_FORM, id_problem
from mha_runtime.decoder.forms import FORMS, GGUF_FORMS, Form
from mha_runtime.decoder.manifest import GPTManifest, read_listed_json

GENERATIONS_FILE = "golden/generations.json"
GENERATIONS_KIND = "gpt-generations"
GENERATIONS_FORMAT = 1
SAMPLING_RULE = (
    "top-k keeps the logits >= the k-th largest (ties stay), then divide by temperature, then float32 softmax; "
    "temperature 0: argmax (the first maximum). Draw: u = numpy PCG64(SeedSequence(seed)).random() (the next "
    "64-bit output >> 11, times 2**-53), one generator per generation and one draw per token; the token is the "
    "first id whose float64 cumulative probability exceeds u * total")


def generations_file(form: str) -> str:
    """A lossy form's own golden generations: golden/generations.<dtype>.json (gpt.inplace.int8.onnx -> int8)."""
    return f"golden/generations.{form.split('.')[-2]}.json"


def golden_form(file: str) -> Form:
    """The contract row whose tolerance a golden file records: a lossy form's own file, that form's; any other
    (golden/generations.json), the fp32 in-place form's, which every fp32 form shares."""
    lossy = [f for f in (*FORMS.values(), *GGUF_FORMS.values()) if f.lossy and generations_file(f.file) == file]
    return lossy[0] if lossy else FORMS[INPLACE_FORM]


@dataclass(frozen=True)
class GoldenGeneration:
    name: str
    prompt_ids: list[int]
    prompt_text: str | None
    max_new_tokens: int
    temperature: float
    top_k: int | None
    seed: int | None
    ids: list[int]
    first_logits_bin: str
    first_logits_npy: str

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "prompt_text" or v is not None}

    @classmethod
    def from_dict(cls, data: Any, where: str) -> GoldenGeneration:
        return record(cls, data, where, first_logits_bin=lambda n: plain_name(n, where),
                      first_logits_npy=lambda n: plain_name(n, where))


@dataclass(frozen=True)
class GoldenGenerations:
    tolerance: Tolerance  # as the file records it: compared with golden_form's, never used to compare logits
    cases: list[GoldenGeneration]
    doc: dict[str, Any]


def load_generations(folder: Path, manifest: GPTManifest, file: str = GENERATIONS_FILE) -> GoldenGenerations:
    """The folder's golden generations (a lossy form's: its own `file`) after the sha256 check of the file
    (ArtifactError if none or broken)."""
    where, doc = read_listed_json(folder, manifest, file, kind=GENERATIONS_KIND, fmt=GENERATIONS_FORMAT,
                                  what="golden generations")
    cases = [GoldenGeneration.from_dict(c, f"{where}: cases[{i}]")
             for i, c in enumerate(get(doc, "cases", list, where))]
    if not cases:  # a check of no case passes nothing: `0 passed, 0 failed` said nothing of the file
        raise ArtifactError(f"{where}: expected at least one case")
    for i, case in enumerate(cases):  # before any runner sees them (ONNX Runtime's own errors are many lines)
        if not case.name or not case.name.isprintable():  # printed in every result line, as the C runner has it
            problem: str | None = f"name: expected printable text, got {case.name!r}"
        elif not case.prompt_ids:
            problem = "expected at least one prompt id, got none"
        elif len(case.prompt_ids) > manifest.shapes.context_length:  # the model has no position past it
            problem = (f"expected at most context_length {manifest.shapes.context_length} prompt ids, got "
                       f"{len(case.prompt_ids)}")
        else:
            problem = id_problem(case.prompt_ids, manifest.shapes.vocab_size, repr)
        if problem is not None:
            raise ArtifactError(f"{where}: cases[{i}]: {problem}")
    return GoldenGenerations(Tolerance.from_dict(get(doc, "tolerance", dict, where)), cases, doc)


def first_logits(folder: Path, manifest: GPTManifest, case: GoldenGeneration, vocab_size: int) -> np.ndarray:
    """A case's expected (V,) first-step logits, from its sha256-checked .bin."""
    data = read_verified(folder, f"golden/{case.first_logits_bin}", manifest)
    if len(data) != 4 * vocab_size:
        raise ArtifactError(f"{folder}/golden/{case.first_logits_bin}: expected {4 * vocab_size} bytes "
                            f"({vocab_size} float32), got {len(data)}")
    return np.frombuffer(data, dtype="<f4").astype(np.float32)
