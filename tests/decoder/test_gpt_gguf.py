"""gpt.gguf and its quant types (`mha export --gpt --variants ...,gguf`), run by llama.cpp itself: from the book's
GPTModel (qkv_bias false: zero biases) and from a Hugging Face GPT2LMHeadModel (tied head), greedy ids equal the
golden generations; the metadata read back with gguf-py's own reader; quantized bytes equal ggml's own; a
tampered file refused by `mha check` before llama.cpp sees it; without llama.cpp, the variant left out in one line.

The tests that run llama.cpp skip, with how to build it, where it is not built; `make test` builds it first."""
from __future__ import annotations

import ctypes
import json
import re
import shutil
from importlib.metadata import version
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from click.testing import CliRunner

from gpt_sources import BOOK, HF, book_model, hf_model, save_book, save_hf, vocab_dir
from helpers import REPO
from mha_export.decoder.archs.gpt2.config import GPTConfig
from mha_export.gguf.write import vocabulary
from mha_runtime.artifact.errors import ArtifactError
from mha_runtime.cli.main import cli
from mha_runtime.decoder.contract import GGUF_FORM, GGUF_Q4_0, GGUF_Q8_0, INT4_FORM, INT8_FORM
from mha_runtime.decoder.forms import GGUF, GGUF_FORMS
from mha_runtime.decoder.golden import GENERATIONS_FILE, GoldenGeneration, first_logits, load_generations
from mha_runtime.decoder.golden_check import check_generations
from mha_runtime.decoder.manifest import load_gpt_manifest
from mha_runtime.gguf import llama_cpp

needs_llama = pytest.mark.skipif(llama_cpp.program() is None, reason=llama_cpp.BUILD_HINT)
SMALL = GPTConfig(vocab_size=512, context_length=32, emb_dim=32, n_heads=4, n_layers=2, qkv_bias=False)
ARCH_KEYS = ("context_length", "embedding_length", "block_count", "feed_forward_length", "attention.head_count",
             "attention.layer_norm_epsilon")


@pytest.fixture(scope="module")
def book_gguf(tmp_path_factory: pytest.TempPathFactory) -> tuple[torch.nn.Module, Path]:
    """The book's GPTModel (qkv_bias false, its own head) with gpt.inplace.onnx, its int8 and int4 forms and the
    three GGUF files; a small vocabulary and no tokenizer (llama.cpp's "none" vocabulary): the export in seconds."""
    if llama_cpp.program() is None:
        pytest.skip(llama_cpp.BUILD_HINT)
    from mha_export.decoder.export import export_gpt

    model = book_model(SMALL)
    root = tmp_path_factory.mktemp("gguf-book")
    weights = save_book(model, root / "ckpt")
    return model, export_gpt("book", root, config=SMALL, weights=weights, variants=("inplace", "int8", "int4", "gguf")
                             ).folder


@pytest.fixture(scope="module")
def hf_gguf(tmp_path_factory: pytest.TempPathFactory) -> tuple[torch.nn.Module, Path]:
    """transformers' GPT2LMHeadModel (model.safetensors + config.json) as gpt.gguf alone."""
    if llama_cpp.program() is None:
        pytest.skip(llama_cpp.BUILD_HINT)
    from mha_export.decoder.export import export_gpt

    model = hf_model()
    root = tmp_path_factory.mktemp("gguf-hf")
    weights = save_hf(model, root / "hf", safetensors=True)
    return model, export_gpt("hf", root, config=HF, weights=weights, tokenizer=vocab_dir(),
                             variants=("gguf",)).folder


def greedy_golden(folder: Path) -> dict[str, list[int]]:
    golden = load_generations(folder, load_gpt_manifest(folder))
    return {c.name: c.ids for c in golden.cases if c.temperature == 0.0}


