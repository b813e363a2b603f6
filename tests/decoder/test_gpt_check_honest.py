"""A check that cannot be fooled (issue 56): a hostile edit of a GPT folder's re-sealable records (manifest.json's
quality figures, bar, dtype, tolerance and plan; a golden file's tolerance, re-sealed) makes `mha check` fail with
a line naming what was edited, and `mha inspect` shows the contract's and the graph's values, never the edit.

Each test edits a copy of gpt-mini (artifacts/gpt-mini when it is this tree's export) from which the forms no edit
here touches are dropped from the manifest's artifacts, so that each check runs in seconds."""
from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner, Result

from helpers import reseal
from mha_runtime.cli.main import cli
from mha_runtime.decoder.contract import INPLACE_FORM, INT4_FORM, INT8_FORM
from mha_runtime.decoder.forms import FORMS
from mha_runtime.decoder.graph_plan import GATHER_QUANTIZED, MATMUL_NBITS, read_graph_plan
from mha_runtime.decoder.manifest import load_gpt_manifest
from mha_runtime.decoder.quality import Quality
from mha_runtime.decoder.record_check import plan_problems


def copy_with(gpt_mini: Path, tmp_path: Path, *forms: str) -> Path:
    """A copy of gpt-mini whose manifest keeps only the artifacts entries of gpt.inplace.onnx and `forms` (every
    file stays listed and sealed)."""
    folder = Path(shutil.copytree(gpt_mini, tmp_path / "gpt-mini"))
    doc = manifest_doc(folder)
    doc["artifacts"] = {f: a for f, a in doc["artifacts"].items() if f in (INPLACE_FORM, *forms)}
    write_manifest(folder, doc)
    return folder


def manifest_doc(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "manifest.json").read_text())  # NaN and Infinity too, as every JSON reader here


def write_manifest(folder: Path, doc: dict[str, Any]) -> None:
    (folder / "manifest.json").write_text(json.dumps(doc, indent=2) + "\n")


def edit_entry(folder: Path, form: str, *path: str, value: object) -> None:
    """Set artifacts[form][path...] = value in manifest.json (not listed in itself: nothing to re-seal)."""
    doc = manifest_doc(folder)
    node = doc["artifacts"][form]
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    write_manifest(folder, doc)


def check(folder: Path) -> Result:
    return CliRunner().invoke(cli, ["check", str(folder)])


def inspect(folder: Path) -> str:
    result = CliRunner().invoke(cli, ["inspect", str(folder)])
    assert result.exit_code == 0, result.output
    return result.stdout


def failed_lines(result: Result) -> list[str]:
    """The FAIL lines of `mha check`, after asserting it failed in its own words (no traceback)."""
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output and "internal error" not in result.output, result.output
    return [line for line in result.stdout.splitlines() if line.startswith("FAIL")]


def test_an_unedited_copy_passes_and_inspect_shows_the_contract(gpt_mini: Path, tmp_path: Path) -> None:
    folder = copy_with(gpt_mini, tmp_path, INT8_FORM, INT4_FORM)
    result = check(folder)
    assert result.exit_code == 0, result.stdout[-3000:]
    shown = inspect(folder)
    for form in (INT8_FORM, INT4_FORM):
        line = next(x for x in shown.splitlines() if x.startswith(f"{form}:"))
        assert f"(bar {FORMS[form].max_mean_kl:g})" in line and "from the graph: MatMulNBits" in line


