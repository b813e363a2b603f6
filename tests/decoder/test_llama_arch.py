"""The llama and qwen3 architectures' members against code no one here wrote: transformers' LlamaForCausalLM and
Qwen3ForCausalLM (config.json read onto the book's config, their checkpoints onto the book's keys, loaded into the
book's own Llama3Model / Qwen3Model from llms_from_scratch: the same logits), llama.cpp's converter (its q/k row
permutation and Llama 3's rope_freqs, imported from the bundled tree) and gguf-py's tensor names; GGUF round trips;
the drop-in config.json as transformers reads it; a config.json the book's model cannot compute refused in one line.
"""
from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from helpers import REPO
from llama_sources import HF_LLAMA, HF_QWEN3, hf_family, save_family
from mha_export.decoder.archs import ARCHS, config_from_dict
from mha_export.decoder.archs.llama.config import LlamaConfig, Qwen3Config
from mha_export.decoder.archs.llama.gguf_map import ROPE_FREQS, rope_freq_of
from mha_export.decoder.weights import read_gpt_weights
from mha_runtime.artifact.errors import BadValueError, ConfigError

# head size 16: of its 8 frequencies (wavelengths 6.3 to 6283 positions) one is kept, three interpolated, four scaled
LLAMA = LlamaConfig(vocab_size=53, context_length=16, emb_dim=64, n_heads=4, n_layers=2, hidden_dim=64,
                    n_kv_groups=2, rope_base=10_000.0, rms_norm_eps=1e-5,
                    rope_freq={"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 16.0,
                               "original_context_length": 256})
QWEN3 = Qwen3Config(vocab_size=53, context_length=16, emb_dim=32, n_heads=4, n_layers=2, hidden_dim=64,
                    n_kv_groups=2, rope_base=1_000_000.0, head_dim_=16)
SMALL = {"llama": LLAMA, "qwen3": QWEN3}
LOGITS_ATOL = 1e-5
CONVERTER = REPO / ".cache" / "llama.cpp" / "src"


