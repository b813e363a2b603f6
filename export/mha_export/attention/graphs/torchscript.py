"""The TorchScript artifact: torch.jit.trace in eval mode, config embedded as an extra file."""
from __future__ import annotations

import contextlib
import copy
import hashlib
import io
import warnings
import zipfile
from collections.abc import Iterator
from pathlib import Path

import torch

from mha_export.infer.torchscript_runner import CONFIG_EXTRA
from mha_export.model.example import example_input
from mha_runtime.attention.config import MHAConfig
from mha_runtime.attention.registry import TORCHSCRIPT


def share_masks(module: torch.nn.Module) -> torch.nn.Module:
    """A copy whose heads hold one mask tensor: the masks are identical, and torch.jit.save writes
    a shared storage once (docs/design-notes.md, "The faithful graph", has the sizes)."""
    shared = copy.deepcopy(module)
    first = shared.heads[0].mask
    for head in shared.heads:
        if not torch.equal(head.mask, first):
            return module  # not the tutorial's identical masks: keep them as they are
        head.mask = first
    return shared


def build_torchscript(wrapper: torch.nn.Module, config: MHAConfig, folder: Path, *, opset: int) -> None:
    """Trace at the example shape; the mask slice follows the input's size, so every length works."""
    with warnings.catch_warnings(), fresh_compilation_unit():
        warnings.simplefilter("ignore")  # TorchScript deprecation and tracer notes: expected, see README
        traced = torch.jit.trace(share_masks(wrapper).eval(), (example_input(config),), check_trace=False)
        buffer = io.BytesIO()
        torch.jit.save(traced, buffer, _extra_files={CONFIG_EXTRA: config.to_json()})
    (folder / TORCHSCRIPT.file).write_bytes(reproducible_archive(buffer.getvalue()))


@contextlib.contextmanager
def fresh_compilation_unit() -> Iterator[None]:
    """Trace into a compilation unit of its own: TorchScript numbers the classes of a re-traced module
    (`___torch_mangle_N`) with a counter of the process-wide unit, so without this the bytes of mha.pt would depend
    on how many modules the process traced before (an export of two presets, a test session)."""
    state = torch.jit._state
    saved = state._python_cu
    state._python_cu = torch._C.CompilationUnit()
    try:
        yield
    finally:
        state._python_cu = saved


# torch.jit.save writes, besides the model, `*.debug_pkl` records (the source line of every traced op, as absolute
# paths of the checkout and the venv) and a `.data/serialization_id` that differs on every save. Both are
# optional to the loaders (torch.jit.load, libtorch): the archive is rewritten without the debug records, with an
# id derived from the content, and with torch's own layout (stored records whose data start 64-byte aligned,
# padded in an "FB" extra field, fixed timestamps), so the bytes depend only on the config and the weights.
ALIGN = 64
SERIALIZATION_ID = ".data/serialization_id"


def reproducible_archive(data: bytes) -> bytes:
    """The TorchScript zip `data` without debug records and with a content-derived serialization id."""
    source = zipfile.ZipFile(io.BytesIO(data))
    names = [n for n in source.namelist() if not n.endswith((".debug_pkl", SERIALIZATION_ID))]
    digest = hashlib.sha256()
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as archive:

        def put(name: str, payload: bytes) -> None:
            pad = (-(out.tell() + 30 + len(name.encode()) + 4)) % ALIGN  # local header, name, extra header
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.extra = b"FB" + pad.to_bytes(2, "little") + b"Z" * pad
            archive.writestr(info, payload)

        for name in names:
            payload = source.read(name)
            digest.update(name.encode() + b"\0" + payload)
            put(name, payload)
        root = names[0].split("/")[0]
        put(f"{root}/{SERIALIZATION_ID}", str(int(digest.hexdigest()[:32], 16)).zfill(40)[:40].encode())
    return out.getvalue()
