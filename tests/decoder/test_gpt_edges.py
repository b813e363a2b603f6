"""The GPT's edges that a single-point bug would cross unseen: top-k ties as the book keeps them, negative ids, the
golden check's own comparison, a valid but altered tokenizer, the stop at context_length in every runner, UTF-8
characters split across tokens, and a Hugging Face head that is not tied to wte. References: the book's
`llms_from_scratch.ch05.generate`, `transformers`, the tokenizer's own decode."""
from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from helpers import reseal, reseal_json
from mha_runtime.artifact.errors import ArtifactError, ContractError
from mha_runtime.cli.main import cli
from mha_runtime.decoder.generate import Generator
from mha_runtime.decoder.sampling import Sampler, probabilities
from mha_runtime.decoder.tokenizer import TextStream

REPO = Path(__file__).resolve().parents[2]
NODE = ["node", str(REPO / "runtime" / "native" / "node" / "cli.js")]
WASM = ["node", str(REPO / "runtime" / "native" / "web" / "check.mjs")]


class _Fixed(torch.nn.Module):
    """A model whose next-token logits are always `row` (what ch05.generate reads: logits[:, -1, :])."""

    def __init__(self, row: list[float]) -> None:
        super().__init__()
        self.row = torch.tensor(row)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.row.expand(idx.shape[0], idx.shape[1], -1)


@pytest.mark.parametrize(("row", "top_k", "temperature"), [([3.0, 2.0, 2.0, 1.0], 2, 1.0),
                                                            ([1.0, 1.0, 1.0, 0.5, 0.5], 1, 0.7),
                                                            ([0.1, 4.0, 2.5, 2.5, 2.5, -1.0], 3, 1.3)])
def test_top_k_keeps_every_logit_tied_with_the_kth_as_the_book_does(row: list[float], top_k: int,
                                                                     temperature: float) -> None:
    """The probabilities the book's generate hands torch.multinomial, beside ours: ties at the k-th place stay."""
    from llms_from_scratch.ch05 import generate

    seen: list[torch.Tensor] = []

    def multinomial(probs: torch.Tensor, num_samples: int) -> torch.Tensor:
        seen.append(probs.clone())
        return torch.zeros((probs.shape[0], 1), dtype=torch.long)

    with mock.patch("torch.multinomial", multinomial):
        generate(_Fixed(row), torch.zeros((1, 1), dtype=torch.long), max_new_tokens=1, context_size=4,
                 temperature=temperature, top_k=top_k)
    ours = probabilities(np.array([row], np.float32), temperature, top_k)
    np.testing.assert_allclose(ours[0], seen[0][0].numpy(), rtol=1e-6, atol=1e-7)
    assert (ours[0] > 0).sum() > top_k  # the case has a tie at the k-th place
    greedy = Sampler(1, temperature=0.0, top_k=top_k, seed=None, vocab_size=len(row))
    assert greedy.next_ids(np.array([row], np.float32)) == [int(np.argmax(row))]


def test_a_negative_token_id_is_refused_before_anything_runs(book_gpt: tuple[object, Path]) -> None:
    folder = book_gpt[1]
    with pytest.raises(ContractError, match="token id -1 is outside the vocabulary"):
        Generator(folder).generate([[5, -1]], max_new_tokens=2)
    result = CliRunner().invoke(cli, ["generate", str(folder), "--prompt-ids", "5,-1"])
    assert result.exit_code == 2 and result.stdout == "" and "token id -1" in result.stderr
    for command in (NODE, WASM):
        run = subprocess.run([*command, "generate", str(folder), "--prompt-ids", "5,-1"], capture_output=True,
                             text=True, timeout=120, cwd=REPO)
        assert run.returncode != 0 and run.stdout == "" and "-1" in run.stderr, run.stderr


def _relist(folder: Path, name: str) -> None:
    """Record `name`'s new sha256 and size in the manifest, as if the exporter had written it."""
    manifest = json.loads((folder / "manifest.json").read_text())
    data = (folder / name).read_bytes()
    manifest["files"][name].update(sha256=hashlib.sha256(data).hexdigest(), size=len(data))
    (folder / "manifest.json").write_text(json.dumps(manifest))


