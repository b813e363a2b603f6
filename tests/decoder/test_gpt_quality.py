"""The lossy GPT forms (int8, int4) judged as llama.cpp judges its quants: the KL divergence of the next-token
distribution from fp32's. The measure against scipy on transformers' logits; the default export of real Hugging
Face checkpoints; a form that cannot meet its bar; `mha check` and `mha inspect` on the recorded figures."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.special import softmax
from scipy.stats import entropy

from gpt_sources import save_hf
from mha_export.decoder.archs.gpt2.config import GPTConfig
from mha_export.decoder.lossy.quantize import FAST, FINE
from mha_runtime.decoder.contract import INPLACE_FORM, INT4_FORM, INT8_FORM
from mha_runtime.decoder.forms import FORMS
from mha_runtime.decoder.generate import Generator
from mha_runtime.decoder.golden_check import check_generations
from mha_runtime.decoder.manifest import load_gpt_manifest
from mha_runtime.decoder.quality import QUALITY_FILE, Quality, kl_divergence, load_windows

MHA = [sys.executable, "-m", "mha_runtime"]
LOSSY = (INT8_FORM, INT4_FORM)
# GPT-2's vocabulary and head count, few layers and a short context: the real checkpoint format and init at a
# size the suite can export in seconds.
SHAPE = {"vocab_size": 50257, "n_positions": 64, "n_embd": 64, "n_layer": 2, "n_head": 4}


def mha(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*MHA, *map(str, args)], capture_output=True, text=True, timeout=900)


def gpt2_checkpoint(folder: Path, *, initializer_range: float = 0.02, seed: int = 3) -> Path:
    """transformers' GPT2LMHeadModel with its own initialisation, saved by save_pretrained."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(**SHAPE, initializer_range=initializer_range, resid_pdrop=0.0, embd_pdrop=0.0,
                        attn_pdrop=0.0)
    return save_hf(GPT2LMHeadModel(config).eval(), folder, safetensors=True)


def assert_meets_bars(folder: Path) -> list[str]:
    """Every lossy form the folder has meets its bar, as recorded; returns those forms."""
    manifest = load_gpt_manifest(folder)
    written = [f for f in LOSSY if f in manifest.artifacts]
    for form in written:
        quality = Quality.from_dict(manifest.artifacts[form].quality, form)
        assert FORMS[form].meets_bar(quality.mean_kl), (form, quality)
        assert (folder / form).is_file()
    assert not [f for f in LOSSY if f not in manifest.artifacts and (folder / f).exists()]
    return written


def test_kl_divergence_equals_scipy() -> None:
    rng = np.random.default_rng(0)
    p, q = rng.normal(0, 3, (5, 300)), rng.normal(0, 3, (5, 300))
    expected = [entropy(softmax(a), softmax(b)) for a, b in zip(p, q, strict=True)]
    np.testing.assert_allclose(kl_divergence(p, q), expected, rtol=1e-9)
    assert np.all(kl_divergence(p, p) < 1e-12)


def test_recorded_quality_equals_scipy_on_transformers_logits(hf_gpt: tuple[torch.nn.Module, Path]) -> None:
    """The manifest's figures for each lossy form, recomputed without the measure's code: transformers' logits as
    the reference, each form's logits from a prefill of every prefix (no stepping), scipy's KL divergence."""
    model, folder = hf_gpt
    manifest = load_gpt_manifest(folder)
    windows = load_windows(folder, manifest)
    half = len(windows.ids[0]) // 2
    with torch.no_grad():
        ref = model(torch.tensor(windows.ids)).logits.numpy()  # (N, W, V)
    for form in LOSSY:
        gen = Generator(folder, form=form)
        kls, same = [], []
        for row, window in enumerate(windows.ids):
            for t in range(half, len(window)):  # the logits after tokens 0..t-1, predicting token t
                got = gen.decoder().prefill([window[:t]])[0]
                kls.append(entropy(softmax(ref[row, t - 1].astype(np.float64)), softmax(got.astype(np.float64))))
                same.append(int(np.argmax(ref[row, t - 1])) == int(np.argmax(got)))
        recorded = Quality.from_dict(manifest.artifacts[form].quality, form)
        assert recorded.positions == len(kls)
        # The reference differs (transformers vs gpt.inplace.onnx, 1e-6 apart): a relative 1% on the KL figures.
        np.testing.assert_allclose([recorded.mean_kl, recorded.p99_kl, recorded.max_kl],
                                   [np.mean(kls), np.quantile(kls, 0.99), np.max(kls)], rtol=1e-2)
        assert abs(recorded.same_top - float(np.mean(same))) <= 2 / len(same)
        assert recorded.mean_kl > 0


