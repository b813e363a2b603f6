"""GPT folders are byte-reproducible and carry no path of the machine that built them.

Every form but int4, whose bytes are pinned with gpt-mini's (tests/data/preset_digests.json, checked by
test_golden.py on every export of it)."""
from __future__ import annotations

import hashlib
from pathlib import Path

from gpt_sources import vocab_dir
from mha_export.decoder.archs.gpt2.config import GPTConfig
from mha_export.decoder.export import export_gpt

CFG = GPTConfig(vocab_size=50257, context_length=24, emb_dim=32, n_heads=4, n_layers=2, qkv_bias=True)
VARIANTS = ("decoder", "inplace", "int8")


def digests(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != "manifest.json"}


def test_two_exports_write_the_same_bytes_and_no_paths(tmp_path: Path) -> None:
    first, second = (export_gpt(name, tmp_path / where, config=CFG, tokenizer=vocab_dir(), variants=VARIANTS).folder
                     for name, where in (("one", "a"), ("two", "elsewhere/b")))
    assert digests(first) == digests(second)
    assert {"gpt.onnx", "gpt.inplace.onnx", "gpt.inplace.int8.onnx", "tokenizer.json", "genai_config.json",
            "gpt.safetensors", "golden/generations.json", "config.json", "generation_config.json",
            "onnx/model.onnx"} <= set(digests(first))
    for path in [p for p in [*first.rglob("*"), *second.rglob("*")] if p.is_file()]:
        data = path.read_bytes()
        for marker in (str(tmp_path).encode(), b"/tmp/", str(vocab_dir()).encode(), b"/work/"):
            assert marker not in data, f"{path.name} holds {marker!r}"
