"""A GPT folder loads as it is in the clients people use for GPT-2: Optimum's ORTModelForCausalLM (in its own venv,
tests/clients/optimum-requirements.txt: optimum-onnx pins transformers < 4.58) and transformers.js in Node.js
(tests/clients/transformersjs, `make transformersjs`), each given nothing but the folder.

On a folder exported from the book's GPTModel and one from a Hugging Face GPT2LMHeadModel checkpoint (the session's
`book_gpt` and `hf_gpt`), their greedy ids equal the book's generate_text_simple / transformers' generate for three
prompts alone and as one left-padded batch, and their first-step logits equal eager PyTorch's within the fp32
row; config.json reads back as transformers' GPT2Config of the model; onnx/model.onnx is a relative link to
gpt.onnx, listed and verified like every file. The slow tests on artifacts/gpt-mini and gpt-demo write the
clients' rows of docs/portability.md (tools/portability.py).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import click
import numpy as np
import pytest
import torch
from click.testing import CliRunner

from clients import optimum_venv
from gpt_sources import BOOK
from helpers import REPO
from mha_runtime.artifact.errors import ArtifactError
from mha_runtime.artifact.manifest import read_verified
from mha_runtime.artifact.tolerance import compare
from mha_runtime.cli.main import cli
from mha_runtime.decoder.contract import (
    CONCAT_FORM,
    GENERATION_CONFIG,
    HF_CONFIG,
    INPLACE_FORM,
    ONNX_MODEL,
    WEIGHTS_FILE,
)
from mha_runtime.decoder.forms import FORMS
from mha_runtime.decoder.golden import first_logits, load_generations
from mha_runtime.decoder.manifest import load_gpt_manifest

CLIENTS = REPO / "tests" / "clients"
TJS = CLIENTS / "transformersjs"
NEW = 12
PROMPTS = [[464, 3290, 318], [15496, 11, 314, 716, 257, 2746, 286], [7, 8]]  # three lengths: a left-padded batch
EOS = 50256
TOLERANCE = FORMS[CONCAT_FORM].tolerance


@pytest.fixture(scope="session")
def optimum_python() -> Path:
    """The python of Optimum's venv (tests/clients/optimum_venv.py; `make optimum` makes it before pytest)."""
    return optimum_venv.ensure()


def _node_client() -> list[str]:
    assert (TJS / "node_modules" / "@huggingface" / "transformers").is_dir(), (
        f"{TJS}/node_modules is missing: run `make transformersjs` (npm ci)")
    return ["node", str(TJS / "client.mjs")]


def _ask(command: list[str], jobs: list[dict[str, Any]], tmp: Path) -> list[dict[str, Any]]:
    """Run one client on the jobs (the protocol of tests/clients/optimum_client.py), offline."""
    job = tmp / "job.json"
    job.write_text(json.dumps({"jobs": jobs}))
    env = os.environ | {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HOME": str(tmp / "hf")}
    done = subprocess.run([*command, str(job)], capture_output=True, text=True, timeout=600, cwd=tmp, env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])["results"]


def _job(folder: Path, tmp: Path, prompts: list[list[int]], new: int, *, batch: bool, eos: bool) -> dict[str, Any]:
    logits = tmp / f"logits-{folder.name}"
    logits.mkdir(exist_ok=True)
    return {"folder": str(folder), "prompts": prompts, "max_new_tokens": new, "batch": batch,
            "logits_dir": str(logits), "eos": eos}


# ---- the references: the book's generate_text_simple, transformers' generate, eager logits ----------------------