def test_default_export_of_gpt2_checkpoints_meets_every_bar(tmp_path: Path) -> None:
    """transformers' default initialisation, then the wider one (initializer_range 0.2, whose 8- and 4-bit forms
    move the distribution more): `mha export --gpt` with the default variants exits 0 both times, every lossy form
    it wrote meets its bar, and a form it left out is named in one line."""
    written = {}
    for init in (0.02, 0.2):
        weights = gpt2_checkpoint(tmp_path / f"ckpt{init}", initializer_range=init)
        out = mha("export", "--gpt", "--weights", weights, "--name", "m", "--out", tmp_path / f"art{init}")
        assert out.returncode == 0, out.stderr
        assert "Traceback" not in out.stderr and "internal error" not in out.stderr
        folder = tmp_path / f"art{init}" / "m"
        written[init] = assert_meets_bars(folder)
        left_out = [f for f in LOSSY if f not in written[init]]
        notes = [line for line in out.stderr.splitlines() if line.startswith("note: left out")]
        assert sorted(n.split()[3].rstrip(":") for n in notes) == sorted(left_out), out.stderr
        for note in notes:
            assert "mean KL divergence from fp32" in note and "above its bar" in note
        check = mha("check", folder)
        assert check.returncode == 0, check.stdout[-2000:]
        assert sum(" quality " in line for line in check.stdout.splitlines()) == len(written[init])
    assert written[0.02] == list(LOSSY)  # both forms at transformers' own initialisation


def test_named_lossy_form_that_misses_its_bar_fails_in_one_line(tmp_path: Path) -> None:
    """Weights of a 10x wider spread than GPT-2's: 8 bits move the distribution past the bar even with a quarter of
    the matrices kept in fp32, so `--variants inplace,int8` fails, naming the figure and the bar, and writes
    nothing."""
    weights = gpt2_checkpoint(tmp_path / "ckpt", initializer_range=0.2)
    out = mha("export", "--gpt", "--weights", weights, "--name", "m", "--out", tmp_path / "art",
              "--variants", "inplace,int8")
    assert out.returncode == 1
    errors = [line for line in out.stderr.splitlines() if line.startswith("Error")]
    assert len(errors) == 1 and "Traceback" not in out.stderr, out.stderr
    # one line, the figure and the bar in it: it was "validation failed: 1 case(s) beyond tolerance" and a second line
    assert errors[0].startswith(f"Error: validation failed: {INT8_FORM}: mean KL divergence from fp32 "), errors[0]
    assert "above its bar 0.0003" in errors[0] and out.stderr.rstrip().endswith(errors[0]), out.stderr
    assert not (tmp_path / "art" / "m").exists()


def test_check_fails_when_a_lossy_form_no_longer_reproduces_its_quality(hf_gpt: tuple[torch.nn.Module, Path],
                                                                        tmp_path: Path) -> None:
    """The recorded quality is what `mha check` compares with: a manifest claiming a 10x smaller mean KL (its
    sha256s kept consistent, as a careless re-export would leave them) fails the quality case, and only it."""
    folder = Path(shutil.copytree(hf_gpt[1], tmp_path / "copy"))
    doc = json.loads((folder / "manifest.json").read_text())
    doc["artifacts"][INT8_FORM]["quality"]["mean_kl"] /= 10
    (folder / "manifest.json").write_text(json.dumps(doc))
    results = check_generations(folder)
    failed = [r for r in results if not r.ok]
    assert [(r.artifact, r.case) for r in failed] == [(INT8_FORM, "quality")]
    assert "differs from the recorded figures" in (failed[0].error or "")
    assert all(r.ok for r in results if r.artifact == INT4_FORM)


