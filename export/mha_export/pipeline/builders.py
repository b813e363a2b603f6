"""A kind's builder table: one row per file (or group of files) of its folder, written in the table's order by the
one runner here, which times every row and draws one bar over them.

A row is a small function over the step values: it reads the loaded step's value (`given`: the weights and what
the files are judged against) and the value the rows before it handed on (`made`: what was written so far and what
it came to), writes its files into the staging folder and returns `made` with its own part added. Whether a row
runs is decided from `given` alone, before the first row, so the bar's length is known; a row may still find it
has nothing to write (a quality file with every lossy form left out). The tables: the decoder's in
mha_export.decoder.steps.files, the attention's in mha_export.attention.pipeline.export.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Generic, TypeVar

import torch
from safetensors.torch import save_file

from mha_export.pipeline.progress import steps
from mha_export.pipeline.run import Stage

G = TypeVar("G")  # what every row reads: the loaded step's value
M = TypeVar("M")  # what the rows hand on: the files made so far


@dataclass(frozen=True)
class FileRow(Generic[G, M]):
    """One row of a builder table: what it writes, whether this export writes it, and the function that does."""

    name: str  # the file or files it writes (its bar's step name; its key in `Written.seconds`)
    wanted: Callable[[G], bool]
    write: Callable[[G, M, Path], M]  # (given, made so far, staging folder) -> made, its part added


@dataclass(frozen=True)
class Written(Generic[M]):
    """What a table's rows made, and each row's wall time by its name."""

    made: M
    seconds: Mapping[str, float]


def always(given: object) -> bool:
    """The `wanted` of a row every export writes."""
    return True


def write_files(rows: Sequence[FileRow[G, M]], given: G, first: M, stage: Stage) -> Written[M]:
    """Run every wanted row in the table's order, each handed what the rows before it made."""
    made, seconds = first, {}
    wanted = [row for row in rows if row.wanted(given)]
    for row in steps(wanted, label=stage.label, unit="file", enabled=stage.progress, name=lambda r: r.name):
        begin = time.perf_counter()
        made = row.write(given, made, stage.folder)
        seconds[row.name] = time.perf_counter() - begin
    return Written(made, MappingProxyType(seconds))


def write_weights(path: Path, state: Mapping[str, torch.Tensor], *, metadata: dict[str, str] | None = None) -> None:
    """Both kinds' weights file: `state` as safetensors (contiguous copies where a tensor is a view)."""
    save_file({k: v.contiguous() for k, v in state.items()}, str(path), metadata=metadata)
