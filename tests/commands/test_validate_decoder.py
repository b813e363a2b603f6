"""`mha validate` of a decoder folder: eager PyTorch rebuilt from the folder's config and gpt.safetensors, every fp32
ONNX form judged against it again, every lossy form's quality measured again against its bar and its record. Weights
altered and re-sealed, or a quality record that is not what the form measures, fail it."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from click.testing import CliRunner, Result
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from mha_runtime.artifact.manifest import sha256_file
from mha_runtime.cli.main import cli
from mha_runtime.decoder.contract import WEIGHTS_FILE
from mha_runtime.decoder.forms import FORMS
from mha_runtime.decoder.quality import KL_AGREEMENT, KL_FLOOR


def _validate(folder: Path) -> Result:
    return CliRunner().invoke(cli, ["validate", str(folder)])


def _copy(folder: Path, tmp_path: Path) -> Path:
    copy = tmp_path / folder.name
    shutil.copytree(folder, copy, symlinks=True)
    return copy


def _rows(result: Result) -> dict[str, list[str]]:
    """The table's rows by artifact."""
    return {line.split()[0]: line.split() for line in result.stdout.splitlines()[1:-1]}


def test_a_decoder_folder_validates_every_form_it_holds(book_gpt: tuple[object, Path]) -> None:
    folder = book_gpt[1]
    manifest = json.loads((folder / "manifest.json").read_text())
    forms = [f for f in FORMS if f in manifest["artifacts"]]
    assert any(FORMS[f].lossy for f in forms) and any(not FORMS[f].lossy for f in forms)
    result = _validate(folder)
    assert result.exit_code == 0, result.output
    rows = _rows(result)
    assert list(rows) == forms and all(row[-1] == "ok" for row in rows.values())
    # the export's cases again (and each fp32 form's greedy run), each lossy form's quality
    checks = {f: manifest["artifacts"][f]["cases"] + 1 if not FORMS[f].lossy else 1 for f in forms}
    assert {f: int(row[2]) for f, row in rows.items()} == checks
    assert result.stdout.splitlines()[-1] == f"{sum(checks.values())} passed, 0 failed"
    for f in forms:  # a lossy form's mean KL measured again: the recorded one (the same kernels, the same windows)
        if FORMS[f].lossy:
            recorded = manifest["artifacts"][f]["quality"]["mean_kl"]  # within the check's own agreement rule
            assert abs(float(rows[f][5]) - recorded) <= KL_AGREEMENT * recorded + KL_FLOOR
    not_onnx = [f for f in manifest["artifacts"] if f not in FORMS]  # gpt.pte where ExecuTorch is installed
    assert all(f"note: {f}: not rerun here" in result.stderr for f in not_onnx)


def test_weights_altered_and_resealed_fail_every_fp32_form(book_gpt: tuple[object, Path], tmp_path: Path) -> None:
    """gpt.safetensors changed and its sha256 written into the manifest: the files all verify, but eager PyTorch
    rebuilt from those weights is no longer what the ONNX forms compute."""
    folder = _copy(book_gpt[1], tmp_path)
    weights = folder / WEIGHTS_FILE
    with safe_open(str(weights), "pt") as handle:
        metadata = handle.metadata()
    state = load_file(weights)
    state["final_norm.scale"] = state["final_norm.scale"] * 1.5
    save_file(state, str(weights), metadata=metadata)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"][WEIGHTS_FILE] |= {"sha256": sha256_file(weights), "size": weights.stat().st_size}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    result = _validate(folder)
    assert result.exit_code == 1, result.output
    rows = _rows(result)
    fp32 = [f for f in rows if not FORMS[f].lossy]
    assert fp32 and all(rows[f][-1] == "FAIL" for f in fp32)
    passed, failed = (int(n) for n in result.stdout.splitlines()[-1].replace(",", "").split()[::2])
    assert failed > 0 and passed + failed == sum(int(row[2]) for row in rows.values())
    assert "validation failed:" in result.stderr and f"{fp32[0]} prefill B=1" in result.stderr


def test_a_lossy_forms_quality_is_measured_again(book_gpt: tuple[object, Path], tmp_path: Path) -> None:
    """A recorded mean KL that is not what the form measures (manifest.json is not listed in itself) fails."""
    folder = _copy(book_gpt[1], tmp_path)
    manifest = json.loads((folder / "manifest.json").read_text())
    lossy = next(f for f in FORMS if FORMS[f].lossy and f in manifest["artifacts"])
    manifest["artifacts"][lossy]["quality"]["mean_kl"] /= 3  # still under its bar
    (folder / "manifest.json").write_text(json.dumps(manifest))
    result = _validate(folder)
    assert result.exit_code == 1, result.output
    assert _rows(result)[lossy][-1] == "FAIL" and result.stdout.splitlines()[-1].endswith(" 1 failed")
    assert f"{lossy} quality: quality differs from the recorded figures" in result.stderr