# (edit of the int8 entry's quality, the figure the failed line must name). The first group is refused before any
# measurement (impossible figures, a count that is not the windows'); the second is measured and compared.
QUALITY_EDITS = [
    ({"mean_kl": math.inf}, "mean_kl"),
    ({"mean_kl": math.nan}, "mean_kl"),
    ({"mean_kl": -1e-6}, "mean_kl"),
    ({"p99_kl": math.inf}, "p99_kl"),
    ({"max_kl": 0.0}, "max_kl"),  # below the mean and p99
    ({"max_kl": math.inf}, "max_kl"),  # above the others, as a max is: only the finiteness rule refuses it
    ({"same_top": 1.5}, "same_top"),
    ({"same_top": math.nan}, "same_top"),
    ({"positions": 0}, "positions"),
    ({"positions": 1025}, "positions"),
    ({"perplexity": math.inf}, "perplexity"),
    ({"perplexity": None}, "perplexity"),
    ({"bar_mean_kl": 1.0}, "bar_mean_kl"),
]
MEASURED_EDITS = [
    (lambda q: {"same_top": q["same_top"] + 0.05 if q["same_top"] <= 0.95 else 1.0}, "same_top"),  # up
    (lambda q: {"same_top": q["same_top"] - 0.05}, "same_top"),  # down
    (lambda q: {"mean_kl": q["mean_kl"] * 2}, "mean_kl"),
    (lambda q: {"p99_kl": q["max_kl"]}, "p99_kl"),
    (lambda q: {"max_kl": q["max_kl"] * 3}, "max_kl"),
    (lambda q: {"perplexity": q["perplexity"] * 1.5}, "perplexity"),
]


@pytest.mark.parametrize("edit,figure", QUALITY_EDITS, ids=[json.dumps(e) for e, _ in QUALITY_EDITS])
def test_an_impossible_or_foreign_quality_figure_fails_check(gpt_mini: Path, tmp_path: Path,
                                                             edit: dict[str, Any], figure: str) -> None:
    folder = copy_with(gpt_mini, tmp_path, INT8_FORM)
    doc = manifest_doc(folder)
    doc["artifacts"][INT8_FORM]["quality"] |= edit
    write_manifest(folder, doc)
    failed = failed_lines(check(folder))
    assert failed and all(INT8_FORM in line for line in failed), failed
    assert any(figure in line for line in failed), failed
    if figure == "bar_mean_kl":  # refused twice: by the manifest's record check and by the quality judge
        assert any("at most the contract's" in line for line in failed) and any(
            "is not a bar the contract allows" in line for line in failed), failed
    shown = inspect(folder)
    # the folder's recorded bar is shown where the contract allows it (at most its ceiling), "?" where not
    bar = "?" if figure == "bar_mean_kl" else f"{FORMS[INT8_FORM].max_mean_kl:g}"
    assert f"(bar {bar})" in shown and "bar 1)" not in shown
    row = next(x for x in shown.splitlines() if x.startswith(INT8_FORM)).split()
    if figure != "bar_mean_kl":  # the figures are refused, so not shown as figures (the table's KL column: "-")
        assert row[7:9] == ["-", "-"] and "recorded quality refused" in shown, row


@pytest.mark.parametrize("edit,figure", MEASURED_EDITS,
                         ids=["same_top up", "same_top down", "mean_kl x2", "p99_kl = max", "max_kl x3",
                              "perplexity x1.5"])
def test_a_recorded_figure_the_form_does_not_reproduce_fails_check(gpt_mini: Path, tmp_path: Path, edit: Any,
                                                                   figure: str) -> None:
    """Every recorded figure is compared with the re-measurement, an edit upward as one downward."""
    folder = copy_with(gpt_mini, tmp_path, INT8_FORM)
    doc = manifest_doc(folder)
    quality = doc["artifacts"][INT8_FORM]["quality"]
    quality |= edit(quality)
    Quality.from_dict(quality, "edited")  # a possible figure: the re-measurement is what refuses it
    write_manifest(folder, doc)
    failed = failed_lines(check(folder))
    assert len(failed) == 1 and " quality " in failed[0] and f"{figure}: measured" in failed[0], failed


