"""The architecture table (export/mha_export/decoder/archs/): every row resolves to a module with every member of the
protocol, the lookups find it by name, model_type, general.architecture and the book's keys, an unknown one is one
line naming the supported ones; GPT-2's weight and tensor maps agree with libraries no one here wrote (transformers'
GPT2LMHeadModel, gguf-py's tensor names); the graph builders' grouped-query attention (fewer key/value heads than
query heads) gives the book's own GPTModel's logits where each group shares one key/value head."""
from __future__ import annotations

import dataclasses
import inspect
import pkgutil
import typing
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType, SimpleNamespace

import numpy as np
import onnxruntime as ort
import pytest
import torch

import mha_export.decoder.archs as archs
from gpt_sources import book_model, hf_model, save_hf
from mha_export.decoder.archs import (
    ARCHS,
    arch_named,
    arch_of,
    book_arch,
    by_gguf_arch,
    by_model_type,
    config_from_dict,
    hf_arch,
)
from mha_export.decoder.archs.gemma3.config import Gemma3Config
from mha_export.decoder.archs.gpt2.config import GPTConfig
from mha_export.decoder.archs.gpt2.graph import GPT2Pieces
from mha_export.decoder.archs.llama.config import LlamaConfig, Qwen3Config
from mha_export.decoder.archs.protocol import Architecture, Pieces
from mha_export.decoder.graphs.concat import concat_model
from mha_export.decoder.graphs.inplace import inplace_model
from mha_export.decoder.graphs.shared import Graph, numpy_state
from mha_runtime.artifact.errors import BadValueError, ConfigError
from mha_runtime.artifact.tolerance import compare
from mha_runtime.decoder.contract import CONCAT_FORM
from mha_runtime.decoder.forms import FORMS

# A small config of every architecture: a new row needs one here (test_every_row_has_a_small_config).
SMALL = {"gpt2": GPTConfig(vocab_size=61, context_length=12, emb_dim=16, n_heads=2, n_layers=2, qkv_bias=True),
         "llama": LlamaConfig(vocab_size=61, context_length=12, emb_dim=16, n_heads=4, n_layers=2, hidden_dim=24,
                              n_kv_groups=2, rope_base=10_000.0),
         "qwen3": Qwen3Config(vocab_size=61, context_length=12, emb_dim=16, n_heads=4, n_layers=2, hidden_dim=24,
                              n_kv_groups=2, rope_base=10_000.0, head_dim_=8),
         "gemma3": Gemma3Config(vocab_size=61, context_length=12, emb_dim=16, n_heads=4, n_layers=2, hidden_dim=24,
                                head_dim=8, n_kv_groups=2, rope_base=1e6, rope_local_base=1e4, sliding_window=4,
                                layer_types=("sliding_attention", "full_attention"), query_pre_attn_scalar=8)}
FP32 = FORMS[CONCAT_FORM].tolerance  # the fp32 forms' row: every comparison here is held to it


def _members(protocol: type) -> tuple[dict[str, object], set[str]]:
    """A protocol's data members with their types, and its methods."""
    data = typing.get_type_hints(protocol)
    methods = {n for n, v in vars(protocol).items() if inspect.isfunction(v) and not n.startswith("_")}
    return data, methods


def test_every_row_has_a_small_config() -> None:
    assert set(SMALL) == set(ARCHS)


@pytest.mark.parametrize("name", sorted(ARCHS))
def test_a_row_is_a_module_with_every_member_of_the_protocol(name: str) -> None:
    arch = ARCHS[name]
    assert isinstance(arch, ModuleType) and arch.__name__ == f"mha_export.decoder.archs.{name}"
    assert arch.NAME == name and arch_named(name) is arch
    data, methods = _members(Architecture)
    assert len(data) >= 10 and len(methods) >= 10  # the protocol was read, not an empty class
    for member, kind in data.items():
        value = getattr(arch, member)  # AttributeError names a missing one
        assert isinstance(value, typing.get_origin(kind) or kind), (member, value)
    for member in methods:
        assert callable(getattr(arch, member)), member
        ours = inspect.signature(getattr(arch, member)).parameters
        theirs = [p for p in inspect.signature(getattr(Architecture, member)).parameters if p != "self"]
        assert list(ours) == theirs, member


