"""Weight layouts: the pure mappings, recognition, and every bad checkpoint refused in one line before any output."""
from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner
from llms_from_scratch.ch03 import MultiHeadAttention
from safetensors.torch import save_file

from mha_export.attention.weights.layouts import book_mha_state, hf_gpt2_state, locate
from mha_export.attention.weights.load import load_model, seeded_model
from mha_export.model.wrapper import build_wrapper
from mha_runtime.artifact.errors import ConfigError
from mha_runtime.attention.config import MHAConfig, preset
from mha_runtime.cli.main import cli

SEED = preset("seed")
CONFIG = MHAConfig(d_in=8, d_out=2, num_heads=3, context_length=5, qkv_bias=True, out_proj=True)


def _wrapper_state(config: MHAConfig = SEED) -> dict[str, torch.Tensor]:
    torch.manual_seed(7)
    return build_wrapper(config).state_dict()


def _book_mha() -> MultiHeadAttention:
    torch.manual_seed(8)
    return MultiHeadAttention(8, 6, 5, 0.0, num_heads=3, qkv_bias=True).eval()


def _hf_state() -> dict[str, torch.Tensor]:
    """GPT-2's Conv1D layout for CONFIG, built from a wrapper so the expected mapping is known."""
    from transformers.pytorch_utils import Conv1D

    torch.manual_seed(9)
    c_attn, c_proj = Conv1D(3 * 6, 8), Conv1D(6, 6)
    return {"c_attn.weight": c_attn.weight, "c_attn.bias": c_attn.bias, "c_proj.weight": c_proj.weight,
            "c_proj.bias": c_proj.bias}


def test_book_mapping_reproduces_the_book_module() -> None:
    mha = _book_mha()
    model = build_wrapper(CONFIG).eval()
    model.load_state_dict(book_mha_state(mha.state_dict(), CONFIG), strict=False)
    x = torch.randn(2, 5, 8)
    with torch.no_grad():
        assert torch.allclose(model(x), mha(x), atol=1e-6)


def test_hf_mapping_reproduces_conv1d_attention() -> None:
    """c_attn's output columns [q | k | v], head h at h*d_out..; c_proj as x @ W + b (Conv1D)."""
    state = _hf_state()
    model = build_wrapper(CONFIG).eval()
    model.load_state_dict(hf_gpt2_state(state, CONFIG), strict=False)
    x = torch.randn(2, 5, 8)
    qkv = x @ state["c_attn.weight"] + state["c_attn.bias"]  # (B, T, 18)
    q, k, v = (t.view(2, 5, 3, 2).transpose(1, 2) for t in qkv.split(6, dim=-1))  # each (B, H, T, d)
    scores = (q @ k.transpose(-2, -1)).masked_fill(torch.triu(torch.ones(5, 5, dtype=torch.bool), 1), -torch.inf)
    ctx = (torch.softmax(scores / 2 ** 0.5, dim=-1) @ v).transpose(1, 2).reshape(2, 5, 6)
    want = ctx @ state["c_proj.weight"] + state["c_proj.bias"]
    with torch.no_grad():
        assert torch.allclose(model(x), want, atol=1e-6)


@pytest.mark.parametrize("fmt", ["safetensors", "pt"])
def test_wrapper_state_dict_round_trip(tmp_path: Path, fmt: str) -> None:
    state = _wrapper_state()
    path = tmp_path / f"w.{fmt}"
    if fmt == "safetensors":
        save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    else:
        torch.save(state, path)
    model, record = load_model(SEED, path)
    x = torch.randn(2, 5, 3)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())
    assert not torch.equal(model(x), seeded_model(SEED)(x))
    assert record.layout == "wrapper" and record.layer is None and len(record.sha256 or "") == 64


