"""Plain-text tables for the CLI: export results, validation results, and `mha inspect`."""
from __future__ import annotations

from typing import Any


def human_size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def table(headers: list[str], rows: list[list[Any]]) -> str:
    """Left-aligned columns, two spaces apart."""
    cells = [headers] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells)


def artifact_rows(preset: str, manifest: dict[str, Any]) -> list[list[Any]]:
    """One row per validated artifact: size, worst errors, tolerance, case count."""
    rows = []
    for file, info in manifest["artifacts"].items():
        tol = info["tolerance"]
        limit = f"atol {tol['atol']:g}" + (f", rel_l2 {tol['rel_l2']:g}" if tol.get("rel_l2") is not None else "")
        nodes = info.get("nodes")
        opset = info.get("opset")
        rows.append([preset, file, human_size(manifest["files"][file]["size"]), "-" if opset is None else opset,
                     f"{info['max_abs_error']:.2e}",
                     f"{info['rel_l2_error']:.2e}", limit, "-" if nodes is None else nodes, info["cases"],
                     "ok" if info["passed"] else "FAIL"])
    return rows


ARTIFACT_HEADERS = ["preset", "artifact", "size", "opset", "max abs err", "rel L2 err", "tolerance", "nodes", "cases", "result"]
