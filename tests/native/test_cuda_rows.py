"""What the CUDA provider was measured to do (docs/measurements/cuda.md), held on a machine without a GPU.

An H200 showed three things no CPU run can: TF32 on by default (fp32 forms 40-80x past their row), forms ONNX Runtime
cannot run there (blocks and int8: its CUDA MultiHeadAttention fails on one token; decode-inplace: wrong outputs),
and lossy GPT forms whose CPU-recorded ids CUDA's kernels do not repeat. These tests hold the decisions taken on
them. Here ONNX Runtime is told it has CUDA (`cuda_listed`); a session asked for CUDA then runs on its CPU, which
is enough to see what is refused, what is skipped and what is judged by which rule.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from click.testing import CliRunner

from mha_runtime.artifact.errors import ProviderError
from mha_runtime.attention.golden_check import check_onnx_artifacts
from mha_runtime.attention.inplace_session import InPlaceDecodeSession
from mha_runtime.attention.registry import VARIANTS
from mha_runtime.attention.runner import OnnxRunner
from mha_runtime.cli.main import cli
from mha_runtime.decoder.contract import INT8_FORM
from mha_runtime.decoder.forms import FORMS
from mha_runtime.decoder.golden_check import LOSSY_ON_CUDA, check_generations
from mha_runtime.infer.providers import session_providers

CPU_ONLY = ("mha.blocks.onnx", "mha.int8.onnx", "mha.decode-inplace.onnx")
# onnxruntime (CPU) warns that the CUDA provider asked for is not there, and runs on its CPU: what these tests use.
pytestmark = pytest.mark.filterwarnings("ignore:Specified provider 'CUDAExecutionProvider':UserWarning")


@pytest.fixture
def cuda_listed(monkeypatch: pytest.MonkeyPatch) -> None:
    """onnxruntime lists CUDA (as onnxruntime-gpu does); sessions that ask for it still run on the CPU here."""
    listed = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    monkeypatch.setattr(ort, "get_available_providers", lambda: listed)


def test_cuda_sessions_keep_float32() -> None:
    """TF32 (ONNX Runtime's CUDA default) put the fp32 forms 40-80x past 1e-5 on the H200; off, they were within
    8.3e-7 of eager PyTorch."""
    cuda, cpu = session_providers("cuda")
    assert cuda == ("CUDAExecutionProvider", {"use_tf32": "0"}) and cpu == "CPUExecutionProvider"
    assert session_providers("cpu") == ["CPUExecutionProvider"]


def test_the_forms_cuda_cannot_run_are_named_in_the_registry() -> None:
    cpu_only = {v.file for v in VARIANTS.values() if v.cuda is not None}
    assert cpu_only == set(CPU_ONLY)
    assert "MultiHeadAttention" in (VARIANTS["blocks"].cuda or "") and "wrong outputs" in (
        VARIANTS["decode-inplace"].cuda or "")


@pytest.mark.usefixtures("cuda_listed")
@pytest.mark.parametrize("model", CPU_ONLY)
def test_such_a_form_is_refused_for_cuda_in_one_line_and_runs_on_the_cpu_for_auto(mid_dir: Path, model: str) -> None:
    kind = InPlaceDecodeSession if model == "mha.decode-inplace.onnx" else OnnxRunner
    with pytest.raises(ProviderError) as refused:
        kind(mid_dir, model=model, provider="cuda")
    line = str(refused.value)
    assert "\n" not in line and line.startswith(f"{model} runs on the CPU only: ") and "--provider cpu or auto" in line
    runner = OnnxRunner(mid_dir, model=model, provider="auto")
    assert runner.provider == "cpu" and runner.session.get_providers() == ["CPUExecutionProvider"]
    assert OnnxRunner(mid_dir, model="mha.onnx", provider="auto").provider == "cuda"  # the others go to CUDA


@pytest.mark.usefixtures("cuda_listed")
def test_mha_run_refuses_such_a_form_in_one_line(seed_dir: Path, tmp_path: Path) -> None:
    """Exit 1, as for CUDA asked for where there is none (both are ProviderError: the machine, not a typo)."""
    x = tmp_path / "x.npy"
    np.save(x, np.zeros((1, 2, 3), np.float32))
    out = CliRunner().invoke(cli, ["run", str(seed_dir), "--model", "mha.blocks.onnx", "--provider", "cuda",
                                   "--input", str(x), "--output", str(tmp_path / "y.npy")])
    assert out.exit_code == 1, out.output
    assert out.output.count("\n") == 1 and "mha.blocks.onnx runs on the CPU only" in out.output
    assert "Traceback" not in out.output
    assert not (tmp_path / "y.npy").exists()


@pytest.mark.usefixtures("cuda_listed")
def test_check_on_cuda_skips_those_forms_with_the_reason_and_runs_the_rest(mid_dir: Path) -> None:
    results = check_onnx_artifacts(mid_dir, provider="cuda")
    skipped = {r.artifact for r in results if r.skipped}
    assert skipped == set(CPU_ONLY)
    assert all((r.error or "").startswith("runs on the CPU only: ") for r in results if r.skipped)
    ran = {r.artifact for r in results if not r.skipped}
    assert {"mha.onnx", "mha.fused.onnx", "mha.qblocks.onnx", "mha.decode.onnx"} <= ran
    assert all(r.ok for r in results if not r.skipped)


@pytest.mark.usefixtures("cuda_listed")
def test_lossy_gpt_forms_are_judged_on_cuda_by_their_bar_not_by_cpu_ids(hf_gpt: tuple[object, Path],
                                                                       tmp_path: Path) -> None:
    """On CUDA a lossy form's golden cases (the CPU kernels' ids) are skipped with the reason, and its quality is
    held to its bar, not to the CPU-recorded figure: a manifest claiming a 10x smaller mean KL fails on the CPU
    (tests/decoder/test_gpt_quality.py) and passes here. The fp32 forms keep their golden cases."""
    folder = Path(shutil.copytree(hf_gpt[1], tmp_path / "copy"))
    doc = json.loads((folder / "manifest.json").read_text())
    doc["artifacts"][INT8_FORM]["quality"]["mean_kl"] /= 10
    (folder / "manifest.json").write_text(json.dumps(doc))
    results = check_generations(folder, provider="cuda")
    lossy = {f for f in FORMS if FORMS[f].lossy}
    for r in results:
        if r.artifact in lossy and r.case != "quality":
            assert r.skipped and r.error == LOSSY_ON_CUDA, r.line()
        else:
            assert r.ok and not r.skipped, r.line()
    assert {r.artifact for r in results if r.case == "quality"} == lossy & set(doc["artifacts"])