def test_mha_check_fails_when_a_golden_logits_file_differs_from_the_model(book_gpt: tuple[object, Path],
                                                                         tmp_path: Path) -> None:
    """The check's comparison itself: a logits file that the manifest lists with its right digest, but whose values
    are off by more than the tolerance, fails that case (and only the cases that read it)."""
    import shutil

    folder = Path(shutil.copytree(book_gpt[1], tmp_path / "gpt"))
    name = "golden/greedy_t7.logits.bin"  # what the runners read (raw little-endian float32; the .npy is for people)
    logits = np.fromfile(folder / name, dtype="<f4")
    logits[3] += 0.5  # far beyond the 1e-3 of the fp32 rows
    logits.tofile(folder / name)
    _relist(folder, name)
    result = CliRunner().invoke(cli, ["check", str(folder)])
    failed = [line for line in result.stdout.splitlines() if line.startswith("FAIL")]
    assert result.exit_code == 1 and failed and all("greedy_t7" in line for line in failed), result.stdout


def test_a_valid_but_altered_tokenizer_is_refused_for_its_sha256(book_gpt: tuple[object, Path],
                                                                 tmp_path: Path) -> None:
    import shutil

    folder = Path(shutil.copytree(book_gpt[1], tmp_path / "gpt"))
    text = (folder / "tokenizer.json").read_text()
    vocab = json.loads(text)["model"]["vocab"]
    one, other = (f'"{key}":{vocab[key]},' if f'"{key}":{vocab[key]},' in text else f'"{key}": {vocab[key]},'
                  for key in ("hello", "Hello"))  # ids of 5 digits each: the file keeps its size
    assert len(str(vocab["hello"])) == len(str(vocab["Hello"])) and one in text and other in text
    swapped = text.replace(one, "\0").replace(other, one.replace(str(vocab["hello"]), str(vocab["Hello"])))
    swapped = swapped.replace("\0", other.replace(str(vocab["Hello"]), str(vocab["hello"])))
    json.loads(swapped)  # still a valid tokenizer, another one
    (folder / "tokenizer.json").write_text(swapped)
    with pytest.raises(ArtifactError, match=r"tokenizer\.json: sha256 .* differs from the manifest's"):
        Generator(folder)
    result = CliRunner().invoke(cli, ["generate", str(folder), "--prompt", "hello world"])
    assert result.exit_code == 1 and result.stdout == "" and "tokenizer.json: sha256" in result.stderr


def test_every_runner_stops_at_context_length_exactly(book_gpt: tuple[object, Path]) -> None:
    """A prompt of context_length - 2 ids leaves room for 2 new ids, then the stop is context_length."""
    folder = book_gpt[1]
    gen = Generator(folder)
    prompt = [(7 * i + 11) % 50000 for i in range(gen.shapes.context_length - 2)]
    python = gen.generate([prompt], max_new_tokens=10)
    assert len(python.ids[0]) == 2 and python.stops[0] == "context_length"
    for command in (NODE, WASM):
        run = subprocess.run([*command, "generate", str(folder), "--prompt-ids", ",".join(map(str, prompt)),
                              "--max-new-tokens", "10", "--no-eos", "--json"], capture_output=True, text=True,
                             timeout=120, cwd=REPO)
        assert run.returncode == 0, run.stderr
        doc = json.loads(run.stdout)
        assert doc["ids"] == python.ids[0] and doc["stop"] == "context_length", doc


STREAM_SCRIPT = """
const { openGpt, gpt } = require('./runtime/native/node/gpt.js');
openGpt(process.argv[1]).then(({ tokenizer }) => {
  const stream = new gpt.TextStream(tokenizer);
  console.log(JSON.stringify([...JSON.parse(process.argv[2]).map((id) => stream.push(id)), stream.end()]));
});
"""