@pytest.mark.parametrize("name", sorted(ARCHS))
def test_no_submodule_of_an_architecture_shadows_a_member(name: str) -> None:
    """An architecture is a package: importing its submodule `x` sets the package's attribute `x`, which would
    replace a protocol member of that name (a submodule eager.py once turned the member eager() into a module)."""
    arch = ARCHS[name]
    submodules = {info.name for info in pkgutil.iter_modules(getattr(arch, "__path__", []))}
    data, methods = _members(Architecture)
    assert submodules.isdisjoint({*data, *methods}), submodules & {*data, *methods}


@pytest.mark.parametrize("name", sorted(ARCHS))
def test_what_a_row_dispatches_to_resolves(name: str) -> None:
    """The lazily imported members: the eager reference (its parameters are book_shapes), the graph pieces (every
    member of Pieces), the ExecuTorch module, the drop-in config, the GGUF tensors, the config round trip."""
    arch, cfg = ARCHS[name], SMALL[name]
    assert arch_of(cfg) is arch
    assert arch.config_from_book(cfg.to_dict()) == cfg
    model = arch.eager(cfg)
    state = {k: v for k, v in model.state_dict().items() if not arch.BUFFERS.fullmatch(k)}
    assert {k: tuple(v.shape) for k, v in state.items()} == arch.book_shapes(cfg)
    pieces = arch.graph_pieces(Graph(), numpy_state(state), cfg, fused=False)
    assert all(callable(getattr(pieces, m)) for m in _members(Pieces)[1])
    assert isinstance(arch.pte_module(model, cfg), torch.nn.Module)
    hf = arch.hf_config(cfg, tied=True, eos_id=None)
    assert hf["model_type"] == arch.HF_MODEL_TYPE
    # the fields a checkpoint's config.json decides: config fields, named as its config.json names them
    named = {field: name.split()[0] for field, name in arch.HF_DECIDED.items()}
    assert set(named) <= set(cfg.to_dict()) and set(named.values()) & set(hf)
    assert all(hf[name] == getattr(cfg, field) for field, name in named.items() if name in hf)
    assert set(arch.hf_names(cfg, "")) >= set(arch.book_shapes(cfg))
    assert all(a.dtype == np.float32 for a in arch.gguf_tensors(state, cfg, tied=False).values())
    assert isinstance(arch.describe(cfg), str)
    assert all(isinstance(arch.refusal(cfg, f), (str, type(None))) for f in ("gpt.onnx", "gpt.pte", "gpt.gguf"))


def test_lookups_by_model_type_gguf_architecture_and_the_books_keys() -> None:
    gpt2 = ARCHS["gpt2"]
    assert by_model_type("gpt2") is gpt2 and by_gguf_arch("gpt2") is gpt2
    assert hf_arch({"model_type": "gpt2"}) is gpt2
    assert hf_arch({"n_embd": 16, "n_head": 2}) is gpt2  # a config.json written without model_type
    assert hf_arch(SMALL["gpt2"].to_dict()) is None  # the book's keys
    assert book_arch({"vocab_size": 5, "context_length": 8, "emb_dim": 8, "n_heads": 2, "n_layers": 1}) is gpt2
    hf = {"model_type": "gpt2", "vocab_size": 61, "n_positions": 12, "n_embd": 16, "n_head": 2, "n_layer": 2,
          "_name_or_path": "x"}
    assert config_from_dict(hf) == SMALL["gpt2"]  # GPT-2's q/k/v biases; keys it does not read are left
    assert config_from_dict(SMALL["gpt2"].to_dict()) == SMALL["gpt2"]


@pytest.mark.parametrize("call, said", [
    (lambda: by_model_type("mistral"), "model_type 'mistral'"),
    (lambda: by_gguf_arch("mamba"), "general.architecture 'mamba'"),
    (lambda: arch_named("bert"), "arch 'bert'"),
    (lambda: config_from_dict({"model_type": "qwen2", "hidden_size": 8}), "model_type 'qwen2'"),
])
def test_an_unknown_architecture_is_one_line_naming_the_supported_ones(call: typing.Callable[[], object],
                                                                      said: str) -> None:
    with pytest.raises(BadValueError) as info:
        call()
    line = str(info.value)
    assert "\n" not in line and said in line and "; supported: " in line
    assert all(f"{name} (" in line.split("; supported: ")[1] for name in ARCHS)