def _book_state(arch: str, cfg: Any, seed: int = 3) -> dict[str, torch.Tensor]:
    """The book's model's parameters, random (the norms too)."""
    torch.manual_seed(seed)
    model = ARCHS[arch].eager(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(1.0 if p.ndim == 1 else 0.0, 0.2)
    return {k: v.detach().clone() for k, v in model.state_dict().items() if not ARCHS[arch].BUFFERS.fullmatch(k)}


@pytest.mark.parametrize("arch, safetensors", [("llama", True), ("qwen3", True), ("qwen3", False)])
def test_a_transformers_checkpoint_in_the_books_model_gives_its_logits(tmp_path: Path, arch: str,
                                                                       safetensors: bool) -> None:
    """save_pretrained's config.json is read onto the book's config (GQA, Llama 3's scaling, the epsilon, Qwen3's
    head size), its weights onto the book's keys (tied where lm_head.weight is absent or the embedding), and the
    book's model gives transformers' logits (measured: identical, 0.0 apart; with the book's hard-coded epsilon
    instead of the config's they are 2.2e-2 (llama) and 4.7e-4 (qwen3) apart)."""
    model = hf_family(arch)
    path = save_family(model, tmp_path, safetensors=safetensors)
    cfg = config_from_dict(json.loads((tmp_path / "config.json").read_text()))
    hf = HF_LLAMA if arch == "llama" else HF_QWEN3
    assert (cfg.arch, cfg.kv_heads, cfg.norm_eps) == (arch, hf["num_key_value_heads"], hf["rms_norm_eps"])
    assert cfg.head_dim == 16  # llama: 64 / 4; qwen3: its own, twice 32 / 4
    if arch == "llama":
        assert cfg.rope_freq == {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 16.0,
                                 "original_context_length": 256}
    else:
        assert cfg.head_dim == 2 * cfg.emb_dim // cfg.n_heads and cfg.rope_base == 1e6
    read = read_gpt_weights(path, cfg)
    assert (read.layout, read.tied) == (ARCHS[arch].HF_LAYOUT, hf["tie_word_embeddings"])
    book = ARCHS[arch].eager(cfg).eval()
    book.load_state_dict(read.state, strict=True)
    ids = torch.randint(0, cfg.vocab_size, (2, 11), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        worst = (book(ids) - model(ids).logits).abs().max().item()
    assert worst <= LOGITS_ATOL, worst


@pytest.mark.parametrize("arch", sorted(SMALL))
def test_hf_names_are_exactly_transformers_keys(arch: str) -> None:
    model = hf_family(arch, tie_word_embeddings=False)
    cfg = config_from_dict(model.config.to_dict())
    row = ARCHS[arch]
    keys = set(model.state_dict())
    prefix = next(m for m in map(row.HF_SIGNATURE.fullmatch, keys) if m).group(1) or ""
    assert set(row.hf_names(cfg, prefix).values()) == keys
    assert set(row.hf_names(cfg, prefix)) == set(row.book_shapes(cfg))


@pytest.mark.parametrize("arch", sorted(SMALL))
def test_the_books_state_dict_reads_back_as_it_is(tmp_path: Path, arch: str) -> None:
    cfg = SMALL[arch]
    state = _book_state(arch, cfg)
    torch.save(state, tmp_path / "model.pth")
    read = read_gpt_weights(tmp_path / "model.pth", cfg)
    assert (read.layout, read.tied, set(read.state)) == (ARCHS[arch].BOOK_LAYOUT, False, set(state))
    assert all(torch.equal(read.state[k], v) for k, v in state.items())


@pytest.mark.parametrize("arch, tied", [("llama", False), ("llama", True), ("qwen3", True), ("qwen3", False)])
def test_gguf_tensors_round_trip_through_read_gguf_exactly(arch: str, tied: bool) -> None:
    import gguf

    cfg, row = SMALL[arch], ARCHS[arch]
    state = _book_state(arch, cfg)
    if tied:
        state["out_head.weight"] = state["tok_emb.weight"]
    tensors = row.gguf_tensors(state, cfg, tied=tied)
    allowed = {gguf.TENSOR_NAMES[t].format(bid=i) + ".weight"
               for t in gguf.MODEL_TENSORS[gguf.MODEL_ARCH.LLAMA if arch == "llama" else gguf.MODEL_ARCH.QWEN3]
               for i in range(cfg.n_layers)}
    assert set(tensors) <= allowed and ("output.weight" in tensors) is not tied
    assert (ROPE_FREQS in tensors) is (arch == "llama")  # Llama 3's scaling; Qwen3 has none
    back, back_tied = row.read_gguf(tensors, cfg)
    assert back_tied is tied and set(back) == set(state)
    assert all(torch.equal(back[k], v) for k, v in state.items())
    other = dataclasses.replace(cfg, rope_base=cfg.rope_base * 2) if arch == "llama" else None
    if other is not None:  # a rope_freqs tensor the config would not compute
        with pytest.raises(ConfigError, match=r"^GGUF \(llama\): tensor 'rope_freqs.weight' scales"):
            row.read_gguf(tensors, dataclasses.replace(other, rope_freq={**cfg.rope_freq, "factor": 8.0}))


@pytest.fixture
def converter(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The bundled llama.cpp tree's converter class for Llama (conversion/llama.py), over the pinned gguf."""
    if not (CONVERTER / "conversion" / "llama.py").is_file():
        pytest.skip("llama.cpp's tree is not under .cache/ (make llama-cpp)")
    monkeypatch.setenv("NO_LOCAL_GGUF", "1")  # its base.py would put its own gguf-py first
    monkeypatch.syspath_prepend(str(CONVERTER))
    from conversion.llama import LlamaModel

    yield LlamaModel
    for name in [n for n in sys.modules if n == "conversion" or n.startswith("conversion.")]:
        del sys.modules[name]


def test_llamas_q_k_rows_and_rope_freqs_are_the_converters(converter: Any) -> None:
    """attn_q / attn_k are LlamaModel.permute of the book's (= Hugging Face's) q_proj / k_proj, with the head
    counts modify_tensors passes; rope_freqs is its generate_extra_tensors' for the same rope parameters. Qwen3's
    converter permutes nothing."""
    cfg = LLAMA
    state = _book_state("llama", cfg)
    tensors = ARCHS["llama"].gguf_tensors(state, cfg, tied=False)
    for i in range(cfg.n_layers):
        q, k = (state[f"trf_blocks.{i}.att.{w}.weight"] for w in ("W_query", "W_key"))
        theirs_q = converter.permute(q, cfg.n_heads, cfg.n_heads)
        theirs_k = converter.permute(k, cfg.n_heads, cfg.kv_heads)
        assert np.array_equal(tensors[f"blk.{i}.attn_q.weight"], theirs_q.numpy())
        assert np.array_equal(tensors[f"blk.{i}.attn_k.weight"], theirs_k.numpy())
    freq = cfg.rope_freq
    stub = SimpleNamespace(
        rope_parameters={"rope_type": "llama3", "rope_theta": cfg.rope_base, "factor": freq["factor"],
                         "low_freq_factor": freq["low_freq_factor"], "high_freq_factor": freq["high_freq_factor"],
                         "original_max_position_embeddings": freq["original_context_length"]},
        hparams={"hidden_size": cfg.emb_dim, "num_attention_heads": cfg.n_heads},
        format_tensor_name=lambda t: "rope_freqs.weight")
    (name, theirs), = list(converter.generate_extra_tensors(stub))
    assert name == ROPE_FREQS and np.allclose(tensors[ROPE_FREQS], theirs.numpy(), rtol=1e-6, atol=0)
    assert len(set(np.round(theirs.numpy(), 4))) == 5  # kept, three interpolated and scaled frequencies
    qwen = ARCHS["qwen3"].gguf_tensors(_book_state("qwen3", QWEN3), QWEN3, tied=True)
    assert ROPE_FREQS not in qwen


@pytest.mark.parametrize("arch", sorted(SMALL))
def test_gguf_metadata_reads_back_as_the_config(tmp_path: Path, arch: str) -> None:
    """gguf_metadata's keys, written by the export's writer and read by gguf-py, give the config back; Llama 3's
    scaling comes back from the rope_freqs tensor (rope_freq_of), computing the same factors."""
    from mha_export.gguf.read import read_metadata
    from mha_export.gguf.write import write_gguf

    cfg, row = SMALL[arch], ARCHS[arch]
    tensors = row.gguf_tensors(_book_state(arch, cfg), cfg, tied=True)
    write_gguf(tmp_path / "m.gguf", tensors, cfg, dtype="fp32", name="m", vocab=None)
    fields = read_metadata(tmp_path / "m.gguf")
    got = row.config_from_gguf(fields)
    if arch == "llama":
        assert got == dataclasses.replace(cfg, rope_freq=None)
        bare = {k: v for k, v in fields.items() if not k.endswith(("key_length", "value_length"))}  # SmolLM2's
        assert row.config_from_gguf(bare) == got
        fitted = rope_freq_of(tensors[ROPE_FREQS], got)
        assert fitted.rope_freq == cfg.rope_freq
        assert row.read_gguf(tensors, fitted)[1] is True
    else:
        assert got == cfg


@pytest.mark.parametrize("arch", sorted(SMALL))
def test_the_drop_in_config_is_transformers_config_of_the_same_model(arch: str) -> None:
    """hf_config as transformers 5 reads it (LlamaConfig / Qwen3Config) has the model's shapes, RoPE and head size,
    and reads back through config_from_hf as the config."""
    import transformers

    cfg, row = SMALL[arch], ARCHS[arch]
    fields = row.hf_config(cfg, tied=True, eos_id=5)
    theirs = (transformers.LlamaConfig if arch == "llama" else transformers.Qwen3Config)(**fields)
    assert (theirs.head_dim, theirs.num_key_value_heads, theirs.rms_norm_eps) == (cfg.head_dim, 2, cfg.norm_eps)
    rope = theirs.rope_parameters
    assert rope["rope_theta"] == cfg.rope_base
    assert rope["rope_type"] == ("llama3" if arch == "llama" else "default")
    assert row.config_from_hf(json.loads(json.dumps(fields))) == cfg
    assert row.config_from_hf(theirs.to_dict()) == cfg  # transformers 5's own config.json, rope_parameters


@pytest.mark.parametrize("arch, change, said", [
    ("llama", {"hidden_act": "gelu"}, "hidden_act \"gelu\""),
    ("llama", {"attention_bias": True}, "attention_bias true"),
    ("llama", {"mlp_bias": True}, "mlp_bias true"),
    ("llama", {"head_dim": 32}, "head_dim 32; expected null or 16"),
    ("llama", {"rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, "rope_type \"yarn\""),
    ("llama", {"rope_scaling": {"type": "linear", "factor": 2.0}}, "rope_type \"linear\""),
    ("llama", {"partial_rotary_factor": 0.5}, "partial_rotary_factor 0.5"),
    ("llama", {"quantization_config": {"quant_method": "gptq"}}, "quantization_config"),
    ("qwen3", {"rope_parameters": dict(HF_LLAMA["rope_parameters"])}, "rope_type \"llama3\""),
    ("qwen3", {"use_sliding_window": True}, "use_sliding_window true"),
    ("qwen3", {"layer_types": ["full_attention", "sliding_attention"]}, "layer_types"),
    ("qwen3", {"vocab_size": None}, "missing key 'vocab_size'"),
])
def test_a_config_json_the_books_model_cannot_compute_is_one_line(arch: str, change: dict[str, Any],
                                                                   said: str) -> None:
    base = HF_LLAMA if arch == "llama" else HF_QWEN3
    doc = {"model_type": arch, **base, **change}
    doc = {k: v for k, v in doc.items() if v is not None}
    with pytest.raises(BadValueError) as info:
        config_from_dict(doc)
    line = str(info.value)
    assert "\n" not in line and line.startswith("config.json: ") and said in line, line


def test_the_books_dicts_pick_their_architecture_and_eager_keeps_the_configs_epsilon() -> None:
    from llms_from_scratch.llama3 import LLAMA32_CONFIG_1B
    from llms_from_scratch.qwen3 import QWEN_CONFIG_06_B

    from mha_export.decoder.archs import book_arch

    for arch, book in (("llama", LLAMA32_CONFIG_1B), ("qwen3", QWEN_CONFIG_06_B)):
        data = {**book, "dtype": "bfloat16"}
        assert book_arch(data).NAME == arch
        assert ARCHS[arch].config_from_book(data).to_dict() == data | {"rms_norm_eps": 1e-5 if arch == "llama"
                                                                                     else 1e-6}
    cfg = dataclasses.replace(LLAMA, rms_norm_eps=1e-3)
    eps = {m.eps for m in ARCHS["llama"].eager(cfg).modules() if isinstance(m, torch.nn.RMSNorm)}
    assert eps == {1e-3}
    model = ARCHS["llama"].eager(cfg)
    assert all(p.dtype == torch.float32 for p in model.parameters())
