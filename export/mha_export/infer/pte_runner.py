"""Run `mha.pte` with ExecuTorch's Python runtime: the golden checks, the validator and the bench use it."""
from __future__ import annotations

import contextlib
import logging
import os
import threading
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mha_runtime.artifact.errors import ArtifactError, ConfigError, ContractError, first_line
from mha_runtime.attention.config import MHAConfig
from mha_runtime.attention.contract import check_input, check_output
from mha_runtime.attention.registry import PTE
from mha_runtime.attention.runner import read_model

# Constant methods that make the program self-describing, as metadata_props do for ONNX.
CONFIG_METHOD, BATCH_METHOD = "mha_config", "batch_max"


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """torchao and torch log notes on import and export; ExecuTorch's C++ runtime prints to fd 2 directly."""
    for name in ("torchao", "torch.utils._pytree", "executorch", "torch._export"):
        logging.getLogger(name).setLevel(logging.ERROR)
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def text_fields(data: bytes) -> Iterator[tuple[str, bytes]]:
    """(what, bytes) of each string ExecuTorch may print while it loads a method: the methods' names, their
    operators' names and overloads, their delegates' ids and the named data's keys (program.fbs field order)."""
    from flatbuffers.table import Table  # ExecuTorch's own dependency: only with the executorch extra

    def strings(table: Table, slot: int, what: str, field: int) -> Iterator[tuple[str, bytes]]:
        for j in range(vector_len(table, slot)):
            item = Table(data, table.Indirect(table.Vector(table.Offset(slot)) + 4 * j))
            offset = item.Offset(4 + 2 * field)
            if offset:
                yield what, bytes(item.String(offset + item.Pos))

    def vector_len(table: Table, slot: int) -> int:
        offset = table.Offset(slot)
        return table.VectorLen(offset) if offset else 0

    program = Table(data, int.from_bytes(data[:4], "little"))
    yield from strings(program, 18, "named data key", 0)  # Program.named_data[].key
    for i in range(vector_len(program, 6)):  # Program.execution_plan
        plan = Table(data, program.Indirect(program.Vector(program.Offset(6)) + 4 * i))
        if plan.Offset(4):
            yield "method name", bytes(plan.String(plan.Offset(4) + plan.Pos))
        yield from strings(plan, 16, "operator name", 0)  # ExecutionPlan.operators[].name
        yield from strings(plan, 16, "operator overload", 1)
        yield from strings(plan, 18, "delegate id", 0)  # ExecutionPlan.delegates[].id


def load_program(runtime: Any, data: bytes) -> Any:
    """runtime.load_program(data) (which verifies the flatbuffer's structure), then every string it may print
    checked as UTF-8: ExecuTorch's log reaches Python's stderr through pybind11, which cannot decode other bytes
    and ends the process (abort, exit 134, no message) on an edited operator name; refused with ValueError."""
    program = runtime.load_program(data)
    for what, text in text_fields(data):
        try:
            text.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"its {what} {text[:40]!r} is not UTF-8 text") from None
    return program


@contextlib.contextmanager
def loading(where: str | Path, threads: int | None) -> Iterator[Any]:
    """ExecuTorch's Runtime, quietly, its own pool set to `threads`; whatever the body raises (a program that does
    not load, a method missing or of another arity) becomes one ArtifactError naming `where`. A context manager, not
    a function: each caller loads its methods in its own order and unpacks their values inside it."""
    with quiet():
        from executorch.extension.pybindings.portable_lib import _unsafe_reset_threadpool
        from executorch.runtime import Runtime

        if threads is not None:
            _unsafe_reset_threadpool(threads)  # ExecuTorch's own pool; torch's thread setting does not reach it
        try:
            yield Runtime.get()
        except Exception as exc:
            raise ArtifactError(f"{where}: ExecuTorch cannot load it ({first_line(exc)})") from None


class PteRunner:
    """Run `mha.pte` with ExecuTorch's Python runtime. Like OnnxRunner: from a folder (checked against the
    manifest) or a lone file; the config comes from the program itself (its `mha_config` constant method)."""

    def __init__(self, artifact: str | Path, *, model: str = PTE.file, threads: int | None = None) -> None:
        data, self.path, self.verified = read_model(Path(artifact), model, (".pte",))  # verified before parsing
        with loading(self.path, threads) as runtime:
            self._program = load_program(runtime, data)  # kept: a Method outliving its Program crashes
            self._method = self._program.load_method("forward")
            (text,) = self._program.load_method(CONFIG_METHOD).execute([])
            (self.batch_max,) = self._program.load_method(BATCH_METHOD).execute([])
        try:
            self.config = MHAConfig.from_json(text)
        except ConfigError as exc:
            raise ArtifactError(f"{self.path}: its {CONFIG_METHOD!r} is invalid: {exc}") from None
        self._lock = threading.Lock()  # a Method is not safe to run from two threads at once

    def run(self, x: Any) -> np.ndarray:
        """x: (B, T, d_in), B <= batch_max -> context (B, T, H * d_out); checked before ExecuTorch sees it."""
        x = check_input(x, self.config)
        if x.shape[0] > self.batch_max:
            raise ContractError(f"input 'x': expected batch <= {self.batch_max} (the ExecuTorch program's planned "
                                f"maximum), got {x.shape[0]}")
        with self._lock:
            try:
                (out,) = self._method.execute([torch.from_numpy(x)])
            except Exception as exc:
                raise ArtifactError(f"{self.path}: ExecuTorch failed on {list(x.shape)} ({first_line(exc)})") from None
        return check_output(out.numpy(), x)

    __call__ = run


def pte_runner(path: Path) -> Callable[[np.ndarray], np.ndarray]:
    """The `mha.runners` entry point for `mha check`: x (B, T, d_in) -> context through the verified program."""
    return PteRunner(path.parent, model=path.name).run
