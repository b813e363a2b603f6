"""The benchmarks' PNG writer (matplotlib, the bench extra)."""
from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from mha_runtime.artifact.atomic import write_file_atomic


def save_png(fig: Any, path: Path) -> None:
    """Render a matplotlib figure and write it atomically (a unique temporary file, then rename); close it."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    try:
        fig.savefig(buf, format="png", dpi=110)
    finally:
        plt.close(fig)
    write_file_atomic(path, buf.getvalue())