def test_streamed_text_never_shows_half_a_character(book_gpt: tuple[object, Path]) -> None:
    """Ids that split multi-byte characters: no piece holds U+FFFD, and the pieces join to decode(ids), in Python
    and in the JS runners' TextStream. Ids that end inside a character (max_new_tokens cut it) end with the
    decode's U+FFFD, which the stream's end() gives (it was left out of the streamed text)."""
    folder = book_gpt[1]
    gen = Generator(folder)
    ids = gen.encode("日本語 😀🎉 naïve")
    assert len(ids) > len("日本語 😀🎉 naïve".split()) * 2  # the characters span several ids
    cut = ids[:len(gen.encode("日本語 😀")) - 1]
    assert gen.tokenizer.decode(cut).endswith("\ufffd")
    for row, text in ((ids, "日本語 😀🎉 naïve"), (cut, "日本語 \ufffd")):
        stream = TextStream(gen.tokenizer)
        pieces = [stream.push(i) for i in row]
        pieces.append(stream.end())
        assert "" in pieces and not any("\ufffd" in p for p in pieces[:-1])
        assert "".join(pieces) == gen.tokenizer.decode(row) == text
        run = subprocess.run(["node", "-e", STREAM_SCRIPT, str(folder), json.dumps(row)], capture_output=True,
                             text=True, timeout=120, cwd=REPO, check=True)
        assert json.loads(run.stdout) == pieces


def test_a_hugging_face_head_not_tied_to_wte_is_refused(tmp_path: Path) -> None:
    """GPT-2's head is wte; a checkpoint whose lm_head differs would be exported tied, and wrong. Refused both when
    its config.json says so and when only the tensors do."""
    from safetensors.torch import load_file, save_file
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=300, n_positions=16, n_embd=16, n_layer=1, n_head=2, tie_word_embeddings=False)
    model = GPT2LMHeadModel(config)
    with torch.no_grad():
        model.lm_head.weight.add_(0.5)
    model.save_pretrained(tmp_path / "untied")
    out = tmp_path / "out"
    said = CliRunner().invoke(cli, ["export", "--gpt", "--weights", str(tmp_path / "untied" / "model.safetensors"),
                                    "--name", "x", "--out", str(out), "--variants", "decoder"])
    assert said.exit_code == 2 and "tie_word_embeddings false" in said.stderr, said.stderr
    state = load_file(tmp_path / "untied" / "model.safetensors")
    assert not torch.equal(state["lm_head.weight"], state["transformer.wte.weight"])
    (tmp_path / "quiet").mkdir()
    save_file(state, str(tmp_path / "quiet" / "model.safetensors"))  # no config.json: only the tensors tell
    gpt_json = tmp_path / "gpt.json"
    gpt_json.write_text(json.dumps({"vocab_size": 300, "context_length": 16, "emb_dim": 16, "n_heads": 2,
                                    "n_layers": 1, "qkv_bias": True}))
    tensors = CliRunner().invoke(cli, ["export", "--gpt", "--config", str(gpt_json), "--weights",
                                       str(tmp_path / "quiet" / "model.safetensors"), "--name", "x", "--out",
                                       str(out), "--variants", "decoder"])
    assert tensors.exit_code == 1 and "'lm_head.weight' differs from the token embedding" in tensors.stderr
    assert not out.exists()


