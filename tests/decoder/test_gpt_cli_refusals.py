"""`mha export --gpt` and `mha generate` refusing what they cannot do right: one stderr line, exit 2 for a bad value,
nothing on stdout, nothing written. Checkpoints are made by transformers (save_pretrained)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch

from gpt_sources import BOOK, book_model, save_book

MHA = [sys.executable, "-m", "mha_runtime"]


def mha(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*MHA, *map(str, args)], capture_output=True, text=True, timeout=600)


def refused(result: subprocess.CompletedProcess[str], code: int, *texts: str) -> str:
    """Exactly one stderr line with every text, the exit code, nothing on stdout."""
    lines = result.stderr.strip().splitlines()
    assert result.returncode == code, result.stderr
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr
    assert result.stdout == ""
    for text in texts:
        assert text in lines[0], lines[0]
    return lines[0]


def gpt2(folder: Path, *, n_head: int) -> Path:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=300, n_positions=32, n_embd=32, n_layer=1, n_head=n_head,
                        bos_token_id=None, eos_token_id=None)
    GPT2LMHeadModel(config).save_pretrained(folder)
    return folder / "model.safetensors"


@pytest.mark.parametrize(("theirs", "ours"), [(2, 4), (4, 2)])
def test_a_config_that_disagrees_with_the_checkpoints_own_is_refused(tmp_path: Path, theirs: int, ours: int) -> None:
    """The shapes cannot tell the head count: a --config saying another n_heads than the config.json beside the
    weights would export a silently wrong model. Refused both ways round, naming both values."""
    weights = gpt2(tmp_path / "hf", n_head=theirs)
    gpt_json = tmp_path / "gpt.json"
    gpt_json.write_text(json.dumps({"vocab_size": 300, "context_length": 32, "emb_dim": 32, "n_heads": ours,
                                    "n_layers": 1, "qkv_bias": True}))
    result = mha("export", "--gpt", "--config", gpt_json, "--weights", weights, "--name", "x", "--out",
                 tmp_path / "out", "--variants", "decoder")
    refused(result, 2, f"n_heads {ours} disagrees", f"(n_head {theirs})", str(tmp_path / "hf" / "config.json"))
    assert not (tmp_path / "out").exists()
    agreeing = tmp_path / "same.json"
    agreeing.write_text(json.dumps(json.loads(gpt_json.read_text()) | {"n_heads": theirs}))
    ok = mha("export", "--gpt", "--config", agreeing, "--weights", weights, "--name", "x", "--out", tmp_path / "out",
             "--variants", "decoder")
    assert ok.returncode == 0, ok.stderr


@pytest.mark.parametrize(("shape", "said"), [
    # a 2-D Conv1D weight of the wrong width: named as the file stores it (in, out), not transposed
    ((32, 64), "has shape [32, 64], expected [32, 128]"),
    # another rank: torch's UserWarning about x.T (two more stderr lines) came before the line
    ((32, 128, 1), "has shape [32, 128, 1], expected [32, 128]"),
])
def test_a_misshapen_conv1d_weight_is_named_as_the_file_has_it(tmp_path: Path, shape: tuple[int, ...],
                                                               said: str) -> None:
    from safetensors.torch import load_file, save_file

    weights = gpt2(tmp_path / "hf", n_head=2)
    state = load_file(weights)
    state["transformer.h.0.mlp.c_fc.weight"] = torch.zeros(shape)
    save_file(state, str(weights))
    result = mha("export", "--gpt", "--weights", weights, "--name", "x", "--out", tmp_path / "out", "--variants",
                 "decoder")
    refused(result, 1, f"weights: 'transformer.h.0.mlp.c_fc.weight' {said}")
    assert not (tmp_path / "out").exists()


def test_a_head_size_gqa_cannot_take_limits_only_the_in_place_forms(tmp_path: Path) -> None:
    """Head size 12: the decoder form is fine; the default set leaves the in-place and lossy forms out with a note;
    asking for them by name is refused before any work, the line starting with the config file."""
    cfg = BOOK.to_dict() | {"emb_dim": 48, "n_heads": 4, "n_layers": 1, "context_length": 16}
    gpt_json = tmp_path / "gpt.json"
    gpt_json.write_text(json.dumps(cfg))
    weights = save_book(book_model(type(BOOK)(**cfg)), tmp_path / "ckpt")
    base = ["export", "--gpt", "--config", gpt_json, "--weights", weights, "--out", tmp_path / "out"]
    alone = mha(*base, "--name", "dec", "--variants", "decoder")
    assert alone.returncode == 0, alone.stderr
    default = mha(*base, "--name", "all")
    assert default.returncode == 0, default.stderr
    notes = [line for line in default.stderr.splitlines() if line.startswith("note: left out")]
    assert len(notes) == 3 and all("head size 12" in n for n in notes), default.stderr
    assert sorted(p.name for p in (tmp_path / "out" / "all").glob("*.onnx")) == ["gpt.onnx"]
    refused(mha(*base, "--name", "inp", "--variants", "decoder,inplace"), 2, f"--config {gpt_json}:",
            "--variants inplace: head size 12")
    assert not (tmp_path / "out" / "inp").exists()


def test_a_prompt_that_is_not_text_exits_2(book_gpt: tuple[object, Path]) -> None:
    folder = book_gpt[1]
    refused(mha("generate", folder, "--prompt", "\udcff"), 2, "lone surrogate")
    refused(mha("generate", folder, "--prompt-ids", "1e3"), 2, "--prompt-ids: expected comma-separated integers")
    # int() reads any script's digits: '\u0663' (Arabic-Indic three) was taken as token 3
    refused(mha("generate", folder, "--prompt-ids", "1,\u0663"), 2, "--prompt-ids: expected comma-separated integers")
    # nor underscores: '1_0' was taken as token 10 (the Node and C runners refuse it)
    refused(mha("generate", folder, "--prompt-ids", "1_0"), 2, "--prompt-ids: expected comma-separated integers")
    # --form is a decoder's file name: '', a relative path out of the folder or an absolute one is a bad value (it
    # was exit 1, "no decoder ... listed", as a broken folder is)
    for form in ("", "../x/gpt.onnx", str(folder / "gpt.onnx")):
        refused(mha("generate", folder, "--prompt-ids", "1", "--form", form), 2, "--form",
                "expected a decoder file name of the folder", form[:60])


def test_cuda_where_there_is_none_is_refused_in_one_line(book_gpt: tuple[object, Path]) -> None:
    """Not ONNX Runtime's UserWarning and a silent fall back to the CPU: one line naming what is there instead."""
    import onnxruntime

    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("this onnxruntime has CUDA")
    for command in (["generate", book_gpt[1], "--prompt-ids", "1,2", "--provider", "cuda"],
                    ["check", book_gpt[1], "--provider", "cuda"]):
        refused(mha(*command), 1, "provider 'cuda' is not available", "CPUExecutionProvider")


