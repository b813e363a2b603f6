"""User weights: safetensors and torch state_dicts load; ones that do not fit are refused by name."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from export.weights import load_model, seeded_model
from runtime.config import MHAConfig, preset
from runtime.errors import ConfigError

SEED = preset("seed")


def _other_state() -> dict[str, torch.Tensor]:
    torch.manual_seed(7)
    from export.model import build_wrapper

    return build_wrapper(SEED).state_dict()


@pytest.mark.parametrize("fmt", ["safetensors", "pt"])
def test_weights_round_trip(tmp_path: Path, fmt: str) -> None:
    state = _other_state()
    path = tmp_path / f"w.{fmt}"
    if fmt == "safetensors":
        save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    else:
        torch.save(state, path)
    model = load_model(SEED, path)
    x = torch.randn(2, 5, 3)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())
    assert not torch.equal(model(x), seeded_model(SEED)(x))


def test_masks_may_be_left_out(tmp_path: Path) -> None:
    state = {k: v for k, v in _other_state().items() if not k.endswith("mask")}
    torch.save(state, tmp_path / "w.pt")
    assert torch.equal(load_model(SEED, tmp_path / "w.pt").heads[0].W_key.weight, state["heads.0.W_key.weight"])


@pytest.mark.parametrize("edit,message", [
    (lambda s: s.pop("heads.1.W_value.weight"), "missing key 'heads.1.W_value.weight'"),
    (lambda s: s.__setitem__("heads.0.W_query.weight", torch.zeros(2, 4)), r"'heads.0.W_query.weight' has shape \[2, 4\], expected \[2, 3\]"),
    (lambda s: s.__setitem__("heads.2.W_query.weight", torch.zeros(2, 3)), "unexpected key 'heads.2.W_query.weight'"),
    (lambda s: s.__setitem__("heads.0.mask", torch.zeros(6, 6)), "'heads.0.mask' is not the causal mask"),
])
def test_mismatched_state_dict_is_refused(tmp_path: Path, edit, message: str) -> None:
    state = _other_state()
    edit(state)
    torch.save(state, tmp_path / "w.pt")
    with pytest.raises(ConfigError, match=message):
        load_model(SEED, tmp_path / "w.pt")


def test_bias_config_needs_bias_keys(tmp_path: Path) -> None:
    torch.save(_other_state(), tmp_path / "w.pt")
    with pytest.raises(ConfigError, match="missing key 'heads.0.W_key.bias'"):
        load_model(MHAConfig(d_in=3, d_out=2, num_heads=2, context_length=6, qkv_bias=True), tmp_path / "w.pt")


def test_unreadable_and_missing_files(tmp_path: Path) -> None:
    (tmp_path / "w.pt").write_bytes(b"not a pickle")
    with pytest.raises(ConfigError, match="cannot read it as weights"):
        load_model(SEED, tmp_path / "w.pt")
    with pytest.raises(ConfigError, match="found nothing"):
        load_model(SEED, tmp_path / "absent.safetensors")
