"""A GPT folder's manifest entries against the contract and the graphs (torch-free).

manifest.json lists every file's sha256 but is not listed in itself: anyone can edit it and re-seal the folder.
So nothing it records is a tolerance or a bar: each entry's kind, dtype and tolerance, and a lossy form's quality
bar, bits and own golden file, must be the contract's (mha_runtime.decoder.contract), and a lossy ONNX form's recorded
quantization plan must be the plan its graph has (mha_runtime.decoder.graph_plan). `mha check` reports each
disagreement as one failed line; `mha inspect` shows the contract's rows and the graph's plan, never the entry's
own claims.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from mha_runtime.artifact.errors import MHAError, first_line
from mha_runtime.artifact.tolerance import Tolerance
from mha_runtime.decoder.contract import PTE_FORM
from mha_runtime.decoder.forms import BAR_CEILING, FORMS, GGUF_FORMS, PTE, Form, folder_bar
from mha_runtime.decoder.golden import generations_file
from mha_runtime.decoder.graph_plan import MATMUL_NBITS, GraphPlan, Quantized, read_graph_plan
from mha_runtime.decoder.manifest import GPTArtifact

FP32, INT8 = "fp32", "int8"  # the precisions a plan keeps a matrix at (mha_export.decoder.lossy.quantize)
_PLAN_FIELDS: dict[str, type] = {"bits": int, "block_size": int, "symmetric": bool, "accuracy_level": int,
                                 "kept": dict, "finer": dict}


def contract_form(file: str) -> Form | None:
    """The contract's row of a decoder file the folder lists, or None for a file the contract does not know."""
    return (FORMS | GGUF_FORMS | {PTE_FORM: PTE}).get(file)


def tolerance_words(tolerance: Tolerance) -> str:
    l2 = "" if tolerance.rel_l2 is None else f" rel_l2={tolerance.rel_l2:g}"
    return f"atol={tolerance.atol:g} rtol={tolerance.rtol:g}{l2}"


def entry_problems(folder: Path, file: str, entry: GPTArtifact) -> list[str]:
    """Each way the manifest's entry of `file` differs from the contract (and, for a lossy ONNX form, its plan
    from its graph), one line each."""
    form = contract_form(file)
    if form is None:
        return []
    out = [f"{field}: expected {want!r} (the contract's), got {got!r}"
           for field, want, got in (("kind", form.kind, entry.kind), ("dtype", form.dtype, entry.dtype))
           if want != got]
    try:
        recorded = Tolerance.from_dict(entry.tolerance, "tolerance")
    except MHAError as exc:
        recorded = None
        out.append(first_line(exc))
    if recorded is not None and recorded != form.tolerance:
        out.append(f"tolerance: expected the contract's {tolerance_words(form.tolerance)}, got "
                   f"{tolerance_words(recorded)}")
    if form.lossy:
        out += _lossy_problems(folder, form, entry)
    elif entry.quality is not None or entry.quantization is not None:
        out.append(f"expected no quality figures or quantization plan (the contract's {form.dtype} form)")
    return out


def _lossy_problems(folder: Path, form: Form, entry: GPTArtifact) -> list[str]:
    out = []
    bar = (entry.quality or {}).get("bar_mean_kl")
    if folder_bar(form, bar) is None:
        out.append(f"quality.bar_mean_kl: expected a bar above 0 and at most the contract's "
                   f"{BAR_CEILING[form.bits or 0]:g}, got {bar!r}")
    if entry.generations != generations_file(form.file):
        out.append(f"generations: expected {generations_file(form.file)!r} (its own), got {entry.generations!r}")
    plan = entry.quantization or {}
    if plan.get("bits") != form.bits or isinstance(plan.get("bits"), bool):
        out.append(f"quantization.bits: expected the contract's {form.bits}, got {plan.get('bits')!r}")
    elif form.file in FORMS:  # an ONNX graph to read; a GGUF file's tensor types are llama.cpp's to check
        try:
            out += plan_problems(plan, read_graph_plan(folder / form.file))
        except MHAError as exc:
            out.append(first_line(exc))
    return out