@needs_llama
@pytest.mark.parametrize("source", ["book_gguf", "hf_gguf"])
def test_llama_cpp_reproduces_the_golden_generations(source: str, request: pytest.FixtureRequest) -> None:
    _, folder = request.getfixturevalue(source)
    manifest = load_gpt_manifest(folder)
    record = manifest.artifacts[GGUF_FORM]
    assert record.kind == "gguf" and record.passed and record.greedy_agreement == 1.0
    assert record.max_abs_error <= GGUF.tolerance.atol and GGUF_FORM in manifest.files
    assert manifest.versions["gguf"] == version("gguf") == "0.19.0"  # llama.cpp's bundled gguf-py
    # llama.cpp on the file itself (not the export's records): the greedy golden ids, the text prompt's encoding
    golden = load_generations(folder, manifest)
    got = llama_cpp.run_greedy(folder / GGUF_FORM, golden.cases)
    texts = [c for c in golden.cases if c.prompt_text is not None and c.temperature == 0.0]
    assert got.ids == greedy_golden(folder) and len(got.ids) == 3 + len(texts)
    assert len(texts) == (manifest.tokenizer is not None)  # "Every effort moves you", by the GGUF's tokenizer
    assert all(got.encoded[c.name] == c.prompt_ids for c in texts)
    for case in llama_cpp.greedy_cases(golden.cases):
        expected = first_logits(folder, manifest, case, manifest.shapes.vocab_size)
        assert np.abs(got.first[case.name] - expected).max() <= GGUF.tolerance.atol
    results = [r for r in check_generations(folder) if r.artifact.endswith(".gguf")]
    assert results and all(r.ok for r in results), [r.line() for r in results]


@needs_llama
def test_quant_types_meet_the_bars_of_the_forms_of_their_width(book_gguf: tuple[torch.nn.Module, Path]) -> None:
    _, folder = book_gguf
    manifest = load_gpt_manifest(folder)
    for onnx_form, file in ((INT8_FORM, GGUF_Q8_0), (INT4_FORM, GGUF_Q4_0)):
        record = manifest.artifacts[file]
        assert onnx_form in manifest.artifacts and record.passed and record.quality is not None
        assert record.quality["mean_kl"] <= GGUF_FORMS[file].max_mean_kl == record.quality["bar_mean_kl"]
        assert record.generations == f"golden/generations.{GGUF_FORMS[file].dtype}.json"
        own = load_generations(folder, manifest, record.generations)
        assert llama_cpp.run_greedy(folder / file, own.cases).ids == {c.name: c.ids for c in own.cases}
    assert manifest.artifacts[GGUF_Q4_0].quantization["kept"] == {"output.weight": "Q8_0"}  # type: ignore[index]
    assert (folder / GGUF_FORM).stat().st_size > (folder / GGUF_Q8_0).stat().st_size > (
        folder / GGUF_Q4_0).stat().st_size


@needs_llama
@pytest.mark.parametrize("source", ["book_gguf", "hf_gguf"])
def test_each_gguf_says_what_its_tensors_are(source: str, request: pytest.FixtureRequest) -> None:
    """general.file_type names the file's type (llama.cpp's tools and users read it: `llama-cli` prints it, the
    Hub lists files by it), and every 2-D weight is of that type but those its plan keeps higher (the Q4_0 file's
    head) and the position embedding, which the converter keeps at F32 as llama.cpp's own converter does."""
    _, folder = request.getfixturevalue(source)
    manifest = load_gpt_manifest(folder)
    for file, file_type, tensor_type in ((GGUF_FORM, gguf.LlamaFileType.ALL_F32, gguf.GGMLQuantizationType.F32),
                                         (GGUF_Q8_0, gguf.LlamaFileType.MOSTLY_Q8_0, gguf.GGMLQuantizationType.Q8_0),
                                         (GGUF_Q4_0, gguf.LlamaFileType.MOSTLY_Q4_0, gguf.GGMLQuantizationType.Q4_0)):
        if file not in manifest.artifacts:  # hf_gguf: gpt.gguf alone
            assert source == "hf_gguf" and file != GGUF_FORM
            continue
        reader = gguf.GGUFReader(folder / file)
        assert reader.fields["general.file_type"].contents() == file_type, file
        kept = (manifest.artifacts[file].quantization or {}).get("kept", {})
        matrices = [t for t in reader.tensors if len(t.shape) == 2 and t.name not in kept
                    and t.name != "position_embd.weight"]
        assert matrices and {t.tensor_type for t in matrices} == {tensor_type}, (file, {
            t.name: t.tensor_type.name for t in matrices if t.tensor_type != tensor_type})


