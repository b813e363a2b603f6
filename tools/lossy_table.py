"""The lossy forms beside llama.cpp's quant types of the same weights: bytes (and their share of the fp32 file) and
the quality figures each manifest records (mean KL divergence from fp32, same top token), one markdown row a
folder and form.

Repository tooling, not part of either package. The folders are exports with `--variants all,gguf` (after `make
llama-cpp`): their gpt.q8_0.gguf and gpt.q4_0.gguf are llama.cpp's Q8_0 and Q4_0 of the same weights (ggml's own
quantizers' bytes, tests/decoder/test_gpt_gguf.py), measured on the same quality windows as the ONNX forms.

    python tools/lossy_table.py artifacts/gpt-mini artifacts/gpt-demo ...
"""
from __future__ import annotations

import sys
from pathlib import Path

from mha_runtime.decoder.contract import GGUF_FORM, GGUF_Q4_0, GGUF_Q8_0, INPLACE_FORM, INT4_FORM, INT8_FORM
from mha_runtime.decoder.manifest import load_gpt_manifest

ROWS = ((INT8_FORM, INPLACE_FORM), (GGUF_Q8_0, GGUF_FORM), (INT4_FORM, INPLACE_FORM), (GGUF_Q4_0, GGUF_FORM))


def rows(folder: Path) -> list[str]:
    """One row per lossy file the folder lists: its bytes against its own fp32 file's, and its recorded quality."""
    manifest = load_gpt_manifest(folder)
    out = []
    for file, fp32 in ROWS:
        if file not in manifest.artifacts or fp32 not in manifest.files:
            continue
        size, base = manifest.files[file].size, manifest.files[fp32].size
        quality = manifest.artifacts[file].quality or {}
        plan = manifest.artifacts[file].quantization or {}
        embedding = (plan.get("embedding") or {}).get("dtype", "-")
        out.append(f"| {folder.name} | {file} | {size / 1e6:.1f} MB | {size / base:.3f} | {embedding} | "
                   f"{quality.get('mean_kl', float('nan')):.3g} | {100 * quality.get('same_top', float('nan')):.1f}% |")
    return out


def main(argv: list[str]) -> int:
    print("| folder | file | bytes | share of fp32 | embedding | mean KL | same top |")
    print("|---|---|---|---|---|---|---|")
    for folder in argv:
        print("\n".join(rows(Path(folder))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
