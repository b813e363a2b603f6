"""A GGUF file as the decoder export's source (`mha export --gpt --weights model.gguf`): recognised by its magic,
its config from its metadata (general.architecture names the architecture, whose config_from_gguf reads its keys:
decoder/checkpoint.gguf_config), its tensors dequantized to float32 by gguf-py (the library of llama.cpp's own
converter) and handed to the architecture's read_gguf, which maps llama.cpp's names onto the book's keys.

Decisions:
- The types read are the ones gguf-py dequantizes that llama.cpp's converter and `llama-quantize` write for the
  usual file types: F32, F16, BF16, the legacy block types (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) and the k-quants (Q2_K to
  Q6_K). Any other (the IQ and ternary types, MXFP4) is refused in one line naming the tensor and its type, before
  any work: the file the user gave cannot be read here (a bad file, exit 1).
- Memory: one tensor is dequantized at a time; the float32 arrays are the state (torch.from_numpy shares them), so
  the only second copy is the eager model's own parameters, as for every other source.
"""
from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mha_runtime.artifact.errors import ConfigError, first_line

if TYPE_CHECKING:
    import numpy as np
    import torch

    from mha_export.decoder.archs.protocol import DecoderConfig

MAGIC = b"GGUF"  # the first four bytes of every GGUF file (gguf.GGUF_MAGIC, little-endian)
READ_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
LAYOUT = "gguf-{arch}"  # the manifest's weights.layout: llama.cpp's names of the architecture


def is_gguf(path: Path | None) -> bool:
    """Whether `path` is a file that starts with the GGUF magic (the suffix alone says nothing)."""
    if path is None or not Path(path).is_file():
        return False
    try:
        with open(path, "rb") as fh:
            return fh.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


def reader(path: Path) -> Any:
    """gguf-py's GGUFReader of the file (memory-mapped), parsed once per file as it is: it parses every token
    string (seconds for a vocabulary of 50,000), and the config, the origin, the tokenizer, the type check and the
    weights all ask. The file's path, modification time and size are the key."""
    stat = Path(path).stat()
    return _parsed(str(Path(path).resolve()), stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=1)
def _parsed(path: str, mtime: int, size: int) -> Any:
    import gguf

    del mtime, size  # the cache key: a file rewritten in between is read again
    try:
        return gguf.GGUFReader(path, "r")
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(f"{path}: not a GGUF file gguf-py can read ({first_line(exc)})") from None


def check_types(path: Path) -> None:
    """Refuse, before any work, a GGUF holding a tensor of a type this export does not dequantize (memory-mapped:
    no tensor is read)."""
    for tensor in reader(path).tensors:
        _readable(path, tensor)


def _readable(path: Path, tensor: Any) -> None:
    """One line naming a tensor (a gguf-py ReaderTensor) of a type outside READ_TYPES, and its type."""
    if tensor.tensor_type.name not in READ_TYPES:
        raise ConfigError(f"{path}: tensor {tensor.name!r} is {tensor.tensor_type.name}; the export reads "
                          f"{', '.join(READ_TYPES)}")


def dequantized(path: Path) -> dict[str, np.ndarray]:
    """GGUF name -> float32 array, rows first (llama.cpp's ne reversed: (V, E) for token_embd), as the
    architecture's gguf_tensors writes them."""
    import gguf
    import numpy as np

    out: dict[str, np.ndarray] = {}
    for tensor in reader(path).tensors:
        _readable(path, tensor)
        array = gguf.quants.dequantize(tensor.data, tensor.tensor_type)  # (rows..., columns)
        out[tensor.name] = np.array(array, dtype=np.float32, order="C")  # its own memory, not the file's map
    return out


def read_gguf_weights(path: Path, cfg: DecoderConfig) -> tuple[dict[str, torch.Tensor], bool, str]:
    """The book's state for `cfg` from the GGUF at `path` (the architecture's read_gguf over its dequantized
    tensors), whether the head is the token embedding, and the weights' layout."""
    from mha_export.decoder.archs import arch_of

    arch = arch_of(cfg)
    state, tied = arch.read_gguf(dequantized(path), cfg)
    return state, tied, LAYOUT.format(arch=arch.GGUF_ARCH)


def gguf_ids(fields: Mapping[str, Any], vocab_size: int) -> tuple[tuple[int, ...], int | None]:
    """The eos ids (tokenizer.ggml.eos_token_id, then eot_token_id, llama.cpp's end of turn, where another) and the
    bos id a GGUF's metadata names, those in the vocabulary."""
    def said(key: str) -> int | None:
        value = fields.get(f"tokenizer.ggml.{key}")
        ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value < vocab_size
        return value if ok else None

    eos = tuple(dict.fromkeys(i for i in (said("eos_token_id"), said("eot_token_id")) if i is not None))
    return eos, said("bos_token_id")



def metadata(path: Path) -> dict[str, Any]:
    """The GGUF's metadata as plain values (gguf/read.py's fields_of), from the one parse of the file."""
    from mha_export.gguf.read import fields_of

    return fields_of(reader(path))
