"""Reading and writing the .npy files the `mha run` command takes and gives."""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from mha_runtime.errors import ContractError


def load_npy(path: Path) -> np.ndarray:
    """A numeric array from a .npy file (no pickles), or ContractError saying what came instead."""
    path = Path(path)
    try:
        array = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise ContractError(f"--input {path}: expected a .npy file, found nothing there") from None
    except (ValueError, OSError, EOFError) as exc:
        raise ContractError(f"--input {path}: expected a .npy array, could not read it ({exc})") from None
    if not isinstance(array, np.ndarray):  # an .npz archive loads as a mapping
        raise ContractError(f"--input {path}: expected a single .npy array, got {type(array).__name__}")
    return array


def npy_bytes(array: np.ndarray) -> bytes:
    """The .npy encoding of `array`, ready for an atomic write."""
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()