@pytest.mark.parametrize("form,path,value,named", [
    (INT4_FORM, ("dtype",), "fp32", "dtype: expected 'int4'"),
    (INT8_FORM, ("tolerance", "atol"), math.inf, "tolerance: expected the contract's atol=0.001"),
    (INT4_FORM, ("quantization", "bits"), 2, "quantization.bits: expected the contract's 4"),
    (INT4_FORM, ("quantization", "kept"), lambda kept: {} if kept else {"h0.fc.weight": "int8"},
     "quantization: the recorded plan disagrees with the graph"),
    (INT8_FORM, ("quantization", "block_size"), 32, "quantization: the recorded plan disagrees with the graph"),
    (INT8_FORM, ("quantization", "kept"), {"h0.fc.weight": "fp32"}, "h0.fc.weight"),
    (INT8_FORM, ("generations",), "golden/generations.json", "generations: expected"),
], ids=["dtype", "tolerance", "bits", "kept", "block_size", "kept fp32", "generations"])
def test_an_entry_unlike_the_contract_or_the_graph_fails_check(gpt_mini: Path, tmp_path: Path, form: str,
                                                               path: tuple[str, ...], value: object,
                                                               named: str) -> None:
    folder = copy_with(gpt_mini, tmp_path, form)
    if callable(value):  # an edit of what the export recorded
        recorded: Any = manifest_doc(folder)["artifacts"][form]
        for key in path:
            recorded = recorded[key]
        value = value(recorded)
    edit_entry(folder, form, *path, value=value)
    failed = failed_lines(check(folder))
    assert [line for line in failed if " manifest " in line and named in line], failed
    shown = inspect(folder)
    table = next(x for x in shown.splitlines() if x.startswith(form))
    assert table.split()[1] == FORMS[form].dtype  # the contract's dtype, not the entry's
    assert "2 bits" not in shown and "kept at fp32: h0.fc.weight" not in shown


def test_a_golden_tolerance_edited_and_resealed_fails_check(gpt_mini: Path, tmp_path: Path) -> None:
    """golden/generations.int8.json with atol Infinity and its first-step logits zeroed, every file re-sealed: the
    file's tolerance is a failed line of its own, and its cases are compared at the contract's row (and fail)."""
    folder = copy_with(gpt_mini, tmp_path, INT8_FORM)
    file = "golden/generations.int8.json"
    doc = json.loads((folder / file).read_text())
    doc["tolerance"]["atol"] = math.inf
    (folder / file).write_text(json.dumps(doc))
    zeroed = [f"golden/{c['first_logits_bin']}" for c in doc["cases"]]
    for name in zeroed:
        (folder / name).write_bytes(np.zeros(len((folder / name).read_bytes()) // 4, "<f4").tobytes())
    reseal(folder, file, *zeroed)
    failed = failed_lines(check(folder))
    assert any(line.split()[1] == file and "expected the contract's tolerance" in line and "atol=inf" in line
               for line in failed), failed
    beyond = [line for line in failed if line.split()[1] == INT8_FORM and "beyond tolerance" in line]
    assert len(beyond) == len(doc["cases"]), failed


def test_the_recorded_plans_are_the_graphs(gpt_mini: Path) -> None:
    """The export's recorded plan of each lossy form is what its graph has (the check's comparison finds nothing),
    and the graph has no MatMul left at fp32 that the plan does not keep."""
    manifest = load_gpt_manifest(gpt_mini)
    for form in (INT8_FORM, INT4_FORM):
        graph = read_graph_plan(gpt_mini / form)
        plan = manifest.artifacts[form].quantization or {}
        assert plan_problems(plan, graph) == []
        assert {q.bits for q in graph.quantized.values()} >= {FORMS[form].bits}
        assert sorted(graph.fp32) == sorted(w for w, p in plan["kept"].items() if p == "fp32")
    assert read_graph_plan(gpt_mini / INPLACE_FORM).quantized == {}


def test_graph_plan_reads_matmulnbits_and_a_quantized_gather(tmp_path: Path) -> None:
    """A hand-built graph (onnx.helper): a MatMulNBits with zero points, one without, a GatherBlockQuantized, an
    fp32 MatMul weight; the reader finds each with its bits, block size and symmetry, under the fp32 name."""
    import onnx
    from onnx import TensorProto, helper

    def init(name: str, dims: list[int], dtype: int = TensorProto.FLOAT) -> TensorProto:
        return helper.make_tensor(name, dtype, dims, np.zeros(int(np.prod(dims))).tolist())

    nodes = [
        helper.make_node(MATMUL_NBITS, ["x", "a_Q4", "a_scales", "a_zero_points"], ["y1"], domain="com.microsoft",
                         K=32, N=8, bits=4, block_size=32, accuracy_level=4),
        helper.make_node(MATMUL_NBITS, ["x", "b_Q8", "b_scales"], ["y2"], domain="com.microsoft", K=32, N=8,
                         bits=8, block_size=16, accuracy_level=4),
        helper.make_node(GATHER_QUANTIZED, ["emb_Q4", "ids", "emb_scales"], ["e"], domain="com.microsoft",
                         bits=4, block_size=64, gather_axis=0, quantize_axis=1),
        helper.make_node("MatMul", ["x", "c"], ["y3"]),
        helper.make_node("MatMul", ["x", "x"], ["y4"]),  # not a weight
    ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32])], [],
                              initializer=[init("c", [32, 8])])
    onnx.save(helper.make_model(graph), tmp_path / "m.onnx")
    plan = read_graph_plan(tmp_path / "m.onnx")
    got = {n: (q.op, q.bits, q.block_size, q.symmetric) for n, q in plan.quantized.items()}
    assert got == {"a": (MATMUL_NBITS, 4, 32, False), "b": (MATMUL_NBITS, 8, 16, True),
                   "emb": (GATHER_QUANTIZED, 4, 64, True)}
    assert plan.fp32 == ["c"]
    assert "GatherBlockQuantized 4 bits in blocks of 64" in plan.line()