@pytest.mark.parametrize(("flags", "text"), [
    (["--max-new-tokens", "0"], "max_new_tokens: expected an integer >= 1"),
    (["--top-k", "0"], "top_k"),
    (["--temperature", "nan"], "temperature"),
    (["--seed", "-1"], "seed: expected an integer >= 0"),
    (["--prompt-ids", "1,99999999"], "outside the vocabulary"),
])
def test_a_bad_generation_setting_exits_2_before_any_output(book_gpt: tuple[object, Path], flags: list[str],
                                                              text: str) -> None:
    prompt = [] if "--prompt-ids" in flags else ["--prompt", "Every effort"]
    refused(mha("generate", book_gpt[1], *prompt, *flags), 2, text)


def test_a_manifest_config_edited_after_export_is_refused(gpt_mini: Path, tmp_path: Path) -> None:
    """manifest.json is not listed in itself: a config edited there (more layers than the model has; 10**18 of
    them took the process to the kernel's OOM killer) is refused against the model's own metadata before anything
    is sized from it."""
    folder = tmp_path / "g"
    shutil.copytree(gpt_mini, folder, symlinks=True)
    manifest = json.loads((folder / "manifest.json").read_text())
    layers = manifest["config"]["n_layers"]
    manifest["config"]["n_layers"] = layers + 3
    (folder / "manifest.json").write_text(json.dumps(manifest))
    result = mha("generate", folder, "--prompt-ids", "1,2", "--max-new-tokens", "2")
    refused(result, 1, f"n_layers={layers + 3}", f"n_layers={layers}", "does not belong to this folder")


def test_a_refusal_of_a_preset_exported_under_another_name_names_the_preset(tmp_path: Path) -> None:
    """Too little memory for gpt-mini, exported as --name small: the line starts with the preset it came from (it
    named './config.json', a file the user never gave, when the folder name was not a preset's)."""
    from click.testing import CliRunner

    from mha_runtime.cli.main import cli

    for name, extra in (("gpt-mini", []), ("small", ["--name", "small"])):
        with mock.patch("mha_export.decoder.plan.available_memory", return_value=1):
            said = CliRunner().invoke(cli, ["export", "--gpt", "--preset", "gpt-mini", *extra, "--out",
                                            str(tmp_path / "out")])
        assert said.exit_code == 1, said.output
        assert said.output.startswith("Error: --preset gpt-mini: gpt config: exporting needs about "), said.output
        assert not (tmp_path / "out" / name).exists()


def test_the_budget_counts_the_validations_logits(tmp_path: Path) -> None:
    """A vocabulary of 10^8 at width 2: 1.6 GB of fp32 weights (4x of them fit in 16 GiB), but the validation's
    (3, 16, 10^8) logits are 19.2 GB a copy. With 16 GiB available the export is refused in one line naming the
    logits, before any file; the book's own small GPT still fits the same memory."""
    from click.testing import CliRunner

    from mha_runtime.cli.main import cli

    config = tmp_path / "wide.json"
    config.write_text(json.dumps({"vocab_size": 10**8, "context_length": 16, "emb_dim": 2, "n_heads": 1,
                                  "n_layers": 1, "drop_rate": 0.0, "qkv_bias": False}))
    with mock.patch("mha_export.decoder.plan.available_memory", return_value=16 * 2**30):
        said = CliRunner().invoke(cli, ["export", "--gpt", "--config", str(config), "--name", "wide",
                                        "--variants", "decoder", "--out", str(tmp_path / "out")])
        fits = CliRunner().invoke(cli, ["export", "--gpt", "--preset", "gpt-mini", "--variants", "decoder",
                                        "--out", str(tmp_path / "mini")])
    assert said.exit_code == 1, said.output
    lines = said.output.strip().splitlines()
    assert len(lines) == 1 and "exporting needs about" in lines[0] and "the validation's logits 35.8 GiB" in lines[0]
    assert not (tmp_path / "out" / "wide").exists()
    assert fits.exit_code == 0, fits.output