def expected_setting(plan: dict[str, Any], weight: str) -> Quantized | None:
    """How the recorded `plan` says `weight` is quantized (None: kept at fp32), as mha_export.decoder.lossy.quantize
    writes it: a weight kept at int8 is 8 bits, symmetric; each at its `finer` block, else the plan's."""
    kept, block = plan["kept"].get(weight), plan["finer"].get(weight, plan["block_size"])
    if kept == FP32:
        return None
    if kept == INT8:
        return Quantized(MATMUL_NBITS, 8, block, True, plan["accuracy_level"])
    return Quantized(MATMUL_NBITS, plan["bits"], block, plan["symmetric"], plan["accuracy_level"])


def _words(q: Quantized | None) -> str:
    return "fp32" if q is None else f"{q.words()}, accuracy level {q.accuracy_level}"


def plan_problems(plan: dict[str, Any], graph: GraphPlan) -> list[str]:
    """Where the recorded quantization `plan` disagrees with the graph's, one line (the first weight named and
    how many disagree); a quantized gather (GatherBlockQuantized) is compared where the plan names it."""
    for name, kind in _PLAN_FIELDS.items():
        value = plan.get(name)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            return [f"quantization.{name}: expected {kind.__name__}, got {value!r}"]
    kept, finer = plan["kept"], plan["finer"]
    if any(v not in (FP32, INT8) for v in kept.values()) or any(
            not isinstance(v, int) or isinstance(v, bool) for v in finer.values()):
        return [f"quantization: expected kept values {FP32!r} or {INT8!r} and finer values block sizes, got kept "
                f"{kept!r}, finer {finer!r}"]
    matmuls = {n: q for n, q in graph.quantized.items() if q.op == MATMUL_NBITS} | dict.fromkeys(graph.fp32)
    named = set(kept) | set(finer)
    gathers = {n: q for n, q in graph.quantized.items() if q.op != MATMUL_NBITS}
    wrong = [f"{n}: recorded {_words(expected_setting(plan, n))}, the graph has {_words(q)}"
             for n, q in matmuls.items() if expected_setting(plan, n) != q]
    for n, q in gathers.items():  # compared by name where the plan names it (its symmetry and level: the gather's)
        e = expected_setting(plan, n) if n in named else q
        if e is None or (e.bits, e.block_size) != (q.bits, q.block_size):
            wrong.append(f"{n}: recorded {_words(e)}, the graph's {q.op} has {q.bits} bits in blocks of {q.block_size}")
    # A name the plan quantizes must be in the graph. One it keeps at fp32 may not be, by that name: a tied head kept
    # at fp32 reads the embedding itself (a Gemm of tok_emb), so there is no head MatMul to find.
    missing = sorted(n for n in named - set(matmuls) - set(gathers) if kept.get(n) != FP32)
    if missing:
        wrong.append(f"{missing[0]}: named by the recorded plan, not a quantized or fp32 weight of the graph")
    wrong += _embedding_problems(plan.get("embedding"), list(gathers.values()))
    if not wrong:
        return []
    return [f"quantization: the recorded plan disagrees with the graph on {len(wrong)} weight(s): {wrong[0]}"]


def _embedding_problems(embedding: Any, gathers: list[Quantized]) -> list[str]:
    """The recorded token embedding storage ({"dtype": "fp32" | "int8" | "int4", "block_size", "symmetric"}, as
    mha_export.decoder.lossy.quantize records it; absent in folders made before it) against the graph's quantized
    gathers: none for fp32, else exactly one of those bits, block size and symmetry."""
    if embedding is None:
        return []
    dtype = embedding.get("dtype") if isinstance(embedding, dict) else None
    if dtype == FP32:
        return [f"embedding: recorded fp32, the graph has {len(gathers)} GatherBlockQuantized"] if gathers else []
    if dtype not in ("int8", "int4"):
        return [f"embedding: expected a dtype 'fp32', 'int8' or 'int4', got {embedding!r}"]
    want = (int(dtype[3:]), embedding.get("block_size"), embedding.get("symmetric"))
    got = [(q.bits, q.block_size, q.symmetric) for q in gathers]
    if got != [want]:
        return [f"embedding: recorded {want[0]} bits in blocks of {want[1]}, symmetric {want[2]}; the graph's "
                f"GatherBlockQuantized: {got or 'none'} (bits, block, symmetric)"]
    return []