@needs_llama
@pytest.mark.parametrize("source", ["book_gguf", "hf_gguf"])
def test_metadata_read_back_is_gpt2s(source: str, request: pytest.FixtureRequest) -> None:
    model, folder = request.getfixturevalue(source)
    manifest = load_gpt_manifest(folder)
    cfg = GPTConfig.from_dict(manifest.config)  # GPT-2's own keys, as the GGUF metadata holds them
    reader = gguf.GGUFReader(folder / GGUF_FORM)
    fields = {k: f.contents() for k, f in reader.fields.items()}
    assert fields["general.architecture"] == "gpt2" and fields["general.file_type"] == gguf.LlamaFileType.ALL_F32
    assert [fields[f"gpt2.{k}"] for k in ARCH_KEYS[:5]] == [cfg.context_length, cfg.emb_dim, cfg.n_layers,
                                                            4 * cfg.emb_dim, cfg.n_heads]
    assert fields["gpt2.attention.layer_norm_epsilon"] == pytest.approx(1e-5)
    if manifest.tokenizer is None:  # llama.cpp's "none" vocabulary: token ids only, as the folder
        assert fields["tokenizer.ggml.model"] == "none" and fields["gpt2.vocab_size"] == cfg.vocab_size
    else:  # GPT-2's tokenizer, from the folder's tokenizer.json
        assert fields["tokenizer.ggml.model"] == "gpt2" and fields["tokenizer.ggml.pre"] == "gpt-2"
        tokens, types = fields["tokenizer.ggml.tokens"], fields["tokenizer.ggml.token_type"]
        assert len(tokens) == len(types) == 50257 and tokens[50256] == "<|endoftext|>" and types[50256] == 3
        assert tokens[:2] == ["!", '"'] and set(types[:50256]) == {1}
        assert len(fields["tokenizer.ggml.merges"]) == 50000 and fields["tokenizer.ggml.merges"][0] == "Ġ t"
        assert fields["tokenizer.ggml.bos_token_id"] == fields["tokenizer.ggml.eos_token_id"] == 50256
        assert fields["tokenizer.ggml.add_bos_token"] is False
    tensors = {t.name: t for t in reader.tensors}
    blocks = {f"blk.{i}.{n}.{p}" for i in range(cfg.n_layers) for n in
              ("attn_norm", "attn_qkv", "attn_output", "ffn_norm", "ffn_up", "ffn_down") for p in ("weight", "bias")}
    tied = source == "hf_gguf"  # GPT-2's head is its token embedding: stored once, as llama.cpp reads it
    assert set(tensors) == {"token_embd.weight", "position_embd.weight", "output_norm.weight", "output_norm.bias",
                            *blocks} | (set() if tied else {"output.weight"})
    assert {t.tensor_type.name for t in tensors.values()} == {"F32"}
    state = model.state_dict()
    if tied:
        qkv = state["transformer.h.0.attn.c_attn.weight"].T  # Conv1D (in, out) -> rows (out, in)
        assert np.array_equal(tensors["blk.0.attn_qkv.bias"].data, state["transformer.h.0.attn.c_attn.bias"].numpy())
    else:
        qkv = torch.cat([state[f"trf_blocks.0.att.{w}.weight"] for w in ("W_query", "W_key", "W_value")])
        assert not tensors["blk.0.attn_qkv.bias"].data.any()  # qkv_bias false: zeros, which add nothing
        assert np.array_equal(tensors["output.weight"].data, state["out_head.weight"].numpy())
    assert np.array_equal(tensors["blk.0.attn_qkv.weight"].data, qkv.numpy())