@pytest.mark.parametrize("flag", [{"scale_attn_weights": False}, {"scale_attn_by_inverse_layer_idx": True}])
def test_a_hugging_face_attention_flag_the_book_lacks_is_refused(tmp_path: Path, flag: dict[str, bool]) -> None:
    """GPT2Config flags that change the attention's scores: transformers' logits move with them, so a checkpoint
    that sets one would be exported as the book's GPT and be wrong. Refused in one line, before any work."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    shape = {"vocab_size": 300, "n_positions": 16, "n_embd": 16, "n_layer": 2, "n_head": 2, "initializer_range": 0.3}
    model = GPT2LMHeadModel(GPT2Config(**shape, **flag)).eval()
    plain = GPT2LMHeadModel(GPT2Config(**shape)).eval()
    plain.load_state_dict(model.state_dict())
    ids = torch.arange(12)[None]
    with torch.no_grad():
        assert (model(ids).logits - plain(ids).logits).abs().max() > 1e-3  # the flag matters
    model.save_pretrained(tmp_path / "hf")
    out = tmp_path / "out"
    said = CliRunner().invoke(cli, ["export", "--gpt", "--weights", str(tmp_path / "hf" / "model.safetensors"),
                                    "--name", "x", "--out", str(out), "--variants", "decoder"])
    (key, value), = flag.items()
    assert said.exit_code == 2, said.output
    lines = said.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: the checkpoint's {tmp_path / 'hf' / 'config.json'}: "
                                                   f"config.json: {key} {json.dumps(value)}; expected "
                                                   f"{json.dumps(not value)} ("), said.stderr
    assert not out.exists()


@pytest.mark.parametrize("inner", [64, "64"])
def test_a_hugging_face_feed_forward_width_the_book_lacks_is_refused(tmp_path: Path, inner: object) -> None:
    """n_inner sets GPT-2's feed-forward width (4 * n_embd when null); the book's is always 4 * emb_dim. It was
    ignored: a config.json given as --config (no weights) exported a model of another shape than it says."""
    config = {"model_type": "gpt2", "vocab_size": 300, "n_positions": 16, "n_embd": 32, "n_layer": 1, "n_head": 2,
              "n_inner": inner}
    (tmp_path / "config.json").write_text(json.dumps(config))
    out = tmp_path / "out"
    said = CliRunner().invoke(cli, ["export", "--gpt", "--config", str(tmp_path / "config.json"), "--name", "x",
                                    "--out", str(out), "--variants", "decoder"])
    lines = said.stderr.strip().splitlines()
    assert said.exit_code == 2 and len(lines) == 1, said.stderr
    assert f"config.json: n_inner {json.dumps(inner)}; expected null or 128 (" in lines[0], said.stderr
    assert not out.exists()
    from mha_export.decoder.archs.gpt2.config import GPTConfig

    (tmp_path / "config.json").write_text(json.dumps(config | {"n_inner": 128}))  # 4 * n_embd, as transformers
    assert GPTConfig.from_file(tmp_path / "config.json").emb_dim == 32


def test_a_config_smaller_than_the_golden_cases_exports_and_checks(tmp_path: Path) -> None:
    """A context under the 16 greedy steps of validation and a vocabulary under the golden sampled case's top_k of
    40 (a character-level toy model): the export fits its cases to them, and every case holds, gpt.pte's too (its
    validation ran 16 greedy steps whatever the context, so this export failed: "positions 8..8 are beyond its
    context_length 8")."""
    cfg = tmp_path / "gpt.json"
    cfg.write_text(json.dumps({"vocab_size": 27, "context_length": 8, "emb_dim": 16, "n_heads": 2, "n_layers": 1}))
    out = tmp_path / "out"
    made = CliRunner().invoke(cli, ["export", "--gpt", "--config", str(cfg), "--name", "toy", "--out", str(out),
                                    "--variants", "decoder,inplace,pte"])
    assert made.exit_code == 0, made.output
    assert (out / "toy" / "gpt.pte").is_file()
    cases = json.loads((out / "toy" / "golden" / "generations.json").read_text())["cases"]
    assert {c["top_k"] for c in cases} == {None, 27}
    assert all(len(c["prompt_ids"]) + len(c["ids"]) <= 8 for c in cases)
    checked = CliRunner().invoke(cli, ["check", str(out / "toy")])
    assert checked.exit_code == 0 and " 0 failed" in checked.output, checked.output


