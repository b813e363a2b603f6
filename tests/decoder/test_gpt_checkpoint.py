"""What a Hugging Face checkpoint says beside its weights, carried into the GPT folder and honoured by every runtime:
its eos ids (one or a list) and generation defaults (config.json, generation_config.json), its dropouts, its
tokenizer.json; a --config that disagrees with it is refused. Checkpoints are made by transformers
(save_pretrained), as a user's are."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gpt_sources import VOCAB_DIR
from mha_runtime.decoder.generate import Generator
from mha_runtime.decoder.manifest import load_gpt_manifest

MHA = [sys.executable, "-m", "mha_runtime"]
SHAPE = {"vocab_size": 50257, "n_positions": 32, "n_embd": 16, "n_layer": 1, "n_head": 2}
PROMPT = [464, 3290, 318]


def mha(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*MHA, *map(str, args)], capture_output=True, text=True, timeout=600)


def greedy(model: torch.nn.Module, new: int) -> list[int]:
    """transformers' greedy ids without any stop (the reference the eos is picked from)."""
    with torch.no_grad():
        out = model.generate(torch.tensor([PROMPT]), do_sample=False, max_new_tokens=new, min_new_tokens=new,
                             eos_token_id=None, pad_token_id=0)
    return [int(i) for i in out[0, len(PROMPT):]]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[torch.nn.Module, Path, list[int]]:
    """A GPT2LMHeadModel whose own eos is the third token it generates greedily from PROMPT (not GPT-2's 50256),
    with GPT2Config's 0.1 dropouts and a generation_config.json listing two eos ids and a repetition_penalty."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(7)
    model = GPT2LMHeadModel(GPT2Config(**SHAPE, initializer_range=0.3)).eval()
    ids = greedy(model, 6)
    eos = ids[2]
    assert eos not in ids[:2] and eos != 50256  # the first stop falls after two new tokens
    model.config.eos_token_id = model.config.bos_token_id = eos
    model.generation_config.eos_token_id = [50000 if eos != 50000 else 49999, eos]
    model.generation_config.bos_token_id = eos
    folder = tmp_path_factory.mktemp("ckpt") / "hf"
    model.save_pretrained(folder)
    generation = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps(generation | {"repetition_penalty": 1.3}))
    return model, folder, ids


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with no checkpoint behind it (seeded weights, the book's keys): GPT-2's vocabulary."""
    from mha_export.decoder.archs.gpt2.config import GPTConfig
    from mha_export.decoder.export import export_gpt

    config = GPTConfig(vocab_size=50257, context_length=16, emb_dim=16, n_heads=2, n_layers=1)
    return export_gpt("seeded", tmp_path_factory.mktemp("seeded"), config=config, variants=("decoder",)).folder


def test_the_checkpoints_eos_and_generation_defaults_reach_the_folder_and_every_runtime(
        checkpoint: tuple[torch.nn.Module, Path, list[int]], tmp_path: Path) -> None:
    """The eos ids are generation_config.json's list (transformers' generate reads it first), not GPT-2's 50256:
    transformers stops at the third token, so does `mha generate` (it emitted the eos id eight times), and the
    folder's generation_config.json / config.json / genai_config.json say what the checkpoint said (its 0.1
    dropouts, not 0.0). The repetition_penalty the runtimes do not apply is one note line, not a failure."""
    from transformers import GenerationConfig, GPT2Config

    model, folder, ids = checkpoint
    own_gen = json.loads((folder / "generation_config.json").read_text())
    made = mha("export", "--gpt", "--weights", folder / "model.safetensors", "--name", "m", "--out", tmp_path,
               "--variants", "decoder,inplace")
    assert made.returncode == 0, made.stderr
    notes = [line for line in made.stderr.splitlines() if "repetition_penalty" in line]
    assert len(notes) == 1 and notes[0].startswith("note: ") and "do not apply it" in notes[0], made.stderr
    out = tmp_path / "m"
    manifest = load_gpt_manifest(out)
    eos = ids[2]
    assert manifest.eos_ids == own_gen["eos_token_id"] and eos in manifest.stop_ids
    assert manifest.eos_id == own_gen["eos_token_id"][0]
    # transformers on the checkpoint as saved: it stops at eos after two tokens
    with torch.no_grad():
        reference = model.generate(torch.tensor([PROMPT]), do_sample=False, max_new_tokens=8,
                                   generation_config=GenerationConfig.from_pretrained(folder),
                                   repetition_penalty=1.0)[0, len(PROMPT):].tolist()
    assert reference == [*ids[:2], eos]
    ran = mha("generate", out, "--prompt-ids", ",".join(map(str, PROMPT)), "--max-new-tokens", "8", "--json")
    assert ran.returncode == 0, ran.stderr
    answer = json.loads(ran.stdout)
    assert (answer["ids"], answer["stops"]) == ([ids[:2]], ["eos"])  # the eos id itself is not returned
    for form in ("gpt.onnx", "gpt.inplace.onnx"):
        assert Generator(out, form=form).generate([PROMPT], max_new_tokens=8,
                                                  eos_id=manifest.stop_ids).ids == [ids[:2]]
    hf = json.loads((out / "config.json").read_text())
    own = json.loads((folder / "config.json").read_text())
    for key in ("resid_pdrop", "embd_pdrop", "attn_pdrop", "bos_token_id", "eos_token_id", "initializer_range"):
        assert hf[key] == own[key], key
    assert hf["resid_pdrop"] == 0.1 and GPT2Config.from_pretrained(out).eos_token_id == eos
    assert json.loads((out / "generation_config.json").read_text()) == own_gen
    genai = json.loads((out / "genai_config.json").read_text())["model"]
    assert genai["eos_token_id"] == own_gen["eos_token_id"] and genai["bos_token_id"] == eos