def ggml_quantize(kind: gguf.GGMLQuantizationType, rows: np.ndarray) -> np.ndarray:
    """ggml's own quantizer (ggml_quantize_chunk in the libggml-base that `make llama-cpp` builds: what
    llama-quantize calls for every tensor) on a float32 matrix (rows, n_per_row): its bytes, as uint8."""
    path = llama_cpp.program().parent / "libggml-base.so"  # type: ignore[union-attr]
    if not path.is_file():  # a program found on PATH or in $MHA_LLAMA_CPP without the libraries beside it
        pytest.skip(f"{path}: not found beside {llama_cpp.PROGRAM}; run `make llama-cpp`")
    lib = ctypes.CDLL(str(path))
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                        ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    rows = np.ascontiguousarray(rows, dtype=np.float32)  # (rows, n_per_row)
    block, size = gguf.GGML_QUANT_SIZES[kind]
    out = np.zeros(rows.shape[0] * rows.shape[1] // block * size, dtype=np.uint8)
    written = lib.ggml_quantize_chunk(int(kind), rows.ctypes.data, out.ctypes.data, 0, rows.shape[0], rows.shape[1],
                                      None)
    assert written == out.size
    return out


def llama_quantizes(name: str, shape: tuple[int, ...]) -> bool:
    """llama-quantize's rule for which GPT-2 tensors take the file's type (src/llama-quant.cpp, tensor_allows_
    quantization): matrices named *weight, but not norms and not the position embeddings."""
    return (len(shape) >= 2 and name.endswith("weight") and "_norm.weight" not in name
            and name != "position_embd.weight")


@needs_llama
@pytest.mark.parametrize("dtype", ["q8_0", "q4_0"])
def test_quantized_bytes_equal_ggmls(book_gguf: tuple[torch.nn.Module, Path], dtype: str) -> None:
    """gguf-py's quantizers against ggml's own, tensor by tensor from gpt.gguf's float32 values: the same bytes;
    the tensors quantized are those llama-quantize --pure quantizes, at the file's type, but for Q4_0's head kept at
    Q8_0 (as llama-quantize keeps it higher: Q6_K, which gguf-py cannot write)."""
    _, folder = book_gguf
    full = {t.name: t for t in gguf.GGUFReader(folder / GGUF_FORM).tensors}
    ours = {t.name: t for t in gguf.GGUFReader(folder / f"gpt.{dtype}.gguf").tensors}
    assert set(ours) == set(full)
    kind = gguf.GGMLQuantizationType[dtype.upper()]
    for name, tensor in ours.items():
        source = np.asarray(full[name].data)  # float32, (rows, n_per_row) for a matrix
        if not llama_quantizes(name, source.shape):
            assert tensor.tensor_type == gguf.GGMLQuantizationType.F32, name
            assert np.array_equal(tensor.data, source), name
            continue
        want = gguf.GGMLQuantizationType.Q8_0 if (dtype, name) == ("q4_0", "output.weight") else kind
        assert tensor.tensor_type == want, (name, tensor.tensor_type.name)
        assert np.array_equal(np.asarray(tensor.data).reshape(-1), ggml_quantize(want, source)), name


def test_a_case_is_judged_on_its_ids_its_prompts_encoding_and_its_logits() -> None:
    """llama_cpp.judge_case fails a case for each of its three rules alone: other ids at any step, a text prompt
    that the GGUF's tokenizer encodes otherwise, first-step logits past the tolerance."""
    case = GoldenGeneration(name="c", prompt_ids=[5, 6], prompt_text="hi", max_new_tokens=3, temperature=0.0,
                            top_k=None, seed=None, ids=[1, 2, 3], first_logits_bin="c.bin", first_logits_npy="c.npy")
    expected = np.zeros(8, dtype=np.float32)

    def judged(ids: list[int], encoded: list[int], shift: float) -> str | None:
        got = llama_cpp.Greedy(ids={"c": ids}, first={"c": expected + np.float32(shift)}, encoded={"c": encoded})
        return llama_cpp.judge_case(got, case, expected, GGUF.tolerance)[1]

    assert judged([1, 2, 3], [5, 6], GGUF.tolerance.atol / 2) is None
    assert judged([1, 2, 4], [5, 6], 0.0) == "ids differ from token 2: got [4], golden [3]"
    assert judged([1, 2], [5, 6], 0.0) == "ids differ from token 2: got [], golden [3]"
    assert "encodes 'hi' to [5, 7], golden [5, 6]" in (judged([1, 2, 3], [5, 7], 0.0) or "")
    assert "first-step logits beyond tolerance" in (judged([1, 2, 3], [5, 6], 2 * GGUF.tolerance.atol) or "")


def test_string_arrays_are_packed_as_gguf_py_packs_them() -> None:
    """The writer's one-join packing of tokens and merges (its only change to gguf-py's writer) gives gguf-py's own
    bytes: on GPT-2's tokens past the ASCII ones (multi-byte UTF-8) and its first merges."""
    from mha_export.decoder.tokenizer import read_tokenizer
    from mha_export.gguf.write import _Writer

    vocab = vocabulary(read_tokenizer(vocab_dir(), vocab_size=BOOK.vocab_size,
                                      context_length=BOOK.context_length).tokenizer_json, BOOK.vocab_size)
    array = gguf.GGUFValueType.ARRAY
    for values in (vocab.tokens[180:4000] + vocab.tokens[-3:], vocab.merges[:3000]):
        assert any(len(v.encode()) > len(v) for v in values)
        ours = _Writer(None, "gpt2")._pack_val(values, array, add_vtype=True)
        assert ours == gguf.GGUFWriter(None, "gpt2")._pack_val(values, array, add_vtype=True)


@needs_llama
def test_a_tampered_gguf_is_refused_before_llama_cpp_sees_it(hf_gguf: tuple[torch.nn.Module, Path], tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    _, folder = hf_gguf
    copy = Path(shutil.copytree(folder, tmp_path / "hf"))
    data = bytearray((copy / GGUF_FORM).read_bytes())
    data[len(data) // 2] ^= 0x01
    (copy / GGUF_FORM).write_bytes(bytes(data))
    # A stand-in llama.cpp that leaves a mark when it runs: it must never run.
    fake = tmp_path / "bin"
    fake.mkdir()
    mark = tmp_path / "ran"
    (fake / llama_cpp.PROGRAM).write_text(f"#!/bin/sh\ntouch {mark}\nexit 1\n")
    (fake / llama_cpp.PROGRAM).chmod(0o755)
    monkeypatch.setenv(llama_cpp.ENV, str(fake))
    with pytest.raises(ArtifactError, match=r"gpt\.gguf: sha256 .* differs from the manifest"):
        check_generations(copy)
    with pytest.raises(ArtifactError, match=r"gpt\.gguf: sha256 .* differs from the manifest"):
        with llama_cpp.verified_copy(copy, GGUF_FORM, load_gpt_manifest(copy)):  # the copy llama.cpp is handed
            pass
    said = CliRunner().invoke(cli, ["check", str(copy)])
    assert said.exit_code == 1 and "gpt.gguf: sha256" in said.stderr and said.stderr.count("\n") == 1
    assert not mark.exists()
    # the same folder untampered: the stand-in runs (and fails its cases), so the mark proves what it would show
    results = [r for r in check_generations(folder) if r.artifact == GGUF_FORM]
    assert results and not any(r.ok for r in results) and mark.exists()
    # the failure names the listed file, not the private copy llama.cpp was handed (gone when the line is read)
    assert all(f"{folder / GGUF_FORM}: llama.cpp" in (r.error or "") for r in results), results[0].error


@pytest.mark.parametrize(("script", "said"), [
    ("echo garbage", "answered 'garbage', not a JSON object (is it mha-llama-golden"),  # was json's 'Expecting value'
    ("echo '[1]'", "answered '[1]', not a JSON object"),
    (r"printf '\377\n'", "answered '\ufffd', not a JSON object"),  # was UnicodeDecodeError
    # a header and one answer, no logits file: was [Errno 2] naming a temporary logits.bin
    ("""echo '{"n_vocab": 50}'; echo '{"ids": [1]}'""", "n_vocab 50 and None bytes of logits"),
    ("""echo '{"n_vocab": "50"}'; echo '{"ids": [1]}'; : > "$2\"""", "n_vocab '50' and 0 bytes of logits"),
    ("""echo '{"n_vocab": 50}'; echo '{"x": 1}'; : > "$2\"""", """answered {"x": 1}, not a list of token ids"""),
    ("""echo '{"n_vocab": 50}'; echo '{"ids": [1]}'; : > "$2\"""", "wrote 0 logits rows for 1 generations"),
])
def test_a_program_at_mha_llama_cpp_that_is_not_mha_llama_golden_is_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: str, said: str) -> None:
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / llama_cpp.PROGRAM).write_text(f"#!/bin/sh\n{script}\n")
    (fake / llama_cpp.PROGRAM).chmod(0o755)
    monkeypatch.setenv(llama_cpp.ENV, str(fake))
    case = GoldenGeneration(name="g", prompt_ids=[1], prompt_text=None, max_new_tokens=1, temperature=0.0,
                            top_k=None, seed=None, ids=[1, 2], first_logits_bin="g.bin", first_logits_npy="g.npy")
    with pytest.raises(ArtifactError, match=re.escape(said)):
        llama_cpp.run_greedy(tmp_path / "x.gguf", [case], where=tmp_path / "listed.gguf")


@pytest.mark.parametrize("variants", ["decoder,gguf", "gguf"])
def test_without_llama_cpp_a_named_gguf_fails_the_export_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     variants: str) -> None:
    """gguf is only ever named, and a named form that is not built fails the export (exit 1: a missing build, not a
    bad value), naming `make llama-cpp`, before any work and with nothing written. It was left out with a note:
    `decoder,gguf` exited 0 without the GGUF asked for, and `gguf` alone exited 2 ("nothing to build")."""
    monkeypatch.setenv(llama_cpp.ENV, str(tmp_path / "no-build"))
    assert llama_cpp.program() is None
    gpt_json = tmp_path / "gpt.json"  # the smallest model: what is measured is the refusal, not the export
    gpt_json.write_text(json.dumps({"vocab_size": 97, "context_length": 16, "emb_dim": 32, "n_heads": 4,
                                    "n_layers": 1}))
    made = CliRunner().invoke(cli, ["export", "--gpt", "--config", str(gpt_json), "--name", "b", "--variants",
                                    variants, "--out", str(tmp_path / "out")])
    lines = made.stderr.strip().splitlines()
    assert made.exit_code == 1 and len(lines) == 1, made.stderr
    assert lines[0] == f"Error: --variants gguf: {llama_cpp.BUILD_HINT}; nothing was exported"
    assert "run `make llama-cpp`" in lines[0] and made.stdout == ""
    assert not (tmp_path / "out" / "b").exists()