def test_lossy_golden_generations_are_the_forms_own(hf_gpt: tuple[torch.nn.Module, Path]) -> None:
    """A lossy form's golden ids are what that form generates (not eager PyTorch's), listed with sha256."""
    folder = hf_gpt[1]
    manifest = load_gpt_manifest(folder)
    for form in LOSSY:
        record = manifest.artifacts[form]
        assert record.generations in manifest.files and record.quantization["bits"] == FORMS[form].bits
        doc = json.loads((folder / record.generations).read_text())
        gen = Generator(folder, form=form)
        for case in doc["cases"][:2]:
            got = gen.generate([case["prompt_ids"]], max_new_tokens=case["max_new_tokens"],
                               temperature=case["temperature"], top_k=case["top_k"], seed=case["seed"]).ids[0]
            assert got == case["ids"], (form, case["name"])
    assert QUALITY_FILE in manifest.files and INPLACE_FORM in manifest.artifacts


def test_inspect_shows_each_forms_quality(hf_gpt: tuple[torch.nn.Module, Path]) -> None:
    folder = hf_gpt[1]
    out = mha("inspect", folder)
    assert out.returncode == 0, out.stderr
    manifest = load_gpt_manifest(folder)
    for form in LOSSY:
        kl = manifest.artifacts[form].quality["mean_kl"]
        line = next(line for line in out.stdout.splitlines() if line.startswith(f"{form}:"))
        assert f"mean KL divergence from fp32 {kl:.3g}" in line and f"bar {FORMS[form].max_mean_kl}" in line
    assert json.loads(mha("inspect", folder, "--json").stdout)["artifacts"][INT4_FORM]["quality"]["mean_kl"] > 0


@pytest.mark.parametrize("bits", [8, 4])
def test_fallback_keeps_the_worst_matrices_until_the_bar_is_met(tmp_path: Path, bits: int,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A model whose fast and fine plans both miss a bar set between their figures and the figure with a quarter
    of the matrices kept at a higher precision: the export keeps matrices (the head among them, the one rounding
    moves most here) in the fine plan until it is met, and records every plan tried, the fast one first."""
    from dataclasses import replace

    from mha_export.decoder.export import load_gpt
    from mha_export.decoder.graphs.inplace import inplace_model
    from mha_export.decoder.lossy import build
    from mha_export.decoder.lossy.build import build_lossy, quality_windows
    from mha_export.decoder.lossy.methods import METHODS
    from mha_runtime.decoder.decoder import decoder_for, make_session

    # The kept-matrix search alone: the 4-bit row's offsets plan (tried second) is test_lossy_offsets's.
    monkeypatch.setattr(build, "METHODS", {k: replace(m, offsets=False) for k, m in METHODS.items()})

    weights = gpt2_checkpoint(tmp_path / "ckpt", initializer_range=0.2)
    cfg = GPTConfig.from_file(weights.parent / "config.json")
    _, state, record = load_gpt(cfg, weights)
    tied = bool(record["tied"])
    inplace_model(state, cfg, tied=tied).save(tmp_path / INPLACE_FORM)
    ref = make_session(str(tmp_path / INPLACE_FORM))
    windows = quality_windows(cfg, None)
    form = FORMS[INT8_FORM if bits == 8 else INT4_FORM]

    def run(spec: object) -> object:
        return build_lossy(spec, state, cfg, tmp_path / "q.onnx", tied=tied,  # type: ignore[arg-type]
                           reference=lambda: decoder_for("inplace", ref, cfg, "ref"), windows=windows)

    whole = run(replace(form, max_mean_kl=0.0))  # nothing meets 0: every plan is tried
    assert [t["plan"].split(",")[0] for t in whole.tries[:2]] == [FAST[bits].label().split(",")[0],
                                                                  FINE[bits].label().split(",")[0]]
    fast, first, last = (whole.tries[i]["mean_kl"] for i in (0, 1, -1))
    assert last < min(fast, first) and len(whole.tries) >= 3
    bar = (min(fast, first) + last) / 2  # neither the fast nor the fine plan meets it
    chosen = run(replace(form, max_mean_kl=bar))
    assert chosen.ok and chosen.quality.mean_kl <= bar and chosen.plan.kept
    assert chosen.plan.block_size == FINE[bits].block_size
    assert set(chosen.plan.kept.values()) == {"fp32" if bits == 8 else "int8"}
    assert chosen.tries[0]["mean_kl"] == pytest.approx(fast) and len(chosen.tries) <= len(whole.tries)