def test_without_a_checkpoint_the_folder_keeps_gpt2s_eos(seeded: Path) -> None:
    """No config.json behind the weights: GPT-2's 50256, one id, as every folder before eos_ids."""
    manifest = load_gpt_manifest(seeded)
    assert (manifest.eos_id, manifest.eos_ids, manifest.stop_ids) == (50256, [50256], (50256,))
    assert json.loads((seeded / "generation_config.json").read_text()) == {"bos_token_id": 50256,
                                                                                "eos_token_id": 50256}


def test_a_folder_made_before_eos_ids_still_stops_at_its_eos_id(seeded: Path, tmp_path: Path) -> None:
    """manifest.json without `eos_ids` (an older folder) reads back: its one eos_id is what generation stops at."""
    folder = tmp_path / "old"
    subprocess.run(["cp", "-a", str(seeded), str(folder)], check=True)
    doc = json.loads((folder / "manifest.json").read_text())
    del doc["eos_ids"]
    (folder / "manifest.json").write_text(json.dumps(doc))
    assert load_gpt_manifest(folder).stop_ids == (50256,)
    doc["eos_ids"] = [7]  # eos_id must be the first of eos_ids: one definition, not two that disagree
    (folder / "manifest.json").write_text(json.dumps(doc))
    refused = mha("generate", folder, "--prompt-ids", "1")
    assert refused.returncode == 1 and "'eos_id' 50256 is not the first of 'eos_ids'" in refused.stderr