@pytest.fixture(scope="module")
def references(book_gpt: tuple[torch.nn.Module, Path],
               hf_gpt: tuple[torch.nn.Module, Path]) -> dict[str, tuple[list[list[int]], list[np.ndarray]]]:
    """{source: (greedy new ids per prompt, first-step logits per prompt)}."""
    from llms_from_scratch.ch04 import generate_text_simple

    book, hf = book_gpt[0], hf_gpt[0]
    with torch.no_grad():
        book_ids = [generate_text_simple(book, torch.tensor([p]), max_new_tokens=NEW,
                                         context_size=BOOK.context_length)[0, len(p):].tolist() for p in PROMPTS]
        hf_ids = [hf.generate(torch.tensor([p]), do_sample=False, max_new_tokens=NEW, min_new_tokens=0,
                              eos_token_id=None, pad_token_id=0)[0, len(p):].tolist() for p in PROMPTS]
        book_logits = [book(torch.tensor([p]))[0, -1].numpy() for p in PROMPTS]
        hf_logits = [hf(torch.tensor([p])).logits[0, -1].numpy() for p in PROMPTS]
    for ids in (*book_ids, *hf_ids):  # the clients stop at eos (generation_config.json): none may be due
        assert len(ids) == NEW and EOS not in ids
    return {"book": (book_ids, book_logits), "hf": (hf_ids, hf_logits)}


@pytest.fixture(scope="module")
def folders(book_gpt: tuple[torch.nn.Module, Path], hf_gpt: tuple[torch.nn.Module, Path]) -> dict[str, Path]:
    return {"book": book_gpt[1], "hf": hf_gpt[1]}


def _answers(command: list[str], folders: dict[str, Path], tmp: Path) -> dict[str, dict[str, Any]]:
    jobs = [_job(folder, tmp, PROMPTS, NEW, batch=True, eos=True) for folder in folders.values()]
    return dict(zip(folders, _ask(command, jobs, tmp), strict=True))


def _same_as_reference(answer: dict[str, Any], reference: tuple[list[list[int]], list[np.ndarray]]) -> None:
    ids, logits = reference
    assert answer["solo"] == ids  # each prompt alone
    assert answer["batch"] == ids  # the three as one left-padded batch
    for file, expected in zip(answer["logits"], logits, strict=True):
        got = np.fromfile(file, dtype="<f4")
        assert compare(got, expected, TOLERANCE).ok, f"{file}: {np.abs(got - expected).max()}"


