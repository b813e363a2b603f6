"""Reading and writing the .npy files the `mha run` command takes and gives."""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from mha_runtime.artifact.errors import ContractError, first_line


def load_npy(path: Path) -> np.ndarray:
    """A numeric array from a .npy file (no pickles), or ContractError saying what came instead. The header
    is checked against the file's size first, so a header claiming a huge shape is refused, not allocated."""
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            version = np.lib.format.read_magic(fh)
            read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                           else np.lib.format.read_array_header_2_0)
            shape, _, dtype = read_header(fh)
            body = path.stat().st_size - fh.tell()
        if dtype.hasobject:
            raise ContractError(f"--input {path}: expected a numeric array, got dtype {dtype} (pickled objects)")
        expected = int(np.prod(shape, dtype=object)) * dtype.itemsize
        if expected != body:
            raise ContractError(f"--input {path}: the header says shape {list(shape)} {dtype} ({expected} bytes), "
                                f"the file holds {body} bytes")
        array = np.load(path, allow_pickle=False)
    except ContractError:
        raise
    except FileNotFoundError:
        raise ContractError(f"--input {path}: expected a .npy file, found nothing there") from None
    except IsADirectoryError:
        raise ContractError(f"--input {path}: expected a .npy file, found a folder") from None
    except (ValueError, OSError, EOFError, SyntaxError) as exc:
        raise ContractError(f"--input {path}: expected a .npy array, could not read it ({first_line(exc)})") from None
    return array


def npy_bytes(array: np.ndarray) -> bytes:
    """The .npy encoding of `array`, ready for an atomic write."""
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()
