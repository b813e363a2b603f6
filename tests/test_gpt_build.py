"""The streamed writer (export/mha_export/gpt/stream_save.py) writes exactly protobuf's own serialization."""
from __future__ import annotations

from pathlib import Path

import onnx

from mha_export.gpt.concat import concat_model
from mha_export.gpt.eager import seeded_gpt
from mha_export.gpt.inplace import inplace_model
from mha_runtime.gpt.config import GPTConfig

CFG = GPTConfig(vocab_size=97, context_length=16, emb_dim=16, n_heads=2, n_layers=2, qkv_bias=True)


def test_streamed_files_equal_onnx_save(tmp_path: Path) -> None:
    state = {k: v for k, v in seeded_gpt(CFG).state_dict().items() if not k.endswith(".mask")}
    for name, built in (("concat", concat_model(state, CFG, tied=False)),
                        ("inplace", inplace_model(state, CFG, tied=True))):
        built.save(tmp_path / f"{name}.onnx")
        onnx.save(built.full(), str(tmp_path / f"{name}.ref.onnx"))
        assert (tmp_path / f"{name}.onnx").read_bytes() == (tmp_path / f"{name}.ref.onnx").read_bytes(), name
        onnx.checker.check_model(str(tmp_path / f"{name}.onnx"))