@pytest.mark.parametrize(("edit", "says"), [
    ({"prompt_ids": [99999]}, "cases[0]: token id 99999 is outside the vocabulary (0..50256)"),
    ({"prompt_ids": []}, "cases[0]: expected at least one prompt id, got none"),
    # ONNX Runtime's own error log (two raw lines on stderr) came from the prefill of a prompt past the context
    ({"prompt_ids": [1] * 49}, "cases[0]: expected at most context_length 48 prompt ids, got 49"),
    ({"name": "a\n\x1b[31mred"}, "cases[0]: name: expected printable text, got 'a\\n\\x1b[31mred'"),
])
def test_a_resealed_golden_case_with_bad_prompt_ids_is_one_line(book_gpt: tuple[object, Path], tmp_path: Path,
                                                                 edit: dict[str, object], says: str) -> None:
    """A golden file edited and resealed (size and sha256 in the manifest updated): its prompt ids are checked
    before any runner sees them (ONNX Runtime's and ExecuTorch's own errors were a dozen raw lines)."""
    folder = tmp_path / "book"
    shutil.copytree(book_gpt[1], folder)
    path = folder / "golden" / "generations.json"
    doc = json.loads(path.read_text())
    doc["cases"][0].update(edit)
    path.write_text(json.dumps(doc))
    reseal(folder, "golden/generations.json")
    result = CliRunner().invoke(cli, ["check", str(folder)])
    assert result.exit_code == 1 and result.stderr.count("\n") == 1 and says in result.stderr, result.output


@pytest.mark.parametrize(("field", "value", "says"), [
    ("quality", {"mean_kl": "x", "p99_kl": 1.0}, "quality: field 'mean_kl' expected a number, got str 'x'"),
    ("quality", {"same_top": None}, "quality: field 'same_top' expected a number, got null"),
    ("quantization", {"kept": 5}, "quantization: field 'kept' expected a JSON object, got int 5"),
    ("quantization", {"finer": [1]}, "quantization: field 'finer' expected a JSON object, got list [1]"),
])
def test_an_edited_quality_figure_is_one_line_before_any_output(book_gpt: tuple[object, Path], tmp_path: Path,
                                                                 field: str, value: object, says: str) -> None:
    """manifest.json is not listed in itself: `mha inspect` formatted these as it found them, an internal error
    after half its output."""
    folder = tmp_path / "book"
    shutil.copytree(book_gpt[1], folder)
    doc = json.loads((folder / "manifest.json").read_text())
    doc["artifacts"]["gpt.onnx"][field] = value
    (folder / "manifest.json").write_text(json.dumps(doc))
    result = CliRunner().invoke(cli, ["inspect", str(folder)])
    assert result.exit_code == 1 and result.stdout == "" and result.stderr.count("\n") == 1, result.output
    assert f"artifacts.gpt.onnx: {says}" in result.stderr, result.stderr


def test_inspect_shows_edited_text_with_its_newlines_escaped(book_gpt: tuple[object, Path], tmp_path: Path) -> None:
    """manifest.json is not listed in itself: a newline edited into a form's dtype and quantization plan forged
    lines of the output. Inspect now shows the contract's dtype and the graph's plan (issue 56), so the edited text
    is not shown at all, and no line is forged."""
    folder = tmp_path / "book"
    shutil.copytree(book_gpt[1], folder)
    doc = json.loads((folder / "manifest.json").read_text())
    lossy = next(f for f, a in doc["artifacts"].items() if a.get("quantization"))
    doc["artifacts"]["gpt.onnx"]["dtype"] = "fp32\nforged"
    doc["artifacts"][lossy]["quantization"]["bits"] = "8\nforged"
    (folder / "manifest.json").write_text(json.dumps(doc))
    result = CliRunner().invoke(cli, ["inspect", str(folder)])
    assert result.exit_code == 0, result.output
    assert not any(line.startswith("forged") for line in result.stdout.splitlines()), result.stdout
    assert "forged" not in result.stdout


def test_a_resealed_golden_file_with_format_true_is_refused(book_gpt: tuple[object, Path], tmp_path: Path) -> None:
    """JSON true equals 1 in Python: generations.json with "format": true was read as format 1."""
    folder = tmp_path / "book"
    shutil.copytree(book_gpt[1], folder)
    reseal_json(folder, "golden/generations.json", format=True)
    result = CliRunner().invoke(cli, ["check", str(folder)])
    assert result.exit_code == 1 and result.stderr.count("\n") == 1, result.output
    assert "generations.json: expected kind 'gpt-generations' format 1" in result.stderr, result.stderr
