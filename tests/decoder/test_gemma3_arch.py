"""The gemma3 architecture's members against code no one here wrote: the book's GEMMA3_CONFIG_270M (ch05/12_gemma3),
transformers' Gemma3TextConfig (config.json of both generations, and its GGUF loader on a file gguf-py writes as
llama.cpp's converter does), gguf-py's tensor name map and llama.cpp's converter (its norm shift, imported from the
bundled tree) for Gemma3ForCausalLM's keys; the drop-in config.json as transformers reads it; a config the book's
model or llama.cpp cannot compute refused in one line."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from gemma3_folders import HF_GEMMA3, hf_gemma3
from helpers import REPO
from mha_export.decoder.archs import ARCHS, book_arch, config_from_dict
from mha_export.decoder.archs.gemma3.config import Gemma3Config
from mha_runtime.artifact.errors import BadValueError

GEMMA3 = ARCHS["gemma3"]
CONVERTER = REPO / ".cache" / "llama.cpp" / "src"
S, F = "sliding_attention", "full_attention"
# The book's GEMMA3_CONFIG_270M (its torch.bfloat16 as the string the JSON config holds).
BOOK_270M: dict[str, Any] = {
    "vocab_size": 262_144, "context_length": 32_768, "emb_dim": 640, "n_heads": 4, "n_layers": 18,
    "hidden_dim": 2048, "head_dim": 256, "qk_norm": True, "n_kv_groups": 1, "rope_local_base": 10_000.0,
    "rope_base": 1_000_000.0, "sliding_window": 512, "layer_types": ([S] * 5 + [F]) * 3, "dtype": "bfloat16",
    "query_pre_attn_scalar": 256}
# google/gemma-3-270m's config.json fields as transformers 4.x wrote them (no layer_types, no rope_parameters).
HF4_270M: dict[str, Any] = {
    "model_type": "gemma3_text", "vocab_size": 262_144, "max_position_embeddings": 32_768, "hidden_size": 640,
    "num_attention_heads": 4, "num_key_value_heads": 1, "num_hidden_layers": 18, "intermediate_size": 2048,
    "head_dim": 256, "rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0, "rope_scaling": None,
    "sliding_window": 512, "sliding_window_pattern": 6, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-6,
    "hidden_activation": "gelu_pytorch_tanh", "final_logit_softcapping": None, "attn_logit_softcapping": None,
    "torch_dtype": "bfloat16"}


def _f32(value: float) -> float:
    return float(str(np.float32(value)))


def test_the_books_dict_and_both_config_json_generations_are_one_config() -> None:
    """The book's dict, transformers 4.x's config.json, and what transformers 5 makes of it (its to_dict:
    rope_parameters per layer type, layer_types) are one config: every sixth layer global."""
    import transformers

    book = config_from_dict(dict(BOOK_270M))
    assert book_arch(BOOK_270M) is GEMMA3 and book.parameters(tied=True) == 268_098_176  # the figure
    assert config_from_dict(dict(HF4_270M)) == book
    theirs = transformers.Gemma3TextConfig(**{k: v for k, v in HF4_270M.items() if k != "model_type"})
    assert theirs.layer_types == list(book.layer_types)
    assert config_from_dict(json.loads(theirs.to_json_string())) == book
    assert [i for i in range(18) if not book.is_local(i)] == [5, 11, 17]
    assert (book.rope_base_of(0), book.rope_base_of(5), book.window_of(0), book.window_of(5)) == (1e4, 1e6, 512, None)


def test_hf_names_are_exactly_transformers_keys_and_gguf_pys_names() -> None:
    """Every Gemma3ForCausalLM key is a book key's (the tied lm_head aside), and gguf-py's tensor name map for
    MODEL_ARCH.GEMMA3 sends each to the GGUF name gguf_tensors writes."""
    import gguf

    model = hf_gemma3(tie_word_embeddings=False)
    cfg = config_from_dict(HF_GEMMA3 | {"model_type": "gemma3_text"})
    keys = {k for k in model.state_dict() if not GEMMA3.BUFFERS.fullmatch(k)}
    names = GEMMA3.hf_names(cfg, "model.")
    assert set(names.values()) == keys and set(names) == set(GEMMA3.book_shapes(cfg))
    assert all(tuple(model.state_dict()[names[k]].shape) == s for k, s in GEMMA3.book_shapes(cfg).items())
    state = {book: model.state_dict()[hf] for book, hf in names.items()}
    tensors = GEMMA3.gguf_tensors(state, cfg, tied=False)
    mapping = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA3, cfg.n_layers)
    theirs = {mapping.get_name(hf, try_suffixes=(".weight",)) for hf in names.values()}
    assert theirs == set(tensors)


def _converter_shifts(names: list[str]) -> list[float]:
    """llama.cpp's Gemma3Model.norm_shift (conversion/gemma.py of the bundled tree) of each Hugging Face name, in a
    subprocess: the converter imports its own gguf-py (newer than the pinned one, which it needs)."""
    if not (CONVERTER / "conversion" / "gemma.py").is_file():
        pytest.skip("llama.cpp's tree is not under .cache/ (make llama-cpp)")
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); from conversion.gemma import Gemma3Model; "
            "print(json.dumps([Gemma3Model.norm_shift(None, n) for n in json.loads(sys.stdin.read())]))")
    done = subprocess.run([sys.executable, "-c", code, str(CONVERTER)], input=json.dumps(names),
                          capture_output=True, text=True, check=True, timeout=120)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_norms_are_stored_as_the_converter_shifts_them() -> None:
    """Each GGUF tensor is Hugging Face's plus the converter's norm_shift of its name (1 for every norm, the q/k
    norms included; 0 for the matrices); read_gguf takes the shift off again."""
    model = hf_gemma3()
    cfg = config_from_dict(HF_GEMMA3 | {"model_type": "gemma3_text"})
    names = GEMMA3.hf_names(cfg, "model.")
    hf_state = model.state_dict()
    state = {book: hf_state[hf] if hf in hf_state else hf_state[names["tok_emb.weight"]]
             for book, hf in names.items()}
    tensors = GEMMA3.gguf_tensors(state, cfg, tied=True)
    hf_keys = [hf for book, hf in names.items() if book != "out_head.weight"]
    shifts = dict(zip(hf_keys, _converter_shifts(hf_keys), strict=True))
    for book, hf in names.items():
        if book != "out_head.weight":
            assert np.array_equal(tensors[_gguf_names(cfg)[book]], (hf_state[hf] + shifts[hf]).numpy()), hf
    shifted = sum(v == 1.0 for v in shifts.values())
    assert shifted == 6 * cfg.n_layers + 1  # four block norms, q and k norms, the final norm
    back, tied = GEMMA3.read_gguf(tensors, cfg)
    assert tied and all(torch.allclose(back[k], state[k], rtol=0, atol=2 ** -23) for k in state)


def _gguf_names(cfg: Gemma3Config) -> dict[str, str]:
    from mha_export.decoder.archs.gemma3.gguf_map import names

    return names(cfg)


def _write_like_the_converter(path: Path, cfg: dict[str, Any], vocab: int, **extra: Any) -> None:
    """A GGUF of metadata only, the keys llama.cpp's Gemma3Model.set_gguf_parameters writes (gguf-py's writer)."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "gemma3")
    writer.add_context_length(cfg["context_length"])
    writer.add_embedding_length(cfg["emb_dim"])
    writer.add_block_count(cfg["n_layers"])
    writer.add_feed_forward_length(cfg["hidden_dim"])
    writer.add_head_count(cfg["n_heads"])
    writer.add_head_count_kv(cfg["n_kv_groups"])
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_key_length(cfg["head_dim"])
    writer.add_value_length(cfg["head_dim"])
    writer.add_rope_freq_base(cfg["rope_base"])
    writer.add_sliding_window(cfg["sliding_window"])
    writer.add_token_list([f"t{i}" for i in range(vocab)])
    for key, value in extra.items():
        getattr(writer, f"add_{key}")(value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_gguf_metadata_reads_as_transformers_gguf_loader_reads_it(tmp_path: Path) -> None:
    """The 270M's keys (a small vocabulary) as the converter writes them: config_from_gguf is what transformers'
    GGUF loader builds (its epsilon the float32 the file holds), the layer pattern and local base their defaults."""
    import transformers

    small = dict(BOOK_270M, vocab_size=300, n_layers=7, layer_types=[S] * 5 + [F, S], dtype="float32")
    _write_like_the_converter(tmp_path / "m.gguf", small, 300)
    from mha_export.gguf.read import read_metadata

    ours = GEMMA3.config_from_gguf(read_metadata(tmp_path / "m.gguf"))
    theirs = transformers.AutoConfig.from_pretrained(tmp_path, gguf_file="m.gguf")
    assert theirs.model_type == "gemma3_text"
    doc = theirs.to_dict()
    read = config_from_dict(doc | {"rms_norm_eps": _f32(doc["rms_norm_eps"])})
    assert ours == read == config_from_dict(small)


def test_our_gguf_metadata_says_every_layer_and_the_local_base(tmp_path: Path) -> None:
    """gguf_metadata writes llama.cpp's per-layer pattern and local base: a pattern and base other than the
    defaults read back; the pattern as an integer (llama.cpp's other form) reads as every n-th layer global."""
    from mha_export.gguf.read import read_metadata
    from mha_export.gguf.write import write_gguf

    cfg = Gemma3Config(vocab_size=40, context_length=32, emb_dim=32, n_heads=2, n_layers=3, hidden_dim=32,
                       head_dim=16, n_kv_groups=1, rope_base=5e5, rope_local_base=100.0, sliding_window=4,
                       layer_types=(F, S, S), query_pre_attn_scalar=16, rms_norm_eps=1e-5)
    torch.manual_seed(0)
    state = {k: v for k, v in GEMMA3.eager(cfg).state_dict().items() if not GEMMA3.BUFFERS.fullmatch(k)}
    write_gguf(tmp_path / "m.gguf", GEMMA3.gguf_tensors(state, cfg, tied=True), cfg, dtype="fp32", name="m",
               vocab=None)
    fields = read_metadata(tmp_path / "m.gguf")
    assert fields["gemma3.attention.sliding_window_pattern"] == [False, True, True]
    assert GEMMA3.config_from_gguf(fields) == cfg
    every_second = fields | {"gemma3.attention.sliding_window_pattern": 2}
    assert GEMMA3.config_from_gguf(every_second).layer_types == (S, F, S)


@pytest.mark.parametrize("change, said", [
    ({"hidden_activation": "gelu"}, "hidden_activation \"gelu\""),
    ({"final_logit_softcapping": 30.0}, "final_logit_softcapping 30.0"),
    ({"attention_bias": True}, "attention_bias true"),
    ({"use_bidirectional_attention": True}, "use_bidirectional_attention true"),
    ({"rope_parameters": {F: {"rope_type": "linear", "factor": 8.0}, S: None}}, "rope_type \"linear\""),
    ({"layer_types": [S, F, "chunked_attention", S]}, "unknown layer type 'chunked_attention'"),
    ({"layer_types": [S, F]}, "expected a list of n_layers (4) entries"),
    ({"sliding_window": None}, "sliding_window': expected a positive integer, got None"),
    ({"quantization_config": {"quant_method": "gptq"}}, "quantization_config"),
    ({"vocab_size": None}, "missing key 'vocab_size'"),
])
def test_a_config_json_the_books_model_cannot_compute_is_one_line(change: dict[str, Any], said: str) -> None:
    doc = {k: v for k, v in (HF_GEMMA3 | {"model_type": "gemma3_text"} | change).items() if v is not None
           or k == "sliding_window"}
    with pytest.raises(BadValueError) as info:
        config_from_dict(doc)
    line = str(info.value)
    assert "\n" not in line and said in line, line


@pytest.mark.parametrize("drop, change, said", [
    ("gemma3.attention.sliding_window", {}, "missing 'gemma3.attention.sliding_window'"),
    (None, {"gemma3.attention.sliding_window_pattern": [True, False]}, "expected one bool per block (7)"),
    (None, {"gemma3.final_logit_softcapping": 30.0}, "no soft-capping"),
    (None, {"gemma3.attention.value_length": 128}, "value_length 128; expected the key length 256"),
])
def test_gguf_metadata_the_books_model_cannot_compute_is_one_line(tmp_path: Path, drop: str | None,
                                                                  change: dict[str, Any], said: str) -> None:
    from mha_export.gguf.read import read_metadata

    small = dict(BOOK_270M, vocab_size=300, n_layers=7, layer_types=[S] * 5 + [F, S])
    _write_like_the_converter(tmp_path / "m.gguf", small, 300)
    fields = {k: v for k, v in read_metadata(tmp_path / "m.gguf").items() if k != drop} | change
    with pytest.raises(BadValueError) as info:
        GEMMA3.config_from_gguf(fields)
    assert "\n" not in str(info.value) and said in str(info.value), str(info.value)


def test_the_drop_in_config_is_transformers_config_of_the_same_model() -> None:
    """hf_config as transformers 5 reads it (Gemma3TextConfig) has the model's layers, window, both bases and
    scalar, and reads back through config_from_hf as the config (JSON and transformers' own to_dict)."""
    import transformers

    cfg = config_from_dict(HF_GEMMA3 | {"model_type": "gemma3_text"})
    fields = json.loads(json.dumps(GEMMA3.hf_config(cfg, tied=True, eos_id=1)))
    theirs = transformers.Gemma3TextConfig(**fields)
    assert theirs.layer_types == list(cfg.layer_types) and theirs.sliding_window == 8
    assert theirs.rope_parameters[S]["rope_theta"] == 1e4 and theirs.rope_parameters[F]["rope_theta"] == 1e6
    assert theirs.query_pre_attn_scalar == 24 and theirs.head_dim == 16
    assert GEMMA3.config_from_hf(fields) == cfg == GEMMA3.config_from_hf(theirs.to_dict())


def test_llama_cpp_refuses_a_query_scalar_other_than_the_head_size() -> None:
    """llama.cpp's gemma3 scales queries by head_dim ** -0.5: the test checkpoint's 24 (head 16) has no GGUF form;
    the 270M's 256 (head 256) has every one."""
    small = config_from_dict(HF_GEMMA3 | {"model_type": "gemma3_text"})
    line = GEMMA3.refusal(small, "gpt.gguf")
    assert line is not None and "query_pre_attn_scalar 24 is not 16" in line
    assert GEMMA3.refusal(dataclasses.replace(small, query_pre_attn_scalar=16), "gpt.gguf") is None
    big = config_from_dict(dict(BOOK_270M))
    assert all(GEMMA3.refusal(big, f) is None for f in ("gpt.gguf", "gpt.q8_0.gguf", "gpt.q4_0.gguf", "gpt.pte",
                                                        "gpt.inplace.onnx", "gpt.inplace.int4.onnx"))