def test_the_native_runners_contract_rows_are_the_contracts() -> None:
    """The C and JavaScript runners compare golden logits with their own copy of the contract's tolerance row (they
    read no Python): each copy equals FORMS' row of every form they check."""
    import re

    from helpers import REPO
    from mha_runtime.artifact.tolerance import Tolerance
    from mha_runtime.decoder.contract import CONCAT_FORM

    header = (REPO / "runtime/native/c/gpt.h").read_text()
    c_row = Tolerance(atol=float(re.search(r"#define MHA_GPT_ATOL (\S+)", header)[1]),  # type: ignore[index]
                      rtol=float(re.search(r"#define MHA_GPT_RTOL (\S+)", header)[1]))  # type: ignore[index]
    base = (REPO / "runtime/native/common/gpt/base.mjs").read_text()
    js = re.search(r"CONTRACT_TOLERANCE = Object\.freeze\(\{ atol: (\S+), rtol: (\S+), rel_l2: null \}\)", base)
    assert js is not None
    js_row = Tolerance(atol=float(js[1]), rtol=float(js[2]))
    assert all(FORMS[f].tolerance == c_row for f in (INPLACE_FORM, INT8_FORM, INT4_FORM))
    assert all(FORMS[f].tolerance == js_row for f in (CONCAT_FORM, INPLACE_FORM, INT8_FORM, INT4_FORM))


def test_inspect_shows_the_distance_from_eager_of_the_golden_files_not_the_manifests(gpt_mini: Path,
                                                                                     tmp_path: Path) -> None:
    """The export's validation figures (max_abs_error, greedy_agreement, cases) are records no check measures
    again: edited, inspect's output does not move. What it shows of a lossy form's distance from eager is read from
    the golden files `mha check` runs it on, recomputed here from their .npy copies with numpy alone."""
    folder = copy_with(gpt_mini, tmp_path, INT8_FORM, INT4_FORM)
    before = inspect(folder)
    doc = manifest_doc(folder)
    for form in (INPLACE_FORM, INT8_FORM, INT4_FORM):
        doc["artifacts"][form] |= {"max_abs_error": 1e9, "greedy_agreement": 0.5, "cases": 7}
    write_manifest(folder, doc)
    assert inspect(folder) == before
    eager = {c["name"]: c for c in json.loads((folder / "golden/generations.json").read_text())["cases"]}
    for form in (INT8_FORM, INT4_FORM):
        own = json.loads((folder / doc["artifacts"][form]["generations"]).read_text())["cases"]
        far = max(float(np.abs(np.load(folder / "golden" / c["first_logits_npy"])
                               - np.load(folder / "golden" / eager[c["name"]]["first_logits_npy"])).max())
                  for c in own)
        same = sum(c["ids"] == eager[c["name"]]["ids"] for c in own)
        row = next(x for x in before.splitlines() if x.startswith(form)).split()
        assert row[4:7] == [str(len(own)), f"{far:.2e}", f"{same}/{len(own)}"], row
    fp32 = next(x for x in before.splitlines() if x.startswith(INPLACE_FORM + " ")).split()
    assert fp32[5:7] == [f"<={FORMS[INPLACE_FORM].tolerance.atol:g}", "all"], fp32