def test_gpt2_names_are_transformers_gpt2_keys_and_read_back_its_logits(tmp_path: Path) -> None:
    """hf_names covers GPT2LMHeadModel's state_dict exactly (its tied lm_head aside); the checkpoint read through
    them into the book's own GPTModel (llms_from_scratch) gives transformers' logits."""
    from mha_export.decoder.weights import read_gpt_weights

    gpt2, cfg = ARCHS["gpt2"], GPTConfig(vocab_size=50257, context_length=16, emb_dim=32, n_heads=4, n_layers=2,
                                         qkv_bias=True)
    model = hf_model(cfg)
    keys = {k for k in model.state_dict() if not gpt2.BUFFERS.fullmatch(k)}
    match = next(m for m in map(gpt2.HF_SIGNATURE.fullmatch, keys) if m)
    assert set(gpt2.hf_names(cfg, match.group(1) or "").values()) | {"lm_head.weight"} == keys
    read = read_gpt_weights(save_hf(model, tmp_path, safetensors=True), cfg)
    assert (read.layout, read.tied) == (gpt2.HF_LAYOUT, True)
    book = book_model(cfg)
    book.load_state_dict(read.state, strict=False)
    ids = torch.randint(0, cfg.vocab_size, (2, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert compare(book(ids).numpy(), model(ids).logits.numpy(), FP32).ok


def test_gpt2_gguf_tensors_are_llama_cpps_gpt2_names(tmp_path: Path) -> None:
    """Every tensor name is one gguf-py lists for MODEL_ARCH.GPT2, every block has each of its tensors, and the
    metadata written reads back (gguf/read.py) as the config, with GPT-2's q/k/v biases."""
    import gguf

    from mha_export.decoder.checkpoint import gguf_config
    from mha_export.gguf.read import read_metadata
    from mha_export.gguf.write import write_gguf

    gpt2, cfg = ARCHS["gpt2"], dataclasses.replace(SMALL["gpt2"], qkv_bias=False, emb_dim=32)
    state = {k: v for k, v in gpt2.eager(cfg).state_dict().items() if not gpt2.BUFFERS.fullmatch(k)}
    tensors = gpt2.gguf_tensors(state, cfg, tied=False)
    allowed = {gguf.TENSOR_NAMES[t].format(bid=i) + suffix for t in gguf.MODEL_TENSORS[gguf.MODEL_ARCH.GPT2]
               for i in range(cfg.n_layers) for suffix in (".weight", ".bias")}
    assert set(tensors) <= allowed
    assert len({n for n in tensors if n.startswith("blk.")}) == 12 * cfg.n_layers and "output.weight" in tensors
    write_gguf(tmp_path / "m.gguf", tensors, cfg, dtype="fp32", name="m", vocab=None)
    fields = read_metadata(tmp_path / "m.gguf")
    assert fields["general.architecture"] == gpt2.GGUF_ARCH
    assert gguf_config(fields, where="m.gguf") == dataclasses.replace(cfg, qkv_bias=True)
    with pytest.raises(BadValueError, match=r"^m\.gguf: unknown architecture: general\.architecture 'mamba'"):
        gguf_config(fields | {"general.architecture": "mamba"}, where="m.gguf")


# ---- grouped-query attention in both graph builders
GROUPS = 2


@dataclasses.dataclass(frozen=True, kw_only=True)
class GroupedConfig(GPTConfig):
    """GPT-2 whose query heads share key/value heads in GROUPS: a test architecture of its own."""

    @property
    def kv_heads(self) -> int:
        return self.n_heads // GROUPS

    @property
    def arch(self) -> str:
        return "gpt2-grouped"


def _kept(w: dict[str, np.ndarray], cfg: GPTConfig) -> dict[str, np.ndarray]:
    """The book's weights with W_key, W_value (and their biases) cut to each group's first head: rows (out) by head."""
    d, out = cfg.head_dim, dict(w)
    rows = np.concatenate([np.arange(h * d, (h + 1) * d) for h in range(0, cfg.n_heads, GROUPS)])
    for key in [k for k in w if ".att.W_key." in k or ".att.W_value." in k]:
        out[key] = w[key][rows]
    return out


def _grouped_book(cfg: GPTConfig) -> torch.nn.Module:
    """The book's own GPTModel whose key/value heads are copies of their group's first: grouped-query attention."""
    model = book_model(cfg)
    d = cfg.head_dim
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".att.W_key." in name or ".att.W_value." in name:
                for h in range(cfg.n_heads):
                    first = h // GROUPS * GROUPS
                    p[h * d:(h + 1) * d] = p[first * d:(first + 1) * d].clone()
    return model


def test_grouped_query_attention_in_both_forms(monkeypatch: pytest.MonkeyPatch) -> None:
    """kv_heads < n_heads: the portable form (q viewed by group; a prefill and a step over the Concat cache) and the
    in-place form (GroupQueryAttention's kv_num_heads) give the book's GPTModel's logits with shared key/value
    heads, from K-head caches."""
    base = GPTConfig(vocab_size=53, context_length=12, emb_dim=32, n_heads=4, n_layers=2, qkv_bias=True)
    cfg = GroupedConfig(**base.to_dict())
    row = SimpleNamespace(NAME=cfg.arch, graph_pieces=lambda g, w, c, *, fused: GPT2Pieces(g, _kept(w, c), c,
                                                                                            fused=fused))
    monkeypatch.setattr(archs, "ARCHS", {**ARCHS, cfg.arch: row})
    book = _grouped_book(base)
    state = {k: v for k, v in book.state_dict().items() if not k.endswith(".mask")}
    ids = np.random.default_rng(1).integers(0, cfg.vocab_size, (2, 6))
    with torch.no_grad():
        expected = book(torch.tensor(ids)).numpy()  # (2, 6, V)
    k, d, layers = cfg.kv_heads, cfg.head_dim, range(cfg.n_layers)

    concat = ort.InferenceSession(concat_model(state, cfg, tied=False).full().SerializeToString())
    empty = {f"past_key_values.{i}.{n}": np.zeros((2, k, 0, d), np.float32) for i in layers for n in ("key", "value")}
    feeds = {"input_ids": ids[:, :5], "attention_mask": np.ones((2, 5), np.int64),
             "position_ids": np.tile(np.arange(5), (2, 1))}
    names = [o.name for o in concat.get_outputs()]
    got = dict(zip(names, concat.run(None, feeds | empty), strict=True))
    assert got["present.0.key"].shape == (2, k, 5, d)
    assert compare(got["logits"], expected[:, :5], FP32).ok
    past = {f"past_key_values.{i}.{n}": got[f"present.{i}.{n}"] for i in layers for n in ("key", "value")}
    step = {"input_ids": ids[:, 5:], "attention_mask": np.ones((2, 6), np.int64), "position_ids": np.full((2, 1), 5)}
    assert compare(concat.run(["logits"], step | past)[0][:, 0], expected[:, 5], FP32).ok

    inplace = ort.InferenceSession(inplace_model(state, cfg, tied=False).full().SerializeToString())
    buffers = {f"past_key_values.{i}.{n}": np.zeros((2, k, cfg.context_length, d), np.float32)
               for i in layers for n in ("key", "value")}
    feeds = {"input_ids": ids, "past_tokens": np.zeros(2, np.int32)}
    assert compare(inplace.run(["next_token_logits"], feeds | buffers)[0], expected[:, -1], FP32).ok


def test_mapping_members_are_read_only() -> None:
    assert isinstance(ARCHS, Mapping)
    assert all(isinstance(m, Mapping) and not isinstance(m, dict) for a in ARCHS.values()
               for m in (a.HF_DEFAULTS, a.HF_DECIDED))
    with pytest.raises(TypeError):
        ARCHS["x"] = ARCHS["gpt2"]  # type: ignore[index]


@pytest.mark.parametrize("name", sorted(ARCHS))
def test_a_checkpoint_of_no_known_layout_is_refused_naming_the_architectures_own_keys(name: str,
                                                                                       tmp_path: Path) -> None:
    """The refusal names the book's keys of the architecture asked for (Gemma 3's blocks are 'blocks.N', the
    others' 'trf_blocks.N'), read from its book_shapes, and its Hugging Face names."""
    from safetensors.torch import save_file

    from mha_export.decoder.weights import read_gpt_weights

    cfg = SMALL[name]
    save_file({"encoder.layer.0.weight": torch.zeros(2, 2)}, str(tmp_path / "bert.safetensors"))
    with pytest.raises(ConfigError) as info:
        read_gpt_weights(tmp_path / "bert.safetensors", cfg)
    line = str(info.value)
    prefix = "blocks" if name == "gemma3" else "trf_blocks"
    assert "\n" not in line and f"('tok_emb.weight', '{prefix}.N...')" in line, line
    assert ARCHS[name].HF_KEYS in line and "got 1 keys: 'encoder.layer.0.weight'" in line, line
