"""Constants and helpers shared by the tests (pytest puts tests/ on sys.path: pyproject's `pythonpath`)."""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np

from mha_runtime.attention.config import MHAConfig

REPO = Path(__file__).resolve().parent.parent
PRESET_DIGESTS = Path(__file__).parent / "data" / "preset_digests.json"
# A mid-size config (with qkv_bias, and d_out 16 for decode-inplace) between the toy seed preset and gpt2-small;
# `make test` exports it to artifacts/mid from the same file.
MID = MHAConfig.from_file(Path(__file__).parent / "data" / "mid.json")


def preset_digests(folder: Path) -> dict[str, str]:
    """sha256 of the bytes of the artifacts and weights of a folder: exports are byte-reproducible
    (test_reproducible.py), so the bytes themselves are pinned. Not the .ort files (ONNX Runtime does not write
    them byte-stable) nor the golden files (checked against the eager model and torch's generator in
    test_golden.py: float kernels may differ in the last bit between CPUs)."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(Path(folder).iterdir())
            if p.suffix in (".onnx", ".pt", ".pte", ".safetensors")}


def add_zero_case(folder: Path, name: str, shape: tuple[int, int, int], width: int) -> None:
    """Append a golden case of the given input shape to cases.json, zeros in and out, with a one-chunk schedule
    for the decode forms (the manifest is not resealed: the caller decides)."""
    golden = folder / "golden"
    (golden / f"{name}.x.bin").write_bytes(np.zeros(shape, "<f4").tobytes())
    (golden / f"{name}.context.bin").write_bytes(np.zeros((*shape[:2], width), "<f4").tobytes())
    doc = json.loads((golden / "cases.json").read_text())
    doc["cases"].append({"name": name, "input_shape": list(shape), "output_shape": [*shape[:2], width],
                         "input_bin": f"{name}.x.bin", "output_bin": f"{name}.context.bin",
                         "input_npy": f"{name}.x.npy", "output_npy": f"{name}.context.npy"})
    for entry in doc["artifacts"]:
        if "schedules" in entry:
            entry["schedules"][name] = [shape[1]]
    (golden / "cases.json").write_text(json.dumps(doc))


def copy_packages(dest: Path) -> Path:
    """runtime/ and export/ copied under `dest`, without what installs and builds leave there (setuptools' build/
    and egg-info beside each pyproject.toml, bytecode caches, the native runners' sources and builds)."""
    for folder in ("runtime", "export"):
        def ignore(where: str, names: list[str], top: Path = REPO / folder) -> set[str]:
            skipped = {n for n in names if n == "__pycache__" or n.endswith(".egg-info")}
            return skipped | ({"build", "native"} & set(names) if Path(where) == top else set())

        shutil.copytree(REPO / folder, dest / folder, ignore=ignore)
    return dest


def reseal(folder: Path, *names: str) -> None:
    """Record the current size and sha256 of `names` in manifest.json, as a consistent (if hostile) export would."""
    path = folder / "manifest.json"
    doc = json.loads(path.read_text())
    for name in names:
        data = (folder / name).read_bytes()
        doc["files"][name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    path.write_text(json.dumps(doc, indent=2) + "\n")


def reseal_json(folder: Path, name: str, **fields: object) -> None:
    """Set top-level `fields` in the JSON file `name` of `folder` and reseal it (an edited, consistent export)."""
    path = folder / name
    path.write_text(json.dumps(json.loads(path.read_text()) | fields))
    reseal(folder, name)


def book_wrapper(folder: Path) -> tuple[object, MHAConfig]:
    """(the book's own MultiHeadAttentionWrapper, llms_from_scratch.ch03, with the folder's weights file, its
    config): a reference no one here wrote, for a folder without an output projection. Its masks are its own."""
    from llms_from_scratch.ch03 import MultiHeadAttentionWrapper
    from safetensors.torch import load_file

    from mha_runtime.attention.manifest import load_manifest
    from mha_runtime.attention.registry import WEIGHTS_FILE

    config = load_manifest(folder).config
    assert not config.out_proj, "the book's wrapper has no output projection"
    model = MultiHeadAttentionWrapper(config.d_in, config.d_out, config.context_length, 0.0, config.num_heads,
                                      qkv_bias=config.qkv_bias)
    missing, unexpected = model.load_state_dict(load_file(str(Path(folder) / WEIGHTS_FILE)), strict=False)
    assert not unexpected and all(k.endswith(".mask") for k in missing), (missing, unexpected)
    return model.eval(), config