def test_masks_may_be_left_out_and_a_nested_state_dict_is_found(tmp_path: Path) -> None:
    state = {k: v for k, v in _wrapper_state().items() if not k.endswith("mask")}
    torch.save({"model_state_dict": state, "optimizer_state_dict": {}}, tmp_path / "w.pt")
    model, _ = load_model(SEED, tmp_path / "w.pt")
    assert torch.equal(model.heads[0].W_key.weight, state["heads.0.W_key.weight"])


@pytest.mark.parametrize("keys,layer,message", [
    (["tok_emb.weight"], None, "no known layout"),
    (["W_query.weight", "h.0.attn.c_attn.weight"], None, "more than one layout"),
    ([f"h.{i}.attn.c_attn.weight" for i in range(3)], None, "holds 3 layers .* choose one with --layer N"),
    ([f"h.{i}.attn.c_attn.weight" for i in range(3)], 3, "--layer 3 is out of range: the file holds 3 layers"),
    (["W_query.weight"], 1, "holds one attention layer"),
])
def test_locate_refusals(keys: list[str], layer: int | None, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        locate(keys, layer)


def test_locate_finds_the_layer_and_prefix() -> None:
    found = locate(["transformer.wte.weight"] + [f"transformer.h.{i}.attn.c_attn.weight" for i in range(12)], 11)
    assert (found.layout.name, found.layer, found.prefix, found.layers) == ("hf-gpt2", 11, "transformer.h.11.attn.", 12)


def _pop(key: str) -> Callable[[dict[str, torch.Tensor]], None]:
    return lambda s: s.pop(key)


def _set(key: str, value: torch.Tensor) -> Callable[[dict[str, torch.Tensor]], None]:
    return lambda s: s.__setitem__(key, value)


def _nan(key: str, value: float = float("nan")) -> Callable[[dict[str, torch.Tensor]], None]:
    def edit(s: dict[str, torch.Tensor]) -> None:
        s[key] = s[key].clone()
        s[key].view(-1)[3] = value
    return edit


def _checkpoint() -> dict[str, torch.Tensor]:
    """A two-layer GPT-2 attention checkpoint for CONFIG."""
    return {f"h.{i}.attn.{k}": v.detach().contiguous() for i in range(2) for k, v in _hf_state().items()}


BAD = {
    "wrong shape": (_set("h.1.attn.c_attn.weight", torch.zeros(8, 17)), CONFIG,
                    r"'h\.1\.attn\.c_attn\.weight' has width 17"),
    "wrong d_in": (_set("h.1.attn.c_attn.weight", torch.zeros(7, 18)), CONFIG,
                   r"'h\.1\.attn\.c_attn\.weight' has shape \[7, 18\], expected \[8, 18\]"),
    "missing key": (_pop("h.1.attn.c_proj.bias"), CONFIG, r"missing key 'h\.1\.attn\.c_proj\.bias'"),
    "extra key": (_set("h.1.attn.c_fc.weight", torch.zeros(2)), CONFIG, r"unexpected key 'h\.1\.attn\.c_fc\.weight'"),
    "NaN": (_nan("h.1.attn.c_attn.weight"), CONFIG, r"'h\.1\.attn\.c_attn\.weight' holds NaN or inf"),
    # +inf and no NaN: a check written as `isnan` would let it through.
    "inf": (_nan("h.1.attn.c_proj.bias", float("inf")), CONFIG, r"'h\.1\.attn\.c_proj\.bias' holds NaN or inf"),
    # float64 past float32's range passed the finiteness check, then became inf in the cast: the export failed
    # after its work with a line blaming the input
    "float64 past float32": (_set("h.1.attn.c_proj.weight", torch.full((6, 6), 1e300, dtype=torch.float64)), CONFIG,
                             r"'h\.1\.attn\.c_proj\.weight' holds values beyond float32's range"),
    # finite float32 weights whose attention scores overflow: likewise, refused now before "exporting ..."
    "scores that overflow": (_set("h.1.attn.c_attn.weight", torch.full((8, 18), 1e30)), CONFIG,
                             r"eager PyTorch's output is NaN or inf with these weights"),
    "integer weights": (_set("h.1.attn.c_proj.weight", torch.zeros(6, 6, dtype=torch.int64)), CONFIG,
                        r"'h\.1\.attn\.c_proj\.weight' has dtype torch\.int64"),
    # float8 is floating point, but torch.isfinite is not defined for it: it was an "internal error".
    "float8 weights": (_set("h.1.attn.c_proj.weight", torch.zeros(6, 6, dtype=torch.float8_e4m3fn)), CONFIG,
                       r"'h\.1\.attn\.c_proj\.weight' has dtype float8_e4m3fn, expected float32, float16"),
    "bias dropped by config": (lambda s: None, MHAConfig(**{**CONFIG.to_dict(), "qkv_bias": False}),
                               r"holds 'h\.1\.attn\.c_attn\.bias' but the config says qkv_bias=false"),
    "projection dropped by config": (lambda s: None, MHAConfig(**{**CONFIG.to_dict(), "out_proj": False}),
                                     r"holds 'h\.1\.attn\.c_proj\.weight' but the config says out_proj=false"),
    "width not divisible by num_heads": (lambda s: None, MHAConfig(d_in=8, d_out=1, num_heads=4, context_length=5,
                                                                   qkv_bias=True, out_proj=True),
                                         r"width 18, not divisible into 3 x num_heads=4"),
    "two layouts in one file": (_set("W_query.weight", torch.zeros(6, 8)), CONFIG, "more than one layout"),
    # Two causal squares stacked, where GPT-2 has (1, 1, n, n): reshaping it to (n, n) was an "internal error".
    "mask of two squares": (_set("h.1.attn.bias", torch.tril(torch.ones(5, 5, dtype=torch.bool)).expand(2, 5, 5)
                                 .clone()), CONFIG, r"'h\.1\.attn\.bias' is not the causal mask this model requires"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_weights_one_line_exit_1_no_folder(case: str, tmp_path: Path) -> None:
    edit, config, message = BAD[case]
    state = _checkpoint()
    edit(state)
    save_file(state, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(config.to_dict()))
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["export", "--config", str(tmp_path / "config.json"), "--name", "mine",
                                      "--weights", str(tmp_path / "model.safetensors"), "--layer", "1",
                                      "--out", str(out)])
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()  # the "exporting" line comes once the weights are read
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "Traceback" not in result.output, result.stderr
    assert re.search(message, lines[0]), lines[0]
    assert not out.exists()


TORCH_ONLY = {  # what only a torch.save file can hold: each was an "internal error"
    "meta tensor": (_set("h.1.attn.c_proj.weight", torch.zeros(6, 6, device="meta")),
                    r"'h\.1\.attn\.c_proj\.weight' is a meta tensor; expected a dense tensor"),
    "sparse tensor": (_set("h.1.attn.c_proj.weight", torch.eye(6).to_sparse()),
                      r"'h\.1\.attn\.c_proj\.weight' is a sparse_coo tensor; expected a dense tensor"),
    "a key that is not a name": (lambda s: s.__setitem__(1, torch.zeros(3)),
                                 r"expected tensor names \(strings\) as its keys, got int 1"),
    # A training checkpoint's step count beside the tensors: the line said "got dict" of a dict.
    "a value that is not a tensor": (lambda s: s.__setitem__("step", 3), r"a state_dict\), but 'step' holds int"),
}


@pytest.mark.parametrize("case", list(TORCH_ONLY))
def test_bad_torch_checkpoints_one_line_exit_1(case: str, tmp_path: Path) -> None:
    edit, message = TORCH_ONLY[case]
    state: dict[Any, torch.Tensor] = dict(_checkpoint())
    edit(state)
    torch.save(state, tmp_path / "model.pt")
    (tmp_path / "config.json").write_text(json.dumps(CONFIG.to_dict()))
    result = CliRunner().invoke(cli, ["export", "--config", str(tmp_path / "config.json"), "--name", "mine",
                                      "--weights", str(tmp_path / "model.pt"), "--layer", "1",
                                      "--out", str(tmp_path / "out")])
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and re.search(message, lines[0]) and "internal error" not in lines[0], result.stderr
    assert not (tmp_path / "out").exists()


def test_layer_out_of_range_from_the_cli(tmp_path: Path) -> None:
    save_file(_checkpoint(), str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(CONFIG.to_dict()))
    result = CliRunner().invoke(cli, ["export", "--config", str(tmp_path / "config.json"), "--name", "mine",
                                      "--weights", str(tmp_path / "model.safetensors"), "--layer", "2",
                                      "--out", str(tmp_path / "out")])
    assert result.exit_code == 2 and "--layer 2 is out of range: the file holds 2 layers" in result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("text,message,code", [
    ("{", "expected JSON", 1),  # not a config file at all: a bad file
    ('{"d_in": 8, "d_out": 2, "num_heads": 3}', "missing field 'context_length'", 2),  # bad values: usage errors
    ('{"d_in": 8, "d_out": 2, "num_heads": 3, "context_length": 5, "heads": 3}', "unknown field 'heads'", 2),
    ('{"d_in": 8, "d_out": 2, "num_heads": 3, "context_length": 5, "d_in": 4}',
     "expected unique member names, got 'd_in' twice", 2),  # json.loads alone kept the last
    ('{"d_in": "8", "d_out": 2, "num_heads": 3, "context_length": 5}', "field 'd_in': expected a positive integer",
     2),
    ('{"d_in": 8, "d_out": 2, "num_heads": 3, "context_length": 5, "out_proj": 1}', "field 'out_proj'", 2),
    # json.loads' own ValueError past 4300 digits was an "internal error"
    ('{"d_in": 1' + "0" * 5000 + ', "d_out": 2, "num_heads": 3, "context_length": 5}',
     "expected JSON integers of at most 4300 digits", 2),
])
def test_bad_config_file_is_one_line(tmp_path: Path, text: str, message: str, code: int) -> None:
    (tmp_path / "config.json").write_text(text)
    result = CliRunner().invoke(cli, ["export", "--config", str(tmp_path / "config.json"), "--name", "mine",
                                      "--out", str(tmp_path / "out")])
    assert result.exit_code == code and message in result.stderr and result.stderr.count("\n") == 1, result.stderr
    assert not (tmp_path / "out").exists()


def test_preset_and_config_exclude_each_other(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["export", "--preset", "seed", "--config", "c.json", "--name", "x"])
    assert result.exit_code == 2 and "--preset and --config exclude each other" in result.stderr
    result = CliRunner().invoke(cli, ["export", "--config", "c.json"])
    assert result.exit_code == 2 and "--config needs --name NAME" in result.stderr


def test_unreadable_and_missing_files(tmp_path: Path) -> None:
    (tmp_path / "w.pt").write_bytes(b"not a pickle")
    with pytest.raises(ConfigError, match=r"expected a \.safetensors file or a torch\.save file .*, got text"):
        load_model(SEED, tmp_path / "w.pt")
    with pytest.raises(ConfigError, match="found nothing"):
        load_model(SEED, tmp_path / "absent.safetensors")


def test_a_pickle_that_runs_code_is_refused(tmp_path: Path) -> None:
    import pickle

    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self) -> tuple[object, tuple[str, str]]:
            return (open, (str(marker), "w"))  # unpickling it would create the file

    (tmp_path / "w.pt").write_bytes(pickle.dumps({"heads.0.W_query.weight": Exploit()}))
    with pytest.raises(ConfigError, match="refused: its pickle holds objects other than tensors"):
        load_model(SEED, tmp_path / "w.pt")
    assert not marker.exists(), "the pickle's code ran"