@pytest.mark.parametrize(("n_heads", "made"), [(2, True), (4, False)])
def test_head_size_1_is_refused_before_any_work(tmp_path: Path, n_heads: int, made: bool) -> None:
    """emb_dim 4: head size 2 exports gpt.gguf (vocab 50 and context 2 at their edges); head size 1 made llama.cpp
    abort (GGML_ASSERT) in the validation, a two-line failure ending in gdb's noise after the whole export."""
    gpt_json = tmp_path / "gpt.json"
    gpt_json.write_text(json.dumps({"vocab_size": 50, "context_length": 2, "emb_dim": 4, "n_heads": n_heads,
                                    "n_layers": 1}))
    result = CliRunner().invoke(cli, ["export", "--gpt", "--config", str(gpt_json), "--name", "h", "--variants",
                                      "decoder,gguf", "--out", str(tmp_path / "out")])
    if made:
        if llama_cpp.program() is None:
            pytest.skip(llama_cpp.BUILD_HINT)
        assert result.exit_code == 0, result.stderr
        assert load_gpt_manifest(tmp_path / "out" / "h").artifacts[GGUF_FORM].passed
        return
    assert result.exit_code == 2 and result.stdout == "", result.stderr
    assert result.stderr == (f"Error: --config {gpt_json}: --variants gguf: head size 1 (emb_dim / n_heads), which "
                             "llama.cpp's gpt2 graph cannot run (it aborts)\n")
    assert not (tmp_path / "out").exists()