def test_a_duplicate_key_in_the_checkpoints_config_is_a_bad_file_as_a_malformed_one(tmp_path: Path) -> None:
    """The checkpoint's config.json is a file the user did not name: a duplicate key exited 2 where a file that is
    not JSON exited 1; both are a bad file, exit 1, one line naming it."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(**SHAPE)).save_pretrained(tmp_path / "hf")
    config = tmp_path / "hf" / "config.json"
    text = config.read_text()
    for bad, says in ((text.replace('"n_head": 2,', '"n_head": 2, "n_head": 4,'), "n_head"),
                      (text[:-3], "expected JSON")):
        config.write_text(bad)
        said = mha("export", "--gpt", "--weights", tmp_path / "hf" / "model.safetensors", "--name", "x", "--out",
                   tmp_path / "out", "--variants", "decoder")
        lines = said.stderr.strip().splitlines()
        assert said.returncode == 1 and len(lines) == 1, said.stderr
        assert lines[0].startswith(f"Error: the checkpoint's {config}: ") and says in lines[0], lines[0]
        assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("change", [{"n_head": 4}, {"eos_token_id": 11}])
def test_a_config_json_elsewhere_that_disagrees_with_the_checkpoints_own_is_refused(
        checkpoint: tuple[torch.nn.Module, Path, list[int]], tmp_path: Path, change: dict[str, int]) -> None:
    """--config other/config.json is told from the checkpoint's own config.json by path, not by name: one that
    disagrees in a shape or in an id the folder carries (eos, bos) is refused, exit 2, before any work."""
    folder = checkpoint[1]
    other = tmp_path / "other" / "config.json"
    other.parent.mkdir()
    other.write_text(json.dumps(json.loads((folder / "config.json").read_text()) | change))
    said = mha("export", "--gpt", "--weights", folder / "model.safetensors", "--config", other, "--name", "x",
               "--out", tmp_path / "out", "--variants", "decoder")
    lines = said.stderr.strip().splitlines()
    assert said.returncode == 2 and len(lines) == 1, said.stderr
    assert "disagrees with the checkpoint's" in lines[0] and str(folder / "config.json") in lines[0], lines[0]
    assert not (tmp_path / "out").exists()
    same = tmp_path / "same" / "config.json"  # the same values under the same name elsewhere: taken
    same.parent.mkdir()
    same.write_text((folder / "config.json").read_text())
    made = mha("export", "--gpt", "--weights", folder / "model.safetensors", "--config", same, "--name", "x",
               "--out", tmp_path / "out", "--variants", "decoder")
    assert made.returncode == 0, made.stderr


def _save_tokenizer(folder: Path) -> None:
    """GPT-2's tokenizer as transformers' save_pretrained writes it: tokenizer.json and tokenizer_config.json."""
    from transformers import GPT2TokenizerFast

    vocab = json.loads((VOCAB_DIR / "encoder.json").read_text(encoding="utf-8"))
    lines = (VOCAB_DIR / "vocab.bpe").read_text(encoding="utf-8").split("\n")[1:]
    GPT2TokenizerFast(vocab=vocab, merges=[tuple(line.split(" ")) for line in lines if line]).save_pretrained(folder)


def test_a_tokenizer_json_beside_the_weights_is_taken_and_tokenizer_wins(
        checkpoint: tuple[torch.nn.Module, Path, list[int]], tmp_path: Path) -> None:
    """save_pretrained's tokenizer.json beside the weights is taken as its config.json is (the folder had no
    tokenizer); an explicit --tokenizer wins, a folder holding tokenizer.json or the file itself; the export says
    which in one line."""
    import shutil

    ckpt = Path(shutil.copytree(checkpoint[1], tmp_path / "ckpt"))
    _save_tokenizer(ckpt)
    weights = ckpt / "model.safetensors"
    made = mha("export", "--gpt", "--weights", weights, "--name", "beside", "--out", tmp_path / "out",
               "--variants", "decoder")
    assert made.returncode == 0, made.stderr
    assert f"tokenizer: the checkpoint's {ckpt / 'tokenizer.json'} (beside the weights" in made.stderr
    beside = tmp_path / "out" / "beside"
    assert (beside / "tokenizer.json").read_bytes() == (ckpt / "tokenizer.json").read_bytes()
    assert (beside / "tokenizer_config.json").read_bytes() == (ckpt / "tokenizer_config.json").read_bytes()
    assert Generator(beside).encode("Hello, I am") == [15496, 11, 314, 716]
    other = tmp_path / "tok"
    _save_tokenizer(other)
    for name, given in (("folder", other), ("file", other / "tokenizer.json")):
        chosen = mha("export", "--gpt", "--weights", weights, "--name", name, "--out", tmp_path / "out",
                     "--variants", "decoder", "--tokenizer", given)
        assert chosen.returncode == 0, chosen.stderr
        assert f"tokenizer: --tokenizer {given} (not the checkpoint's" in chosen.stderr
        assert Generator(tmp_path / "out" / name).encode("Hello, I am") == [15496, 11, 314, 716]
    (ckpt / "tokenizer.json").write_text(json.dumps({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1},
                                                              "merges": ["a b"]}}))
    bad = mha("export", "--gpt", "--weights", weights, "--name", "bad", "--out", tmp_path / "out",
              "--variants", "decoder")  # the existing checks apply: the merges check, in one line, exit 1
    lines = bad.stderr.strip().splitlines()
    assert bad.returncode == 1 and len(lines) == 1, bad.stderr
    assert lines[0].startswith(f"Error: the checkpoint's {ckpt / 'tokenizer.json'}: merge 1 'a b' makes 'ab'")


def test_torchaos_kernel_library_warnings_are_filtered_and_its_others_kept() -> None:
    """transformers imports torchao (the executorch extra), which logged "Failed to load .../_C_mxfp8...so" for each
    CUDA-only library on a CPU machine in every test that imports transformers: tests/conftest.py drops those records
    on torchao's logger, and only those."""
    import logging

    def record(message: str) -> logging.LogRecord:
        return logging.LogRecord("torchao", logging.WARNING, "__init__.py", 96, message, None, None)

    logger = logging.getLogger("torchao")
    assert not logger.filter(record("Failed to load /x/torchao/_C_mxfp8.cpython-310-x86_64-linux-gnu.so: Could not"))
    assert logger.filter(record("Skipping import of cpp extensions due to incompatible torch version"))


def test_the_gguf_carries_the_checkpoints_bos_and_eos_ids(checkpoint: tuple[torch.nn.Module, Path, list[int]],
                                                          tmp_path: Path) -> None:
    """gpt.gguf says the checkpoint's ids as the manifest does: its first eos id as llama.cpp's eos, the second as
    its end-of-turn id (llama.cpp stops at both), its bos; it wrote GPT-2's 50256 for both whatever the checkpoint
    said."""
    import gguf

    from mha_runtime.gguf import llama_cpp

    if llama_cpp.program() is None:
        pytest.skip(llama_cpp.BUILD_HINT)
    _, folder, _ = checkpoint
    out = mha("export", "--gpt", "--weights", folder / "model.safetensors", "--name", "m", "--out", tmp_path,
              "--tokenizer", VOCAB_DIR, "--variants", "decoder,gguf")
    assert out.returncode == 0, out.stderr[-2000:]
    manifest = load_gpt_manifest(tmp_path / "m")
    fields = {k: f.contents() for k, f in gguf.GGUFReader(tmp_path / "m" / "gpt.gguf").fields.items()}
    first, second = manifest.eos_ids or []
    assert fields["tokenizer.ggml.eos_token_id"] == first and fields["tokenizer.ggml.eot_token_id"] == second
    assert fields["tokenizer.ggml.bos_token_id"] == second  # the fixture's bos is its own eos id