@pytest.fixture(scope="module")
def transformersjs_answers(folders: dict[str, Path],
                           tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    return _answers(_node_client(), folders, tmp_path_factory.mktemp("transformersjs"))


@pytest.fixture(scope="module")
def optimum_answers(folders: dict[str, Path], optimum_python: Path,
                    tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    return _answers([str(optimum_python), str(CLIENTS / "optimum_client.py")], folders,
                    tmp_path_factory.mktemp("optimum"))


@pytest.mark.parametrize("source", ["book", "hf"])
def test_transformersjs_loads_the_folder_as_it_is(source: str, transformersjs_answers: dict[str, dict[str, Any]],
                                                  references: dict[str, Any]) -> None:
    _same_as_reference(transformersjs_answers[source], references[source])


@pytest.mark.slow  # its venv: pip installs Optimum, transformers 4.57 and torch once per requirements file
@pytest.mark.parametrize("source", ["book", "hf"])
def test_optimum_loads_the_folder_as_it_is(source: str, optimum_answers: dict[str, dict[str, Any]],
                                           references: dict[str, Any]) -> None:
    _same_as_reference(optimum_answers[source], references[source])


# ---- the files ----------------------------------------------------------------------------------------------------


def test_config_json_is_transformers_gpt2_config_of_the_model(folders: dict[str, Path],
                                                              hf_gpt: tuple[torch.nn.Module, Path]) -> None:
    from transformers import GenerationConfig, GPT2Config, GPT2LMHeadModel

    book = GPT2Config.from_pretrained(folders["book"])
    assert (book.model_type, book.architectures, book.vocab_size, book.n_positions, book.n_embd, book.n_head,
            book.n_layer) == ("gpt2", ["GPT2LMHeadModel"], 50257, BOOK.context_length, 64, 4, 2)
    assert (book.activation_function, book.layer_norm_epsilon, book.tie_word_embeddings) == ("gelu_new", 1e-5, False)
    assert book.bos_token_id == book.eos_token_id == EOS
    for folder in folders.values():
        generation = GenerationConfig.from_pretrained(folder)
        assert generation.eos_token_id == generation.bos_token_id == EOS
    # The checkpoint's own weights under the folder's config.json: the checkpoint's logits, exactly.
    model, folder = hf_gpt
    config = GPT2Config.from_pretrained(folder)
    assert config.tie_word_embeddings is True
    for key in ("vocab_size", "n_positions", "n_embd", "n_head", "n_layer", "n_inner", "activation_function",
                "layer_norm_epsilon", "scale_attn_weights", "scale_attn_by_inverse_layer_idx"):
        assert getattr(config, key) in (getattr(model.config, key), 4 * model.config.n_embd), key
    twin = GPT2LMHeadModel(config).eval()
    twin.load_state_dict(model.state_dict())
    ids = torch.tensor([PROMPTS[1]])
    with torch.no_grad():
        assert torch.equal(twin(ids).logits, model(ids).logits)


def test_onnx_model_is_a_relative_link_to_gpt_onnx_listed_and_verified(folders: dict[str, Path],
                                                                        tmp_path: Path) -> None:
    folder = folders["book"]
    link = folder / ONNX_MODEL
    assert link.is_symlink() and os.readlink(link) == "../gpt.onnx" and link.samefile(folder / CONCAT_FORM)
    manifest = load_gpt_manifest(folder)
    assert manifest.files[ONNX_MODEL] == manifest.files[CONCAT_FORM]
    for name in (HF_CONFIG, GENERATION_CONFIG, ONNX_MODEL):
        read_verified(folder, name, manifest)  # size and sha256, through the link
    plain = Path(shutil.copytree(folder, tmp_path / "plain"))  # a copy that follows links: still the same bytes
    assert not (plain / ONNX_MODEL).is_symlink()
    read_verified(plain, ONNX_MODEL, manifest)
    kept = Path(shutil.copytree(folder, tmp_path / "kept", symlinks=True))  # cp -a: the relative link still resolves
    assert (kept / ONNX_MODEL).samefile(kept / CONCAT_FORM)
    read_verified(kept, ONNX_MODEL, manifest)
    (kept / ONNX_MODEL).unlink()
    (kept / ONNX_MODEL).symlink_to(f"../{INPLACE_FORM}")  # re-pointed: refused
    with pytest.raises(ArtifactError, match="bytes"):
        read_verified(kept, ONNX_MODEL, manifest)
    config = kept / HF_CONFIG
    config.write_text(config.read_text().replace('"n_head": 4', '"n_head": 2'))  # same size, other bytes
    with pytest.raises(ArtifactError, match="sha256"):
        read_verified(kept, HF_CONFIG, manifest)
    # `mha check` verifies every listed file, also those only other clients read, before running anything.
    checked = CliRunner().invoke(cli, ["check", str(kept)])
    assert checked.exit_code == 1 and "config.json: sha256" in checked.output, checked.output


def test_without_symbolic_links_a_hard_link_and_without_either_a_note(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Never a copy: a filesystem with no symbolic links gets a hard link; with neither, the layout is left out
    with one line naming the clients' options."""
    from mha_export.decoder.checkpoint import default_origin
    from mha_export.decoder.hf_files import write_hf_files

    def refuse(*_: object) -> None:
        raise OSError(1, "Operation not permitted")

    monkeypatch.setattr(Path, "symlink_to", refuse)
    stage = tmp_path / "hard"
    stage.mkdir()
    (stage / CONCAT_FORM).write_bytes(b"onnx")
    assert write_hf_files(stage, BOOK, origin=default_origin(BOOK), tied=False) is None
    assert not (stage / ONNX_MODEL).is_symlink() and (stage / ONNX_MODEL).samefile(stage / CONCAT_FORM)
    monkeypatch.setattr(os, "link", refuse)
    stage = tmp_path / "neither"
    stage.mkdir()
    (stage / CONCAT_FORM).write_bytes(b"onnx")
    note = write_hf_files(stage, BOOK, origin=default_origin(BOOK), tied=False)
    assert note is not None and "file_name=\"gpt.onnx\"" in note and "\n" not in note
    assert not (stage / "onnx").exists() and (stage / HF_CONFIG).is_file()


def test_the_folders_own_weights_still_take_config_not_its_config_json(folders: dict[str, Path]) -> None:
    """config.json beside the folder's gpt.safetensors (book keys) is the clients' view of gpt.onnx, not the
    checkpoint's config: re-exporting those weights takes --config or --preset, as before it existed."""
    from mha_export.decoder.command import check_beside, resolve_config

    weights = folders["book"] / WEIGHTS_FILE
    with pytest.raises(click.UsageError, match="--weights needs --config"):
        resolve_config((), None, "again", weights)
    check_beside(BOOK, "--config gpt.json", weights)  # BOOK has no q/k/v biases; GPT-2's config would say it has


# ---- the portability table's client rows, on the folders `make test` makes ---------------------------------------


@pytest.mark.slow  # on the folders `make test` writes first (gpt-mini by native-test, gpt-demo by make demo)
@pytest.mark.parametrize("preset", ["gpt-mini", "gpt-demo"])
def test_clients_on_the_made_folders_write_the_portability_results(preset: str, optimum_python: Path,
                                                                   tmp_path: Path) -> None:
    """Each client's greedy golden generations (ids equal, first-step logits within the golden tolerance), eos not
    applied as the golden contract says, saved as artifacts/checks/<client>-<preset>.json."""
    folder = REPO / "artifacts" / preset
    if not (folder / "golden" / "generations.json").is_file():
        pytest.skip(f"{folder}: not made yet ({'make demo' if preset == 'gpt-demo' else 'make export'})")
    assert (folder / HF_CONFIG).is_file(), f"{folder} predates config.json: re-export it (rm -r it; make test)"
    manifest = load_gpt_manifest(folder)
    golden = load_generations(folder, manifest)
    cases = [c for c in golden.cases if c.temperature == 0.0]
    assert cases and len({c.max_new_tokens for c in cases}) == 1
    prompts = [c.prompt_ids for c in cases]
    commands = {"optimum": [str(optimum_python), str(CLIENTS / "optimum_client.py")],
                "transformersjs": _node_client()}
    out = REPO / "artifacts" / "checks"
    out.mkdir(parents=True, exist_ok=True)
    for client, command in commands.items():
        (out / f"{client}-{preset}.json").unlink(missing_ok=True)
        answer = _ask(command, [_job(folder, tmp_path, prompts, cases[0].max_new_tokens, batch=False, eos=False)],
                      tmp_path)[0]
        records = []
        for case, ids, file in zip(cases, answer["solo"], answer["logits"], strict=True):
            expected = first_logits(folder, manifest, case, manifest.shapes.vocab_size)
            near = compare(np.fromfile(file, dtype="<f4"), expected, golden.tolerance)
            records.append({"name": case.name, "ok": ids == case.ids and near.ok, "ids_equal": ids == case.ids,
                            "max_abs": near.max_abs, "error": None})
        passed = sum(r["ok"] for r in records)
        doc = {"runtime": client, "folder": preset, "passed": passed, "failed": len(records) - passed,
               "artifacts": [{"file": ONNX_MODEL, "not_loadable": None, "skipped": None, "cases": records}]}
        (out / f"{client}-{preset}.json").write_text(json.dumps(doc, indent=2) + "\n")
        assert doc["failed"] == 0, records