@needs_llama
def test_check_without_llama_cpp_skips_the_gguf_cases_but_checks_the_sha256(
        hf_gguf: tuple[torch.nn.Module, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, folder = hf_gguf
    monkeypatch.setenv(llama_cpp.ENV, str(tmp_path / "no-build"))
    results = [r for r in check_generations(folder) if r.artifact == GGUF_FORM]
    assert results and all(r.skipped and "make llama-cpp" in (r.error or "") for r in results)
    copy = Path(shutil.copytree(folder, tmp_path / "hf"))
    with open(copy / GGUF_FORM, "r+b") as f:
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 1]))
    with pytest.raises(ArtifactError, match=r"gpt\.gguf: sha256"):
        check_generations(copy)
    assert GENERATIONS_FILE in load_gpt_manifest(copy).files


def test_a_matrix_kept_higher_is_written_at_that_type(tmp_path: Path) -> None:
    """The search for the quality bar keeps matrices at F32 in Q8_0 (F32 is GGML type 0: a falsy value once slipped
    through as 'no choice') and at Q8_0 in Q4_0; the head of Q4_0 is Q8_0 from the start."""
    from mha_export.gguf.write import F32, Q8_0, gguf_tensors, write_gguf

    state = {k: v for k, v in book_model(SMALL).state_dict().items() if not k.endswith(".mask")}
    tensors = gguf_tensors(state, SMALL, tied=False)
    for dtype, kept in (("q8_0", F32), ("q4_0", Q8_0)):
        path = tmp_path / f"{dtype}.gguf"
        written = write_gguf(path, tensors, SMALL, dtype=dtype, name="s", vocab=None,
                             keep={"blk.0.ffn_up.weight": kept})
        types = {t.name: t.tensor_type for t in gguf.GGUFReader(path).tensors}
        assert types["blk.0.ffn_up.weight"] == kept and types["blk.1.ffn_up.weight"].name == dtype.upper()
        head = {"output.weight": "Q8_0"} if dtype == "q4_0" else {}
        assert written.kept == {"blk.0.ffn_up.weight": kept.name} | head


