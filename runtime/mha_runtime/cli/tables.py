"""Plain-text tables for the CLI: export results, validation results, `mha inspect`, the benchmarks."""
from __future__ import annotations

from typing import Any

from mha_runtime.attention.manifest import Manifest


def shown(text: str) -> str:
    """A manifest's own text as a line shows it: as it is when printable, else escaped (an edited manifest.json is
    not listed in itself, and a newline or a direction mark in its name would forge or reorder what is shown)."""
    return text if text.isprintable() else ascii(text)


def human_size(n: int) -> str:
    """Bytes in B, KiB, MiB or GiB."""
    value, unit = float(n), "B"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            break
        value /= 1024
    return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"


def table(headers: list[str], rows: list[list[Any]]) -> str:
    """Left-aligned columns, two spaces apart."""
    cells = [headers] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells)


def artifact_rows(manifest: Manifest) -> list[list[Any]]:
    """One row per validated artifact: size, worst errors, tolerance, case count."""
    rows = []
    for file, info in manifest.artifacts.items():
        tol = info.tolerance
        limit = f"atol {tol.atol:g}" + (f", rel_l2 {tol.rel_l2:g}" if tol.rel_l2 is not None else "")
        size = manifest.files[file].size if file in manifest.files else None
        rows.append([shown(manifest.name), file, "-" if size is None else human_size(size),
                     "-" if info.opset is None else info.opset, f"{info.max_abs_error:.2e}", f"{info.rel_l2_error:.2e}",
                     limit, "-" if info.nodes is None else info.nodes, info.cases, "ok" if info.passed else "FAIL"])
    return rows


ARTIFACT_HEADERS = ["name", "artifact", "size", "opset", "max abs err", "rel L2 err", "tolerance", "nodes", "cases",
                    "result"]
