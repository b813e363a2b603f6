"""The one config object and its presets."""
import pytest

from mha_runtime.artifact.errors import ConfigError
from mha_runtime.attention.config import PRESETS, MHAConfig, preset


def test_presets() -> None:
    assert preset("seed") == MHAConfig(d_in=3, d_out=2, num_heads=2, context_length=6)
    gpt2 = preset("gpt2-small")
    assert (gpt2.d_in, gpt2.d_out, gpt2.num_heads, gpt2.context_length, gpt2.qkv_bias) == (768, 64, 12, 1024, False)
    assert gpt2.d_model == 768


def test_unknown_preset_names_the_choices() -> None:
    with pytest.raises(ConfigError, match="unknown preset 'gpt5'; choose one of seed, gpt2-small"):
        preset("gpt5")


@pytest.mark.parametrize("field,value", [("d_in", 0), ("d_out", -1), ("num_heads", 1.5), ("context_length", True)])
def test_invalid_fields_are_refused(field: str, value: object) -> None:
    data = PRESETS["seed"].to_dict() | {field: value}
    with pytest.raises(ConfigError, match=f"config field '{field}': expected a positive integer"):
        MHAConfig.from_dict(data)


def test_json_round_trip_and_unknown_field() -> None:
    cfg = PRESETS["gpt2-small"]
    assert MHAConfig.from_json(cfg.to_json()) == cfg
    with pytest.raises(ConfigError, match="unknown field 'n_layer'"):
        MHAConfig.from_dict(cfg.to_dict() | {"n_layer": 12})
    with pytest.raises(ConfigError, match="missing"):
        MHAConfig.from_dict({"d_in": 3})