@needs_llama
def test_a_quant_type_no_plan_brings_under_its_bar_is_left_out(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Every plan tried (0, 1, 2 of the 10 matrices kept at F32: up to a quarter), then the file deleted and one
    line; gpt.gguf itself stays."""
    import dataclasses

    from mha_export.decoder.eager import seeded_gpt
    from mha_export.decoder.golden import golden_generations
    from mha_export.decoder.lossy.build import quality_windows
    from mha_export.gguf.build import build_ggufs

    model = seeded_gpt(SMALL).eval()
    state = {k: v for k, v in model.state_dict().items() if not k.endswith(".mask")}
    cases, eager = golden_generations(model, SMALL, None)
    monkeypatch.setitem(GGUF_FORMS, GGUF_Q8_0, dataclasses.replace(GGUF_FORMS[GGUF_Q8_0], max_mean_kl=0.0))
    out = build_ggufs(tmp_path, state, SMALL, tied=False, name="s", tokenizer_json=None, lossy=[INT8_FORM],
                      cases=cases, eager=eager, windows=quality_windows(SMALL, None))
    assert out.misses == [out.misses[0]] and out.misses[0].startswith(f"{GGUF_Q8_0}: mean KL divergence from gpt.gguf")
    assert "above its bar 0 with every plan tried (up to 2 of its matrices kept at a higher type)" in out.misses[0]
    assert set(out.artifacts) == {GGUF_FORM} and not out.failures and not (tmp_path / GGUF_Q8_0).exists()


# ---- the portability table's llama.cpp row, on the folders `make test` makes --------------------------------------


@needs_llama
@pytest.mark.slow  # on the folders `make test` writes first (gpt-mini by native-test, gpt-demo by make demo)
@pytest.mark.parametrize("preset", ["gpt-mini", "gpt-demo"])
def test_llama_cpp_on_the_made_folders_writes_the_portability_results(preset: str, tmp_path: Path) -> None:
    """The made folder's weights as gpt.gguf (`mha export --gpt --variants gguf`, as a user asks for it), run by
    llama.cpp on the made folder's greedy golden generations (eager PyTorch's): ids equal, text prompts encoded by
    the GGUF's tokenizer to the golden ids, first-step logits within the GGUF row; saved as
    artifacts/checks/llamacpp-<preset>.json for docs/portability.md's clients table."""
    folder = REPO / "artifacts" / preset
    if not (folder / "golden" / "generations.json").is_file():
        pytest.skip(f"{folder}: not made yet ({'make demo' if preset == 'gpt-demo' else 'make export'})")
    out = REPO / "artifacts" / "checks" / f"llamacpp-{preset}.json"
    out.unlink(missing_ok=True)
    manifest = load_gpt_manifest(folder)
    config = tmp_path / "gpt.json"
    config.write_text(json.dumps(manifest.config))
    done = CliRunner().invoke(cli, ["export", "--gpt", "--config", str(config), "--weights",
                                    str(folder / "gpt.safetensors"), "--tokenizer", str(vocab_dir()), "--name", preset,
                                    "--out", str(tmp_path), "--variants", "gguf"])
    assert done.exit_code == 0, done.output
    golden = load_generations(folder, manifest)
    cases = llama_cpp.greedy_cases(golden.cases)
    got = llama_cpp.run_greedy(tmp_path / preset / GGUF_FORM, cases)
    records = []
    for case in cases:
        expected = first_logits(folder, manifest, case, manifest.shapes.vocab_size)
        near, error = llama_cpp.judge_case(got, case, expected, GGUF.tolerance)
        records.append({"name": case.name, "ok": error is None, "ids_equal": got.ids[case.name] == case.ids,
                        "max_abs": near.max_abs, "error": error})
    passed = sum(r["ok"] for r in records)
    doc = {"runtime": "llamacpp", "folder": preset, "passed": passed, "failed": len(records) - passed,
           "artifacts": [{"file": GGUF_FORM, "not_loadable": None, "skipped": None, "cases": records}]}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    assert cases and doc["failed"] == 0, records


@needs_llama
def test_check_measures_each_quant_types_quality_again(book_gguf: tuple[torch.nn.Module, Path],
                                                       tmp_path: Path) -> None:
    """`mha check` scores each quant type against gpt.gguf over the quality windows again, as the export did: the
    recorded figures pass as they are, and one edited (manifest.json is not listed in itself) fails, named; it was
    shown by `mha inspect` and never compared."""
    _, folder = book_gguf
    quality = [r for r in check_generations(folder) if r.case == "quality" and r.artifact.endswith(".gguf")]
    assert sorted(r.artifact for r in quality) == [GGUF_Q4_0, GGUF_Q8_0] and all(r.ok for r in quality), quality
    copy = Path(shutil.copytree(folder, tmp_path / "book"))
    doc = json.loads((copy / "manifest.json").read_text())
    doc["artifacts"][GGUF_Q4_0]["quality"]["mean_kl"] *= 2
    (copy / "manifest.json").write_text(json.dumps(doc))
    failed = [r for r in check_generations(copy) if not r.ok]
    assert [(r.artifact, r.case) for r in failed] == [(GGUF_Q4_0, "quality")], [r.line() for r in failed]
    assert "mean_kl: measured" in (failed[0].error or ""), failed[0].line()
